"""GSM8K (L1): grade-school math, exact match of the final number."""

from __future__ import annotations

from pathlib import Path

from rlbench.jsonio import read_jsonl, sha256_file, write_jsonl
from rlbench.tasks.base import EVAL_FILE, TRAIN_FILE, EvalResult, Task

PUBLIC = Path(__file__).with_name("gsm8k_public.py")
# The offline eval split is drawn from its own seed stream, far from the training seed.
EVAL_SEED_OFFSET = 1_000_003

DESCRIPTION = """\
# Task: GSM8K (grade-school math word problems)

Improve the base model's accuracy on grade-school math word problems.

- Training data: `data/train.jsonl`, one JSON object per line with `question` and `answer`;
  `answer` is a worked solution whose last line is `#### <number>`.
- Evaluation: a held-out set of {eval_desc} that you never see. The grader sends each
  question through the model's chat template exactly as `task.py:format_prompt` builds it,
  decodes greedily (at most {max_new_tokens} new tokens) and extracts the final answer with
  `task.py:extract_answer` (the number after the last `####`, else the last number).
- Metric: exact-match accuracy of the final number, 0-100.
- `task.py` holds the prompt format, the answer extraction and the reward the grader uses;
  import it, do not copy it by hand.
"""


def _offline_rows(seed: int, size: int, prefix: str, exclude: set[str]) -> list[dict]:
    import reasoning_gym

    rows: list[dict] = []
    attempt = 0
    while len(rows) < size:
        # Draw extra so that dropping duplicates never leaves the split short.
        batch = reasoning_gym.create_dataset("gsm_symbolic", seed=seed + attempt, size=2 * size)
        for entry in batch:
            question = entry["question"]
            if question in exclude:
                continue
            exclude.add(question)
            solution = entry["metadata"]["answer_cot"].strip()
            if "####" not in solution:
                solution = f"{solution}\n#### {entry['answer']}"
            rows.append({"id": f"{prefix}-{len(rows)}", "question": question, "answer": solution})
            if len(rows) == size:
                break
        attempt += 7919
    return rows


def _check_source(settings: dict) -> str:
    if settings["source"] not in ("hub", "offline"):
        raise ValueError(f"unknown source {settings['source']!r}; allowed: hub, offline")
    return settings["source"]


def _hub_rows(settings: dict, which: str) -> list[dict]:
    """The train or eval split of the real dataset (`datasets` caches it between calls)."""
    from datasets import load_dataset

    hub = settings.get("hub", {})
    split = hub.get("train_split", "train") if which == "train" else hub.get("eval_split", "test")
    try:
        data = load_dataset(hub.get("path", "openai/gsm8k"), hub.get("name", "main"), split=split)
    except Exception as exc:  # the hub is unreachable or the dataset moved
        raise RuntimeError(
            f"could not load GSM8K from the hub ({exc}); set `tasks: gsm8k: source: offline` "
            "in the config to use the offline twin"
        ) from exc
    return [{"id": f"{which}-{i}", "question": r["question"], "answer": r["answer"]} for i, r in enumerate(data)]


class GSM8K(Task):
    name = "gsm8k"
    level = "L1"
    public_module_path = PUBLIC

    def prepare_train(self, settings: dict, train_dir: Path) -> dict:
        source = _check_source(settings)
        if source == "hub":
            train = _hub_rows(settings, "train")[: settings.get("train_size") or None]
        else:
            train = _offline_rows(settings.get("data_seed", 0), settings.get("train_size") or 1000, "train", set())
        path = Path(train_dir) / TRAIN_FILE
        write_jsonl(path, train)
        return {"source": source, "train_rows": len(train), "train_sha256": sha256_file(path)}

    def prepare_eval(self, settings: dict, train_dir: Path, eval_dir: Path) -> dict:
        source = _check_source(settings)
        train_questions = {row["question"] for row in read_jsonl(Path(train_dir) / TRAIN_FILE)}
        if source == "hub":
            held_out = _hub_rows(settings, "eval")[: settings.get("eval_size") or None]
        else:
            seed = settings.get("data_seed", 0) + EVAL_SEED_OFFSET
            held_out = _offline_rows(seed, settings.get("eval_size") or 200, "eval", set(train_questions))
        overlap = train_questions & {r["question"] for r in held_out}
        if overlap:
            raise RuntimeError(f"{len(overlap)} held-out questions also appear in the training split")
        path = Path(eval_dir) / EVAL_FILE
        write_jsonl(path, held_out)
        return {"source": source, "eval_rows": len(held_out), "eval_sha256": sha256_file(path)}

    def describe(self, settings: dict) -> str:
        size = settings.get("eval_size")
        eval_desc = f"{size} problems" if size else "problems (the GSM8K test split)"
        return DESCRIPTION.format(eval_desc=eval_desc, max_new_tokens=settings.get("max_new_tokens", 256))

    def evaluate(self, model_dir: Path, eval_dir: Path, backend, settings: dict) -> EvalResult:
        public = self.public_module()
        rows = list(read_jsonl(Path(eval_dir) / EVAL_FILE))
        completions = backend.generate_chat(
            [public.format_prompt(r) for r in rows], settings.get("max_new_tokens", 256)
        )
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


TASK_CLASS = GSM8K
