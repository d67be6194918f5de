"""Text generators for multi-step rollouts (ALFWorld ReAct episodes), chosen by name: greedy text
completion of many growing prompts at once, with the already computed prompt state reused between steps.

A rollout asks, at every step, for the greedy continuation of each live episode's full prompt text
(up to a stop string, at most `max_new_tokens` tokens); the next step's prompt is the previous one
plus the completion's action and the new observation. Three generators answer that question (the
interface they share, and its contract, in textgen_base):

- FullPromptGenerator (full_prompt): the reference harness's way, one prompt at a time, the whole
  prompt computed at every call (transformers ``generate``, batch 1);
- CachedBatchGenerator (prefix_cache): all prompts in one batched greedy decode (one forward per
  decoded token for all live rows); the KV cache of each episode is kept between calls and reused
  up to the longest common *token* prefix of the new full-prompt tokenization, and prompt prefixes
  shared by several episodes (the few-shot examples) are computed and stored once, in a radix tree;
- VLLMTextGenerator (vllm_text): vLLM with automatic prefix caching, one ``llm.generate`` per call (GPU).
"""

from __future__ import annotations

from pathlib import Path

from rlbench.generation.backends import DEFAULT_GPU_MEMORY_UTILIZATION, resolve_backend_name
from rlbench.generation.chat_format import ChatFormat
from rlbench.generation.full_prompt import FullPromptGenerator
from rlbench.generation.prefix_cache import CachedBatchGenerator
from rlbench.generation.textgen_base import TextGenerator
from rlbench.generation.vllm_text import VLLMTextGenerator

TEXT_GENERATORS = ("auto", "hf", "vllm", "reference")


def load_text_generator(
    name: str,
    model_dir: Path,
    device: str | None = None,
    base_chat_template: str | None = None,
    protocol: bool = False,
    **kwargs,
) -> TextGenerator:
    """'hf' -> CachedBatchGenerator, 'vllm' -> VLLMTextGenerator, 'auto' -> vllm when CUDA and vllm
    are both present, else hf (generation.resolve_backend_name); 'reference' -> FullPromptGenerator
    (the reference harness's one-prompt-at-a-time loop, for comparisons). protocol and
    base_chat_template: how its chat prompts are rendered (backends.HFBackend)."""
    memory = kwargs.pop("gpu_memory_utilization", None)  # vLLM's only
    if name == "reference":
        generator = FullPromptGenerator(model_dir, device=device, **kwargs)
    elif name not in TEXT_GENERATORS:
        raise ValueError(f"unknown text generator {name!r}; allowed: {', '.join(TEXT_GENERATORS)}")
    elif resolve_backend_name(name) == "vllm":
        generator = VLLMTextGenerator(
            model_dir, gpu_memory_utilization=memory or DEFAULT_GPU_MEMORY_UTILIZATION, **kwargs
        )
    else:
        generator = CachedBatchGenerator(model_dir, device=device, **kwargs)
    generator.chat_format = ChatFormat.for_model(generator.tokenizer, base_chat_template, protocol)
    return generator
