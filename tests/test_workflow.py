"""The workflow through the Snakemake CLI: plan, lint, a real tiny sweep, and targeted reruns."""

from __future__ import annotations

import csv
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


def test_tiny_sweep_end_to_end_then_targeted_rerun(tmp_path):
    workdir = make_workdir(tmp_path, TEST_CONFIG)
    plan = planned_jobs(workdir)
    assert plan["run_agent"] == 3 and plan["evaluate_baseline"] == 1 and plan["prepare_workspace"] == 3
    snakemake(workdir, "--cores", "2")
    results = workdir / "results"

    with open(results / "report" / "leaderboard.csv") as handle:
        rows = {row["agent"]: row for row in csv.DictReader(handle)}
    assert set(rows) == {"copy", "sft", "grpo"}
    assert float(rows["copy"]["delta"]) == 0.0 and rows["copy"]["status"] == "completed"
    assert read_json(results / "runs" / "gsm8k" / "tiny" / "copy" / "0" / "summary.json")["route"] == "Copy"
    for agent in ("sft", "grpo"):
        run_dir = results / "runs" / "gsm8k" / "tiny" / agent / "0"
        ledger = list(read_jsonl(run_dir / "grader" / "ledger.jsonl"))
        scored = [e for e in ledger if e["status"] == "scored"]
        assert scored, f"{agent} made no evaluated submission: {ledger}"
        assert all(e["n"] == 12 for e in scored)  # scored on the whole held-out split
        final = read_json(run_dir / "final.json")
        assert final["status"] == "evaluated" and final["n"] == 12
        assert final["score"] == max(e["score"] for e in scored)  # fresh re-evaluation agrees
        assert rows[agent]["submissions"] == str(len(ledger)) and int(rows[agent]["submissions"]) >= 1
        summary = read_json(run_dir / "summary.json")
        assert summary["metrics"]["valid_submission_rate"] > 0
        assert summary["route"] == {"sft": "SFT-only", "grpo": "GRPO"}[agent]
        assert (run_dir / "summary.md").read_text().startswith("# gsm8k / tiny /")

    held_out = {p.read_bytes() for p in (results / "data" / "gsm8k" / "eval").iterdir()}
    for path in (results / "runs").rglob("workspace/**/*"):
        if path.is_file():
            assert path.read_bytes() not in held_out, f"held-out file leaked into {path}"

    assert planned_jobs(workdir) == {}  # the same command again does nothing

    (results / "runs" / "gsm8k" / "tiny" / "sft" / "0" / "final.json").unlink()
    assert planned_jobs(workdir) == {"evaluate_final": 1, "summarize_run": 1, "aggregate": 1, "all": 1}
