"""The pairwise judge interface: batched, both orders, cached, failures counted.

A pair is (instruction, output_1 = the reference, output_2 = the evaluated model). Preferences use
AlpacaEval's encoding: a float in [1, 2], 1 = output_1 (reference) better, 2 = output_2 (model)
better, 1.5 = tie.

Every pair is judged twice to cancel position bias: `forward` shows the reference as "m" and the
model as "M"; `swapped` shows the model as "m" and the reference as "M". The swapped preference is
mapped back with 3 - x, and the pair's preference is the mean of the two:

    preference = (forward + (3 - swapped)) / 2

A judge that always favours the first slot with P(m) = p gives forward 2 - p and swapped 2 - p, so
(2 - p + 1 + p) / 2 = 1.5: pure position bias becomes a tie. (AlpacaEval itself asks once per pair,
in an order drawn at random per instruction; asking both orders costs twice the calls and removes
that draw's noise.) A pair whose outputs are identical is a tie without a call, as in AlpacaEval.

A single-order annotator (rlbench.scoring.judges.annotators: the function-calling ranking annotators) asks
each pair once instead, in alpaca_eval's order: `forward` when the hash keeps the reference first,
`swapped` when it shows the model first (the other order is a Verdict with parser "not_asked"), and
the pair's preference is that one verdict's, mapped back with 3 - x when swapped.

A pair is judged only when both orders are: if either call still fails after its retries, the
pair's preference is None and the evaluation drops it (it is neither a win nor a loss) and counts
the failure by kind (see `failure_summary`).

Grading tasks (DeepSearchQA) ask free-text prompts instead: `Judge.ask(prompts, max_tokens=...,
purpose=...)` sends each prompt (a list of {"role", "content"} messages) as it is and returns one
`Answer` per prompt, in order: the answer's text, which the task parses itself, or a failure of one
of FAILURE_KINDS. Answers go through the same cache (rlbench.scoring.judges.cache.text_cache_key): only
successful answers are stored, identical prompts within one call are asked once, and a
deterministic judge's replicates share replicate 0's answers. A failed prompt has no answer; the
task decides what that means and counts it (see `answer_failure_summary`).
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

from rlbench.scoring.judges.annotators import Annotator, get_annotator, is_switched
from rlbench.scoring.judges.cache import JudgmentCache, cache_key, text_cache_key

#: The kinds a failed judge call is counted under.
FAILURE_KINDS = ("timeout", "connection", "http_error", "refusal", "unparsable", "too_long")


class JudgeError(RuntimeError):
    """A judge that cannot work at all (bad settings, missing key or model): raised, never counted."""


@dataclass(frozen=True)
class Pair:
    instruction: str
    output_1: str  # the reference
    output_2: str  # the evaluated model


@dataclass
class Verdict:
    """One judge call (one order of one pair): a preference in [1, 2] for the order asked, or a failure."""

    preference: float | None = None
    # "logprobs", "text" (no logprobs returned), "next_token" (local), "ranking" (a function call), "identical",
    # "not_asked" (the order a single-order annotator does not ask)
    parser: str | None = None
    failure: str | None = None  # one of FAILURE_KINDS when there is no preference
    detail: str | None = None  # the failure's message, or the raw answer that did not parse
    attempts: int = 0  # requests sent for it (0: from the cache, or no call needed)
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.preference is not None


@dataclass(frozen=True)
class Call:
    """One prompt to judge: the texts in the order shown (first = "m", second = "M") and the rendered messages."""

    instruction: str
    first: str
    second: str
    messages: list[dict]


@dataclass
class Judgment:
    """Both orders of one pair and their combination (None when either order failed)."""

    preference: float | None
    forward: Verdict  # reference as "m", model as "M"
    swapped: Verdict  # model as "m", reference as "M"; its preference is in that order

    @property
    def failed(self) -> bool:
        return self.preference is None


def preference_from_logprobs(lp_first: float, lp_second: float) -> float:
    """alpaca_eval's logprob rule: P(m) = exp(lp_m - logsumexp(lp_m, lp_M)), preference = 2 - P(m)."""
    top = max(lp_first, lp_second)
    first, second = math.exp(lp_first - top), math.exp(lp_second - top)
    return 2.0 - first / (first + second)


def combine(forward: float, swapped: float) -> float:
    """The pair's preference from both orders (the swapped one mapped back with 3 - x)."""
    return (forward + (3.0 - swapped)) / 2.0


def failure_summary(judgments: Sequence[Judgment]) -> dict:
    """What failed: `count` failed calls, `by_kind` those calls per kind, `instructions` pairs dropped."""
    kinds = Counter(v.failure for j in judgments for v in (j.forward, j.swapped) if v.failure)
    return {
        "count": sum(kinds.values()),
        "by_kind": {kind: kinds[kind] for kind in FAILURE_KINDS if kinds[kind]},
        "instructions": sum(j.failed for j in judgments),
    }


@dataclass
class Answer:
    """One free-text prompt's answer (Judge.ask): its text, or a failure."""

    text: str | None = None
    failure: str | None = None  # one of FAILURE_KINDS when there is no text
    detail: str | None = None  # the failure's message (or a note on a truncated answer)
    attempts: int = 0  # requests sent for it (0: from the cache)
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.text is not None


def answer_failure_summary(answers: Sequence[Answer]) -> dict:
    """What failed among the answers of one or more `ask` calls: `count` failed judge calls and
    `by_kind` those calls per kind (identical prompts of one call share one call, and its Answer
    object), `prompts` the prompts left without an answer."""
    failed = [a for a in answers if not a.ok]
    calls = list({id(a): a for a in failed}.values())
    kinds = Counter(a.failure or "unparsable" for a in calls)
    return {
        "count": len(calls),
        "by_kind": {kind: kinds[kind] for kind in sorted(kinds, key=_kind_order)},
        "prompts": len(failed),
    }


def _kind_order(kind: str) -> tuple[int, str]:
    return (FAILURE_KINDS.index(kind) if kind in FAILURE_KINDS else len(FAILURE_KINDS), kind)


def _checked_messages(messages: object, index: int) -> list[dict]:
    """A prompt as plain {"role", "content"} dicts (a copy), or JudgeError naming what is wrong."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise JudgeError(f"prompt {index} is not a non-empty list of {{'role', 'content'}} messages: {messages!r:.200}")
    checked = []
    for message in messages:
        if (
            not isinstance(message, dict)
            or set(message) != {"role", "content"}
            or not isinstance(message["role"], str)
            or not isinstance(message["content"], str)
        ):
            raise JudgeError(
                f"prompt {index} has a message that is not {{'role': str, 'content': str}}: {message!r:.200}"
            )
        checked.append({"role": message["role"], "content": message["content"]})
    return checked


@dataclass
class CallStats:
    """Calls a judge made (requests sent, retries included) and answers it took from its cache."""

    requests: int = 0
    cache_hits: int = 0
    judged: int = 0  # calls answered by the judge (not from the cache)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **counts: int) -> None:
        with self._lock:
            for name, value in counts.items():
                setattr(self, name, getattr(self, name) + value)


class Judge(ABC):
    """A judge of pairs (`compare`) and of free-text prompts (`ask`). Subclasses answer rendered
    prompts (`_judge_calls`, `_complete_calls`); this class renders, caches and combines."""

    backend: str
    #: True when asking again gives the same answer: its repeats (replicates) share cache entries.
    deterministic: bool = False

    def __init__(self, cache_dir: Path | None = None, replicate: int = 0, annotator: Annotator | None = None):
        self.cache = JudgmentCache(cache_dir) if cache_dir is not None else None
        self.replicate = int(replicate)
        self.stats = CallStats()
        self.annotator = annotator or get_annotator(None)

    @property
    @abstractmethod
    def model(self) -> str:
        """The judge model's name."""

    @abstractmethod
    def decoding(self) -> dict:
        """The settings that change its answers (part of its identity)."""

    @abstractmethod
    def _judge_calls(self, calls: list[Call]) -> list[Verdict]:
        """One verdict per call, in order; failures are verdicts, not exceptions."""

    def _complete_calls(self, prompts: list[list[dict]], max_tokens: int) -> list[Answer]:
        """One answer per prompt (a list of messages), in order, of at most max_tokens tokens;
        failures are answers, not exceptions."""
        raise JudgeError(f"the {self.backend} judge answers no free-text prompts")

    def text_decoding(self) -> dict:
        """The settings that change its free-text answers (default: all of `decoding`)."""
        return self.decoding()

    def text_identity(self) -> dict:
        """What makes two judges give the same free-text answers: backend, model, decoding."""
        return {"backend": self.backend, "model": self.model, "decoding": self.text_decoding()}

    def text_identity_sha256(self) -> str:
        return hashlib.sha256(json.dumps(self.text_identity(), sort_keys=True).encode()).hexdigest()

    def identity(self) -> dict:
        """What makes two judges the same judge: backend, model, prompt template, decoding."""
        return {
            "backend": self.backend,
            "model": self.model,
            "annotator": self.annotator.config,
            "template_sha256": self.annotator.template_sha256(),
            "decoding": self.decoding(),
        }

    def check_ready(self) -> None:
        """Raise JudgeError when the judge could not answer at all (missing key, unusable model)."""

    def identity_sha256(self) -> str:
        return hashlib.sha256(json.dumps(self.identity(), sort_keys=True).encode()).hexdigest()

    def compare(self, pairs: Sequence[Pair], *, replicate: int | None = None) -> list[Judgment]:
        """Judge every pair in both orders (a single-order annotator: once, in alpaca_eval's order). The
        replicate (default: the judge's own) is part of the cache key of a non-deterministic judge, so
        repeat k > 0 re-asks it afresh; a deterministic judge's repeats share replicate 0's answers."""
        identity = self.identity()
        replicate = self.replicate if replicate is None else int(replicate)
        replicate_key = None if self.deterministic else replicate
        # Both orders of every pair, as (instruction, shown first, shown second); None = not asked.
        single = self.annotator.single_order
        calls: list[tuple[str, str, str] | None] = []
        for pair in pairs:
            switched = is_switched(pair.instruction) if single else None
            calls.append(None if switched else (pair.instruction, pair.output_1, pair.output_2))
            calls.append(None if switched is False else (pair.instruction, pair.output_2, pair.output_1))
        verdicts: list[Verdict | None] = [None] * len(calls)
        pending: dict[str, list[int]] = {}  # key -> call indices (the same call twice is asked once)
        call_of: dict[str, Call] = {}
        for index, call in enumerate(calls):
            if call is None:
                verdicts[index] = Verdict(parser="not_asked")
                continue
            instruction, first, second = call
            if first == second:
                verdicts[index] = Verdict(preference=1.5, parser="identical")
                continue
            messages = self.annotator.render(instruction, first, second)
            key = cache_key(identity, messages, first, second, replicate_key)
            record = self.cache.get(key) if self.cache is not None else None
            if record is not None and record.get("preference") is not None:
                verdicts[index] = Verdict(
                    preference=float(record["preference"]), parser=record.get("parser"), cached=True
                )
                self.stats.add(cache_hits=1)
                continue
            pending.setdefault(key, []).append(index)
            call_of[key] = Call(instruction, first, second, messages)
        keys = list(pending)
        answers = self._judge_calls([call_of[key] for key in keys]) if keys else []
        for key, verdict in zip(keys, answers, strict=True):
            self.stats.add(judged=1)
            if verdict.ok and self.cache is not None:
                self.cache.put(
                    key,
                    {
                        "preference": verdict.preference,
                        "parser": verdict.parser,
                        "judge": identity,
                        "replicate": replicate_key,
                    },
                )
            for index in pending[key]:
                verdicts[index] = verdict
        judgments = []
        for i in range(len(pairs)):
            forward, swapped = verdicts[2 * i], verdicts[2 * i + 1]
            if calls[2 * i] is None:  # single order, model shown first
                preference = 3.0 - swapped.preference if swapped.ok else None
            elif calls[2 * i + 1] is None:  # single order, reference shown first
                preference = forward.preference
            else:
                both = forward.ok and swapped.ok
                preference = combine(forward.preference, swapped.preference) if both else None
            judgments.append(Judgment(preference, forward, swapped))
        return judgments

    def ask(
        self, prompts: Sequence[list[dict]], *, max_tokens: int, purpose: str, replicate: int | None = None
    ) -> list[Answer]:
        """Free-text answers to chat prompts (each a list of {"role", "content"} messages), one per
        prompt, in order; a failed prompt's Answer has no text and a failure kind. `purpose` names
        what the answers are for (part of the cache key). The replicate (default: the judge's own)
        is part of the cache key of a non-deterministic judge, as in `compare`."""
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise JudgeError(f"max_tokens must be a positive integer, not {max_tokens!r}")
        if not isinstance(purpose, str) or not purpose:
            raise JudgeError(f"purpose must be a non-empty string, not {purpose!r}")
        identity = self.text_identity()
        replicate = self.replicate if replicate is None else int(replicate)
        replicate_key = None if self.deterministic else replicate
        answers: list[Answer | None] = [None] * len(prompts)
        pending: dict[str, list[int]] = {}  # key -> prompt indices (the same prompt twice is asked once)
        prompt_of: dict[str, list[dict]] = {}
        for index, raw in enumerate(prompts):
            messages = _checked_messages(raw, index)
            key = text_cache_key(identity, purpose, messages, max_tokens, replicate_key)
            if key in pending:
                pending[key].append(index)
                continue
            record = self.cache.get(key) if self.cache is not None else None
            if record is not None and isinstance(record.get("text"), str):
                answers[index] = Answer(text=record["text"], detail=record.get("detail"), cached=True)
                self.stats.add(cache_hits=1)
                continue
            pending[key] = [index]
            prompt_of[key] = messages
        keys = list(pending)
        results = self._complete_calls([prompt_of[key] for key in keys], max_tokens) if keys else []
        for key, answer in zip(keys, results, strict=True):
            self.stats.add(judged=1)
            if answer.ok and self.cache is not None:
                self.cache.put(
                    key,
                    {
                        "text": answer.text,
                        "detail": answer.detail,
                        "purpose": purpose,
                        "max_tokens": max_tokens,
                        "judge": identity,
                        "replicate": replicate_key,
                    },
                )
            for index in pending[key]:
                answers[index] = answer
        return answers
