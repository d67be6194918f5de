"""DeepSearchQA grading: the reference's yes/no verdict (the headline accuracy) and the official
autorater's per-item grading (precision, recall, F1), each asked of the task's judge, or decided
by string-matching rules when the judge is the `match` backend.

- Verdict (RD-Agent's judge, `judge_prompt: reference`, the default): its system prompt "You are a
  strict answer evaluator." and its user prompt, byte for byte (eval.py's indented f-string: lines
  2+ start with 8 spaces), with the answer type, the gold and the predicted answer. The reply is
  read as the reference reads it (`parse_verdict`): lower-cased, its first line stripped of
  ".!,;:" and whitespace must be "correct". An empty reply (the reference's IndexError) or a
  failed judge call falls back to public.string_match, as the reference does on any exception
  (counted: judge_fallbacks). `judge_prompt: paraphrase` asks this harness's earlier wording of
  the same two rules instead (same system prompt, same reading).
- Official (the dataset's starter-notebook autorater, prompt structure of the paper's appendix):
  the judge returns JSON {explanation, correctness_details: {gold item: bool},
  excessive_answers: [...]}, turned into public.official_metrics. A failed call or a reply
  without that JSON falls back to `match_official` (counted: official_fallbacks).
- The match backend asks nothing: the verdict is public.string_match, the official grading
  `match_official`.

The metrics record what graded: judge_backend, judge_model, judge_temperature, judge_prompt (and
its template's sha256), the rollout's prompt variant and search provider.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

from rlbench.tasks.base import EvalResult
from rlbench.tasks.deepsearchqa import public

VERDICT_PURPOSE = "deepsearchqa-verdict"
OFFICIAL_PURPOSE = "deepsearchqa-official"
DEFAULT_JUDGE_TOKENS = 1024
# RD-Agent's judge, byte for byte: rdagent/scenarios/rl/autorl_bench/benchmarks/deepsearchqa/eval.py
# (DeepSearchQAEvaluator._judge_answer) at commit 471eb30d1ec03f35631c532c58a52ce75d684037 (MIT,
# scripts/rlbench/assets/LICENSE-RD-Agent). Its f-string is indented in the source: lines 2+ carry
# 8 leading spaces, kept here.
VERDICT_SYSTEM = "You are a strict answer evaluator."
REFERENCE_VERDICT_PROMPT = (
    "You are an answer evaluator. Compare the predicted answer to the gold answer.\n"
    "        Question answer type: {answer_type}\n"
    "        Gold answer: {gold}\n"
    "        Predicted answer: {predicted}\n"
    '        For "Single Answer": The predicted answer is correct if it contains the same key information as the '
    "gold answer.\n"
    '        For "Set Answer": The predicted answer is correct if it contains ALL items from the gold answer (order '
    "doesn't matter, minor wording variations are OK).\n"
    '        Reply with ONLY "correct" or "incorrect". No explanation.'
)
# What the reference's first reply line is stripped of before it is compared with "correct".
VERDICT_STRIP = ".!,;: \t\r\n"

# This harness's earlier paraphrase of the same rules (`judge_prompt: paraphrase`).
PARAPHRASE_VERDICT_PROMPT = """\
Decide whether the predicted answer to a question is correct.

Answer type: {answer_type}
Gold answer: {gold}
Predicted answer: {predicted}

Rules:
- Single Answer: the prediction is correct if it gives the same key information as the gold answer.
- Set Answer: the prediction is correct if it contains ALL items of the gold answer; their order and small differences in wording do not matter.

Reply with ONLY "correct" or "incorrect"."""

#: judge_prompt variant -> the verdict's user prompt template.
VERDICT_PROMPTS = {"reference": REFERENCE_VERDICT_PROMPT, "paraphrase": PARAPHRASE_VERDICT_PROMPT}
DEFAULT_JUDGE_PROMPT = "reference"
VERDICT_PROMPT = REFERENCE_VERDICT_PROMPT  # the default's template


def judge_prompt_variant(settings: dict) -> str:
    """The task's `judge_prompt` setting (default: the reference's), checked."""
    variant = settings.get("judge_prompt") or DEFAULT_JUDGE_PROMPT
    if variant not in VERDICT_PROMPTS:
        raise ValueError(
            f"tasks.deepsearchqa: unknown judge_prompt {variant!r}; use one of {', '.join(VERDICT_PROMPTS)}"
        )
    return variant


def verdict_prompt_sha256(variant: str) -> str:
    """The hash of a variant's system prompt and template: which judge prompt graded."""
    text = json.dumps([VERDICT_SYSTEM, VERDICT_PROMPTS[variant]])
    return hashlib.sha256(text.encode()).hexdigest()


OFFICIAL_PROMPT = """\
Your job is to decide whether an AI response to a user prompt reached the correct answer. You get the user prompt, its prompt type, the correct answer and the AI response.

How to judge, by prompt type:
- "Single Answer": the response must give the correct answer. It does not have to use the same words, but it must mean the same thing.
- "Set Answer": the correct answer is a set of items, in any order. Check each item of the correct answer on its own: does the response contain it? The response may name more items than the correct answer; judge the items of the correct answer first, then write down every further item of the response as an excessive answer.

Reply with one JSON object with these keys:
- "explanation": a short explanation of your judgement;
- "correctness_details": an object mapping each item of the correct answer to true (the response contains it) or false (it does not);
- "excessive_answers": a list of the items of the response that are not in the correct answer (empty when there are none).

Example of a partially correct response:
User prompt: Which three colours of light do RGB screens mix?
Prompt Type: Set Answer
Correct answer: red, green, blue
AI response: Red, green and yellow.
Rating: {{"explanation": "Red and green are given, blue is missing, and yellow is not one of the colours.", "correctness_details": {{"red": true, "green": true, "blue": false}}, "excessive_answers": ["yellow"]}}

Now judge this one.

<prompt>
{problem}
</prompt>

Prompt Type: {answer_type}
<answer>
{gold}
</answer>

<response>
{response}
</response>

Rating:"""


def verdict_messages(answer_type: str, gold: str, predicted: str, variant: str = DEFAULT_JUDGE_PROMPT) -> list[dict]:
    """The judge's chat deciding correct/incorrect, as the reference builds it (APIBackend's
    messages: the system prompt, then the user prompt)."""
    user = VERDICT_PROMPTS[variant].format(answer_type=answer_type, gold=gold, predicted=predicted)
    return [{"role": "system", "content": VERDICT_SYSTEM}, {"role": "user", "content": user}]


def parse_verdict(text: str) -> bool | None:
    """The reference's reading of a verdict: the reply stripped and lower-cased, its first line
    stripped of ".!,;:" and whitespace, is "correct" (anything else, "incorrect" included, is
    not). None for a reply without a line: the reference's reading raises there and it falls back
    to string matching."""
    lines = text.strip().lower().splitlines()
    if not lines:
        return None
    return lines[0].strip().strip(VERDICT_STRIP).lower() == "correct"


def official_messages(problem: str, answer_type: str, gold: str, response: str) -> list[dict]:
    """The official autorater's prompt as one user turn."""
    text = OFFICIAL_PROMPT.format(problem=problem, answer_type=answer_type, gold=gold, response=response)
    return [{"role": "user", "content": text}]


def parse_official(text: str) -> tuple[dict, list] | None:
    """(correctness_details, excessive_answers) from an autorater reply: the JSON object in it
    (code fences and text around it tolerated); None when there is no such object."""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        return None
    try:
        data = json.loads(text[start : end + 1])
    except json.JSONDecodeError:
        return None
    details, extras = data.get("correctness_details") if isinstance(data, dict) else None, data.get(
        "excessive_answers", []
    )
    if not isinstance(details, dict) or not isinstance(extras, list):
        return None
    flags = {}
    for item, value in details.items():
        if isinstance(value, str) and value.strip().lower() in ("true", "false"):
            value = value.strip().lower() == "true"
        if not isinstance(value, bool):
            return None
        flags[str(item)] = value
    return flags, [str(extra) for extra in extras if str(extra).strip()]


_ITEM_SEPARATORS = re.compile(r",|;|\n|&|\band\b", re.IGNORECASE)


def response_items(response: str) -> list[str]:
    """The items of an answer: its parts between commas, semicolons, newlines, "&" and "and"."""
    return [part.strip(" .") for part in _ITEM_SEPARATORS.split(response or "") if public.normalize(part)]


def _same_item(part: str, item: str) -> bool:
    return public.contains_words(part, item) or public.contains_words(item, part)


def match_official(response: str, gold: str | None, answer_type: str) -> tuple[dict, list]:
    """The official grading by string matching (the match backend, and the fallback of a failed
    autorater call): each gold item is found iff its words occur in the response; the excessive
    answers are the response's items (`response_items`) that are part of no gold item and contain
    none, "none"-like items aside. An empty gold is graded as the one item "None", found iff the
    response says there are none (as an autorater reads the dataset's literal "None"), so that a
    right "None" earns F1 1 rather than the 0 of an empty precision and recall."""
    items = public.gold_items(gold, answer_type)
    parts = [part for part in response_items(response) if not public.says_none(part)]
    if not items:
        return {public.NONE_ANSWER: public.says_none(response)}, parts
    details = {item: public.contains_words(response or "", item) for item in items}
    extras = [part for part in parts if not any(_same_item(part, item) for item in items)]
    return details, extras


def _rate(values: list[float]) -> float:
    return round(100.0 * sum(values) / len(values), 4) if values else 0.0


class AnswerScorer:
    """Accuracy by the reference's verdict (primary, 0-100), the official grading beside it, and
    what the episodes did (searches, how they ended, context exhausted)."""

    def __init__(self, settings: dict):
        self.settings = settings

    def _judge_tokens(self) -> int:
        return int((self.settings.get("judge") or {}).get("max_tokens") or DEFAULT_JUDGE_TOKENS)

    def score(self, rows: list[dict], samples: dict, ctx) -> EvalResult:
        episodes = samples["episodes"]
        predictions = [episodes[row["id"]]["answer"] or "" for row in rows]  # a missing episode is a harness bug
        variant = judge_prompt_variant(self.settings)
        judge = ctx.judge()
        failures = {"count": 0, "by_kind": {}}
        if judge.backend == "match":
            verdicts = [
                (public.string_match(p, r["answer"], r["answer_type"]), "match") for r, p in zip(rows, predictions)
            ]
            officials = [(match_official(p, r["answer"], r["answer_type"]), "match") for r, p in zip(rows, predictions)]
        else:
            verdicts, officials, failures = self._ask(judge, rows, predictions, ctx.replicate, variant)
        items, per_type = [], {public.SINGLE: [], public.SET: []}
        grades = []
        for row, prediction, (correct, verdict_source), ((details, extras), official_source) in zip(
            rows, predictions, verdicts, officials
        ):
            episode = episodes[row["id"]]
            grade = public.official_metrics(details, extras)
            grades.append(grade)
            per_type.setdefault(row["answer_type"], []).append(float(correct))
            items.append(
                {
                    "id": row["id"],
                    "answer_type": row["answer_type"],
                    "problem_category": row.get("problem_category"),
                    "gold": row["answer"],
                    "predicted": prediction,
                    "correct": bool(correct),
                    "verdict_source": verdict_source,
                    "official": {
                        **grade,
                        "correctness_details": details,
                        "excessive_answers": extras,
                        "source": official_source,
                    },
                    "end": episode["end"],
                    "steps": episode["steps"],
                    "searches": episode["searches"],
                    "actions": episode["actions"],
                }
            )
        n = len(items)
        correct = sum(item["correct"] for item in items)
        ends: dict = {}
        for item in items:
            ends[item["end"]] = ends.get(item["end"], 0) + 1
        metrics = {
            "accuracy": round(100.0 * correct / n, 4) if n else 0.0,
            "correct": correct,
            "accuracy_single": _rate(per_type[public.SINGLE]) if per_type[public.SINGLE] else None,
            "accuracy_set": _rate(per_type[public.SET]) if per_type[public.SET] else None,
            "official_f1": _rate([g["f1"] for g in grades]),
            "official_precision": _rate([g["precision"] for g in grades]),
            "official_recall": _rate([g["recall"] for g in grades]),
            "official_fully_correct": _rate([g["fully_correct"] for g in grades]),
            "official_fully_incorrect": _rate([g["fully_incorrect"] for g in grades]),
            "official_correct_with_extras": _rate([g["correct_with_excessive_answers"] for g in grades]),
            "official_partially_correct": _rate([g["partially_correct"] for g in grades]),
            "judge_failures": failures["count"],
            "judge_failures_by_kind": failures["by_kind"],
            "judge_fallbacks": sum(source == "fallback" for _, source in verdicts),
            "official_fallbacks": sum(source == "fallback" for _, source in officials),
            "judge_backend": judge.backend,
            "judge_model": judge.model,
            "judge_temperature": judge.text_decoding().get("temperature"),
            "judge_prompt": None if judge.backend == "match" else variant,
            "judge_prompt_sha256": None if judge.backend == "match" else verdict_prompt_sha256(variant),
            "prompt": self.settings.get("prompt") or public.REFERENCE_PROMPT,
            "search_provider": samples.get("search_provider"),
            "mean_searches": round(sum(item["searches"] for item in items) / n, 4) if n else 0.0,
            "mean_steps": round(sum(item["steps"] for item in items) / n, 4) if n else 0.0,
            "episode_ends": ends,
            "context_exhausted": ends.get("context", 0),
        }
        return EvalResult(metrics=metrics, primary="accuracy", n=n, items=items)

    def _ask(self, judge, rows: list[dict], predictions: list[str], replicate: int, variant: str):
        """Both gradings from the judge, each question's failed call (or empty verdict, or
        unreadable official reply) decided by the match rules instead."""
        from rlbench.scoring.judges import answer_failure_summary

        tokens = self._judge_tokens()
        verdict_answers = judge.ask(
            [verdict_messages(r["answer_type"], r["answer"], p, variant) for r, p in zip(rows, predictions)],
            max_tokens=tokens, purpose=VERDICT_PURPOSE, replicate=replicate,
        )  # fmt: skip
        official_answers = judge.ask(
            [official_messages(r["problem"], r["answer_type"], r["answer"], p) for r, p in zip(rows, predictions)],
            max_tokens=tokens, purpose=OFFICIAL_PURPOSE, replicate=replicate,
        )  # fmt: skip
        verdicts, officials = [], []
        unparsable = 0
        for row, prediction, verdict, official in zip(
            rows, predictions, verdict_answers, official_answers, strict=True
        ):
            correct = parse_verdict(verdict.text) if verdict.ok else None
            if correct is not None:
                verdicts.append((correct, "judge"))
            else:
                unparsable += verdict.ok
                verdicts.append((public.string_match(prediction, row["answer"], row["answer_type"]), "fallback"))
            parsed = parse_official(official.text) if official.ok else None
            if parsed is None:
                unparsable += official.ok
                officials.append((match_official(prediction, row["answer"], row["answer_type"]), "fallback"))
            else:
                officials.append((parsed, "judge"))
        summary = answer_failure_summary(list(verdict_answers) + list(official_answers))
        failures = {"count": summary["count"] + unparsable, "by_kind": dict(summary["by_kind"])}
        if unparsable:
            failures["by_kind"]["unparsable"] = failures["by_kind"].get("unparsable", 0) + unparsable
        if failures["count"]:
            print(f"deepsearchqa judge failures (decided by string matching instead): {failures}", file=sys.stderr)
        return verdicts, officials, failures

    def code_files(self) -> list[Path]:
        from rlbench.scoring import judges

        return [Path(public.__file__), *judges.code_files()]
