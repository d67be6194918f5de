"""Parts tasks are composed of: rollouts (how a model meets held-out rows) and scorers.

A rollout has `run(rows, ctx) -> samples` (one sample per row, in order); a scorer has
`score(rows, samples, ctx) -> EvalResult`. Level 1 and 2 tasks roll out with SingleTurn (one
greedy chat completion per row, batched); level 3 tasks bring an environment loop. Scorers:
RuleScorer (a deterministic verifier from the task's public module) and ExecutionScorer (unit tests run
by rlbench.scoring.execution) here; LLM judges (rlbench.scoring.judges) are built by the task from its
judge settings.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from rlbench.scoring import execution
from rlbench.tasks.base import EvalContext, EvalResult, score_exact_match


@dataclass
class SingleTurn:
    """One chat completion per row (decoded as ctx.decoding says): prompt(row) -> messages, at
    most max_new_tokens new tokens (or the decoding's max_new_tokens when `model_length`: the
    dataset config sets no length), cut at the first of `stop` (when given), all rows in batches."""

    prompt: Callable[[dict], list[dict]]
    max_new_tokens: int
    stop: Sequence[str] | None = None
    model_length: bool = False

    def prepare(self, ctx: EvalContext) -> None:
        """Load the model (phases loading, then generating) before any held-out row is read."""
        ctx.generator()

    def run(self, rows: list[dict], ctx: EvalContext) -> list[str]:
        conversations = [self.prompt(row) for row in rows]
        generator = ctx.generator()
        limit = self.max_new_tokens
        if self.model_length and ctx.decoding and ctx.decoding.get("max_new_tokens"):
            limit = int(ctx.decoding["max_new_tokens"])
        return generator.generate_chat(conversations, limit, stop=list(self.stop) if self.stop else None)


@dataclass
class RuleScorer:
    """Exact-match accuracy judged by the task's public module (extract_answer, reference_answer,
    is_correct): the same functions the agent gets as task.py. Primary metric: accuracy."""

    public: ModuleType

    def score(self, rows: list[dict], samples: list[str], ctx: EvalContext) -> EvalResult:
        return score_exact_match(rows, samples, self.public)

    def code_files(self) -> list[str]:
        return [self.public.__file__] if getattr(self.public, "__file__", None) else []


# -- level 3: what interactive tasks share ------------------------------------------------------
BUILT_MANIFEST = "manifest.json"


def built_split(sources: dict | None, name: str, task: str) -> Path:
    """The folder the generate_games rule built for one split of an interactive task (`name`:
    "train_games" or "heldout_games"), checked to hold its manifest."""
    if not sources or name not in sources:
        raise ValueError(
            f"{task}'s splits are built from the generate_games rule's output ({name}); "
            "run the workflow, or pass sources={'" + name + "': <folder with manifest.json>}"
        )
    path = Path(sources[name])
    if not (path / BUILT_MANIFEST).is_file():
        raise FileNotFoundError(f"{path} has no {BUILT_MANIFEST}: rerun the generate_games rule")
    return path


class PhasedGenerator:
    """A text generator (rlbench.generation.textgen) as an episode loop uses it during an evaluation: its
    calls run in phase "generating" (the submitted model's part), and everything between them in
    "environment" (the harness's part: games, shops, search tools), so that a failure is blamed
    on the right side."""

    def __init__(self, generator, phase: Callable[[str], None]):
        self.generator = generator
        self.phase = phase

    def generate(self, prompts: dict, max_new_tokens: int, stop):
        self.phase("generating")
        try:
            return self.generator.generate(prompts, max_new_tokens, stop)
        finally:
            self.phase("environment")

    def chat_prompt(self, messages: list[dict]) -> str:
        return self.generator.chat_prompt(messages)

    def release(self, key) -> None:
        release = getattr(self.generator, "release", None)
        if release is not None:
            release(key)


@dataclass
class ExecutionScorer:
    """pass@1 (0-100) of one greedy completion per row: the row's program (the public module's
    `program(completion, row)`: the code the completion commits to, with the row's unit tests) run in the
    execution sandbox; solved when it passes. Primary metric: pass@1."""

    public: ModuleType
    settings: Mapping = field(default_factory=dict)  # the task's `execution:` block
    id_field: str = "task_id"

    def score(self, rows: list[dict], samples: list[str], ctx: EvalContext | None = None) -> EvalResult:
        pairs = list(zip(rows, samples, strict=True))  # a short backend must not shrink n
        runner = execution.ProgramRunner.from_settings(self.settings)
        results = runner.run_many([self.public.program(completion, row) for row, completion in pairs])
        items = [
            {
                "id": row[self.id_field],
                "passed": result.passed,
                "result": result.result,
                "duration_s": result.duration_s,
                "completion": completion,
            }
            for (row, completion), result in zip(pairs, results)
        ]
        passed = sum(result.passed for result in results)
        timed_out = sum(result.result == "timed out" for result in results)
        metrics = {
            "pass@1": round(100.0 * passed / len(items), 4) if items else 0.0,
            "passed": passed,
            "failed": len(items) - passed - timed_out,
            "timed_out": timed_out,
            "sandbox": runner.sandbox,
        }
        return EvalResult(metrics=metrics, primary="pass@1", n=len(items), items=items)

    def code_files(self) -> list[str]:
        files = [execution.__file__, str(execution.DRIVER)]
        return files + ([self.public.__file__] if getattr(self.public, "__file__", None) else [])
