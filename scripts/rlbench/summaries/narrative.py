"""The optional LLM narrative of summary.md: per iteration, 1-3 sentences of "what was done / why".

Off by default (config report.narrative.enabled: false): then nothing is asked and summary.json's
`narrative` and every record's `narrative` stay None. When on, each iteration's facts (its numbers,
the deterministic "what was done" / "why" lines, its key code lines and the start of its diff) go
as one prompt to the judge backend of the tasks (rlbench.scoring.judges.load_judge: openai or local), whose
on-disk cache keys each answer by the judge's identity and the prompt's hash
(rlbench.scoring.judges.cache.text_cache_key): a rerun of summarize_run asks the LLM nothing again.

The text is always marked as generated: records get {"generated": true, "model", "text"} and
summary.json {"generated": true, "model", "cached"} (cached: every answer came from the cache).
A prompt the judge failed to answer gets {"generated": false, "model", "text": null, "failure"}.
"""

from __future__ import annotations

from pathlib import Path

from rlbench.scoring.judges import Judge, load_judge

#: Part of the cache key: answers for this purpose never mix with a task's judgments.
PURPOSE = "run-narrative"
MAX_TOKENS = 160
#: Lines of the code diff shown in the prompt.
PROMPT_DIFF_LINES = 40
SYSTEM = (
    "You summarize one iteration of an AI agent's reinforcement-learning post-training run for a report. "
    "From the facts given, write 1 to 3 plain sentences: what the agent did in this iteration and why, "
    "citing the evidence from the previous iteration. Use only the facts given; do not speculate."
)


def enabled(settings: dict | None) -> bool:
    """Whether the narrative is on (config report.narrative.enabled)."""
    return bool((settings or {}).get("enabled"))


def iteration_prompt(summary: dict, record: dict) -> list[dict]:
    """The chat messages asking for one iteration's narrative: deterministic, from the record's
    facts only (no time of now), so that the same iteration hashes to the same cache key."""
    labels = summary.get("labels") or {}
    diff = (record.get("code_diff") or "").splitlines()[:PROMPT_DIFF_LINES]
    facts = [
        f"Task {labels.get('task')}, base model {labels.get('model')}, agent {labels.get('agent')}; "
        f"baseline score {summary.get('baseline')}.",
        f"Iteration {record['iteration']}: status {record['status']} (grader {record.get('grader_status')}), "
        f"score {record['score']}, improvement {record.get('improvement')}, best so far {record.get('best_so_far')}, "
        f"training type {record['train_type']}, failure type {record.get('failure_type') or 'none'}.",
        f"What was done (from the code diff): {record.get('what_was_done') or '-'}",
        f"Evidence from the previous iteration: {record.get('why') or '-'}",
    ]
    if str(record.get("error") or "").strip():
        facts.append(f"Grader error: {str(record['error']).strip().splitlines()[0][:300]}")
    if record.get("key_code_lines"):
        facts.append("Key code lines:\n" + "\n".join(record["key_code_lines"]))
    if diff:
        facts.append("Start of the code diff:\n" + "\n".join(diff))
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n".join(facts)}]


def make_judge(settings: dict, cache_dir: Path, model_dir: Path | None = None) -> Judge:
    """The narrative's judge (report.narrative.judge), answering through the cache under cache_dir."""
    return load_judge(settings.get("judge") or {}, model_dir=model_dir, cache_dir=Path(cache_dir))


def add_narrative(
    summary: dict,
    records: list[dict],
    settings: dict | None,
    cache_dir: Path | None,
    *,
    model_dir: Path | None = None,
    judge: Judge | None = None,
) -> None:
    """Fill in summary["narrative"] and each record's "narrative" when the narrative is enabled;
    leave them None and ask nothing otherwise. `judge`: an already built judge (tests pass a fake
    one); by default the one report.narrative.judge describes, cached under cache_dir."""
    summary["narrative"] = None
    for record in records:
        record["narrative"] = None
    if not enabled(settings):
        return
    if judge is None:
        if cache_dir is None:
            raise ValueError("the narrative needs a cache directory (params.narrative_cache)")
        judge = make_judge(settings, cache_dir, model_dir)
    prompts = [iteration_prompt(summary, record) for record in records]
    answers = judge.ask(prompts, max_tokens=MAX_TOKENS, purpose=PURPOSE) if prompts else []
    for record, answer in zip(records, answers, strict=True):
        if answer.ok:
            record["narrative"] = {"generated": True, "model": judge.model, "text": " ".join(answer.text.split())}
        else:
            record["narrative"] = {"generated": False, "model": judge.model, "text": None, "failure": answer.failure}
    summary["narrative"] = {
        "generated": True,
        "model": judge.model,
        "cached": all(answer.cached for answer in answers),
    }
