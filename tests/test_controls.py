"""The benchmark can see a change: the default sweep's controls on the real workflow, 3 seeds.

Positive control: the sft reference agent lifts SmolLM2-135M above its baseline on
addition-control within the default budget, on every seed. Negative control: copy submits the
base model and its delta is exactly 0. About 6-8 minutes on 2 CPU cores.
"""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
import yaml

from rlbench.jsonio import read_json
from test_workflow import REPO, make_workdir, planned_jobs, snakemake

SEEDS = [0, 1, 2]


def control_config() -> dict:
    """The default sweep's control grid and budget, run on three seeds."""
    default = yaml.safe_load((REPO / "config" / "config.yaml").read_text())
    grids = [g for g in default["sweep"] if "addition-control" in g["tasks"]]
    assert len(grids) == 1, "config/config.yaml must hold the control grid"
    return {
        **default,
        "sweep": {**grids[0], "seeds": SEEDS},
        "evaluation": {**default["evaluation"], "backend": "hf"},
    }


@pytest.fixture(scope="module")
def controls(tmp_path_factory) -> Path:
    config = control_config()
    assert set(config["sweep"]["agents"]) == {"copy", "sft"}
    workdir = make_workdir(tmp_path_factory.mktemp("controls"), config)
    assert planned_jobs(workdir)["run_agent"] == 2 * len(SEEDS)
    snakemake(workdir, "--cores", "2")
    return workdir


def test_positive_and_negative_controls_on_every_seed(controls):
    with open(controls / "results" / "report" / "leaderboard.csv") as handle:
        rows = {(r["agent"], int(r["seed"])): r for r in csv.DictReader(handle)}
    assert set(rows) == {(agent, seed) for agent in ("copy", "sft") for seed in SEEDS}
    runs = controls / "results" / "runs" / "addition-control" / "smollm2-135m-instruct"
    for seed in SEEDS:
        copy, sft = read_json(runs / "copy" / str(seed) / "final.json"), read_json(runs / "sft" / str(seed) / "final.json")
        assert copy["delta"] == 0.0 and copy["score"] == copy["baseline_score"], copy
        assert sft["delta"] > 0, f"positive control failed on seed {seed}: {sft['score']} vs {sft['baseline_score']}"
        assert float(rows[("copy", seed)]["delta"]) == 0.0 and float(rows[("sft", seed)]["delta"]) > 0
        assert rows[("sft", seed)]["level"] == "control"
        summary = read_json(runs / "sft" / str(seed) / "summary.json")
        assert summary["improvement_success"] is True and summary["route"] == "SFT-only"
        assert summary["metrics"]["valid_submission_rate"] > 0 and summary["metrics"]["first_valid_idx"] == 1
        copy_summary = read_json(runs / "copy" / str(seed) / "summary.json")
        assert copy_summary["route"] == "Copy" and copy_summary["improvement_success"] is False
        assert read_json(runs / "copy" / str(seed) / "run.json")["status"] == "completed"
