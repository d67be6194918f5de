"""The task interface: prepare data, describe the task, expose files, evaluate a model."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import secrets
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import ModuleType

TRAIN_FILE = "train.jsonl"
EVAL_FILE = "eval.jsonl"
SALT_BYTES = 32  # 256 bits: the held-out split of an offline source is drawn with this, never guessed


def new_salt() -> str:
    """A fresh per-installation salt (hex). The offline sources' generators, seeds and sizes are
    all public; the salt is the one thing an agent cannot know, so it alone keeps the held-out
    split underivable."""
    return secrets.token_hex(SALT_BYTES)


def ensure_salt(path: Path) -> str:
    """The installation's salt: read from `path`, or drawn and written there when there is none
    (mode 0600, in a directory of its own that is made owner-only too). Never replaces one: a new
    salt means new held-out splits, so only deleting the file (or copying another in) changes it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_salt(path)
    salt = new_salt()
    with os.fdopen(fd, "w") as handle:
        handle.write(salt + "\n")
    return salt


def read_salt(path: Path) -> str:
    salt = Path(path).read_text().strip()
    if not salt:
        raise ValueError(f"the eval salt file {path} is empty; delete it to draw a new one, or copy in the original")
    return salt


def require_salt(salt: str | None, task: str) -> str:
    """The salt an offline held-out split is drawn with; without one it could be rebuilt from
    public facts, so there is no fallback."""
    if not isinstance(salt, str) or not salt:
        raise ValueError(
            f"{task}: an offline held-out split needs a secret salt (prepare_eval(..., salt=...)); "
            "the workflow reads it from results/secrets/eval_salt"
        )
    return salt


def salt_fingerprint(salt: str) -> str:
    """What a manifest records to tie a split to its salt: a hash, never the salt itself."""
    return hashlib.sha256(salt.encode()).hexdigest()


def salted_seed(salt: str, task: str, data_seed: int) -> int:
    """A 63-bit seed for a task's held-out split: unknowable without the salt, and different per
    task and data_seed so that no two splits share a stream."""
    digest = hashlib.sha256("\0".join(["rlbench-eval", salt, task, str(data_seed)]).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


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
    def prepare_eval(self, settings: dict, train_dir: Path, eval_dir: Path, *, salt: str | None = None) -> dict:
        """Write the held-out split to eval_dir, disjoint from the training split; returns its manifest.

        Separate from prepare_train so that changing an evaluation setting never rewrites the
        training split (and so never reruns finished agent runs). A generated (offline) split is
        drawn with `salt`, the installation's secret (see new_salt), and raises without one: the
        code, the settings and the training split are all known to agents. Its manifest records
        salt_fingerprint(salt). A public source (the hub's test split) ignores the salt."""

    def prepare(self, settings: dict, train_dir: Path, eval_dir: Path, *, salt: str | None = None) -> dict:
        """Both splits."""
        return {
            **self.prepare_train(settings, train_dir),
            **self.prepare_eval(settings, train_dir, eval_dir, salt=salt),
        }

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
