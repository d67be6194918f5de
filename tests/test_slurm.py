"""The workflow on a real (throwaway, single-node) SLURM cluster through Snakemake's SLURM
executor and workflow/profiles/slurm: every non-local job goes through sbatch, the agent run
gets a (fake) GPU from SLURM's gres, and the results are the same as on a workstation.

Needs Debian's `slurm-wlm` and `munge` (.ci/run installs them when it runs as root) and root;
it is skipped only when the SLURM/munge programs are not installed.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "workflow" / "profiles" / "slurm"

_spec = importlib.util.spec_from_file_location("slurm_cluster", REPO / "tests" / "cluster" / "slurm_cluster.py")
slurm_cluster = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(slurm_cluster)

pytestmark = pytest.mark.cluster

# A few SLURM jobs only: one task, the tiny model, the copy agent.
SLURM_CONFIG = {
    "sweep": {"tasks": ["gsm8k"], "models": ["tiny"], "agents": ["copy"], "seeds": [0]},
    "budget": {"time_limit_s": 120, "kill_grace_s": 2},
    "tasks": {"gsm8k": {"source": "offline", "train_size": 32, "eval_size": 8, "max_new_tokens": 8}},
    "evaluation": {"backend": "hf", "batch_size": 8, "eval_timeout_s": 300},
}


@pytest.fixture
def slurm(tmp_path):
    """A single-node SLURM cluster (2 fake GPUs) for this test; its daemons, jobs and job steps
    are stopped by PID at teardown, whatever the test did."""
    missing = slurm_cluster.missing_binaries()
    if missing:
        pytest.skip(
            f"SLURM is not installed here (missing {', '.join(missing)}); "
            "install Debian's slurm-wlm and munge to run the cluster test"
        )
    if os.geteuid() != 0:
        pytest.skip("the throwaway SLURM cluster runs slurmd and munged, which need root")
    state = tmp_path / "slurm"
    short = None
    if len(str(state / "munge" / "munge.socket")) > 100:  # unix socket paths are short
        short = Path(tempfile.mkdtemp(prefix="rlbench-slurm-"))
        state = short
    cluster = slurm_cluster.SlurmCluster(state, gpus=2)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        if short is not None:
            subprocess.run(["rm", "-rf", str(short)], check=False)


def squeue_all(cluster) -> list[tuple[str, str, str]]:
    """(job id, name, state) of every job slurmctld still remembers (MinJobAge=600 s)."""
    proc = subprocess.run(
        ["squeue", "--states=all", "--noheader", "--format=%i|%j|%T"],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return [tuple(line.split("|")) for line in proc.stdout.split() if line.strip()]


def job_record(cluster, job_id: str) -> str:
    proc = subprocess.run(
        ["scontrol", "show", "job", "--oneliner", job_id],
        env=cluster.env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    return proc.stdout


def test_tiny_sweep_runs_through_the_slurm_executor(slurm, tmp_path):
    workdir = tmp_path / "work"
    (workdir / "config").mkdir(parents=True)
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(SLURM_CONFIG))

    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable, "-m", "snakemake",
            "-s", str(REPO / "Snakefile"),
            "-d", str(workdir),
            "--profile", str(PROFILE),
            "--executor", "slurm",
        ],
        capture_output=True,
        text=True,
        env={**slurm.env, "PYTHONPATH": str(REPO / "scripts")},
        timeout=900,
    )
    elapsed = time.monotonic() - started
    print(f"snakemake --executor slurm: {elapsed:.0f} s")
    assert proc.returncode == 0, (
        f"snakemake on SLURM failed after {elapsed:.0f} s:\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}\n"
        f"{slurm.logs()}"
    )

    results = workdir / "results"
    with open(results / "report" / "leaderboard.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["agent"] for row in rows] == ["copy"]
    assert float(rows[0]["delta"]) == 0.0 and rows[0]["status"] == "completed"

    run_dir = results / "runs" / "gsm8k" / "tiny" / "copy" / "0"
    run = json.loads((run_dir / "run.json").read_text())
    assert run["status"] == "completed"

    # The jobs really went through SLURM: every job of this run is one of ours, and completed
    # at the first try (a retry would have left a FAILED job behind).
    jobs = squeue_all(slurm)
    assert jobs, "slurmctld saw no job"
    assert all(name.startswith("rlbench_") for _, name, _ in jobs), jobs  # slurm-jobname-prefix
    assert all(state == "COMPLETED" for _, _, state in jobs), jobs
    logs = workdir / ".snakemake" / "slurm_logs"
    agent_logs = list((logs / "rule_run_agent").rglob("*.log"))
    assert len(agent_logs) == 1, sorted(logs.rglob("*.log"))
    group_logs = [p for p in logs.glob("group_postprocess*/**/*.log")]
    assert len(group_logs) == 1, sorted(logs.rglob("*.log"))  # the run's post-processing: one job
    assert not (logs / "rule_evaluate_final").exists() and not (logs / "rule_aggregate").exists()

    # run_agent and the post-processing group each asked SLURM for one GPU ...
    for log in (agent_logs[0], group_logs[0]):
        record = job_record(slurm, log.stem)
        assert "TresPerJob=gres:gpu:1" in record, record  # sbatch --gpus=1
    # ... and the agent's job got one: the runner records CUDA_VISIBLE_DEVICES as `gpus`.
    if slurm.gpu_devices:
        assert run["gpus"] and set(run["gpus"]) <= {"0", "1"}, run["gpus"]
