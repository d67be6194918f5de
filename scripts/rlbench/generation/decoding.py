"""How a model's completions are decoded: greedy (every protocol's default), or sampled with the
settings of the model's registry entry (`generation:`), as the reference harness decodes some
models on the tasks it scores through OpenCompass.

The reference (RD-Agent, rdagent/components/benchmark/configs/models.yaml, read by
autorl_bench/core/opencompass.py at commit 471eb30) matches the model's name by prefix:
"Qwen/Qwen3-8B" (so Qwen3-8B-Base) samples at temperature 0.6, top_p 0.95, top_k 20, thinking on,
up to 38,912 new tokens where the dataset config sets no length; every other model of the paper
decodes greedily (temperature 0, top_k 1), up to 8,192 new tokens. Its other tasks (ALFWorld,
WebShop, DeepSearchQA, AlpacaEval) run their own loops at temperature 0 whatever the model.

A sampled decoding is seeded: repeat k of an evaluation (the baseline's grader-noise repeats)
samples with seed + k, so the same checkpoint, prompts and batch give the same text, and the
baseline's K repeats measure the spread that sampling adds.
"""

from __future__ import annotations

GREEDY = {"temperature": 0.0, "top_p": 1.0, "top_k": 0, "enable_thinking": False, "seed": 0}
#: Baseline evaluations of a sampled decoding: at least this many, for its grader-noise band.
SAMPLED_REPEATS = 3


def model_decoding(generation: dict | None) -> dict:
    """A registry entry's `generation:` block with the greedy defaults filled in (max_new_tokens
    only when the entry sets one)."""
    decoding = {**GREEDY, **(generation or {})}
    decoding["temperature"] = float(decoding["temperature"])
    decoding["top_p"] = float(decoding["top_p"])
    return decoding


def is_sampled(decoding: dict | None) -> bool:
    return bool(decoding) and float(decoding.get("temperature") or 0.0) > 0.0


def repeat_seed(decoding: dict, replicate: int) -> int:
    """The seed of repeat `replicate` of an evaluation."""
    return int(decoding.get("seed") or 0) + int(replicate)


def describe(decoding: dict | None) -> str:
    """One line for descriptions and logs."""
    if not is_sampled(decoding):
        return "greedy"
    parts = [f"temperature {decoding['temperature']:g}", f"top_p {decoding['top_p']:g}"]
    if decoding.get("top_k"):
        parts.append(f"top_k {decoding['top_k']}")
    if decoding.get("enable_thinking"):
        parts.append("thinking on")
    return "sampled (" + ", ".join(parts) + f", seed {decoding.get('seed') or 0})"


def hf_sampling(decoding: dict | None) -> dict:
    """transformers GenerationConfig fields of a decoding (greedy: do_sample False)."""
    if not is_sampled(decoding):
        return {"do_sample": False}
    fields = {"do_sample": True, "temperature": float(decoding["temperature"]), "top_p": float(decoding["top_p"])}
    fields["top_k"] = int(decoding.get("top_k") or 0)  # 0 disables transformers' top-k cut
    return fields


def vllm_sampling(decoding: dict | None, replicate: int = 0) -> dict:
    """vLLM SamplingParams fields of a decoding (greedy: temperature 0)."""
    if not is_sampled(decoding):
        return {"temperature": 0.0}
    return {
        "temperature": float(decoding["temperature"]),
        "top_p": float(decoding["top_p"]),
        "top_k": int(decoding.get("top_k") or 0) or -1,  # vLLM: -1 = no cut
        "seed": repeat_seed(decoding, replicate),
    }


def template_kwargs(decoding: dict | None) -> dict:
    """Extra chat-template variables of a decoding: enable_thinking=True when thinking is on (the
    reference passes chat_template_kwargs only then; otherwise the template's own default holds)."""
    return {"enable_thinking": True} if decoding and decoding.get("enable_thinking") else {}
