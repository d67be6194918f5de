"""Run one agent under its budget: grader up, agent sandboxed, process tree killed at the deadline."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from rlbench import sandbox
from rlbench.attempts import RUN_MARKER, archive_previous_attempt, begin_attempt, marked_processes, previous_attempts
from rlbench.grader.app import Grader, GraderConfig
from rlbench.grader.server import GradingServer, new_secret
from rlbench.jsonio import read_json, write_json
from rlbench.ledger import is_scored
from rlbench.provenance import provenance
from rlbench.workspace import rebuild_workspace

REPO_ROOT = Path(__file__).resolve().parents[2]
AGENTS_DIR = REPO_ROOT / "scripts" / "agents"
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


@dataclass
class RunSpec:
    """One agent run: where it lives, what it may use, how long it has."""

    run_dir: Path
    workspace: Path
    task_settings: dict
    agent: dict
    hf_id: str
    eval_dir: Path
    baseline: dict  # score + fingerprint of the base model
    time_limit_s: float
    kill_grace_s: float = 10.0
    evaluation: dict = field(default_factory=dict)
    sandbox_backend: str = "auto"
    hidden_paths: list[Path] = field(default_factory=list)
    seed: int = 0
    threads: int = 1
    labels: dict = field(default_factory=dict)  # task/model/agent/seed for run.json
    data: dict = field(default_factory=dict)  # hashes of the splits, for provenance


@dataclass
class RunRecord:
    """run.json: what happened to one agent run."""

    status: str  # completed | failed | timeout | error | interrupted
    exit_code: int | None
    timed_out: bool
    start_time: float
    end_time: float
    duration_s: float
    time_limit_s: float
    submissions: int
    valid_submissions: int
    best: dict | None
    sandbox: str
    sandbox_note: str
    command: list[str]
    gpus: list[str]  # CUDA_VISIBLE_DEVICES given to the agent and the grader (by SLURM, say)
    attempt: int = 1
    previous_attempts: list[str] = field(default_factory=list)  # archived under attempts/<k>/
    error: str | None = None
    labels: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)


def visible_gpus() -> list[str]:
    """The GPUs this job may use, as the scheduler set CUDA_VISIBLE_DEVICES (empty on CPU)."""
    return [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]


def agent_command(agent: dict) -> list[str]:
    """The agent's argv with {python} and {agents_dir} filled in."""
    # Plain replacement, not str.format: shell snippets in commands carry JSON braces.
    return [
        part.replace("{python}", sys.executable).replace("{agents_dir}", str(AGENTS_DIR)) for part in agent["command"]
    ]


def readiness_problems(agent: dict) -> list[str]:
    """Why an agent cannot start here (missing binaries or key variables), if anything."""
    needs = agent.get("requires") or {}
    problems = [f"binary {b!r} not found on PATH" for b in needs.get("binaries", []) if shutil.which(b) is None]
    problems += [f"environment variable {v} is not set" for v in needs.get("env", []) if not os.environ.get(v)]
    return problems


def agent_env(spec: RunSpec, url: str, marker: str) -> dict:
    workspace = spec.workspace.resolve()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAKEMAKE")}
    env.update(OFFLINE_ENV)
    env.update({k: str(v) for k, v in (spec.agent.get("env") or {}).items()})
    cache = workspace / ".cache"
    env.update(
        TASK=spec.task_settings["name"],
        BASE_MODEL=spec.hf_id,
        WORKSPACE=str(workspace),
        MODEL_PATH=str(workspace / "models" / spec.hf_id),
        DATA_PATH=str(workspace / "data"),
        OUTPUT_DIR=str(workspace / "output"),
        GRADING_SERVER_URL=url,
        AGENT_SEED=str(spec.seed),
        OMP_NUM_THREADS=str(spec.threads),
        # Caches inside the workspace: the rest of the file system is read-only in the sandbox.
        HF_HOME=str(cache / "huggingface"),
        XDG_CACHE_HOME=str(cache),
        MPLCONFIGDIR=str(cache / "matplotlib"),
        TMPDIR="/tmp",
        PYTHONUNBUFFERED="1",
    )
    env[RUN_MARKER] = marker
    return env


def agent_processes(proc: subprocess.Popen, marker: str) -> list[psutil.Process]:
    """The agent, its descendants, and daemons it detached (found by the run marker in their env)."""
    found: dict[int, psutil.Process] = {}
    try:
        root = psutil.Process(proc.pid)
        found.update({p.pid: p for p in [root, *root.children(recursive=True)]})
    except psutil.NoSuchProcess:
        pass
    found.update({p.pid: p for p in marked_processes(marker)})
    return list(found.values())


def kill_tree(proc: subprocess.Popen, grace_s: float, marker: str) -> None:
    """SIGTERM the agent's session and every process of the run, then SIGKILL what is left after grace_s."""
    members = agent_processes(proc, marker)
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)  # the session leader's group: children that did not detach
        except (ProcessLookupError, PermissionError):
            pass
        for member in members:  # descendants that started their own session
            try:
                member.send_signal(sig)
            except psutil.NoSuchProcess:
                pass
        _, alive = psutil.wait_procs(members, timeout=grace_s if sig == signal.SIGTERM else 5)
        members = alive
        if not members:
            break
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


class Interrupted(Exception):
    """The runner itself was told to stop (SIGTERM/SIGINT), e.g. Snakemake cancelled the job."""


def _raise_interrupted(signum, frame) -> None:
    raise Interrupted(signal.Signals(signum).name)


def supervise(proc: subprocess.Popen, deadline: float, grace_s: float, marker: str) -> tuple[int | None, str]:
    """Wait for the agent until the deadline; returns (exit code, 'exited' | 'timeout' | 'interrupted').

    Whatever ends the wait, no process of the agent outlives this call.
    """
    handlers = {}
    if threading.current_thread() is threading.main_thread():
        handlers = {sig: signal.signal(sig, _raise_interrupted) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        return proc.wait(timeout=max(0.0, deadline - time.time())), "exited"
    except subprocess.TimeoutExpired:
        ending = "timeout"
    except Interrupted:
        ending = "interrupted"
    finally:
        for sig, handler in handlers.items():
            signal.signal(sig, handler)
    kill_tree(proc, grace_s, marker)
    return proc.returncode, ending


def run_agent(spec: RunSpec) -> RunRecord:
    """Run the agent to completion or deadline; always returns (and writes) a run record.

    When an earlier attempt of this run was interrupted, it is archived under attempts/<k>/
    (ledger included) and the agent starts again from a fresh workspace.
    """
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    if archive_previous_attempt(spec.run_dir) is not None:
        rebuild_workspace(read_json(spec.run_dir / "workspace.json"))
    grader_dir = spec.run_dir / "grader"
    command = agent_command(spec.agent)
    marker = new_secret()
    attempt = begin_attempt(spec.run_dir, marker)
    start = time.time()
    record_provenance = provenance(
        spec.task_settings,
        data=spec.data,
        models={"base": spec.baseline["fingerprint"]},
        evaluation=spec.evaluation,
    )
    grader = Grader(
        GraderConfig(
            workspace=spec.workspace.resolve(),
            grader_dir=grader_dir,
            task_settings=spec.task_settings,
            eval_dir=spec.eval_dir.resolve(),
            baseline_score=spec.baseline["score"],
            baseline_fingerprint=spec.baseline["fingerprint"],
            start_time=start,
            timeout_s=spec.time_limit_s,
            secret=new_secret(),
            evaluation=spec.evaluation,
            gpus=visible_gpus(),
            provenance=record_provenance,
        )
    )
    exit_code, timed_out, error, status = None, False, None, "error"
    plan = sandbox.SandboxPlan("none", command, "not started")
    problems = readiness_problems(spec.agent)
    log_path = spec.workspace / "agent.log"
    with GradingServer(grader) as server:
        if problems:
            error = f"agent {spec.agent['name']!r} is not ready: " + "; ".join(problems)
        else:
            try:
                plan = sandbox.plan(
                    command,
                    spec.workspace,
                    hidden=spec.hidden_paths,
                    readonly_inside=[spec.workspace / "data", spec.workspace / "models"],
                    backend=spec.sandbox_backend,
                    visible=[REPO_ROOT, Path(sys.prefix), Path(sys.base_prefix)],
                )
                with open(log_path, "ab") as log:
                    proc = subprocess.Popen(
                        plan.argv,
                        cwd=spec.workspace,
                        env=agent_env(spec, server.url, marker),
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                    exit_code, ending = supervise(proc, grader.config.deadline, spec.kill_grace_s, marker)
                timed_out = ending == "timeout"
                if ending == "exited":
                    status = "completed" if exit_code == 0 else "failed"
                else:
                    status = ending
            except (OSError, RuntimeError) as exc:
                error = f"could not start the agent: {exc}"
    end = time.time()
    grader.finish(end)  # run_meta.json's end_time: the agent has stopped, the server has drained
    scored = [e for e in grader.entries if is_scored(e)]
    record = RunRecord(
        status=status,
        exit_code=exit_code,
        timed_out=timed_out,
        start_time=start,
        end_time=end,
        duration_s=round(end - start, 3),
        time_limit_s=spec.time_limit_s,
        submissions=len(grader.entries),
        valid_submissions=len(scored),
        best=grader.best,
        sandbox=plan.backend,
        sandbox_note=plan.note,
        command=command,
        gpus=grader.config.gpus,
        attempt=attempt,
        previous_attempts=previous_attempts(spec.run_dir),
        error=error,
        labels=spec.labels,
        provenance=record_provenance,
    )
    write_json(spec.run_dir / "run.json", asdict(record))
    return record
