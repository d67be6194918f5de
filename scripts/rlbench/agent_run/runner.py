"""Run one agent under its budget: grader up, agent sandboxed, process tree killed at the deadline."""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from rlbench.proc import lifeline
from rlbench.sandbox import bubblewrap as sandbox
from rlbench.coding_agents.session import CliSession, scrub_provider_keys
from rlbench.agent_run.attempts import (
    RUN_MARKER,
    archive_previous_attempt,
    begin_attempt,
    kill_marked,
    marked_processes,
    previous_attempts,
    wait_gone,
)
from rlbench.grader.grading import Grader, GraderConfig
from rlbench.grader.server import GradingServer, new_secret
from rlbench.fileio.jsonio import read_json, write_json
from rlbench.recording.ledger import is_scored
from rlbench.recording.provenance import provenance
from rlbench.recording.trace import ResourceSampler, tree_of
from rlbench.agent_run.workspace import rebuild_workspace
from rlbench.paths import AGENTS_DIR, REPO_ROOT

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
# Where the host may keep downloaded data, held-out splits of hub tasks included (datasets caches the whole
# dataset, test split too). Hidden from the agent when set, and never passed on to it: its own caches live
# in its workspace.
HOST_CACHE_VARS = (
    "HF_HOME",
    "HF_DATASETS_CACHE",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_ASSETS_CACHE",
    "HF_XET_CACHE",
    "TRANSFORMERS_CACHE",
    "TORCH_HOME",
    "XDG_CACHE_HOME",
    "XDG_DATA_HOME",
)
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
PRIVATE_HOME = ".home"  # the agent's HOME, inside its workspace
SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh"})


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
    # What the task's evaluation may use beyond the split (tasks.base.EvalContext): judge_model_dir,
    # judgment_cache. Outside the workspace, hidden from the agent like the rest of results/.
    resources: dict = field(default_factory=dict)
    sandbox_backend: str = "auto"
    # sandbox.network: "isolated" (own network namespace; the grader and the agent's allow_ports bridged in) or
    # "host" (the host's network).
    network: str = "isolated"
    hidden_paths: list[Path] = field(default_factory=list)
    # Hidden like the repository, beside the home and caches: run_agent.py passes Snakemake's working directory
    # (its .snakemake/ metadata lists eval sizes and data seeds; with -d it is not the repository).
    masked_paths: list[Path] = field(default_factory=list)
    seed: int = 0
    threads: int = 1
    labels: dict = field(default_factory=dict)  # task/model/agent/seed for run.json
    data: dict = field(default_factory=dict)  # hashes of the splits, for provenance


@dataclass
class RunRecord:
    """run.json: what happened to one agent run."""

    status: str  # completed | failed | timeout | error | interrupted | stopped
    # The exit status of the process the runner started, as Popen reports it (negative: killed by that signal).
    # Backend none: the agent's command itself. Backend bubblewrap: bwrap, which passes on its command's exit
    # code, reports a command killed by signal n as 128+n, and is itself what the runner SIGKILLs at the end of
    # the grace period (then -9; every process in the sandbox dies with it).
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
    # The signal that ended the agent's command ("SIGKILL", "SIGTERM", ...), null when it exited by itself: from a
    # negative exit_code, and under bubblewrap also from 128+n (so there an agent that itself exits with 129-192
    # reads as signalled, as in a shell).
    exit_signal: str | None = None
    # Processes of the run (found by the run marker in their environment) still running once the agent's own
    # process had ended, or after its tree was killed at the deadline or interrupt: daemons it left behind.
    # All were SIGKILLed before run.json was written.
    stray_processes: int = 0
    # Why an interrupted run stopped: the signal the runner got, and whether the Snakemake that started it was gone.
    interrupted_by: str | None = None
    agent_kind: str = "script"  # script (a reference agent) or cli (a coding-agent tool driven by an LLM)
    # status "stopped": why the runner ended the run early ({"kind": "llm_endpoint_dead" | "llm_limit", "detail"}).
    stopped_by: dict | None = None
    # kind cli: the tool and its version, the driver (no key), limits, token totals (from the gateway) and usage as
    # the gateway and the tool's own log report it, where the prompt, the tool's logs and the transcript are.
    llm: dict | None = None
    # What the agent could reach: {"isolated": bool, "reachable": ["127.0.0.1:<port> (grader)", ...] or ["*"] when
    # it shared the host's network, "note": str}.
    network: dict = field(default_factory=dict)


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


def _host_homes(environ: Mapping[str, str]) -> list[str]:
    """The home in HOME and the user's home in the password database (they differ under sudo, or in tests)."""
    homes = [environ.get("HOME", "")]
    try:
        homes.append(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:  # a uid without a passwd entry (some containers)
        pass
    return homes


def masked_paths(extra: Sequence[Path] = (), environ: Mapping[str, str] = os.environ) -> list[Path]:
    """What the sandbox hides behind empty tmpfs: the repository (`.snakemake/` metadata with eval sizes and data
    seeds, `config/`, the tasks' private code that generates held-out splits), `extra`, the host's home and every
    cache location set in the environment (a prepared hub task leaves its test split in the datasets cache)."""
    caches = [environ.get(v, "") for v in HOST_CACHE_VARS]
    # /var/tmp outlives reboots and is shared by every user and run: other runs' leftovers sit there.
    candidates = [str(REPO_ROOT), *map(str, extra), *_host_homes(environ), *caches, "/var/tmp"]
    return [Path(c) for c in candidates if c and os.path.isabs(c)]


def visible_paths() -> list[Path]:
    """What the agent's command needs from under the masks, bound back read-only: the interpreter prefixes (the
    venv may live in the repository, the base interpreter in the home) and the reference agents' code."""
    prefixes = (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
    return [*(Path(p) for p in prefixes), AGENTS_DIR]


def refuse_provider_key(env: Mapping[str, str], argv: Sequence[str], driver: dict | None) -> None:
    """Raise if the driver's real key would reach the sandbox (in an adapter's env or argv): only the gateway holds it."""
    key_env = (driver or {}).get("key_env")
    secret = os.environ.get(key_env, "") if key_env else ""
    if len(secret) >= 8 and (any(secret in v for v in env.values()) or any(secret in a for a in argv)):
        raise RuntimeError(f"the adapter would pass the provider key ({key_env}) into the sandbox; refused")


def agent_env(spec: RunSpec, url: str, marker: str) -> dict:
    """The agent's environment: the host's, minus Snakemake's and the host's cache locations, plus the contract."""
    workspace = spec.workspace.resolve()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SNAKEMAKE") and k not in HOST_CACHE_VARS}
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
        # A private home: the host's is hidden in the sandbox, and tools write dotfiles and caches there.
        HOME=str(workspace / PRIVATE_HOME),
        # Caches inside the workspace: the rest of the file system is read-only in the sandbox.
        HF_HOME=str(cache / "huggingface"),
        XDG_CACHE_HOME=str(cache),
        MPLCONFIGDIR=str(cache / "matplotlib"),
        TMPDIR="/tmp",
        PYTHONUNBUFFERED="1",
    )
    # Loopback never goes through a proxy (the grader, the gateway and bridged ports are all on 127.0.0.1); in an
    # isolated sandbox no proxy is reachable anyway, so none is passed on.
    if spec.network == "isolated":
        for var in PROXY_VARS:
            env.pop(var, None)
    local = "127.0.0.1,localhost,::1"
    for var in ("NO_PROXY", "no_proxy"):
        env[var] = ",".join(filter(None, [env.get(var), local]))
    # The run's interpreter first: a bare `python` in an agent's shell gets the packages it was promised
    # (the host's own PATH may lead to shims under the now hidden home).
    env["PATH"] = os.pathsep.join(filter(None, [str(Path(sys.executable).parent), env.get("PATH")]))
    env[RUN_MARKER] = marker
    return env


def agent_processes(proc: subprocess.Popen, marker: str) -> list[psutil.Process]:
    """The agent's processes but its root (proc): descendants, and daemons it detached (found by the run marker).

    The root is left out: only its Popen may wait for it (see kill_tree).
    """
    found: dict[int, psutil.Process] = {}
    try:
        found.update({p.pid: p for p in psutil.Process(proc.pid).children(recursive=True)})
    except psutil.NoSuchProcess:
        pass
    found.update({p.pid: p for p in marked_processes(marker)})
    found.pop(proc.pid, None)
    return list(found.values())


def _signal_all(members: list[psutil.Process], sig: int) -> None:
    for member in members:
        try:
            member.send_signal(sig)
        except psutil.NoSuchProcess:
            pass


def _wait_tree(proc: subprocess.Popen, members: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until the root has exited (reaped by its Popen) and the other members are gone; returns those alive."""
    end = time.monotonic() + timeout_s
    while True:
        alive = wait_gone(members, 0)
        if (proc.poll() is not None and not alive) or time.monotonic() >= end:
            return alive
        time.sleep(0.05)


def kill_tree(proc: subprocess.Popen, grace_s: float, marker: str, wrapped: bool = False) -> None:
    """SIGTERM the agent's processes, SIGKILL what is left after grace_s; returns once they are gone.

    The root is waited for by its Popen only: psutil.wait_procs would reap it first, and Popen would then record
    exit code 0 for an agent it never saw exit. `wrapped`: the root is bwrap and its only child the sandbox's
    init. They get no SIGTERM (bwrap would die of it at once and take the sandbox with it, leaving the agent no
    grace); the agent's processes inside do. SIGKILL goes to bwrap first, which ends everything in the sandbox.
    """
    wrappers = {proc.pid}
    if wrapped:
        try:
            wrappers.update(child.pid for child in psutil.Process(proc.pid).children())
        except psutil.NoSuchProcess:
            pass
    else:
        try:
            os.killpg(proc.pid, signal.SIGTERM)  # the session leader's group: the root, children that did not detach
            if os.getpgid(proc.pid) != proc.pid:  # the root left its own group
                proc.send_signal(signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            pass
    members = agent_processes(proc, marker)
    _signal_all([m for m in members if m.pid not in wrappers], signal.SIGTERM)  # also those that started a session
    if not _wait_tree(proc, members, grace_s) and proc.returncode is not None:
        return
    proc.kill()  # no-op once Popen has seen it exit
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    members = agent_processes(proc, marker)  # with what was started during the grace period
    _signal_all(members, signal.SIGKILL)
    _wait_tree(proc, members, 10)
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        pass


def exit_signal(returncode: int | None, wrapped: bool = False) -> str | None:
    """The signal that ended the agent's command, from the runner's exit status; None when it exited by itself.

    Popen reports a process killed by signal n as -n; bwrap (`wrapped`) reports its command killed by n as 128+n.
    """
    if returncode is None:
        return None
    number = -returncode if returncode < 0 else returncode - 128 if wrapped and 128 < returncode < 128 + 65 else 0
    if number <= 0:
        return None
    try:
        return signal.Signals(number).name
    except ValueError:  # a real-time signal
        return f"SIG{number}"


class Interrupted(Exception):
    """The runner itself was told to stop (SIGTERM/SIGINT), e.g. Snakemake cancelled the job or died."""


# The process whose death stops this runner (set by stop_with_owner), named in an interrupted run's record.
_OWNER: psutil.Process | None = None


def _owner_gone() -> bool:
    if _OWNER is None:
        return False
    try:
        return not _OWNER.is_running() or _OWNER.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


class StopRequest:
    """SIGTERM/SIGINT to the runner while a run is on.

    Raised as Interrupted only while the runner waits for the agent (an exception anywhere else could leave the
    grader or the record half done); at any other moment it is remembered: the agent is then not started, or
    the run ends as usual with status interrupted. Either way the agent's processes are stopped and run.json is
    written.
    """

    def __init__(self) -> None:
        self.reason: str | None = None
        self.waiting = False
        self._previous: dict = {}

    def __call__(self, signum: int, frame) -> None:
        if self.reason is None:
            self.reason = signal.Signals(signum).name
            if _owner_gone():
                self.reason += f" (the process that started the runner, pid {_OWNER.pid}, is gone)"
        if self.waiting:
            self.waiting = False
            raise Interrupted(self.reason)

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            self._previous = {sig: signal.signal(sig, self) for sig in (signal.SIGTERM, signal.SIGINT)}
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)


def supervise(
    proc: subprocess.Popen,
    deadline: float,
    grace_s: float,
    marker: str,
    stop: StopRequest | None = None,
    wrapped: bool = False,
    check: Callable[[], object] | None = None,
    check_every_s: float = 1.0,
) -> tuple[int | None, str]:
    """Wait for the agent until the deadline; returns (exit code, 'exited' | 'timeout' | 'interrupted' | 'stopped').

    Whatever ends the wait, no process of the agent's tree outlives this call (detached daemons are left to the
    run's final sweep of the marker). `stop`: an installed StopRequest (one is installed for the call if None).
    `check`: polled every check_every_s while the agent runs; a true value ends the run now ('stopped'), e.g.
    the LLM gateway saying the driver endpoint is dead or a limit is reached.
    """
    if stop is None:
        with StopRequest() as own:
            return supervise(proc, deadline, grace_s, marker, own, wrapped, check, check_every_s)
    ending = "timeout"
    try:
        stop.waiting = True
        try:
            if stop.reason is not None:  # the signal came before the wait began
                raise Interrupted(stop.reason)
            while True:
                remaining = max(0.0, deadline - time.time())
                try:
                    return proc.wait(timeout=min(remaining, check_every_s) if check else remaining), "exited"
                except subprocess.TimeoutExpired:
                    if time.time() >= deadline:
                        raise
                if check is not None and check():
                    ending = "stopped"
                    break
        finally:
            stop.waiting = False
    except subprocess.TimeoutExpired:
        ending = "timeout"
    except Interrupted:
        ending = "interrupted"
    kill_tree(proc, grace_s, marker, wrapped)
    return proc.returncode, ending


def stop_strays(marker: str, wrapped: bool) -> int:
    """Kill whatever of the run still runs after its agent ended; returns how many processes that was."""
    if wrapped:  # the kernel is already ending the sandbox's PID namespace: let it finish before counting
        wait_gone(marked_processes(marker), 2)
    return kill_marked(marker)


def stop_with_owner(interval_s: float = 0.5) -> psutil.Process:
    """Make the runner stop its run (agent stopped, run.json written, exit) when its Snakemake dies; returns
    the process watched.

    How Snakemake starts this script (checked with Snakemake 9.27 and bash 5.2, local executor): a `script:` job
    runs in a worker thread of the Snakemake process, whose shell() starts `bash -c "set -euo pipefail; <python>
    .snakemake/scripts/tmpXXXX.run_agent.py"` in Snakemake's own process group (no new session); bash 5.1+
    execs its last command, so the runner's parent is the Snakemake process itself. On SLURM, the job's own
    `python -m snakemake` on the node runs it the same way. With an older bash, or a prefix such as conda's
    activation, the shell may stay in between, and a shell outlives a kill -9 of the Snakemake above it: so
    the process watched is the nearest ancestor that is not a shell.

    Two lifelines, both ending in a SIGTERM to the runner, which run_agent handles as an interruption: the
    kernel's parent-death signal (immediate; it fires when the parent *thread* that started us exits, and
    Snakemake's worker thread lives as long as the job), and a watchdog thread for the ancestor.
    """
    global _OWNER
    parent = psutil.Process(os.getppid())
    lifeline.die_with_parent(parent.pid, signal.SIGTERM)
    owner = parent
    try:
        while owner.name() in SHELLS and owner.parent() is not None and owner.parent().pid > 1:
            owner = owner.parent()
    except psutil.NoSuchProcess:
        pass
    _OWNER = owner

    def watch() -> None:
        while not _owner_gone() and (owner.pid != parent.pid or os.getppid() == parent.pid):
            time.sleep(interval_s)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="owner-watchdog", daemon=True).start()
    return owner


def run_agent(spec: RunSpec) -> RunRecord:
    """Run the agent to completion or deadline; always returns (and writes) a run record.

    When an earlier attempt of this run was interrupted, it is archived under attempts/<k>/
    (ledger included) and the agent starts again from a fresh workspace. A SIGTERM/SIGINT to the runner
    stops the agent and ends the run with status interrupted. At the end of every run, whatever the
    outcome, every process carrying the run's marker is killed.
    """
    with StopRequest() as stop:
        return _run_agent(spec, stop)


def _run_agent(spec: RunSpec, stop: StopRequest) -> RunRecord:
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    if archive_previous_attempt(spec.run_dir) is not None:
        rebuild_workspace(read_json(spec.run_dir / "workspace.json"))
    grader_dir = spec.run_dir / "grader"
    command = agent_command(spec.agent) if spec.agent.get("kind") != "cli" else []  # cli: planned by its adapter
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
            baseline_metrics=spec.baseline,
            resources=spec.resources,
            gpus=visible_gpus(),
            provenance=record_provenance,
        )
    )
    grader.warm_up()  # the evaluation worker imports torch while the agent starts
    exit_code, timed_out, error, status, strays = None, False, None, "error", 0
    plan = sandbox.SandboxPlan("none", command, "not started")
    cli = None
    if spec.agent.get("kind") == "cli":  # a coding-agent tool driven by an LLM through the run's gateway
        cli = CliSession(spec.agent, spec.workspace, spec.run_dir, spec.time_limit_s, spec.workspace / PRIVATE_HOME)
        problems = cli.readiness()
    else:
        problems = readiness_problems(spec.agent)
    stopped_by: dict | None = None
    log_path = spec.workspace / "agent.log"
    with GradingServer(grader) as server:
        if problems:
            error = f"agent {spec.agent['name']!r} is not ready: " + "; ".join(problems)
        elif stop.reason is not None:
            status = "interrupted"
        else:
            proc = None
            try:
                with ExitStack() as running:
                    env = scrub_provider_keys(agent_env(spec, server.url, marker), spec.agent.get("driver"))
                    visible = visible_paths()
                    stdout_path, stderr_path = log_path, None
                    if cli is not None:
                        running.enter_context(cli)  # gateway up, launch planned, the tool's files written
                        command = cli.argv
                        env.update(cli.env)
                        refuse_provider_key(env, command, spec.agent.get("driver"))
                        visible += cli.visible
                        stdout_path, stderr_path = cli.stdout_path, cli.stderr_path
                    plan = sandbox.plan(
                        command,
                        spec.workspace,
                        hidden=spec.hidden_paths,
                        readonly_inside=[spec.workspace / "data", spec.workspace / "models"],
                        backend=spec.sandbox_backend,
                        visible=visible,
                        masked=masked_paths(spec.masked_paths),
                        network=sandbox.network_policy(
                            spec.network,
                            spec.run_dir / "net",
                            {server.port: "grader", **(cli.ports if cli is not None else {})},
                            extra=(spec.agent.get("network") or {}).get("allow_ports", []),
                        ),
                    )
                    running.enter_context(plan.bridge())  # the network bridge's host side, while the agent runs
                    (spec.workspace / PRIVATE_HOME).mkdir(exist_ok=True)
                    log = running.enter_context(open(stdout_path, "ab"))
                    err = running.enter_context(open(stderr_path, "ab")) if stderr_path else subprocess.STDOUT
                    proc = subprocess.Popen(
                        plan.argv,
                        cwd=spec.workspace,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=err,
                        start_new_session=True,
                    )
                    # CPU, RAM, disk (and GPU memory where nvidia-smi exists) of the agent, sampled while it runs.
                    running.enter_context(
                        ResourceSampler(
                            lambda: tree_of(proc.pid) + agent_processes(proc, marker),
                            spec.workspace,
                            spec.run_dir / "resources.jsonl",
                            interval_s=5,
                        )
                    )
                    reason: list = []
                    watch = None
                    if cli is not None:
                        watch = lambda: reason.append(cli.stop_reason()) or reason[-1]  # noqa: E731
                    exit_code, ending = supervise(
                        proc,
                        grader.config.deadline,
                        spec.kill_grace_s,
                        marker,
                        stop,
                        plan.backend == "bubblewrap",
                        check=watch,
                    )
                    if ending == "stopped":
                        kind, detail = reason[-1]
                        stopped_by = {"kind": kind, "detail": detail}
                        error = f"the run was stopped: {detail}"
                timed_out = ending == "timeout"
                if ending == "exited":
                    status = "completed" if exit_code == 0 else "failed"
                else:
                    status = ending
            except (OSError, RuntimeError) as exc:
                error = f"could not start the agent: {exc}"
            finally:
                if proc is not None and proc.poll() is None:  # an unexpected exception left it running
                    kill_tree(proc, spec.kill_grace_s, marker, plan.backend == "bubblewrap")
                strays = stop_strays(marker, plan.backend == "bubblewrap")
        if status == "interrupted":  # nobody waits for the answers of evaluations still in flight
            server.drain_timeout_s = spec.kill_grace_s
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
        exit_signal=exit_signal(exit_code, plan.backend == "bubblewrap"),
        stray_processes=strays,
        interrupted_by=stop.reason if status == "interrupted" else None,
        agent_kind=spec.agent.get("kind", "script"),
        stopped_by=stopped_by,
        network=plan.network,
    )
    if cli is not None:
        record.llm = cli.record()
    write_json(spec.run_dir / "run.json", asdict(record))
    return record
