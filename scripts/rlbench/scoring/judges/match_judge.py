"""The `match` judge: no model at all, for grading tasks run offline.

A grading task that supports it (DeepSearchQA) checks `judge.backend == "match"` and grades by its
own deterministic string-matching rules instead of asking the judge anything; this object only
stands for that choice in the task's settings, its provenance record and its cache identity. It
answers no prompt (`ask` with prompts raises JudgeError) and compares no pair (`compare` raises
JudgeError): a pairwise task (AlpacaEval) needs a model, backend `local` or `openai`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from rlbench.scoring.judges.base import Answer, Call, Judge, JudgeError, Judgment, Pair, Verdict

DEFAULT_MODEL = "string-match"
RULE = "string-match-v1"


class MatchJudge(Judge):
    backend = "match"
    deterministic = True

    def __init__(self, model: str | None = None, *, cache_dir: Path | None = None, replicate: int = 0):
        super().__init__(cache_dir, replicate)
        self._model = model or DEFAULT_MODEL

    @property
    def model(self) -> str:
        return self._model

    def decoding(self) -> dict:
        return {"rule": RULE}

    def identity(self) -> dict:
        """Backend, model and rule: no prompt template, since it is asked nothing."""
        return {"backend": self.backend, "model": self.model, "decoding": self.decoding()}

    def compare(self, pairs: Sequence[Pair], *, replicate: int | None = None) -> list[Judgment]:
        raise JudgeError("the match judge compares no pairs: pairwise tasks (AlpacaEval) need backend local or openai")

    def _judge_calls(self, calls: list[Call]) -> list[Verdict]:
        raise JudgeError("the match judge compares no pairs: pairwise tasks (AlpacaEval) need backend local or openai")

    def _complete_calls(self, prompts: list[list[dict]], max_tokens: int) -> list[Answer]:
        raise JudgeError(
            "the match judge answers no prompts; a task that supports it grades by its string-matching rules"
        )
