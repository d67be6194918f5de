"""Generation backends: one interface, batched, for transformers (CPU/GPU) and vLLM (GPU)."""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from pathlib import Path

from rlbench.generation import decoding as decoding_mod
from rlbench.generation.chat_format import ChatFormat

BACKENDS = ("auto", "hf", "vllm")
# The share of the GPU's memory vLLM may take (its own default is 0.9): the grader evaluates on the
# agent's GPU while the agent trains there (config: evaluation.gpu_memory_utilization).
DEFAULT_GPU_MEMORY_UTILIZATION = 0.45


class GenerationBackend(ABC):
    """Chat completion for many conversations at once: greedy, or sampled as a model's registry
    entry says for the tasks that take it (generation.decoding)."""

    name: str

    @abstractmethod
    def generate_chat(
        self, conversations: list[list[dict]], max_new_tokens: int, stop: list[str] | None = None
    ) -> list[str]:
        """One completion per conversation, in the order given, each cut before the first of the
        `stop` strings it contains (the stop string itself is not returned)."""


def cut_at_stop(text: str, stop: list[str] | None) -> str:
    """text up to the earliest occurrence of any stop string (OpenAI/vLLM semantics: excluded)."""
    if not stop:
        return text
    cut = min((i for i in (text.find(s) for s in stop if s) if i >= 0), default=-1)
    return text if cut < 0 else text[:cut]


def protocol_generation_config(model, eos: list[int], pad_token_id: int | None):
    """Replace the checkpoint's generation_config.json with the protocol's greedy decoding.

    transformers' generate() fills every setting a call leaves unset from model.generation_config,
    which a submission ships (num_beams, repetition_penalty, suppress_tokens, min_new_tokens, ...):
    decoding must come from the protocol alone. What is kept: the end-of-sequence and padding ids
    (vLLM stops at the generation config's EOS ids too). Returns the clean config."""
    from transformers import GenerationConfig

    config = GenerationConfig(
        do_sample=False, num_beams=1, eos_token_id=eos or None, pad_token_id=pad_token_id,
        bos_token_id=getattr(model.generation_config, "bos_token_id", None),
    )
    model.generation_config = config
    return config


def greedy_call_config(base, max_new_tokens: int, stop: list[str] | None = None):
    """The protocol's config for one generate() call: greedy, at most max_new_tokens, stopping at
    the stop strings (their text cut exactly by cut_at_stop afterwards)."""
    config = base.__class__.from_dict(base.to_dict())
    config.max_new_tokens = max_new_tokens
    config.stop_strings = list(stop) if stop else None
    return config


def eos_ids(*sources) -> list[int]:
    """Every end-of-sequence id the tokenizer and generation config name (each may be a list)."""
    ids = set()
    for source in sources:
        if source is not None:
            ids.update(source if isinstance(source, (list, tuple)) else [source])
    return sorted(ids)


class HFBackend(GenerationBackend):
    """transformers generate() with left padding, longest-first batches."""

    name = "hf"

    def __init__(
        self,
        model_dir: Path,
        batch_size: int = 32,
        device: str | None = None,
        base_chat_template: str | None = None,
        protocol: bool = False,
        decoding: dict | None = None,
        replicate: int = 0,
    ):
        """protocol: model_dir is a submission, rendered against base_chat_template (the base
        model's template; chat_format.ChatFormat.for_model); False: it is the base model.
        decoding: generation.decoding's settings (None: greedy); replicate: which repeat of the
        evaluation this is (a sampled decoding's seed)."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.bfloat16 if self.device == "cuda" else torch.float32
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
        self.tokenizer.padding_side = "left"
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, trust_remote_code=False, use_safetensors=True, dtype=dtype
        ).to(self.device)
        self.model.eval()
        self.batch_size = batch_size
        self.chat_format = ChatFormat.for_model(self.tokenizer, base_chat_template, protocol)
        self.chat_format.extra = decoding_mod.template_kwargs(decoding)
        eos = eos_ids(self.tokenizer.eos_token_id, self.model.generation_config.eos_token_id)
        self.generation_config = protocol_generation_config(self.model, eos, self.tokenizer.pad_token_id)
        self.decoding, self.replicate = decoding, replicate

    def generate_chat(
        self, conversations: list[list[dict]], max_new_tokens: int, stop: list[str] | None = None
    ) -> list[str]:
        prompts = [self.chat_format.render(c) for c in conversations]
        encoded = [self.tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
        # Longest first: similar lengths share a batch, so little compute goes to padding.
        order = sorted(range(len(prompts)), key=lambda i: -len(encoded[i]))
        outputs: list[str] = [""] * len(prompts)
        config = greedy_call_config(self.generation_config, max_new_tokens, stop)
        if decoding_mod.is_sampled(self.decoding):
            config.update(**decoding_mod.hf_sampling(self.decoding))
            # Seeded per call: the same checkpoint, prompts and batches give the same samples.
            self.torch.manual_seed(decoding_mod.repeat_seed(self.decoding, self.replicate))
        for start in range(0, len(order), self.batch_size):
            batch = order[start : start + self.batch_size]
            inputs = self.tokenizer.pad(
                {"input_ids": [encoded[i] for i in batch]}, padding=True, return_tensors="pt"
            ).to(self.device)
            with self.torch.inference_mode():
                # A row stops early at a stop string; the text is cut exactly by cut_at_stop below.
                generated = self.model.generate(
                    **inputs, generation_config=config, **({"tokenizer": self.tokenizer} if stop else {})
                )
            new_tokens = generated[:, inputs["input_ids"].shape[1] :]
            for row, index in enumerate(batch):
                text = self.tokenizer.decode(new_tokens[row], skip_special_tokens=True)
                outputs[index] = cut_at_stop(text, stop)
        return outputs


class VLLMBackend(GenerationBackend):
    """vLLM offline inference (GPU only; install the `gpu` extra). Prompts are rendered here, as the
    HF backend renders them (chat_format), and given to vLLM as token ids (no special tokens added:
    the template holds them), decoded greedily from explicit sampling parameters alone: vLLM reads
    the checkpoint's generation config only for the defaults of calls that give none."""

    name = "vllm"

    def __init__(
        self,
        model_dir: Path,
        batch_size: int = 256,
        gpu_memory_utilization: float = DEFAULT_GPU_MEMORY_UTILIZATION,
        base_chat_template: str | None = None,
        protocol: bool = False,
        decoding: dict | None = None,
        replicate: int = 0,
    ):
        if importlib.util.find_spec("vllm") is None:
            raise RuntimeError(
                "the vllm generation backend needs the gpu extra: pip install -e '.[gpu]' "
                "(or set evaluation.backend: hf)"
            )
        from vllm import LLM, SamplingParams

        self.llm = LLM(
            model=str(model_dir), trust_remote_code=False, seed=0, gpu_memory_utilization=gpu_memory_utilization
        )
        self.sampling = SamplingParams
        self.tokenizer = self.llm.get_tokenizer()
        self.chat_format = ChatFormat.for_model(self.tokenizer, base_chat_template, protocol)
        self.chat_format.extra = decoding_mod.template_kwargs(decoding)
        self.batch_size = batch_size
        self.decoding, self.replicate = decoding, replicate

    def generate_chat(
        self, conversations: list[list[dict]], max_new_tokens: int, stop: list[str] | None = None
    ) -> list[str]:
        params = self.sampling(
            **decoding_mod.vllm_sampling(self.decoding, self.replicate),
            max_tokens=max_new_tokens,
            stop=list(stop) if stop else None,
        )
        prompts = [
            {"prompt_token_ids": self.tokenizer(self.chat_format.render(c), add_special_tokens=False)["input_ids"]}
            for c in conversations
        ]
        results = self.llm.generate(prompts, params, use_tqdm=False)
        return [cut_at_stop(r.outputs[0].text, stop) for r in results]


def resolve_backend_name(name: str) -> str:
    """'auto' picks vllm when CUDA and vllm are both present, else hf."""
    if name not in BACKENDS:
        raise ValueError(f"unknown generation backend {name!r}; allowed: {', '.join(BACKENDS)}")
    if name != "auto":
        return name
    if importlib.util.find_spec("vllm") is None:
        return "hf"
    import torch

    return "vllm" if torch.cuda.is_available() else "hf"


def load_backend(
    name: str,
    model_dir: Path,
    batch_size: int = 32,
    gpu_memory_utilization: float | None = None,
    base_chat_template: str | None = None,
    protocol: bool = False,
    decoding: dict | None = None,
    replicate: int = 0,
) -> GenerationBackend:
    """The backend `name` over model_dir; protocol, base_chat_template, decoding and replicate:
    see HFBackend."""
    resolved = resolve_backend_name(name)
    chat = {"base_chat_template": base_chat_template, "protocol": protocol, "decoding": decoding, "replicate": replicate}
    if resolved == "vllm":
        return VLLMBackend(
            model_dir,
            batch_size=batch_size,
            gpu_memory_utilization=gpu_memory_utilization or DEFAULT_GPU_MEMORY_UTILIZATION,
            **chat,
        )
    return HFBackend(model_dir, batch_size=batch_size, **chat)
