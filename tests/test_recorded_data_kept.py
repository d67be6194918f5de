"""No rule destroys or archives recorded results before their replacement is complete (issue 25, item 7).

The issue's sweep (a finished addition-control run, then sizes its pool cannot give) rewrote the training
split, archived the finished run (prepare_workspace, beside the failing prepare_eval_data) and lost the held-out
split (Snakemake removes a job's outputs before it runs and after it fails). Now a split is built beside the
recorded one and moved into place only once complete, its data file survives a failed rebuild (update()), and
a new attempt's workspace archives the previous attempt only once everything the attempt needs is there and
its own workspace is built. The config that caused it is refused earlier still (tests/test_config_capacity.py),
so the failures here are injected past validation: an emptied salt file, an unreachable hub dataset.
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from rlbench.agent_run.workspace import replace_workspace
from rlbench.config import Registries, task_settings
from rlbench.tasks import get_task
from support.workflow import make_workdir, snakemake

BUDGET = {"time_limit_s": 60, "kill_grace_s": 2}
SALT = "results/secrets/eval_salt"


def config_of(task: str, model: str = "tiny", **settings) -> dict:
    return {
        "sweep": {"tasks": [task], "models": [model], "agents": ["copy"], "seeds": [0]},
        "budget": BUDGET,
        "tasks": {task: settings},
        "evaluation": {"backend": "hf", "batch_size": 20, "eval_timeout_s": 300},
        "sandbox": {"backend": "none"},
    }


def split_files(workdir, task: str, split: str) -> dict[str, bytes]:
    directory = workdir / "results" / "data" / task / split
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.is_file()} if directory.is_dir() else {}


def set_config(workdir, config: dict) -> None:
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config))


def test_a_failed_held_out_rebuild_keeps_the_recorded_split(tmp_path):
    workdir = make_workdir(tmp_path, config_of("addition-control", eval_size=20))
    target = "results/data/addition-control/eval/manifest.json"
    snakemake(workdir, "--cores", "1", target)
    recorded = split_files(workdir, "addition-control", "eval")
    salt = (workdir / SALT).read_text()

    (workdir / SALT).write_text("")  # prepare_eval_data reruns (a newer input) and fails reading it
    failed = snakemake(workdir, "--cores", "1", target, check=False)
    assert failed.returncode != 0 and "eval salt file" in (workdir / "results/logs/prepare_eval_data/addition-control.log").read_text()
    kept = split_files(workdir, "addition-control", "eval")
    assert kept.get("eval.jsonl") == recorded["eval.jsonl"], "the recorded held-out split was lost"
    # Its manifest is what says the split matches the config: gone, so the next run rebuilds the split.
    assert "manifest.json" not in kept
    assert not list((workdir / "results" / "data" / "addition-control").glob(".*"))  # no staging left behind

    (workdir / SALT).write_text(salt)
    snakemake(workdir, "--cores", "1", target)
    assert split_files(workdir, "addition-control", "eval") == recorded


@pytest.mark.slow  # 7 s; the held-out rebuild above checks the same staging in the default tier
def test_a_failed_training_rebuild_keeps_the_recorded_split(tmp_path):
    workdir = make_workdir(tmp_path, config_of("humaneval"))
    target = "results/data/humaneval/train/manifest.json"
    snakemake(workdir, "--cores", "1", target)
    recorded = split_files(workdir, "humaneval", "train")

    # The hub source from a dataset that is not there (the tests run with HF_DATASETS_OFFLINE=1).
    set_config(workdir, config_of("humaneval", source="hub", hub={"path": "rlbench-test/no-such-dataset"}))
    failed = snakemake(workdir, "--cores", "1", target, check=False)
    assert failed.returncode != 0 and "could not load HumanEval" in (workdir / "results/logs/prepare_data/humaneval.log").read_text()
    kept = split_files(workdir, "humaneval", "train")
    assert kept.get("train.jsonl") == recorded["train.jsonl"], "the recorded training split was lost"
    assert "manifest.json" not in kept


def test_a_new_workspace_waits_for_everything_its_attempt_needs(tmp_path):
    """prepare_workspace archives the previous attempt: it runs only once the held-out split, the baseline
    and the level's inputs are there, as run_agent does (ancient: none of them rebuilds a workspace)."""
    workdir = make_workdir(tmp_path, config_of("humaneval"))
    out = snakemake(workdir, "-n", "results/runs/humaneval/tiny/copy/0/workspace.json").stdout
    block = re.search(r"rule prepare_workspace:\n(.*?)\n\n", out, re.S)
    assert block is not None, out[-3000:]
    inputs = re.search(r"input: (.*)", block.group(1)).group(1).split(", ")
    for needed in (
        "results/data/humaneval/eval/eval.jsonl",
        "results/data/humaneval/eval/manifest.json",
        "results/baselines/humaneval/tiny.json",
        "results/levels/static/humaneval/execution.json",
    ):
        assert needed in inputs, inputs


@pytest.mark.slow  # about 30 s: a real agent run first
def test_the_issue_sweep_with_a_failing_held_out_rebuild_changes_no_recorded_file(tmp_path):
    """The issue's sequence with sizes that validate: a finished run, a new train_size, then a held-out split
    that cannot be rebuilt (the salt file emptied). The run is not archived, its files and the recorded
    held-out split stay as they were; only the training split is replaced, by a complete one."""
    workdir = make_workdir(tmp_path, config_of("addition-control", eval_size=20))
    run = "results/runs/addition-control/tiny/copy/0"
    snakemake(workdir, "--cores", "2", f"{run}/run.json")
    before = snapshot(workdir / run)
    held_out = split_files(workdir, "addition-control", "eval")

    set_config(workdir, config_of("addition-control", train_size=1000, eval_size=20))
    (workdir / SALT).write_text("")
    failed = snakemake(workdir, "--cores", "2", f"{run}/run.json", check=False)
    assert failed.returncode != 0
    assert snapshot(workdir / run) == before, "the finished run was changed"
    assert split_files(workdir, "addition-control", "eval")["eval.jsonl"] == held_out["eval.jsonl"]
    assert len(split_files(workdir, "addition-control", "train")["train.jsonl"].splitlines()) == 1000


@pytest.fixture
def finished_run(tmp_path):
    """A run directory whose attempt 1 finished: attempt.json, run.json, its workspace and ledger."""
    run_dir = tmp_path / "run"
    (run_dir / "workspace" / "output").mkdir(parents=True)
    (run_dir / "workspace" / "output" / "v1.txt").write_text("trained")
    (run_dir / "grader").mkdir()
    (run_dir / "grader" / "ledger.jsonl").write_text('{"submission_id": 1}\n')
    (run_dir / "run.json").write_text('{"status": "completed"}')
    attempt = {"attempt": 1, "marker": "finished-run-test", "runner_pid": 2**22 + 7, "runner_create_time": 0.0, "started": 0.0}
    (run_dir / "attempt.json").write_text(json.dumps(attempt))
    return run_dir


def snapshot(directory) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


def workspace_inputs(tmp_path):
    settings = task_settings({"tasks": {"addition-control": {"train_size": 50, "eval_size": 10}}}, Registries.load(), "addition-control")
    task = get_task(settings)
    task.prepare_train(settings, tmp_path / "train")
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return task, settings, model


def test_a_workspace_that_fails_to_build_leaves_the_previous_attempt_as_it_was(tmp_path, finished_run, monkeypatch):
    task, settings, model = workspace_inputs(tmp_path)
    before = snapshot(finished_run)

    def broken(settings):
        raise OSError("No space left on device")

    monkeypatch.setattr(task, "exposed_files", broken)
    with pytest.raises(OSError, match="No space left"):
        replace_workspace(finished_run, task, settings, model, "org/base", tmp_path / "train")
    assert snapshot(finished_run) == before
    assert sorted(p.name for p in finished_run.iterdir()) == ["attempt.json", "grader", "run.json", "workspace"]


def test_a_built_workspace_archives_the_previous_attempt_and_takes_its_place(tmp_path, finished_run):
    task, settings, model = workspace_inputs(tmp_path)
    before = snapshot(finished_run)
    manifest, archived = replace_workspace(finished_run, task, settings, model, "org/base", tmp_path / "train")
    assert archived == finished_run / "attempts" / "1"
    kept = snapshot(archived)
    assert {name: data for name, data in kept.items() if name != "archived.json"} == before
    assert manifest["workspace"] == str(finished_run / "workspace")
    assert (finished_run / "workspace" / "data" / "train.jsonl").is_file()
    assert not (finished_run / "workspace" / "output" / "v1.txt").exists()
    assert sorted(p.name for p in finished_run.iterdir()) == ["attempts", "workspace"]
