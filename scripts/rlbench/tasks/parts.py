"""Parts tasks are composed of: rollouts (how a model meets held-out rows) and scorers.

A rollout has `run(rows, ctx) -> samples` (one sample per row, in order); a scorer has
`score(rows, samples, ctx) -> EvalResult`. Level 1 and 2 tasks roll out with SingleTurn (one
greedy chat completion per row, batched); level 3 tasks bring an environment loop. Scorers:
RuleScorer (a deterministic verifier from the task's public module) here; unit-test execution
(rlbench.execution) and LLM judges (rlbench.judges) live beside the machinery they need.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType

from rlbench.tasks.base import EvalContext, EvalResult, score_exact_match


@dataclass
class SingleTurn:
    """One greedy chat completion per row: prompt(row) -> messages, at most max_new_tokens new
    tokens, cut at the first of `stop` (when given), all rows in batches."""

    prompt: Callable[[dict], list[dict]]
    max_new_tokens: int
    stop: Sequence[str] | None = None

    def prepare(self, ctx: EvalContext) -> None:
        """Load the model (phases loading, then generating) before any held-out row is read."""
        ctx.generator()

    def run(self, rows: list[dict], ctx: EvalContext) -> list[str]:
        conversations = [self.prompt(row) for row in rows]
        generator = ctx.generator()
        return generator.generate_chat(conversations, self.max_new_tokens, stop=list(self.stop) if self.stop else None)


@dataclass
class RuleScorer:
    """Exact-match accuracy judged by the task's public module (extract_answer, reference_answer,
    is_correct): the same functions the agent gets as task.py. Primary metric: accuracy."""

    public: ModuleType

    def score(self, rows: list[dict], samples: list[str], ctx: EvalContext) -> EvalResult:
        return score_exact_match(rows, samples, self.public)

    def code_files(self) -> list[str]:
        return [self.public.__file__] if getattr(self.public, "__file__", None) else []
