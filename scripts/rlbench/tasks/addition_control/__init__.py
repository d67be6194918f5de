"""Addition control: a synthetic positive control, not a paper task.

Two-number addition with two-digit operands ("What is 47 + 38? Answer with the number only.").
A small instruct model gets it wrong out of the box (it restates the sum or chats) and learns it
from a minute or two of supervised fine-tuning on a CPU, so a reference agent must reach a
positive improvement here: if it does not, the harness, not the agent, is broken.

Splits are disjoint by operand pair: the 4,095 unordered pairs {a, b} with 10 <= a <= b <= 99 are
shuffled with `data_seed` and the training split takes pairs from the front (so it does not depend
on eval_size). The held-out split is drawn from the pairs the training split does not hold, shuffled
with an RNG seeded from the installation's secret salt: `data_seed`, the sizes and this code are
all public, so an unsalted draw (such as the back of the same pool) could be rebuilt by an agent.
47 + 38 in one split means neither 47 + 38 nor 38 + 47 appears in the other; a larger eval_size
extends the held-out split without reordering it.
"""

from __future__ import annotations

import random
from pathlib import Path

from rlbench.fileio.jsonio import read_jsonl, sha256_file, write_jsonl
from rlbench.tasks.base import (
    EVAL_FILE,
    TRAIN_FILE,
    Task,
    require_salt,
    salt_fingerprint,
    salted_seed,
)
from rlbench.tasks.capacity import SplitCapacity
from rlbench.tasks.parts import RuleScorer, SingleTurn

PUBLIC = Path(__file__).with_name("public.py")
LOW, HIGH = 10, 99  # two-digit operands, inclusive
# Every unordered operand pair {a, b}, a <= b: the one pool both splits are drawn from (4,095 pairs).
PAIRS = tuple((a, b) for a in range(LOW, HIGH + 1) for b in range(a, HIGH + 1))
DEFAULT_TRAIN_SIZE = 2000
DEFAULT_EVAL_SIZE = 100

DESCRIPTION = """\
# Task: addition control (two-digit addition)

A synthetic positive control for the harness, not a research task: improve the base model's
accuracy on adding two two-digit numbers.

- Training data: `data/train.jsonl`, one JSON object per line with `question`
  ("What is 47 + 38?"), `answer` (the sum, "85") and the operands `a` and `b`. The problems are
  generated offline from a seed; there is no download.
- Evaluation: a held-out set of {eval_size} problems that you never see; no pair of operands in
  it appears in the training data, in either order. The grader sends each problem through the
  chat template (see "How prompts are rendered") exactly as `task.py:format_prompt` builds it (a single user turn:
  "What is A + B? Answer with the number only."), decodes greedily (at most {max_new_tokens} new
  tokens) and takes the first integer in the reply as the answer (`task.py:extract_answer`):
  "85" and "The answer is 85." are right, "47 + 38 = 85" answers 47.
- Metric: exact-match accuracy of that number, 0-100.
- `task.py` holds the prompt format, the answer extraction and the reward the grader uses;
  import it, do not copy it by hand.
"""


def _check_source(settings: dict) -> str:
    source = settings.get("source", "offline")
    if source != "offline":
        raise ValueError(f"addition-control is synthetic and has only an offline source, not {source!r}")
    return source


def _pool(seed: int) -> list[tuple[int, int]]:
    """Every unordered operand pair, shuffled with `seed`, each in a seeded order (a + b or b + a)."""
    rng = random.Random(seed)
    pairs = list(PAIRS)
    rng.shuffle(pairs)
    return [(b, a) if rng.random() < 0.5 else (a, b) for a, b in pairs]


def _row(prefix: str, index: int, a: int, b: int) -> dict:
    return {"id": f"{prefix}-{index}", "question": f"What is {a} + {b}?", "answer": str(a + b), "a": a, "b": b}


def _pair_key(row: dict) -> tuple[int, int]:
    return (min(row["a"], row["b"]), max(row["a"], row["b"]))


class AdditionControl(Task):
    name = "addition-control"
    public_module_path = PUBLIC

    def prepare_train(self, settings: dict, train_dir: Path) -> dict:
        source = _check_source(settings)
        pool = _pool(settings.get("data_seed", 0))
        size = settings.get("train_size") or DEFAULT_TRAIN_SIZE
        if size >= len(pool):
            raise ValueError(f"train_size {size} leaves no held-out pairs: there are only {len(pool)} operand pairs")
        train = [_row("train", i, a, b) for i, (a, b) in enumerate(pool[:size])]
        path = Path(train_dir) / TRAIN_FILE
        write_jsonl(path, train)
        return {"source": source, "train_rows": len(train), "train_sha256": sha256_file(path)}

    def prepare_eval(self, settings: dict, train_dir: Path, eval_dir: Path, *, salt: str | None = None) -> dict:
        source = _check_source(settings)
        data_seed = settings.get("data_seed", 0)
        rng = random.Random(salted_seed(require_salt(salt, self.name), self.name, data_seed))
        train_pairs = {_pair_key(row) for row in read_jsonl(Path(train_dir) / TRAIN_FILE)}
        unseen = [(a, b) for a, b in _pool(data_seed) if (min(a, b), max(a, b)) not in train_pairs]
        rng.shuffle(unseen)
        size = settings.get("eval_size") or DEFAULT_EVAL_SIZE
        if size > len(unseen):
            raise RuntimeError(
                f"eval_size {size} exceeds the {len(unseen)} operand pairs the training split leaves: "
                f"train_size + eval_size must not exceed {len(train_pairs) + len(unseen)}"
            )
        held_out = [_row("eval", i, a, b) for i, (a, b) in enumerate(unseen[:size])]
        path = Path(eval_dir) / EVAL_FILE
        write_jsonl(path, held_out)
        return {
            "source": source,
            "eval_rows": len(held_out),
            "eval_sha256": sha256_file(path),
            "salt_sha256": salt_fingerprint(salt),
        }

    def split_sizes(self, settings: dict) -> tuple[int, int]:
        return settings.get("train_size") or DEFAULT_TRAIN_SIZE, settings.get("eval_size") or DEFAULT_EVAL_SIZE

    def split_capacity(self, settings: dict) -> SplitCapacity:
        return SplitCapacity(
            source=f"the {len(PAIRS):,} operand pairs {{a, b}} with {LOW} <= a <= b <= {HIGH}", total=len(PAIRS)
        )

    def describe(self, settings: dict) -> str:
        return DESCRIPTION.format(
            eval_size=settings.get("eval_size") or DEFAULT_EVAL_SIZE,
            max_new_tokens=settings.get("max_new_tokens", 8),
        )

    def rollout(self, settings: dict) -> SingleTurn:
        return SingleTurn(self.public_module().format_prompt, settings.get("max_new_tokens", 8))

    def scorer(self, settings: dict) -> RuleScorer:
        return RuleScorer(self.public_module())


TASK_CLASS = AdditionControl
