"""LLM judges for judge-scored tasks: pairwise tasks compare outputs (AlpacaEval 2.0 style), grading
tasks ask free-text prompts (DeepSearchQA).

    judge = load_judge(task_settings["judge"], model_dir=..., cache_dir=..., replicate=0)

    # pairwise tasks
    judgments = judge.compare([Pair(instruction, reference_output, model_output), ...])
    judgments[i].preference   # in [1, 2]: 1 = reference better, 2 = model better; None = failed
    failure_summary(judgments)

    # grading tasks
    answers = judge.ask([[{"role": "system", "content": ...}, {"role": "user", "content": ...}], ...],
                        max_tokens=64, purpose="deepsearchqa-autorater")
    answers[i].text           # the answer, parsed by the task; None = failed (answers[i].failure)
    answer_failure_summary(answers)

Backends: `openai` (any OpenAI-compatible chat endpoint), `local` (a transformers model directory,
offline) and `match` (no model: a grading task that supports it grades by its own string-matching
rules when `judge.backend == "match"`; it compares and answers nothing). The model backends ask
pairs as their annotator says (`judge.annotator`, rlbench.scoring.judges.annotators: the reference's
function-calling ranking prompt once per pair in alpaca_eval's order, or AlpacaEval 2.0's default
weighted prompt in both orders; a local judge always runs the weighted one), and free-text prompts as
given, through an on-disk cache (rlbench.scoring.judges.base explains the combination, rlbench.scoring.judges.cache
the keys).
"""

from __future__ import annotations

from pathlib import Path

from rlbench.scoring.judges.annotators import (
    ANNOTATORS,
    CONFIGURABLE,
    WEIGHTED_LOCAL,
    Annotator,
    AnnotatorError,
    annotator_files,
    get_annotator,
)
from rlbench.scoring.judges.base import (
    FAILURE_KINDS,
    Answer,
    Judge,
    JudgeError,
    Judgment,
    Pair,
    Verdict,
    answer_failure_summary,
    failure_summary,
)
from rlbench.scoring.judges.local_judge import LocalJudge
from rlbench.scoring.judges.match_judge import MatchJudge
from rlbench.scoring.judges.openai_judge import OpenAIJudge

__all__ = [
    "ANNOTATORS",
    "Annotator",
    "BACKENDS",
    "FAILURE_KINDS",
    "Answer",
    "Judge",
    "JudgeError",
    "Judgment",
    "LocalJudge",
    "MatchJudge",
    "OpenAIJudge",
    "Pair",
    "Verdict",
    "answer_failure_summary",
    "code_files",
    "configured_annotator",
    "failure_summary",
    "judge_record",
    "load_judge",
]

BACKENDS = ("local", "match", "openai")
_OPENAI_KEYS = {
    "base_url", "api_key_var", "timeout_s", "max_retries", "retry_backoff_s", "concurrency",
    "temperature", "max_tokens", "top_logprobs", "logprobs",
}  # fmt: skip
_LOCAL_KEYS = {"batch_size", "max_prompt_tokens"}
_MATCH_KEYS: set[str] = set()  # backend and model (optional: "string-match") only
_OWN_KEYS = {"openai": _OPENAI_KEYS, "local": _LOCAL_KEYS, "match": _MATCH_KEYS}
_PAIRWISE_KEYS = {"annotator"}  # the model backends' (a match judge compares nothing)


def configured_annotator(settings: dict) -> Annotator:
    """The annotator a `judge:` block runs: `judge.annotator` (default weighted_gpt4_turbo) on the openai
    backend; weighted_local on the local backend, whatever is configured (a small local model cannot make
    function calls). JudgeError for an unknown name."""
    name = (settings or {}).get("annotator")
    try:
        chosen = get_annotator(name)
    except AnnotatorError as exc:
        raise JudgeError(f"{exc} (judge.annotator; for an OpenAI-compatible judge: {', '.join(CONFIGURABLE)})") from exc
    backend = (settings or {}).get("backend")
    if backend == "local":
        return ANNOTATORS[WEIGHTED_LOCAL]
    if backend == "openai" and chosen.name == WEIGHTED_LOCAL:
        raise JudgeError(
            f"judge.annotator {WEIGHTED_LOCAL} is the local backend's; an openai judge takes {', '.join(CONFIGURABLE)}"
        )
    return chosen


def load_judge(
    settings: dict, *, model_dir: Path | None = None, cache_dir: Path | None = None, replicate: int = 0
) -> Judge:
    """The judge a task's `judge:` block describes. `model_dir`: the materialised model of a local
    judge (its `model` names a models registry entry); `cache_dir`: the judgment cache (None: no
    cache); `replicate`: which repeat of a noisy grader this is (part of the cache key)."""
    settings = dict(settings or {})
    backend = settings.pop("backend", None)
    model = settings.pop("model", None)
    own = _OWN_KEYS.get(backend)
    if own is None:
        raise JudgeError(f"unknown judge backend {backend!r}; use one of {', '.join(BACKENDS)}")
    unknown = sorted(set(settings) - _OPENAI_KEYS - _LOCAL_KEYS - _PAIRWISE_KEYS)
    if unknown:
        raise JudgeError(f"unknown judge settings {unknown}; backend {backend!r} takes {sorted(own | _PAIRWISE_KEYS)}")
    annotator = configured_annotator({**settings, "backend": backend})
    # The other backends' keys are left aside: a sweep that switches the backend merges its
    # judge block over the registry's, so they may still be there.
    settings = {key: value for key, value in settings.items() if key in own}
    if backend == "match":
        return MatchJudge(model, cache_dir=cache_dir, replicate=replicate)
    if backend == "openai":
        return OpenAIJudge(model, cache_dir=cache_dir, replicate=replicate, annotator=annotator, **settings)
    if model_dir is None:
        raise JudgeError(
            f"the local judge needs its model directory (results/models/{model or '<judge.model>'}); "
            "judge.model names a models registry entry that the workflow materialises"
        )
    return LocalJudge(model_dir, model, cache_dir=cache_dir, replicate=replicate, **settings)


def judge_record(settings: dict, *, model_dir: Path | None = None) -> dict:
    """The judge's record for provenance, after checking it can work (the key's variable is set; the
    local model loads, has a chat template and one token each for m and M): settings (the key's
    variable NAME, never its value), the pairwise prompt template's hash and the identity hashes
    that key the judgment cache (`identity_sha256`: pairs; `text_identity_sha256`: free-text
    prompts). Raises JudgeError with the fix otherwise. The record has the same keys for every
    backend; the match judge, which asks no pairwise prompt, has annotator, annotator_config and
    template_sha256 None. `annotator` is the label an evaluation records (annotators.ANNOTATORS);
    `annotator_config` the alpaca_eval annotator config it follows."""
    judge = load_judge(settings, model_dir=model_dir)
    judge.check_ready()
    # The settings in effect: a sweep that switched the backend may have left the other one's keys.
    own = _OWN_KEYS[settings["backend"]] | {"backend", "model"}
    if settings["backend"] != "match":
        own |= _PAIRWISE_KEYS
    pairwise = judge.backend != "match"
    record = {
        "settings": {key: value for key, value in settings.items() if key in own},
        "backend": judge.backend,
        "model": judge.model,
        "annotator": judge.annotator.name if pairwise else None,
        "annotator_config": judge.annotator.config if pairwise else None,
        "template_sha256": judge.annotator.template_sha256() if pairwise else None,
        "deterministic": judge.deterministic,
        "identity_sha256": judge.identity_sha256(),
        "text_identity_sha256": judge.text_identity_sha256(),
    }
    if isinstance(judge, LocalJudge):
        record["weights_sha256"] = judge.decoding()["weights_sha256"]
    return record


def code_files() -> list[Path]:
    """The judge's source files and the annotator files it reads: part of the provenance of every score a
    judge gave."""
    return sorted(Path(__file__).resolve().parent.glob("*.py")) + annotator_files()
