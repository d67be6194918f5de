"""Machinery of the fault-injection suite (tests/test_fault_injection.py).

A trial copies a prepared workdir (data, model, baseline, workspace: everything before run_agent),
starts the sweep as `make run` does (the local profile), kills -9 one part of it at a chosen
moment, lets things settle, resumes as `make resume` does (`snakemake --unlock`, then the profile
again) and audits what is left: acknowledged submissions against the ledgers, ledger lines,
processes and ports.

The parts, as they run (Snakemake's local executor runs a `script:` job as its direct child):

    snakemake (main)                        the process `make run` starts
      └─ runner (scripts/run_agent.py)      grading server thread; attempt.json names it
           ├─ agent (bwrap ─ bwrap ─ python) own session; every process carries the run marker
           └─ python -m rlbench.evaluation        the warm evaluation worker (rlbench.evaluation.workers), or one
                                            per submission (evaluation.worker: fresh)

Everything here only ever signals processes that belong to the trial: found by the trial's
workdir (their cwd), by an attempt's marker, or as the runner an attempt.json names.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import yaml

from rlbench.agent_run.attempts import marked_processes
from rlbench.coding_agents.adapters.base import read_jsonl_events
from support.workflow import REPO, SFT_RUN, SNAKEMAKE_ENV, snakemake_argv

PROFILE = REPO / "workflow" / "profiles" / "local"
RUN_REL = SFT_RUN
EVAL_MODULE = "rlbench.evaluation"
# agent_env.submit() logs every response it got: "submit output/v1 -> HTTP 200: {json}".
RESPONSE_LINE = re.compile(r"\bsubmit (?P<path>.+?) -> HTTP (?P<code>\d{3}): (?P<body>.*)$")
SNAPSHOT_ID = re.compile(r"snapshots/(\d+)/eval/")
POLL_S = 0.25

# How long a part may outlive the part it depends on before it counts as left behind.
EVAL_ORPHAN_GRACE_S = 3.0  # an evaluation child after its grader (the runner) died: PR_SET_PDEATHSIG
AGENT_ORPHAN_GRACE_S = 5.0  # agent processes after their runner died: bwrap --die-with-parent
RUNNER_ORPHAN_EXTRA_S = 10.0  # a runner after its Snakemake died: kill_grace_s plus this (watchdog)


@dataclass
class Plan:
    """One trial, fully determined by (seed, target, index)."""

    trial: str
    target: str  # snakemake | runner | agent | eval_child
    event: str  # delay (from the runner's start) | first_ledger_entry | eval_child (one exists)
    delay_s: float  # after the event
    variant: str  # agent: root | main | tree; the others: pid
    time_limit_s: int
    kill_grace_s: int = 2

    def describe(self) -> str:
        what = self.target if self.variant == "pid" else f"{self.target}/{self.variant}"
        return f"kill -9 {what} {self.delay_s:.1f}s after {self.event} (budget {self.time_limit_s}s)"


# -- processes ------------------------------------------------------------------------------------


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def same_process(pid: int | None, create_time: float | None) -> psutil.Process | None:
    """The process pid, if it is still the one created at create_time (pids are reused) and alive."""
    if pid is None:
        return None
    try:
        proc = psutil.Process(pid)
        if create_time is not None and abs(proc.create_time() - create_time) > 1:
            return None
        return proc if _alive(proc) else None
    except psutil.NoSuchProcess:
        return None


def _inside(path: str | None, root: Path) -> bool:
    if not path:
        return False
    path = path.removesuffix(" (deleted)")
    return path == str(root) or path.startswith(str(root) + os.sep)


def processes_in(workdir: Path) -> list[psutil.Process]:
    """Live processes working in the trial's directory (runner, agent, evaluations, Snakemake jobs)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and _inside(proc.cwd(), workdir) and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def evaluation_children(workdir: Path) -> list[psutil.Process]:
    found = []
    for proc in processes_in(workdir):
        try:
            if EVAL_MODULE in proc.cmdline():
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def current_submission(proc: psutil.Process) -> int | None:
    """The submission an evaluation process is evaluating now: named in a fresh child's argv, or,
    for a warm worker (rlbench.evaluation.workers), by the eval.log of that submission it writes to while it
    evaluates (its stdout and stderr go back to its own log in between). None: it is idle."""
    try:
        match = SNAPSHOT_ID.search(" ".join(proc.cmdline()))
        if match is None:
            match = next(filter(None, (SNAPSHOT_ID.search(f.path) for f in proc.open_files())), None)
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return None
    return int(match.group(1)) if match else None


def describe(proc: psutil.Process) -> str:
    try:
        return f"pid {proc.pid} {' '.join(proc.cmdline())[:120]}"
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return f"pid {proc.pid}"


def short_name(proc: psutil.Process) -> str:
    """bwrap, sft_agent.py, run_agent.py, snakemake, rlbench.evaluation...: what the process runs."""
    argv = _cmdline(proc)
    if not argv or _name(proc) == "bwrap":
        return _name(proc) or f"pid {proc.pid}"
    for i, arg in enumerate(argv[1:], 1):
        if arg == "-m" and i + 1 < len(argv):
            return argv[i + 1]
        if arg.endswith(".py"):
            return Path(arg).name
    return Path(argv[0]).name


def listening_port(proc: psutil.Process) -> int | None:
    try:
        for conn in proc.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN:
                return conn.laddr.port
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        pass
    return None


def port_accepts(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def port_owner(port: int) -> int | None:
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port:
                return conn.pid
    except psutil.AccessDenied:
        pass
    return None


# -- watching a sweep -----------------------------------------------------------------------------


@dataclass
class AttemptSeen:
    attempt: int
    marker: str
    runner_pid: int
    runner_create_time: float
    started: float
    parent_pid: int | None = None  # the runner's parent when first seen: the Snakemake that started it
    port: int | None = None
    orphaned_at: float | None = None  # first seen with another parent
    ended_at: float | None = None  # first seen gone
    agents_checked: float = 0.0  # when its marked processes were last looked for


@dataclass
class EvalSeen:
    pid: int
    create_time: float
    submission_id: int | None
    attempt: int | None
    parent_pid: int
    parent_create_time: float | None
    first_seen: float
    orphaned_at: float | None = None
    ended_at: float | None = None


class Watch:
    """Polls one trial's workdir: attempts and their runners and ports, evaluation children, and
    which part outlived the part it depends on (`violations`)."""

    def __init__(self, workdir: Path, kill_grace_s: float):
        self.workdir = workdir
        self.run_dir = workdir / RUN_REL
        self.runner_grace_s = kill_grace_s + RUNNER_ORPHAN_EXTRA_S
        self.attempts: dict[str, AttemptSeen] = {}
        self.evals: dict[int, EvalSeen] = {}
        self.violations: dict[str, str] = {}

    @property
    def current(self) -> AttemptSeen | None:
        return max(self.attempts.values(), key=lambda a: a.started, default=None)

    def poll(self) -> None:
        now = time.time()
        self._read_attempt(now)
        for seen in self.attempts.values():
            self._check_runner(seen, now)
        self._check_evaluations(now)

    def _read_attempt(self, now: float) -> None:
        try:
            info = json.loads((self.run_dir / "attempt.json").read_text())
        except (OSError, ValueError):
            return
        if info.get("marker") in self.attempts:
            return
        seen = AttemptSeen(info["attempt"], info["marker"], info["runner_pid"], info["runner_create_time"], info["started"])
        runner = same_process(seen.runner_pid, seen.runner_create_time)
        if runner is None:
            seen.ended_at = now
        else:
            try:
                seen.parent_pid = runner.ppid()
            except psutil.NoSuchProcess:
                seen.ended_at = now
        self.attempts[seen.marker] = seen

    def _check_runner(self, seen: AttemptSeen, now: float) -> None:
        if seen.ended_at is not None:
            if now - seen.ended_at <= AGENT_ORPHAN_GRACE_S or now - seen.agents_checked < 1.0:
                return
            seen.agents_checked = now  # a full scan of /proc: at most once a second
            alive = [p for p in marked_processes(seen.marker) if _alive(p)]
            for proc in alive:
                self.violations.setdefault(
                    f"agent:{proc.pid}",
                    f"agent process {describe(proc)} (attempt {seen.attempt}) outlived its runner by > {AGENT_ORPHAN_GRACE_S:.0f}s",
                )
            return
        runner = same_process(seen.runner_pid, seen.runner_create_time)
        if runner is None:
            seen.ended_at = now
            return
        if seen.port is None:
            seen.port = listening_port(runner)
        try:
            parent = runner.ppid()
        except psutil.NoSuchProcess:
            seen.ended_at = now
            return
        if seen.parent_pid is not None and parent != seen.parent_pid and seen.orphaned_at is None:
            seen.orphaned_at = now
        if seen.orphaned_at is not None and now - seen.orphaned_at > self.runner_grace_s:
            self.violations.setdefault(
                f"runner:{seen.runner_pid}",
                f"runner pid {seen.runner_pid} (attempt {seen.attempt}) ran on > {self.runner_grace_s:.0f}s "
                "after the Snakemake that started it was killed",
            )

    def _attempt_of(self, parent_pid: int) -> int | None:
        for seen in self.attempts.values():
            if seen.runner_pid == parent_pid:
                return seen.attempt
        return None

    def _check_evaluations(self, now: float) -> None:
        live = set()
        for proc in evaluation_children(self.workdir):
            live.add(proc.pid)
            if proc.pid in self.evals:  # a warm worker moves from submission to submission
                self.evals[proc.pid].submission_id = current_submission(proc)
                continue
            try:
                parent = proc.ppid()
                created = proc.create_time()
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            try:
                parent_created = psutil.Process(parent).create_time()
            except psutil.NoSuchProcess:
                parent_created = None
            self.evals[proc.pid] = EvalSeen(
                proc.pid, created, current_submission(proc), self._attempt_of(parent), parent, parent_created, now
            )
        for seen in self.evals.values():
            if seen.ended_at is not None:
                continue
            if seen.pid not in live or same_process(seen.pid, seen.create_time) is None:
                seen.ended_at = now
                continue
            if seen.orphaned_at is None and same_process(seen.parent_pid, seen.parent_create_time) is None:
                seen.orphaned_at = now
            if seen.orphaned_at is not None and now - seen.orphaned_at > EVAL_ORPHAN_GRACE_S:
                self.violations.setdefault(
                    f"eval:{seen.pid}",
                    f"evaluation child pid {seen.pid} (submission {seen.submission_id}) ran on "
                    f"> {EVAL_ORPHAN_GRACE_S:.0f}s after its grader (runner pid {seen.parent_pid}) died",
                )

    def live_evaluations(self) -> list[EvalSeen]:
        """Evaluation processes evaluating a submission now (an idle warm worker is not one)."""
        return [
            e
            for e in self.evals.values()
            if e.ended_at is None and e.submission_id is not None and same_process(e.pid, e.create_time)
        ]

    def ledger_has_entries(self) -> bool:
        try:
            return (self.run_dir / "grader" / "ledger.jsonl").stat().st_size > 0
        except OSError:
            return False

    def sleep(self, seconds: float, until=None) -> bool:
        """Poll for `seconds` (or until until() is true); returns whether until() became true."""
        end = time.time() + seconds
        while True:
            self.poll()
            if until is not None and until():
                return True
            if time.time() >= end:
                return False
            time.sleep(POLL_S)


# -- auditing -------------------------------------------------------------------------------------


def attempt_dirs(run_dir: Path) -> list[Path]:
    """Every attempt's directory: archived ones (attempts/<k>/) first, then the current one."""
    root = run_dir / "attempts"
    archived = sorted((p for p in root.iterdir() if p.name.isdigit()), key=lambda p: int(p.name)) if root.is_dir() else []
    return [*archived, run_dir]


def attempt_infos(run_dir: Path) -> list[dict]:
    infos = []
    for directory in attempt_dirs(run_dir):
        try:
            infos.append(json.loads((directory / "attempt.json").read_text()))
        except (OSError, ValueError):
            pass
    return infos


def leftovers(workdir: Path, watch: Watch) -> list[str]:
    """Whatever of the trial still runs or listens: runners, marked processes, processes working in
    the workdir, evaluation children, grading ports that accept connections."""
    items: dict[str, str] = {}
    infos = {a.marker: (a.attempt, a.runner_pid, a.runner_create_time) for a in watch.attempts.values()}
    for info in attempt_infos(watch.run_dir):
        infos.setdefault(info["marker"], (info["attempt"], info["runner_pid"], info["runner_create_time"]))
    ours: set[int] = set()
    for marker, (attempt, pid, created) in infos.items():
        runner = same_process(pid, created)
        if runner is not None:
            ours.add(pid)
            items[f"pid:{pid}"] = f"runner {describe(runner)} (attempt {attempt})"
        for proc in marked_processes(marker):
            if _alive(proc):
                ours.add(proc.pid)
                items.setdefault(f"pid:{proc.pid}", f"agent process {describe(proc)} (attempt {attempt})")
    for proc in processes_in(workdir):
        ours.add(proc.pid)
        kind = "evaluation child" if any(EVAL_MODULE == part for part in _cmdline(proc)) else "process"
        items.setdefault(f"pid:{proc.pid}", f"{kind} {describe(proc)}")
    for seen in watch.attempts.values():
        if seen.port is not None and port_accepts(seen.port):
            owner = port_owner(seen.port)
            if owner is None or owner in ours or owner == seen.runner_pid:
                items[f"port:{seen.port}"] = f"grading port {seen.port} (attempt {seen.attempt}) still accepts connections"
    return sorted(items.values())


def _cmdline(proc: psutil.Process) -> list[str]:
    try:
        return proc.cmdline()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return []


def settle(workdir: Path, watch: Watch, timeout_s: float) -> list[str]:
    """Wait (polling) until nothing of the trial is left, at most timeout_s; returns what is left."""
    end = time.time() + timeout_s
    while True:
        watch.poll()
        left = leftovers(workdir, watch)
        if not left or time.time() >= end:
            return left
        time.sleep(0.5)


def audit_submissions(run_dir: Path) -> dict:
    """Every response an agent logged (all attempts) against that attempt's ledger; ledger lines."""
    report = {"acknowledged": 0, "lost": [], "torn_log_lines": 0, "invalid_ledger_lines": [], "duplicate_ids": [], "responses": []}
    for directory in attempt_dirs(run_dir):
        label = "current" if directory == run_dir else f"attempts/{directory.name}"
        try:
            attempt_no = json.loads((directory / "attempt.json").read_text())["attempt"]
        except (OSError, ValueError, KeyError):
            attempt_no = None
        entries: dict[int, dict] = {}
        ledger = directory / "grader" / "ledger.jsonl"
        if ledger.exists():
            for number, line in enumerate(ledger.read_text(errors="replace").splitlines(), 1):
                try:
                    entry = json.loads(line)
                    if not isinstance(entry, dict):
                        raise ValueError("not a JSON object")
                except ValueError as exc:
                    report["invalid_ledger_lines"].append(f"{label} ledger line {number}: {exc}: {line[:120]!r}")
                    continue
                sid = entry.get("submission_id")
                if sid in entries:
                    report["duplicate_ids"].append(f"{label} ledger: submission_id {sid} recorded twice")
                entries[sid] = entry
        log = directory / "workspace" / "agent.log"
        if not log.exists():
            continue
        for line in log.read_text(errors="replace").splitlines():
            match = RESPONSE_LINE.search(line)
            if match is None:
                continue
            try:
                body = json.loads(match.group("body"))
            except ValueError:
                report["torn_log_lines"] += 1  # the agent was killed while writing the line
                continue
            report["acknowledged"] += 1
            sid = body.get("submission_id") if isinstance(body, dict) else None
            code = int(match.group("code"))
            report["responses"].append({"attempt": label, "attempt_no": attempt_no, "submission_id": sid, "http": code, "status": body.get("status")})
            entry = entries.get(sid)
            if entry is None:
                report["lost"].append(f"{label}: HTTP {code} for submission {sid} ({match.group('path')}) is not in the ledger")
            elif (entry.get("status"), entry.get("score")) != (body.get("status"), body.get("score")):
                report["lost"].append(
                    f"{label}: submission {sid} answered {body.get('status')}/{body.get('score')} "
                    f"but the ledger says {entry.get('status')}/{entry.get('score')}"
                )
    return report


def ledger_entries(directory: Path) -> list[dict]:
    """An attempt directory's readable ledger entries (a torn line is the audit's to report)."""
    return read_jsonl_events(directory / "grader" / "ledger.jsonl")


def ledger_entry(run_dir: Path, attempt: int | None, submission_id: int | None) -> dict | None:
    for directory in attempt_dirs(run_dir):
        try:
            if json.loads((directory / "attempt.json").read_text())["attempt"] != attempt:
                continue
        except (OSError, ValueError, KeyError):
            continue
        for entry in ledger_entries(directory):
            if entry.get("submission_id") == submission_id:
                return entry
    return None


# -- a trial --------------------------------------------------------------------------------------


def prepare_copy(template: Path, workdir: Path, config: dict) -> None:
    shutil.copytree(template, workdir, symlinks=True)
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config))


def start_sweep(workdir: Path, log_path: Path) -> subprocess.Popen:
    """The sweep as `make run` starts it (the local profile), in a session of its own."""
    with open(log_path, "ab") as log:
        return subprocess.Popen(
            snakemake_argv(workdir, "--profile", str(PROFILE), "--cores", "2"),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=SNAKEMAKE_ENV,
            start_new_session=True,
        )


def wait_sweep(sweep: subprocess.Popen, watch: Watch, timeout_s: float) -> int | None:
    """Poll until the sweep exits; its exit code, or None when it ran past timeout_s."""
    watch.sleep(timeout_s, until=lambda: sweep.poll() is not None)
    return sweep.poll()


def _victims(plan: Plan, sweep: subprocess.Popen, watch: Watch, tried: set[int]) -> list[psutil.Process]:
    current = watch.current
    if plan.target == "snakemake":
        proc = same_process(sweep.pid, None)
        return [proc] if proc is not None and sweep.poll() is None else []
    if current is None:
        return []
    runner = same_process(current.runner_pid, current.runner_create_time)
    if plan.target == "runner":
        return [runner] if runner is not None else []
    if plan.target == "eval_child":
        victims = [
            p
            for e in watch.live_evaluations()
            if (e.pid, e.submission_id) not in tried and (p := same_process(e.pid, e.create_time))
        ]
        return [p for p in victims if current_submission(p) is not None]  # still evaluating, just before the kill
    agent = [p for p in marked_processes(current.marker) if _alive(p)]
    if plan.variant == "tree":
        return agent
    if plan.variant == "root":  # what the runner started (the outer bwrap, or the agent itself)
        return [p for p in agent if runner is not None and _ppid(p) == runner.pid]
    # main: the agent's own interpreter, inside the sandbox (bwrap's argv names the script too)
    mains = [p for p in agent if _name(p) != "bwrap" and "sft_agent.py" in " ".join(_cmdline(p))]
    return [p for p in mains if _ppid(p) not in {m.pid for m in mains}]


def _name(proc: psutil.Process) -> str:
    try:
        return proc.name()
    except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
        return ""


def _ppid(proc: psutil.Process) -> int | None:
    try:
        return proc.ppid()
    except psutil.NoSuchProcess:
        return None


def inject(plan: Plan, sweep: subprocess.Popen, watch: Watch, timeout_s: float) -> dict:
    """Wait for the plan's moment and kill -9 its target; what was done (`injected` False if the
    moment never came while the sweep ran)."""
    launched = time.time()
    end = launched + timeout_s
    # (pid, submission) pairs of evaluations already passed over: a warm worker evaluates many
    tried: set = set()
    record = {"injected": False, "killed": [], "killed_names": [], "killed_evaluations": []}

    def sweep_running() -> bool:
        return sweep.poll() is None and time.time() < end

    while sweep_running():
        if plan.event == "delay":
            happened = watch.sleep(end - time.time(), until=lambda: watch.current is not None or not sweep_running())
            event_at = watch.current.started if happened and watch.current is not None else None
        elif plan.event == "first_ledger_entry":
            happened = watch.sleep(end - time.time(), until=lambda: watch.ledger_has_entries() or not sweep_running())
            event_at = time.time() if watch.ledger_has_entries() else None
        else:
            watch.sleep(
                end - time.time(),
                until=lambda: any((e.pid, e.submission_id) not in tried for e in watch.live_evaluations())
                or not sweep_running(),
            )
            event_at = (
                time.time() if any((e.pid, e.submission_id) not in tried for e in watch.live_evaluations()) else None
            )
        if event_at is None or not sweep_running():
            break
        watch.sleep(max(0.0, event_at + plan.delay_s - time.time()), until=lambda: not sweep_running())
        if not sweep_running():
            break
        victims = _victims(plan, sweep, watch, tried)
        if not victims:
            if plan.event == "eval_child":  # that evaluation ended during the delay: wait for the next one
                tried.update((e.pid, e.submission_id) for e in watch.evals.values())
                continue
            break
        record.update(
            injected=True,
            fault_at_s=round(time.time() - launched, 1),
            since_runner_start_s=round(time.time() - watch.current.started, 1) if watch.current else None,
            attempt=watch.current.attempt if watch.current else None,
            ledger_lines_before=_ledger_lines(watch.run_dir),
        )
        named = [(proc, describe(proc), short_name(proc)) for proc in victims]  # before any of them dies
        for proc, what, name in named:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                continue
            record["killed"].append(what)
            record["killed_names"].append(name)
            seen = watch.evals.get(proc.pid)
            if seen is not None and seen.submission_id is not None:
                eval_dir = watch.run_dir / "grader" / "snapshots" / f"{seen.submission_id:04d}" / "eval"
                record["killed_evaluations"].append(
                    {
                        "attempt": seen.attempt,
                        "submission_id": seen.submission_id,
                        # The worker had written its result when it was killed: the evaluation was
                        # over (the kill landed in the instant between it and the worker's reply).
                        "result_written": (eval_dir / "result.json").exists(),
                    }
                )
        if record["killed"]:
            break
        record["injected"] = False
        tried.update((p.pid, watch.evals[p.pid].submission_id) if p.pid in watch.evals else p.pid for p in victims)
    if plan.target == "snakemake" and record["injected"]:
        sweep.wait(timeout=30)
    return record


def _ledger_lines(run_dir: Path) -> int:
    try:
        return len((run_dir / "grader" / "ledger.jsonl").read_text().splitlines())
    except OSError:
        return 0


def resume(workdir: Path, watch: Watch, log_path: Path, timeout_s: float) -> dict:
    """`make resume`: release the dead process's lock, then run the profile again."""
    with open(log_path, "ab") as log:
        unlock = subprocess.run(
            snakemake_argv(workdir, "--unlock"), stdout=log, stderr=subprocess.STDOUT, env=SNAKEMAKE_ENV, timeout=300
        )
    sweep = start_sweep(workdir, log_path)
    try:
        code = wait_sweep(sweep, watch, timeout_s)
    finally:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
    return {"unlock_rc": unlock.returncode, "run_rc": code}


def cleanup(workdir: Path, watch: Watch, sweeps: list[subprocess.Popen]) -> None:
    """Kill (by pid) whatever of this trial still runs, so that one trial never disturbs the next."""
    for sweep in sweeps:
        if sweep.poll() is None:
            sweep.kill()
            sweep.wait()
    for _ in range(3):
        victims = processes_in(workdir)
        for info in attempt_infos(watch.run_dir) + [
            {"marker": a.marker, "runner_pid": a.runner_pid, "runner_create_time": a.runner_create_time}
            for a in watch.attempts.values()
        ]:
            runner = same_process(info["runner_pid"], info["runner_create_time"])
            victims += [runner] if runner is not None else []
            victims += marked_processes(info["marker"])
        if not victims:
            return
        for proc in victims:
            try:
                proc.send_signal(signal.SIGKILL)
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(victims, timeout=5)


def log_tail(path: Path, chars: int = 2500) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


@dataclass
class Trial:
    """What one trial saw; `failures` lists the checks it failed."""

    plan: Plan
    seconds: float = 0.0
    injection: dict = field(default_factory=dict)
    first_sweep_rc: int | None = None
    after_fault: list[str] = field(default_factory=list)
    after_resume: list[str] = field(default_factory=list)
    orphans: list[str] = field(default_factory=list)
    resume: dict = field(default_factory=dict)
    audit: dict = field(default_factory=dict)
    attempts: int = 0
    failures: list[str] = field(default_factory=list)
