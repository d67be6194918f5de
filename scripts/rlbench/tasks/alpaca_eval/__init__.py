"""AlpacaEval 2.0 (L2): open-ended instructions, scored by an LLM judge against reference answers.

- hub: the 805 AlpacaEval instructions with the `alpaca_eval_gpt4_baseline` reference outputs
  (HF dataset tatsu-lab/alpaca_eval), training data the first 2,000 rows of tatsu-lab/alpaca;
  metric alpaca_eval's `length_controlled_v1` LC win rate.
- offline: the instruction set with reference answers and the Alpaca-style training set shipped
  in data/ (written for this repository, disjoint), the held-out order drawn with the salt;
  metric alpaca_eval's `length_controlled_minimal` GLM (no instruction difficulties offline).

Rollout: one user turn through the model's chat template, greedy, at most 512 new tokens, answer
stripped (RD-Agent's protocol). Scorer: the task's judge (rlbench.scoring.judges, from the `judge:` block)
compares each answer with the reference as its annotator says (`judge.annotator`,
rlbench.scoring.judges.annotators), recorded in the metrics as `annotator`:

- `reference_gpt52_fn` (the hub default, the reference harness's `annotators_gpt52_fn`): alpaca_eval's
  function-calling ranking prompt on gpt-5.2, temperature 0, one call per instruction in alpaca_eval's
  seeded order, a discrete preference; a failed call is alpaca_eval's NaN (out of the win rate, still
  predicted by the LC GLM);
- `paper_gpt4o` (the paper's): the same on gpt-4o; a failed or refused call is a loss;
- `weighted_gpt4_turbo` (this project's earlier protocol): AlpacaEval 2.0's weighted m/M prompt on
  gpt-4-1106-preview in both orders; a failed call drops its instruction;
- `weighted_local` (any local judge, the offline default): the weighted prompt read by a local model.

alpaca_eval's own code turns the preferences into win rates (winrate.py): its length-controlled win rate
(the GLM fitted on the preferences, discrete or weighted, as the reference's `alpaca_eval.evaluate` does).
Failed judge calls are counted by kind.
"""

from __future__ import annotations

import json
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from rlbench.fileio.jsonio import read_jsonl, sha256_file, write_jsonl
from rlbench.tasks.alpaca_eval.winrate import LC_HUB, LC_OFFLINE, compute_metrics, ensure_df_gamed, primary_metric
from rlbench.tasks.base import (
    EVAL_FILE,
    TRAIN_FILE,
    EvalContext,
    EvalResult,
    Task,
    require_salt,
    salt_fingerprint,
    salted_seed,
)
from rlbench.tasks.capacity import SplitCapacity
from rlbench.tasks.parts import SingleTurn

PUBLIC = Path(__file__).with_name("public.py")
DATA = Path(__file__).with_name("data")
OFFLINE_EVAL = DATA / "instructions.jsonl"
OFFLINE_TRAIN = DATA / "train.jsonl"
OFFLINE_REFERENCE = "rlbench_offline_reference"
HUB_DEFAULTS = {
    "path": "tatsu-lab/alpaca_eval",
    "reference_file": "alpaca_eval_gpt4_baseline.json",
    "train_path": "tatsu-lab/alpaca",
    "train_split": "train",
}
HUB_TRAIN_SIZE = 2000  # the reference harness's ALPACAEVAL_TRAIN_SAMPLES
# What the default hub data hold: AlpacaEval's 805 instructions (the reference file's rows) and the rows of
# tatsu-lab/alpaca's train split; the most a hub split can give.
HUB_EVAL_ROWS = 805
HUB_TRAIN_ROWS = 52002
MODEL_NAME = "model"  # the evaluated model's generator name in alpaca_eval's tables

DESCRIPTION = """\
# Task: AlpacaEval 2.0 (open-ended instruction following)

Make the base model answer open-ended instructions better: explanations, advice, writing,
lists, rewriting, brainstorming, coding, small math word problems.

- Training data: `data/train.jsonl`, {train_desc}, one JSON object per line with `instruction`,
  `input` (often empty) and `output` (a good answer).
- Evaluation: {eval_desc} that you never see. Each is sent as one user turn through the chat
  template (`task.py:format_prompt`; see "How prompts are rendered"), decoded greedily with at most {max_new_tokens} new
  tokens, and the answer is stripped.
- Scoring: an LLM judge ({judge_desc}) compares each answer with a strong reference answer to the
  same instruction ({annotator_desc}). The metric is
  AlpacaEval 2.0's length-controlled win rate against the references, 0-100 (50 = as good as the
  reference), computed by the alpaca_eval package ({lc_desc}). Length control means a longer answer
  is not better just for being longer. The raw win rate is reported beside it.
- The judge is noisy: the base model is evaluated {repeats} times and the spread is reported with
  every improvement.
- The judge and the references are the grader's; you do not get them. `task.py:proxy_reward` is a
  cheap heuristic for experiments, NOT the grader's reward.
"""


def _norm(text: str) -> str:
    """Lowercase words only: what "the same instruction" means for the disjointness checks."""
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def max_new_tokens(settings: dict) -> int:
    """The generation length: the protocol's 512, unless the sweep shortens it (CPU smoke runs)."""
    return settings.get("max_new_tokens") or 512


def _check_source(settings: dict) -> str:
    if settings["source"] not in ("hub", "offline"):
        raise ValueError(f"unknown source {settings['source']!r}; allowed: hub, offline")
    return settings["source"]


def _hub(settings: dict) -> dict:
    return {**HUB_DEFAULTS, **(settings.get("hub") or {})}


def _hub_failure(what: str, exc: Exception) -> RuntimeError:
    return RuntimeError(
        f"could not load {what} from the Hugging Face hub ({type(exc).__name__}: {exc}); "
        "run with network once so the HF cache holds it, or set `tasks: alpaca-eval: source: offline` "
        "in the config to use the offline twin"
    )


def _hub_train_rows(settings: dict, size: int) -> list[dict]:
    hub = _hub(settings)
    try:
        from datasets import load_dataset

        data = load_dataset(hub["train_path"], split=hub["train_split"])
    except Exception as exc:
        raise _hub_failure(f"the training data {hub['train_path']}", exc) from exc
    rows = data.select(range(min(size, len(data))))
    return [
        {"id": f"train-{i}", "instruction": r["instruction"], "input": r.get("input") or "", "output": r["output"]}
        for i, r in enumerate(rows)
    ]


def _hub_eval_rows(settings: dict) -> list[dict]:
    hub = _hub(settings)
    try:
        from huggingface_hub import hf_hub_download

        path = hf_hub_download(repo_id=hub["path"], filename=hub["reference_file"], repo_type="dataset")
        references = json.loads(Path(path).read_text())
    except Exception as exc:
        raise _hub_failure(f"the AlpacaEval references {hub['path']}/{hub['reference_file']}", exc) from exc
    return [
        {
            "id": f"eval-{i}",
            "index": i,  # AlpacaEval's instruction index: the LC GLM's instruction difficulty
            "instruction": r["instruction"],
            "reference": r["output"],
            "reference_generator": r.get("generator", "reference"),
            "dataset": r.get("dataset", ""),
        }
        for i, r in enumerate(references)
    ]


def lc_method(settings: dict) -> str:
    return LC_HUB if settings["source"] == "hub" else LC_OFFLINE


@dataclass
class WinRateScorer:
    """The judge's preferences for the model's answers over the references, as AlpacaEval metrics.
    Primary: `length_controlled_winrate` (`lc_method` names the GLM), or `win_rate` when no GLM can
    be fitted. `annotator` names the judge's protocol (rlbench.scoring.judges.annotators) and
    `judge_model` the model asked. Judge failures: `judge_failures` (failed calls),
    `judge_failures_by_kind`, `judge_failure_rule` (what a failed instruction became: `drop`, `alpaca_eval`
    or `loss`), `judge_dropped` (instructions left out of the win rate: of every rate under `drop`; under
    `alpaca_eval` the LC GLM still predicts them) and `judge_failures_as_losses` (under `loss`)."""

    lc_method: str

    def score(self, rows: list[dict], samples: list[str], ctx: EvalContext) -> EvalResult:
        from rlbench.scoring.judges import Pair, failure_summary

        outputs = [(sample or "").strip() for sample in samples]
        if len(outputs) != len(rows):
            raise RuntimeError(f"{len(outputs)} answers for {len(rows)} instructions")
        from rlbench.scoring.judges.annotators import ALPACA_EVAL_NAN, LOSS

        judge = ctx.judge()
        annotator = judge.annotator
        judgments = judge.compare([Pair(r["instruction"], r["reference"], o) for r, o in zip(rows, outputs)])
        failures = failure_summary(judgments)
        if rows and failures["instructions"] == len(rows):
            raise RuntimeError(
                f"the judge ({judge.backend}: {judge.model}) answered none of the {len(rows)} instructions; "
                f"failed calls by kind: {failures['by_kind']}"
            )
        if failures["count"]:
            print(f"judge failures: {failures}", file=sys.stderr)
        reference = rows[0].get("reference_generator", "reference") if rows else "reference"
        as_loss = annotator.on_failure == LOSS
        # A loss: output_1 (the reference) preferred.
        preferences = [1.0 if j.preference is None and as_loss else j.preference for j in judgments]
        metrics = compute_metrics(
            [
                {"index": r["index"], "instruction": r["instruction"], "output_1": r["reference"], "output_2": o,
                 "preference": p}
                for r, o, p in zip(rows, outputs, preferences)
            ],  # fmt: skip
            lc_method=self.lc_method,
            reference_name=reference,
            model_name=MODEL_NAME,
            keep_failed=annotator.on_failure == ALPACA_EVAL_NAN,
        )
        metrics.update(
            annotator=annotator.name,
            judge_model=judge.model,
            judge_failures=failures["count"],
            judge_failures_by_kind=failures["by_kind"],
            judge_failure_rule=annotator.on_failure,
            judge_dropped=0 if as_loss else failures["instructions"],
            judge_failures_as_losses=failures["instructions"] if as_loss else 0,
            judge_requests=judge.stats.requests,
            judge_cache_hits=judge.stats.cache_hits,
            judge_backend=judge.backend,
        )
        items = []
        for r, o, j, p in zip(rows, outputs, judgments, preferences):
            asked = j.swapped if j.forward.parser == "not_asked" else j.forward
            items.append(
                {
                    "id": r["id"],
                    "preference": p,
                    "forward": j.forward.preference,
                    "swapped": j.swapped.preference,
                    "parser": asked.parser,
                    "failure": j.forward.failure or j.swapped.failure,
                    "output": o,
                }
            )
        primary = primary_metric(metrics)
        stands_for = "length_controlled_winrate" if primary != "length_controlled_winrate" else None
        return EvalResult(metrics=metrics, primary=primary, n=len(rows), items=items, stands_for=stands_for)

    def code_files(self) -> list[Path]:
        from rlbench.scoring import judges

        return judges.code_files()


class AlpacaEval(Task):
    name = "alpaca-eval"
    public_module_path = PUBLIC

    def prepare_train(self, settings: dict, train_dir: Path) -> dict:
        source = _check_source(settings)
        size = settings.get("train_size")
        if source == "hub":
            train = _hub_train_rows(settings, size or HUB_TRAIN_SIZE)
        else:
            shipped = list(read_jsonl(OFFLINE_TRAIN))
            train = [{"id": f"train-{i}", **row} for i, row in enumerate(shipped[: size or None])]
        path = Path(train_dir) / TRAIN_FILE
        write_jsonl(path, train)
        return {"source": source, "train_rows": len(train), "train_sha256": sha256_file(path)}

    def prepare_eval(self, settings: dict, train_dir: Path, eval_dir: Path, *, salt: str | None = None) -> dict:
        source = _check_source(settings)
        size = settings.get("eval_size")
        train_rows = list(read_jsonl(Path(train_dir) / TRAIN_FILE))
        train_instructions = {_norm(r["instruction"]) for r in train_rows}
        train_instructions |= {_norm(r["instruction"] + " " + (r.get("input") or "")) for r in train_rows}
        extra: dict = {}
        if source == "hub":
            # The LC metric's data, fetched (or found missing) now: before any agent runs, not at
            # the first evaluation.
            if lc_method(settings) == LC_HUB:
                ensure_df_gamed()
            # A prefix keeps every row at its AlpacaEval index, as the reference's max_instances does.
            held_out = _hub_eval_rows(settings)[: size or None]
        else:
            shipped = list(read_jsonl(OFFLINE_EVAL))
            # The order is drawn with the salt; an eval_size below the set's size keeps an unknowable subset.
            rng = random.Random(salted_seed(require_salt(salt, self.name), self.name, settings.get("data_seed", 0)))
            rng.shuffle(shipped)
            held_out = [
                {
                    "id": f"eval-{k}",
                    "index": k,
                    "instruction": row["instruction"],
                    "reference": row["output"],
                    "reference_generator": OFFLINE_REFERENCE,
                    "dataset": row.get("category", ""),
                }
                for k, row in enumerate(shipped[: size or None])
            ]
            extra = {"salt_sha256": salt_fingerprint(salt)}
        overlap = sum(_norm(r["instruction"]) in train_instructions for r in held_out)
        if overlap and source == "offline":
            raise RuntimeError(f"{overlap} held-out instructions also appear in the training split")
        path = Path(eval_dir) / EVAL_FILE
        write_jsonl(path, held_out)
        return {
            "source": source,
            "eval_rows": len(held_out),
            "eval_sha256": sha256_file(path),
            "lc_method": lc_method(settings),
            "train_eval_overlap": overlap,  # hub: the real data as they are, overlap only recorded
            **extra,
        }

    def split_sizes(self, settings: dict) -> tuple[int | None, int | None]:
        train = settings.get("train_size")
        return (train or HUB_TRAIN_SIZE) if _check_source(settings) == "hub" else train, settings.get("eval_size")

    def split_capacity(self, settings: dict) -> SplitCapacity | None:
        """hub: the default datasets' rows (other datasets are known only once loaded); offline: the rows
        shipped in data/."""
        if _check_source(settings) == "offline":
            train, held_out = (sum(1 for _ in read_jsonl(path)) for path in (OFFLINE_TRAIN, OFFLINE_EVAL))
            return SplitCapacity(
                source=f"the offline data shipped in the task's data/ ({train} training rows, {held_out} instructions)",
                train=train,
                eval=held_out,
            )
        hub = _hub(settings)

        def is_default(*keys: str) -> bool:
            return all(hub[key] == HUB_DEFAULTS[key] for key in keys)

        train = HUB_TRAIN_ROWS if is_default("train_path", "train_split") else None
        held_out = HUB_EVAL_ROWS if is_default("path", "reference_file") else None
        if train is None and held_out is None:
            return None
        return SplitCapacity(
            source=f"the hub data ({HUB_TRAIN_ROWS:,} rows of {HUB_DEFAULTS['train_path']}, "
            f"AlpacaEval's {HUB_EVAL_ROWS} instructions)",
            train=train,
            eval=held_out,
        )

    def describe(self, settings: dict) -> str:
        judge = settings.get("judge") or {}
        size = settings.get("eval_size")
        if settings["source"] == "hub":
            train_desc = f"the first {settings.get('train_size') or HUB_TRAIN_SIZE} rows of tatsu-lab/alpaca"
            eval_desc = f"{size or 805} AlpacaEval instructions"
            lc_desc = "`length_controlled_v1`, the AlpacaEval 2.0 leaderboard's"
        else:
            train_desc = "Alpaca-style instruction-answer pairs"
            eval_desc = f"{size} held-out instructions" if size else "a held-out set of instructions"
            lc_desc = "`length_controlled_minimal`: the same GLM without per-instruction difficulty"
        from rlbench.scoring.judges import configured_annotator

        return DESCRIPTION.format(
            annotator_desc=configured_annotator(judge).summary,
            train_desc=train_desc,
            eval_desc=eval_desc,
            max_new_tokens=max_new_tokens(settings),
            judge_desc=f"{judge.get('model', '?')} via the {judge.get('backend', '?')} backend",
            lc_desc=lc_desc,
            repeats=self.noise_repeats(settings),
        )

    def rollout(self, settings: dict) -> SingleTurn:
        return SingleTurn(self.public_module().format_prompt, max_new_tokens(settings))

    def scorer(self, settings: dict) -> WinRateScorer:
        return WinRateScorer(lc_method(settings))


TASK_CLASS = AlpacaEval
