"""The vLLM text generator (VLLMTextGenerator, GPU): vLLM with automatic prefix caching, one
``llm.generate`` per call."""

from __future__ import annotations

import importlib.util
import time
from pathlib import Path

from rlbench.generation.backends import cut_at_stop
from rlbench.generation.textgen_base import TextGenerator, max_positions, new_stats


class VLLMTextGenerator(TextGenerator):
    """vLLM offline inference with automatic prefix caching: one ``llm.generate`` per call; the
    shared few-shot prefix and each episode's history stay in vLLM's block cache between calls."""

    name = "vllm"
    tokenizer = None  # set in __init__ (vLLM's own tokenizer)

    def __init__(self, model_dir: Path, seed: int = 0, **llm_kwargs):
        if importlib.util.find_spec("vllm") is None:
            raise RuntimeError(
                "the vllm text generator needs the gpu extra: pip install -e '.[gpu]' (or use the hf generator)"
            )
        from transformers import AutoConfig
        from vllm import LLM, SamplingParams

        self.llm = LLM(model=str(model_dir), trust_remote_code=False, seed=seed, enable_prefix_caching=True, **llm_kwargs)
        self.sampling = SamplingParams
        self.tokenizer = self.llm.get_tokenizer()
        self.max_positions = max_positions(AutoConfig.from_pretrained(model_dir, trust_remote_code=False))
        self.stats = new_stats()

    def generate(self, prompts: dict, max_new_tokens: int, stop: list[str] | None) -> dict:
        started = time.perf_counter()
        stats = self.stats
        stats["calls"] += 1
        results, keys, texts = {}, [], []
        for key, prompt in prompts.items():
            n = len(self.tokenizer(prompt)["input_ids"])
            stats["prompts"] += 1
            stats["prompt_tokens"] += n
            if self.max_positions is not None and n + max_new_tokens > self.max_positions:
                stats["over_context"] += 1
                results[key] = None
            else:
                keys.append(key)
                texts.append(prompt)
        if texts:
            params = self.sampling(temperature=0.0, max_tokens=max_new_tokens, stop=list(stop) if stop else None)
            outputs = self.llm.generate(texts, params, use_tqdm=False)
            stats["forward_calls"] += 1  # engine steps are not visible here; one call per batch
            for key, output in zip(keys, outputs):
                completion = output.outputs[0]
                results[key] = cut_at_stop(completion.text, stop)
                stats["generated_tokens"] += len(completion.token_ids)
                cached = getattr(output, "num_cached_tokens", None) or 0
                stats["prompt_tokens_reused"] += cached
                stats["prompt_tokens_computed"] += len(output.prompt_token_ids or []) - cached
        stats["generate_seconds"] += time.perf_counter() - started
        return {key: results[key] for key in prompts}
