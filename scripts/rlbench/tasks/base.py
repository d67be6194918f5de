"""The task interface: prepare data, describe the task, expose files, evaluate a model."""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType

TRAIN_FILE = "train.jsonl"
EVAL_FILE = "eval.jsonl"


@dataclass
class EvalResult:
    """The score of one model on a task's held-out split (0-100) and what it rests on."""

    score: float
    n: int
    correct: int
    items: list[dict] = field(default_factory=list)

    def to_dict(self, with_items: bool = True) -> dict:
        data = asdict(self)
        if not with_items:
            data.pop("items")
        return data


def score_exact_match(rows: list[dict], completions: list[str], public: ModuleType) -> EvalResult:
    """Accuracy (0-100) of one completion per row, judged by a task's public module
    (extract_answer, reference_answer, is_correct): the rule-verified tasks' metric."""
    items = []
    for row, completion in zip(rows, completions, strict=True):  # a short backend must not shrink n
        items.append(
            {
                "id": row["id"],
                "predicted": public.extract_answer(completion),
                "reference": public.reference_answer(row),
                "correct": public.is_correct(completion, row),
                "completion": completion,
            }
        )
    correct = sum(item["correct"] for item in items)
    score = 100.0 * correct / len(items) if items else 0.0
    return EvalResult(score=round(score, 4), n=len(items), correct=correct, items=items)


class Task(ABC):
    """One benchmark task. Knows nothing of the grader, the runner or Snakemake."""

    name: str
    level: str
    #: the file copied into every workspace as task.py (prompt format, reward)
    public_module_path: Path

    @abstractmethod
    def prepare_train(self, settings: dict, train_dir: Path) -> dict:
        """Write the training split (what agents get) to train_dir; returns its manifest."""

    @abstractmethod
    def prepare_eval(self, settings: dict, train_dir: Path, eval_dir: Path) -> dict:
        """Write the held-out split to eval_dir, disjoint from the training split; returns its manifest.

        Separate from prepare_train so that changing an evaluation setting never rewrites the
        training split (and so never reruns finished agent runs)."""

    def prepare(self, settings: dict, train_dir: Path, eval_dir: Path) -> dict:
        """Both splits."""
        return {**self.prepare_train(settings, train_dir), **self.prepare_eval(settings, train_dir, eval_dir)}

    @abstractmethod
    def describe(self, settings: dict) -> str:
        """The task description an agent reads (description.md)."""

    @abstractmethod
    def evaluate(self, model_dir: Path, eval_dir: Path, backend, settings: dict) -> EvalResult:
        """Score a model on the held-out split with a generation backend."""

    def exposed_files(self, settings: dict) -> dict[str, Path | bytes]:
        """Workspace-relative name -> what the agent gets there (a file to copy, or its bytes):
        reward code, prompt protocol, environment code."""
        return {"task.py": self.public_module_path}

    def public_module(self) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"rlbench_public_{self.name}", self.public_module_path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
