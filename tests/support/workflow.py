"""Snakemake through its CLI, on a scratch directory with a config of its own."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from support.settings import REPO

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


class BackgroundSweep:
    """`snakemake --cores 2` on a workdir, started now in a process group of its own (the planned jobs
    checked first); result() waits for it and fails with the log's tail unless it succeeded."""

    def __init__(self, workdir: Path, expect: dict[str, int], timeout_s: float = 1800):
        self.workdir, self.log = workdir, workdir / "sweep.log"
        self.deadline = time.time() + timeout_s
        self.proc: subprocess.Popen | None = None
        # A wrong plan fails the tests that read the sweep (result()), not every test of the session.
        plan = planned_jobs(workdir)
        self.error = None if all(plan.get(rule) == n for rule, n in expect.items()) else f"planned {plan}, expected {expect}"
        if self.error is not None:
            return
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [*SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(workdir), "--cores", "2"],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": str(REPO / "scripts")},
                start_new_session=True,
            )

    def result(self) -> Path:
        if self.error is not None:
            raise AssertionError(f"the session sweep was not started: {self.error}")
        try:
            rc = self.proc.wait(timeout=max(1.0, self.deadline - time.time()))
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"the session sweep did not end in time:\n{self.log.read_text()[-3000:]}")
        if rc != 0:
            raise AssertionError(f"the session sweep failed (exit {rc}):\n{self.log.read_text()[-3000:]}")
        return self.workdir

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()


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



# The one sweep the default tier runs (tests/conftest.py: session_sweep): every level on the tiny
# model with the copy agent, GSM8K with copy and grpo, and the default sweep's two controls
# (SmolLM2-135M on addition-control, copy and sft) on seed 0, within the default budget. The sft
# agent's run of the workflow is the positive control's (on GSM8K's long prompts the tiny model's
# SFT alone took two minutes).
GSM8K_GRID = {"tasks": ["gsm8k"], "models": ["tiny"], "agents": ["copy", "grpo"], "seeds": [0]}
LEVELS_GRID = {
    "tasks": ["humaneval", "alpaca-eval", "alfworld", "webshop", "deepsearchqa"],
    "models": ["tiny"],
    "agents": ["copy"],
    "seeds": [0],
}
SESSION_TASKS = {
    "gsm8k": TEST_CONFIG["tasks"]["gsm8k"],
    "humaneval": {"max_new_tokens": 8},
    "alpaca-eval": {
        "source": "offline",
        "eval_size": 6,
        "max_new_tokens": 8,
        # The tiny model as a local judge: the judge's whole path, offline, in seconds.
        "judge": {"backend": "local", "model": "tiny"},
    },
    "alfworld": {
        "source": "offline", "train_size": 6, "eval_size": 6, "max_new_tokens": 8,
        "environment": {"max_steps": 4},
    },
    "webshop": {
        "source": "offline", "catalogue_size": 40, "train_size": 8, "eval_size": 4, "max_new_tokens": 8,
        "environment": {"max_steps": 4},
    },
    "deepsearchqa": {
        "source": "offline", "kb_size": 60, "train_size": 8, "eval_size": 4, "max_new_tokens": 8,
        "grader_noise_repeats": 2, "judge": {"backend": "match", "model": "string-match"},
    },
}  # fmt: skip


# What the session sweep plans: agent runs (GSM8K, the other levels, the controls) and baselines.
SESSION_PLAN = {"run_agent": 2 + 5 + 2, "evaluate_baseline": 1 + 5 + 1}


def default_config() -> dict:
    return yaml.safe_load((REPO / "config" / "config.yaml").read_text())


def control_grid(seeds: list[int]) -> dict:
    """The default sweep's control grid (config/config.yaml), on these seeds."""
    grids = [g for g in default_config()["sweep"] if "addition-control" in g["tasks"]]
    assert len(grids) == 1, "config/config.yaml must hold the control grid"
    return {**grids[0], "seeds": list(seeds)}


def session_config() -> dict:
    """The default tier's sweep: the default config's budget, evaluation (on the hf backend) and report,
    the small task settings above."""
    default = default_config()
    return {
        **default,
        "sweep": [GSM8K_GRID, LEVELS_GRID, control_grid([0])],
        "tasks": SESSION_TASKS,
        "evaluation": {**default["evaluation"], "backend": "hf"},
    }


def copy_sweep(source: Path, dest: Path, tasks: list[str], config: dict) -> Path:
    """A copy of a finished sweep that later tests may change: the runs of `tasks` (outputs, logs and
    Snakemake's records, mtimes kept), the config narrowed to `config`. The other tasks' runs stay behind."""
    runs = source / "results" / "runs"

    def ignore(directory: str, names: list[str]) -> set[str]:
        if Path(directory) == runs:
            return {name for name in names if name not in tasks}
        return set()

    shutil.copytree(source, dest, symlinks=True, ignore=ignore)
    (dest / "config" / "config.yaml").write_text(yaml.safe_dump(config))
    return dest
