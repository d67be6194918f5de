"""The TextGenerator interface of multi-step rollouts and what its generators share: the call
statistics, the stop-string test, the model's context length, and the transformers model holder.

All generators (textgen lists them) tokenize each prompt in full, as vLLM does for text completion
(default special tokens), stop a row at EOS, at `max_new_tokens`, or as soon as the decoded new
text contains a stop string, and return the text cut before the first stop string. A prompt whose
token count plus `max_new_tokens` exceeds the model's ``max_position_embeddings`` is not generated
for: its key maps to None (the caller ends that episode as lost).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path

from rlbench.generation.backends import eos_ids, protocol_generation_config
from rlbench.generation.chat_format import ChatFormat


def new_stats() -> dict:
    return {
        "calls": 0,
        "prompts": 0,
        "prompt_tokens": 0,  # tokens of all prompts asked for
        "prompt_tokens_computed": 0,  # ... of which went through the model in this call
        "prompt_tokens_reused": 0,  # ... of which came from a cache
        "generated_tokens": 0,
        "forward_calls": 0,
        "over_context": 0,  # prompts answered None (context limit)
        "rows_retired_early": 0,  # CachedBatchGenerator: rows dropped from the batch mid-decode
        "draft_tokens": 0,  # prompt-lookup draft tokens fed (RowCachedGenerator, a lone row of CachedBatchGenerator)
        "draft_tokens_accepted": 0,  # ... of which were the greedy token (their forward saved)
        "generate_seconds": 0.0,
    }


class TextGenerator(ABC):
    """Greedy text completion of many keyed prompts at once (keys: episode ids, any hashable)."""

    name: str
    stats: dict
    #: how chat conversations become prompts (chat_format); textgen.load_text_generator sets the
    #: protocol's, and a generator built directly renders with its model's own template
    chat_format: ChatFormat | None = None

    @abstractmethod
    def generate(self, prompts: dict, max_new_tokens: int, stop: list[str] | None) -> dict:
        """key -> greedy completion of prompts[key], cut before the first stop string (excluded);
        None where the prompt plus `max_new_tokens` does not fit the model's context."""

    def release(self, key) -> None:
        """The episode `key` ended: free whatever is cached for it."""

    def chat_prompt(self, messages: list[dict]) -> str:
        """The text prompt of a chat conversation with the generation prompt, as chat_format renders
        it (the model's own template unless the protocol's was set)."""
        if self.chat_format is None:
            self.chat_format = ChatFormat.for_model(self.tokenizer)
        return self.chat_format.render(messages)

    @property
    def tokenizer(self):
        return self.hf.tokenizer

    def reset_stats(self) -> None:
        self.stats = new_stats()


def common_prefix(a: tuple, b: tuple) -> int:
    """Length of the longest common prefix of two token sequences (tuples: slices are compared)."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:  # C-speed fast path
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def contains_stop(text: str, stop: list[str] | None) -> bool:
    return bool(stop) and any(s and s in text for s in stop)


def max_positions(config) -> int | None:
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    value = getattr(text_config, "max_position_embeddings", None)
    return int(value) if value else None


class HFModel:
    """Model and tokenizer loaded like generation.HFBackend (float32 on CPU, eval mode)."""

    def __init__(self, model_dir: Path, device: str | None = None, dtype=None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dtype is None:
            dtype = torch.bfloat16 if self.device == "cuda" else torch.float32
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, trust_remote_code=False, use_safetensors=True, dtype=dtype
        ).to(self.device)
        self.model.eval()
        self.eos = set(eos_ids(self.tokenizer.eos_token_id, self.model.generation_config.eos_token_id))
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = min(self.eos) if self.eos else 0
        # Decoding is the protocol's alone: the checkpoint's generation_config.json is not used.
        protocol_generation_config(self.model, sorted(self.eos), self.pad_id)
        self.max_positions = max_positions(self.model.config)

    def encode(self, prompt: str) -> list[int]:
        # vLLM text completion: the tokenizer's default special tokens (BOS where the model has one).
        return list(self.tokenizer(prompt)["input_ids"])

    def encode_all(self, prompts: list[str]) -> list[list[int]]:
        """encode() of each prompt, in one batch call (the tokenizer's threads share the work)."""
        if not prompts:
            return []
        return [list(ids) for ids in self.tokenizer(prompts)["input_ids"]]

    def decode(self, tokens) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def fits(self, n_prompt_tokens: int, max_new_tokens: int) -> bool:
        return self.max_positions is None or n_prompt_tokens + max_new_tokens <= self.max_positions
