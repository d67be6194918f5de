"""GSM8K (L1): grade-school math, scored with the paper's OpenCompass protocol."""

from __future__ import annotations

import json
from functools import lru_cache
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
from rlbench.tasks.opencompass_config import read_dataset_config

PUBLIC = Path(__file__).with_name("public.py")
# The dataset config the reference harness evaluates GSM8K with (benchmarks/__init__.py there).
OPENCOMPASS_CONFIG = "configs/datasets/gsm8k/gsm8k_gen_1d7fe4.py"
# The rows of the default hub dataset's splits (path, config, split): the most a hub split can give.
HUB_ROWS = {("openai/gsm8k", "main", "train"): 7473, ("openai/gsm8k", "main", "test"): 1319}
# What our public module implements; a config naming anything else is refused, not approximated.
EXPECTED_PARTS = {
    "retriever": "ZeroRetriever",
    "inferencer": "GenInferencer",
    "evaluator": "Gsm8kEvaluator",
    "pred_postprocessor": "gsm8k_postprocess",
    "dataset_postprocessor": "gsm8k_dataset_postprocess",
}

DESCRIPTION = """\
# Task: GSM8K (grade-school math word problems)

Improve the base model's accuracy on grade-school math word problems.

- Training data: `data/train.jsonl`, one JSON object per line with `question` and `answer`;
  `answer` is a worked solution whose last line is `#### <number>`.
- Evaluation: a held-out set of {eval_desc} that you never see, scored with the paper's
  protocol (OpenCompass `gsm8k_gen_1d7fe4`, read from opencompass {oc_version}):
  - Prompt: {shots} worked examples given as a multi-turn chat (user: "Question: ...\\nLet's
    think step by step\\nAnswer:", assistant: the worked solution ending "The answer is N"),
    then the held-out question in the same user format. The chat template renders the
    conversation, with the generation prompt (see "How prompts are rendered"). `task.py:format_prompt` builds exactly these
    messages (the exemplars are in `task_protocol.json`).
  - Generation: as the base model's registry entry decodes it, as the reference's models.yaml
    does (greedy for most models; Qwen3 models sample at temperature 0.6, top_p 0.95, top_k 20,
    thinking on, seeded), at most {max_new_tokens} new tokens, stopping at the model's
    end-of-sequence token(s).
  - Answer extraction (`task.py:extract_answer`): drop any `<think>...</think>` section, cut the
    completion at the first "Question:" (a model that goes on inventing questions is not
    penalised for them), take the last number that remains. The gold answer is the number after
    `#### `, commas removed; it matches when the strings are equal or differ by less than 1e-6.
- Metric: exact-match accuracy, 0-100.
- `task.py` holds the prompt format, the answer extraction and the reward the grader uses;
  import it, do not copy it by hand. End answers with "The answer is N" and stop, as the
  exemplars do.
"""


@lru_cache(maxsize=1)
def opencompass_protocol() -> dict:
    """The GSM8K protocol as the pinned OpenCompass config defines it (rounds, length, parts)."""
    config = read_dataset_config(OPENCOMPASS_CONFIG)
    infer, evaluation = config["gsm8k_infer_cfg"], config["gsm8k_eval_cfg"]
    reader = config["gsm8k_reader_cfg"]
    parts = {
        "retriever": infer["retriever"]["type"],
        "inferencer": infer["inferencer"]["type"],
        "evaluator": evaluation["evaluator"]["type"],
        "pred_postprocessor": evaluation["pred_postprocessor"]["type"],
        "dataset_postprocessor": evaluation["dataset_postprocessor"]["type"],
    }
    if parts != EXPECTED_PARTS:
        raise RuntimeError(f"{OPENCOMPASS_CONFIG} names {parts}; this task implements {EXPECTED_PARTS}")
    return {
        "name": "opencompass/gsm8k_gen_1d7fe4",
        "source": config["__source__"],
        "rounds": infer["prompt_template"]["template"]["round"],
        "input_columns": reader["input_columns"],
        "output_column": reader["output_column"],
        "max_out_len": infer["inferencer"]["max_out_len"],
        # Applied to every model by the reference (models.yaml: use_cot_postprocessor, enable_thinking).
        "model_postprocessor": "extract-non-reasoning-content",
        **parts,
    }


def max_new_tokens(settings: dict) -> int:
    """The generation length: the protocol's, unless the sweep shortens it (CPU smoke runs)."""
    return settings.get("max_new_tokens") or opencompass_protocol()["max_out_len"]


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


def _hub_split(settings: dict, which: str) -> tuple[str, str, str]:
    """(dataset path, config name, split) of the hub's train or eval split."""
    hub = settings.get("hub", {})
    split = hub.get("train_split", "train") if which == "train" else hub.get("eval_split", "test")
    return hub.get("path", "openai/gsm8k"), hub.get("name", "main"), split


def _hub_rows(settings: dict, which: str) -> list[dict]:
    """The train or eval split of the real dataset (`datasets` caches it between calls)."""
    from datasets import load_dataset

    path, name, split = _hub_split(settings, which)
    try:
        data = load_dataset(path, name, split=split)
    except Exception as exc:  # the hub is unreachable or the dataset moved
        raise RuntimeError(
            f"could not load GSM8K from the hub ({exc}); set `tasks: gsm8k: source: offline` "
            "in the config to use the offline twin"
        ) from exc
    return [{"id": f"{which}-{i}", "question": r["question"], "answer": r["answer"]} for i, r in enumerate(data)]


class GSM8K(Task):
    name = "gsm8k"
    public_module_path = PUBLIC
    # The reference scores it through OpenCompass, which decodes as its models.yaml says per model.
    takes_model_decoding = True

    def prepare_train(self, settings: dict, train_dir: Path) -> dict:
        source = _check_source(settings)
        if source == "hub":
            train = _hub_rows(settings, "train")[: settings.get("train_size") or None]
        else:
            train = _offline_rows(settings.get("data_seed", 0), settings.get("train_size") or 1000, "train", set())
        path = Path(train_dir) / TRAIN_FILE
        write_jsonl(path, train)
        return {"source": source, "train_rows": len(train), "train_sha256": sha256_file(path)}

    def prepare_eval(self, settings: dict, train_dir: Path, eval_dir: Path, *, salt: str | None = None) -> dict:
        source = _check_source(settings)
        train_questions = {row["question"] for row in read_jsonl(Path(train_dir) / TRAIN_FILE)}
        extra: dict = {}
        if source == "hub":
            held_out = _hub_rows(settings, "eval")[: settings.get("eval_size") or None]
        else:
            # Seeded from the secret salt: data_seed and the generator are public, so a seed derived
            # from them alone would let an agent rebuild the held-out split.
            seed = salted_seed(require_salt(salt, self.name), self.name, settings.get("data_seed", 0))
            held_out = _offline_rows(seed, settings.get("eval_size") or 200, "eval", set(train_questions))
            extra = {"salt_sha256": salt_fingerprint(salt)}
        overlap = train_questions & {r["question"] for r in held_out}
        if overlap:
            raise RuntimeError(f"{len(overlap)} held-out questions also appear in the training split")
        path = Path(eval_dir) / EVAL_FILE
        write_jsonl(path, held_out)
        return {"source": source, "eval_rows": len(held_out), "eval_sha256": sha256_file(path), **extra}

    def split_capacity(self, settings: dict) -> SplitCapacity | None:
        """hub: the rows of openai/gsm8k's splits (another dataset's are known only once loaded); offline:
        no bound, the twin generates questions until it has as many distinct ones as asked for."""
        if _check_source(settings) != "hub":
            return None
        train, held_out = _hub_split(settings, "train"), _hub_split(settings, "eval")
        if train not in HUB_ROWS and held_out not in HUB_ROWS:
            return None
        path, name, _ = train
        described = ", ".join(f"{HUB_ROWS[s]:,} rows in {s[2]}" for s in (train, held_out) if s in HUB_ROWS)
        return SplitCapacity(
            source=f"the hub dataset {path} ({name}: {described})", train=HUB_ROWS.get(train), eval=HUB_ROWS.get(held_out)
        )

    def describe(self, settings: dict) -> str:
        size = settings.get("eval_size")
        eval_desc = f"{size} problems" if size else "problems (the GSM8K test split, 1,319)"
        protocol = opencompass_protocol()
        return DESCRIPTION.format(
            eval_desc=eval_desc,
            max_new_tokens=max_new_tokens(settings),
            oc_version=protocol["source"]["version"],
            shots=sum(turn["role"] == "BOT" for turn in protocol["rounds"]),
        )

    def exposed_files(self, settings: dict) -> dict[str, Path | bytes]:
        protocol = {**opencompass_protocol(), "max_new_tokens": max_new_tokens(settings)}
        return {"task.py": PUBLIC, "task_protocol.json": json.dumps(protocol, indent=2).encode() + b"\n"}

    def rollout(self, settings: dict) -> SingleTurn:
        public, protocol = self.public_module(), opencompass_protocol()
        return SingleTurn(lambda row: public.format_prompt(row, protocol), max_new_tokens(settings))

    def scorer(self, settings: dict) -> RuleScorer:
        return RuleScorer(self.public_module())


TASK_CLASS = GSM8K
