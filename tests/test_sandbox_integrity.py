"""What the agent can reach, and what outlives it: through the real runner (run_agent) and the real sandbox.

Held-out data must stay out of the agent's sight (caches, home, the repository's metadata and task code);
no process of a run may outlive it (detached daemons, a runner whose Snakemake died); a killed agent is
recorded as killed.
"""

from __future__ import annotations

import os
import pickle
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil
import pytest

from rlbench.agent_run.attempts import kill_marked, marked_processes
from rlbench.fileio.jsonio import read_json
from rlbench.agent_run.runner import run_agent
from rlbench.paths import REPO_ROOT
from rlbench.sandbox.bubblewrap import split_masks
from support.runs import BACKENDS, needs_bwrap, spec_for

CANARY = "held-out-canary-4711"


def gone(pid: int) -> bool:
    """Not running (a zombie runs nothing; pid 1 here may not reap orphans)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_for(predicate, timeout_s: float, what: str) -> None:
    end = time.time() + timeout_s
    while not predicate():
        assert time.time() < end, f"timed out waiting for {what}"
        time.sleep(0.2)


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


# --- what the agent sees -------------------------------------------------------------------------------


@pytest.fixture
def outside_tmp():
    """A scratch directory outside /tmp: the sandbox's /tmp is private anyway, so a canary there proves nothing."""
    for base in ("/var/tmp", str(Path.home())):
        if os.access(base, os.W_OK):
            path = Path(tempfile.mkdtemp(prefix="rlbench-test-", dir=base))
            yield path
            shutil.rmtree(path, ignore_errors=True)
            return
    pytest.skip("no writable directory outside /tmp")


@needs_bwrap
@pytest.mark.sandbox
def test_host_home_and_caches_are_hidden_and_home_is_private(
    workspace, tiny_model, gsm8k_data, outside_tmp, monkeypatch
):
    tmp_path = outside_tmp
    home = tmp_path / "home"
    hub_canary = home / ".cache" / "huggingface" / "datasets" / "canary"
    hub_canary.parent.mkdir(parents=True)
    hub_canary.write_text(CANARY)
    torch_home = tmp_path / "torch-cache"  # a cache outside the home, named by the host's environment
    (torch_home / "canary").parent.mkdir(parents=True)
    (torch_home / "canary").write_text(CANARY)
    workdir_canary = tmp_path / "workdir" / ".snakemake" / "metadata" / "canary"  # Snakemake's -d directory
    workdir_canary.parent.mkdir(parents=True)
    workdir_canary.write_text(CANARY)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("TORCH_HOME", str(torch_home))
    script = (
        f"cat {hub_canary} {torch_home}/canary {workdir_canary} > code/stolen.txt 2>&1; "
        f"ls -A {home} {torch_home} {tmp_path / 'workdir'} > code/ls.txt 2>&1; "
        'echo "$HOME" > code/home.txt; echo "${TORCH_HOME:-unset}" > code/torch_home.txt; '
        'touch "$HOME/written-by-agent"'
    )
    spec = spec_for(workspace, tiny_model, gsm8k_data, ["bash", "-c", script], sandbox_backend="bubblewrap")
    spec.masked_paths = [tmp_path / "workdir"]
    record = run_agent(spec)
    code = workspace / "code"
    assert record.sandbox == "bubblewrap" and record.status == "completed", read(workspace / "agent.log")
    assert CANARY not in read(code / "stolen.txt") + read(code / "ls.txt")
    assert read(code / "stolen.txt").count("No such file") == 3
    for name in ("canary", ".cache", ".snakemake"):
        assert name not in read(code / "ls.txt")
    private = workspace.resolve() / ".home"
    assert Path(read(code / "home.txt").strip()) == private
    assert (private / "written-by-agent").exists()  # writable, and in the workspace
    assert read(code / "torch_home.txt").strip() == "unset"  # a host cache location is not passed on
    assert hub_canary.read_text() == CANARY  # hidden, not touched


@needs_bwrap
@pytest.mark.sandbox
def test_repository_is_hidden_but_interpreter_and_agent_code_are_not(workspace, tiny_model, gsm8k_data):
    secret = [REPO_ROOT / ".snakemake", REPO_ROOT / "config", REPO_ROOT / "scripts" / "rlbench" / "tasks"]
    assert (REPO_ROOT / "config").is_dir() and (REPO_ROOT / "scripts" / "rlbench" / "tasks").is_dir()
    script = "; ".join(
        [f"ls -A {path} > code/ls{i}.txt 2>&1" for i, path in enumerate(secret)]
        + [
            f"cat {REPO_ROOT}/config/config.yaml > code/config.txt 2>&1",
            f"cat {REPO_ROOT}/scripts/rlbench/tasks/gsm8k/__init__.py > code/task_code.txt 2>&1",
            "{python} -c 'import rlbench' > code/import.txt 2>&1; echo $? >> code/import.txt",
            "{python} -c 'import transformers, trl, datasets, requests; print(\"libs ok\")' > code/libs.txt 2>&1",
            "cat {agents_dir}/copy_agent.py > code/agent_code.txt",
        ]
    )
    record = run_agent(
        spec_for(workspace, tiny_model, gsm8k_data, ["bash", "-c", script], sandbox_backend="bubblewrap")
    )
    code = workspace / "code"
    assert record.sandbox == "bubblewrap" and record.status == "completed", read(workspace / "agent.log")
    for i, path in enumerate(secret):
        listing = read(code / f"ls{i}.txt")
        assert "No such file" in listing or listing == "", (path, listing)
    assert "sweep" not in read(code / "config.txt") and "No such file" in read(code / "config.txt")
    assert "No such file" in read(code / "task_code.txt")
    assert "ModuleNotFoundError" in read(code / "import.txt") and read(code / "import.txt").split()[-1] == "1"
    assert read(code / "libs.txt").strip() == "libs ok"
    assert read(code / "agent_code.txt") == (REPO_ROOT / "scripts" / "agents" / "copy_agent.py").read_text()


@needs_bwrap
@pytest.mark.sandbox
def test_agent_has_no_capabilities_to_undo_the_sandbox(workspace, tiny_model, gsm8k_data):
    """Run as root, bwrap would leave the agent CAP_SYS_ADMIN (unmount the masks) and CAP_NET_RAW (sniff loopback)."""
    script = (
        "grep CapEff /proc/self/status > code/caps.txt; "
        "unshare -m -- umount -l /tmp > code/unshare.txt 2>&1; echo $? >> code/unshare.txt; "
        "{python} -c 'import socket; socket.socket(socket.AF_PACKET, socket.SOCK_RAW)' > code/raw.txt 2>&1; "
        "echo $? >> code/raw.txt"
    )
    record = run_agent(
        spec_for(workspace, tiny_model, gsm8k_data, ["bash", "-c", script], sandbox_backend="bubblewrap")
    )
    code = workspace / "code"
    assert record.sandbox == "bubblewrap" and record.status == "completed", read(workspace / "agent.log")
    assert int(read(code / "caps.txt").split()[-1], 16) == 0
    assert read(code / "unshare.txt").split()[-1] != "0", read(code / "unshare.txt")
    assert "PermissionError" in read(code / "raw.txt") and read(code / "raw.txt").split()[-1] == "1"


def test_masks_never_hide_the_system_and_caches_inside_visible_paths_stay_hidden(tmp_path):
    venv = tmp_path / "venv"
    (venv / "hf-cache").mkdir(parents=True)
    home = tmp_path / "home"
    (home / "python").mkdir(parents=True)
    masks = [Path("/"), Path("/usr"), home, venv / "hf-cache", tmp_path / "missing"]
    before, after, refused = split_masks(masks, [venv.resolve(), (home / "python").resolve()])
    assert before == [home.resolve()]  # bound back on top: home/python stays visible
    assert after == [(venv / "hf-cache").resolve()]  # after the venv's bind, or the bind would show it again
    assert any(r.startswith("/ ") for r in refused) and any(r.startswith("/usr ") for r in refused)


# --- reference agents in the sandbox -------------------------------------------------------------------------


@needs_bwrap
@pytest.mark.sandbox
def test_copy_agent_runs_and_submits_in_the_sandbox(workspace, tiny_model, gsm8k_data):
    command = ["{python}", "{agents_dir}/copy_agent.py"]
    record = run_agent(spec_for(workspace, tiny_model, gsm8k_data, command, sandbox_backend="bubblewrap"))
    assert record.sandbox == "bubblewrap", record.sandbox_note
    assert record.status == "completed" and record.valid_submissions == 1, read(workspace / "agent.log")
    assert record.best["score"] == 0.0 and record.exit_signal is None


@needs_bwrap
@pytest.mark.sandbox
def test_sft_agent_trains_and_submits_in_the_sandbox(workspace, tiny_model, gsm8k_data):
    spec = spec_for(
        workspace,
        tiny_model,
        gsm8k_data,
        ["{python}", "{agents_dir}/sft_agent.py"],
        sandbox_backend="bubblewrap",
        time_limit_s=400,
    )
    spec.agent["env"] = {"SFT_ROUNDS": 1, "SFT_STEPS_PER_ROUND": 1, "SFT_BATCH_SIZE": 2, "SFT_MAX_TRAIN_ROWS": 4}
    record = run_agent(spec)
    assert record.status == "completed" and record.valid_submissions == 1, read(workspace / "agent.log")
    assert (workspace / "output" / "v1" / "model.safetensors").exists()


# --- what outlives the agent -------------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
def test_daemon_left_by_a_finished_agent_is_stopped(workspace, tiny_model, gsm8k_data, backend):
    pid_file = workspace / "code" / "daemon.pid"
    script = f"setsid sleep 600 > /dev/null 2>&1 & echo $! > {pid_file}; exit 0"
    record = run_agent(spec_for(workspace, tiny_model, gsm8k_data, ["bash", "-c", script], sandbox_backend=backend))
    assert record.status == "completed" and record.exit_code == 0, read(workspace / "agent.log")
    marker = read_json(workspace.parent / "attempt.json")["marker"]
    assert marked_processes(marker) == []
    run = read_json(workspace.parent / "run.json")
    assert run["stray_processes"] == record.stray_processes
    if backend == "none":  # in the sandbox the daemon dies with the PID namespace (pid_file holds its inner pid)
        assert gone(int(pid_file.read_text())) and run["stray_processes"] >= 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_agent_ignoring_sigterm_is_recorded_as_killed(workspace, tiny_model, gsm8k_data, backend):
    script = "trap '' TERM; while true; do sleep 0.2; done"
    spec = spec_for(workspace, tiny_model, gsm8k_data, ["bash", "-c", script], sandbox_backend=backend, time_limit_s=3)
    started = time.time()
    record = run_agent(spec)
    assert record.status == "timeout" and record.timed_out
    assert record.exit_code == -signal.SIGKILL and record.exit_signal == "SIGKILL"
    assert time.time() - started < 30
    run = read_json(workspace.parent / "run.json")
    assert run["exit_code"] == -9 and run["exit_signal"] == "SIGKILL" and run["status"] == "timeout"
    assert marked_processes(read_json(workspace.parent / "attempt.json")["marker"]) == []


@pytest.mark.parametrize("backend", BACKENDS)
def test_agent_ending_on_sigterm_is_recorded_as_such(workspace, tiny_model, gsm8k_data, backend):
    # exec: the agent's process is sleep itself, which dies of the SIGTERM within the grace period.
    spec = spec_for(
        workspace,
        tiny_model,
        gsm8k_data,
        ["bash", "-c", "exec sleep 1000"],
        sandbox_backend=backend,
        time_limit_s=3,
        kill_grace_s=20,
    )
    record = run_agent(spec)
    assert record.status == "timeout" and record.exit_signal == "SIGTERM"
    # Popen's status of the process the runner started: sleep itself, or bwrap passing it on as 128 + 15.
    assert record.exit_code == (-15 if backend == "none" else 143)
    assert record.duration_s < 15  # it did not wait out the grace period


# --- a runner whose Snakemake dies -----------------------------------------------------------------------------

RUNNER = """\
import pickle, sys
sys.path.insert(0, {scripts!r})
from rlbench.agent_run.runner import run_agent
from rlbench.agent_run.supervision import stop_with_owner
stop_with_owner(interval_s=0.2)
run_agent(pickle.load(open(sys.argv[1], "rb")))
"""


@pytest.mark.parametrize("via_shell", [False, True], ids=["runner-child-of-parent", "shell-in-between"])
def test_runner_stops_the_run_when_its_parent_is_killed(workspace, tiny_model, gsm8k_data, tmp_path, via_shell):
    """A stand-in for Snakemake starts the runner (directly, or through a shell that does not exec it, as an
    older bash would) and is killed with -9: the runner stops the agent, records the interruption and exits."""
    pid_file = workspace / "code" / "agent.pid"
    spec = spec_for(workspace, tiny_model, gsm8k_data, ["bash", "-c", f"echo $$ > {pid_file}; sleep 1000"])
    spec_file, runner_file = tmp_path / "spec.pkl", tmp_path / "runner.py"
    spec_file.write_bytes(pickle.dumps(spec))
    runner_file.write_text(RUNNER.format(scripts=str(REPO_ROOT / "scripts")))
    runner_argv = [sys.executable, str(runner_file), str(spec_file)]
    if via_shell:  # a second command after it: bash cannot exec the runner and stays its parent
        runner_argv = ["bash", "-c", f"{' '.join(runner_argv)}; echo runner ended"]
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(1000)",
            *runner_argv,
        ],
        start_new_session=True,
    )
    try:
        wait_for(lambda: read(pid_file).strip() != "", 60, "the agent to start")
        agent_pid = int(read(pid_file))
        runner = psutil.Process(read_json(workspace.parent / "attempt.json")["runner_pid"])
        assert (runner.parent().name() == "bash") == via_shell
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        wait_for(lambda: (workspace.parent / "run.json").exists(), 30, "run.json")
        run = read_json(workspace.parent / "run.json")
        assert run["status"] == "interrupted" and "is gone" in run["interrupted_by"]
        wait_for(lambda: gone(runner.pid), 30, "the runner to exit")
        assert gone(agent_pid)
        assert marked_processes(read_json(workspace.parent / "attempt.json")["marker"]) == []
    finally:  # on failure: the shell of the second case, the runner, the agent
        try:
            os.killpg(parent.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        parent.wait()
        if (workspace.parent / "attempt.json").exists():
            kill_marked(read_json(workspace.parent / "attempt.json")["marker"])


def test_a_daemon_missed_by_one_listing_is_still_killed(monkeypatch):
    """A process between fork and exec shows no environment for a moment: the first listing of the run's
    processes misses it (made to here), and the stop must not take that one empty listing as 'none left'."""
    import subprocess
    import uuid

    from rlbench.agent_run import attempts

    marker = uuid.uuid4().hex
    daemon = subprocess.Popen(["sleep", "60"], env={**os.environ, attempts.RUN_MARKER: marker})
    real, calls = attempts.marked_processes, []

    def first_listing_misses_it(m):
        calls.append(m)
        return [] if len(calls) == 1 else real(m)

    monkeypatch.setattr(attempts, "marked_processes", first_listing_misses_it)
    try:
        assert attempts.kill_marked(marker) == 1
        assert daemon.wait(timeout=10) == -signal.SIGKILL
    finally:
        daemon.kill()
        daemon.wait()
