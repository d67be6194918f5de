"""Snakemake through its CLI, on a scratch directory with a config of its own."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import yaml

from support.settings import REPO

SNAKEMAKE = [sys.executable, "-m", "snakemake"]
SNAKEMAKE_ENV = {**os.environ, "PYTHONPATH": str(REPO / "scripts")}
TEST_CONFIG = {
    "sweep": {"tasks": ["gsm8k"], "models": ["tiny"], "agents": ["copy", "sft", "grpo"], "seeds": [0]},
    "budget": {"time_limit_s": 180, "kill_grace_s": 2},
    "tasks": {"gsm8k": {"source": "offline", "train_size": 48, "eval_size": 12, "max_new_tokens": 16}},
    "evaluation": {"backend": "hf", "batch_size": 12, "eval_timeout_s": 300},
}

# The sft agent on HumanEval with the tiny model: two rounds of about 10 s each, a submission after
# each (on GSM8K's 8-shot prompts one round takes a minute). The sweep the kill -9 tests interrupt.
SFT_RUN_CONFIG = {
    **TEST_CONFIG,
    "sweep": {"tasks": ["humaneval"], "models": ["tiny"], "agents": ["sft"], "seeds": [0]},
    "tasks": {"humaneval": {"max_new_tokens": 8}},
}
SFT_RUN = Path("results", "runs", "humaneval", "tiny", "sft", "0")


def snakemake_argv(workdir: Path, *args: str) -> list[str]:
    """The command line of this checkout's workflow on `workdir` (run it with env=SNAKEMAKE_ENV)."""
    return [*SNAKEMAKE, "-s", str(REPO / "Snakefile"), "-d", str(workdir), *args]


def snakemake(workdir: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(
        snakemake_argv(workdir, *args),
        capture_output=True,
        text=True,
        env=SNAKEMAKE_ENV,
        timeout=1500,
    )
    if check and proc.returncode != 0:
        raise AssertionError(f"snakemake {' '.join(args)} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return proc


class BackgroundSweep:
    """A sweep that runs while other tests do: from a thread, wait until `after` (another BackgroundSweep)
    has ended when given, make the workdir (`setup`), check the dry run's job counts against `expect`,
    then `snakemake --cores 2` in a process group of its own, at niceness `nice` (its jobs inherit it).
    result() waits for it and fails with the log's tail unless it succeeded; a failure fails only the
    tests that read this sweep."""

    def __init__(self, name: str, setup, expect: dict[str, int], after: "BackgroundSweep | None" = None,
                 nice: int = 0, timeout_s: float = 2400, record: Path | None = None):
        self.name, self.setup, self.expect, self.after, self.nice = name, setup, expect, after, nice
        self.record = record  # where its outcome goes once it has ended, for other pytest processes (SharedSweep)
        self.deadline = time.time() + timeout_s
        self.workdir: Path | None = None
        self.proc: subprocess.Popen | None = None
        self.error: str | None = None
        self._lock = threading.Lock()
        self._stopped = False
        self._thread = threading.Thread(target=self._start, name=f"sweep-{name}", daemon=True)
        self._thread.start()

    def _start(self) -> None:
        try:
            if self.after is not None:
                self.after.wait()  # order only; a setup that reads it calls its result()
            self.workdir = self.setup()
            plan = planned_jobs(self.workdir)
            if any(plan.get(rule) != n for rule, n in self.expect.items()):
                raise AssertionError(f"planned {plan}, expected {self.expect}")
            with self._lock:
                if self._stopped:
                    raise AssertionError("stopped before it started")
                with open(self.workdir / "sweep.log", "wb") as log:
                    self.proc = subprocess.Popen(
                        ["nice", "-n", str(self.nice), *snakemake_argv(self.workdir, "--cores", "2")],
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        env=SNAKEMAKE_ENV,
                        start_new_session=True,
                    )
        except BaseException as exc:  # reported by result(), in the tests that read this sweep
            self.error = f"{type(exc).__name__}: {exc}"
        if self.record is not None:
            self._write_record()

    def _write_record(self) -> None:
        """Once the sweep has ended (or could not start): its workdir or its failure, as result() says it."""
        try:
            outcome = {"workdir": str(self._ended()), "error": None}
        except AssertionError as exc:
            outcome = {"workdir": None, "error": str(exc)}
        tmp = self.record.with_suffix(".tmp")
        tmp.write_text(json.dumps(outcome))
        tmp.replace(self.record)

    def wait(self) -> None:
        """Until the sweep has ended, whatever its outcome."""
        try:
            self.result()
        except AssertionError:
            pass

    def result(self) -> Path:
        self._thread.join(max(1.0, self.deadline - time.time()))
        return self._ended()

    def _ended(self) -> Path:
        """result() once the starting thread is done (or from that thread itself)."""
        if self.error is not None or self.proc is None:
            raise AssertionError(f"the {self.name} was not started: {self.error or 'it did not start in time'}")
        log = self.workdir / "sweep.log"
        try:
            rc = self.proc.wait(timeout=max(1.0, self.deadline - time.time()))
        except subprocess.TimeoutExpired:
            self.stop()
            raise AssertionError(f"the {self.name} did not end in time:\n{log.read_text()[-3000:]}")
        if rc != 0:
            raise AssertionError(f"the {self.name} failed (exit {rc}):\n{log.read_text()[-3000:]}")
        return self.workdir

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()


class SharedSweep:
    """A BackgroundSweep that another pytest process runs (pytest-xdist's workers share one of each):
    result() and wait() as BackgroundSweep's, from the outcome that sweep writes to `record` once it ends."""

    def __init__(self, name: str, record: Path, timeout_s: float = 2400):
        self.name, self.record = name, record
        self.deadline = time.time() + timeout_s

    def _outcome(self) -> dict:
        while not self.record.exists():
            if time.time() > self.deadline:
                raise AssertionError(f"the {self.name} (run by another test process) did not end in time")
            time.sleep(1)
        return json.loads(self.record.read_text())

    def wait(self) -> None:
        try:
            self._outcome()
        except AssertionError:
            pass

    def result(self) -> Path:
        outcome = self._outcome()
        if outcome["error"] is not None:
            raise AssertionError(outcome["error"])
        return Path(outcome["workdir"])

    def stop(self) -> None:
        """Nothing to stop here: the process that runs it does."""


_config_locks_held: dict[Path, int] = {}


@contextlib.contextmanager
def config_lock(workdir: Path):
    """Hold `workdir`'s config lock (re-entrant within a process): a test that changes a shared
    sweep's config.yaml for a moment holds it from the change to the restore, and every dry run
    (planned_jobs) holds it, so that a test on another xdist worker never plans against a config
    another test changed (the session sweep is read from both workers). The lock file lies beside
    the workdir, not in it."""
    key = Path(workdir).resolve()
    if _config_locks_held.get(key):
        _config_locks_held[key] += 1
        try:
            yield
        finally:
            _config_locks_held[key] -= 1
        return
    with open(key.parent / f"{key.name}.config.lock", "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        _config_locks_held[key] = 1
        try:
            yield
        finally:
            _config_locks_held[key] = 0  # closing the file releases the lock


def planned_jobs(workdir: Path) -> dict[str, int]:
    """Rule -> job count of a dry run ({} when there is nothing to do), under the workdir's
    config_lock."""
    with config_lock(workdir):
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
# The multi-task mode (rules/multi.smk): one run over an L1, an L2 and an L3 task with the copy control and the
# multi reference agent; their splits and baselines are the single-task runs' above.
MULTI_GRID = {
    "tasks": ["humaneval", "alpaca-eval", "alfworld"],
    "models": ["tiny"],
    "agents": ["copy", "multi-sft"],
    "seeds": [0],
    "mode": "multi",
}
MULTI_GROUP = "alfworld+alpaca-eval+humaneval"
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
SESSION_PLAN = {"run_agent": 2 + 5 + 2, "run_agent_multi": 2, "evaluate_baseline": 1 + 5 + 1}
# The control sweep on a copy of it: seeds 1 and 2 of both agents, the baseline kept.
CONTROLS_PLAN = {"run_agent": 2 * 2, "evaluate_baseline": None}


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
        "sweep": [GSM8K_GRID, LEVELS_GRID, MULTI_GRID, control_grid([0])],
        # the controls as the default sweep runs them: addition-control with its final split (scoring), which the
        # slow tier's control sweep (control_config) carries on, so that its seed 0 reruns nothing
        "tasks": {**SESSION_TASKS, CONTROL_TASK: default["tasks"][CONTROL_TASK]},
        "evaluation": {**default["evaluation"], "backend": "hf"},
    }


# The slow tier's controls: the default sweep's control grid on three seeds. They run on a copy of the
# session sweep's seed 0 (tests/conftest.py: controls_sweep), so only seeds 1 and 2 run.
CONTROL_SEEDS = [0, 1, 2]
CONTROL_TASK = "addition-control"


def control_config() -> dict:
    """The default sweep's control grid, budget and report, on CONTROL_SEEDS (the hf backend)."""
    default = default_config()
    return {**default, "sweep": control_grid(CONTROL_SEEDS), "evaluation": {**default["evaluation"], "backend": "hf"}}


def smollm2_gsm8k_config() -> dict:
    """SmolLM2-135M-Instruct on GSM8K's 8-shot prompts (about 1,550 tokens each) with the copy agent: the
    baseline and the final evaluation of 4 questions (the slow tier's real small model sweep)."""
    return {
        **TEST_CONFIG,
        "sweep": {**TEST_CONFIG["sweep"], "models": ["smollm2-135m-instruct"], "agents": ["copy"]},
        "tasks": {"gsm8k": {"source": "offline", "train_size": 16, "eval_size": 4, "max_new_tokens": 48}},
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
