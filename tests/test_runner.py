"""The agent runner: deadline kills the whole tree, failures are results, the sandbox hides results/."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import psutil
import pytest

from rlbench.fileio.jsonio import read_json, read_jsonl
from rlbench.agent_run.preflight import EXPECTED_MEMORY_VAR, IDLE_MEMORY_MIB, gpu_preflight
from rlbench.agent_run.runner import run_agent
from rlbench.sandbox.bubblewrap import bubblewrap_available
from support.nvidia_smi import FakeNvidiaSmi, gpu
from support.runs import spec_for
from support.settings import GSM8K_SETTINGS

SUBMIT_BASE = (
    'cp -r "$MODEL_PATH" "$OUTPUT_DIR/v1" && '
    'python3 -c "import json,os,urllib.request as u; '
    "r=u.Request(os.environ['GRADING_SERVER_URL']+'/submit', json.dumps({'model_path':'output/v1'}).encode()); "
    'print(u.urlopen(r).read().decode())"'
)


def test_agent_killed_at_deadline_leaves_complete_ledger_and_timeout_record(workspace, tiny_model, gsm8k_data):
    pid_file = workspace / "code" / "grandchild.pid"
    script = (
        f"{SUBMIT_BASE} && "
        # A grandchild in its own session: killing the process group alone would miss it.
        f"(setsid sleep 1000 & echo $! > {pid_file}) && sleep 1000"
    )
    started = time.time()
    record = run_agent(spec_for(workspace, tiny_model, gsm8k_data, ["bash", "-c", script], time_limit_s=6))
    assert time.time() - started < 30
    run = read_json(workspace.parent / "run.json")
    assert run["status"] == "timeout" and run["timed_out"] is True and record.status == "timeout"
    assert run["submissions"] == 1 and run["valid_submissions"] == 1
    # run_meta.json's end_time is the run's actual end, set once the agent is stopped (the reference's).
    assert read_json(workspace / "run_meta.json")["end_time"] == int(run["end_time"])
    entries = list(read_jsonl(workspace.parent / "grader" / "ledger.jsonl"))
    assert len(entries) == 1 and entries[0]["score"] == 0.0 and entries[0]["status"] == "cached"
    grandchild = int(pid_file.read_text())
    assert not psutil.pid_exists(grandchild) or psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
    assert "GRADING_SERVER_URL" not in (workspace / "agent.log").read_text()


def test_failing_agent_is_a_recorded_result(workspace, tiny_model, gsm8k_data, monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    record = run_agent(spec_for(workspace, tiny_model, gsm8k_data, ["bash", "-c", "echo boom; exit 3"]))
    assert record.status == "failed" and record.exit_code == 3 and record.submissions == 0
    assert (workspace.parent / "grader" / "ledger.jsonl").read_text() == ""
    assert "boom" in (workspace / "agent.log").read_text()
    # No GPUs given (CUDA_VISIBLE_DEVICES unset): the GPU pre-flight passed trivially and said so.
    assert record.preflight["ok"] and not record.preflight["checked"] and "a CPU run" in record.preflight["message"]


def test_gpu_preflight_failure_ends_the_run_with_error_before_the_agent_starts(
    workspace, tiny_model, gsm8k_data, tmp_path, monkeypatch
):
    """GPU 1 (CUDA_VISIBLE_DEVICES) holds another job's memory: the run ends with status error and the reason
    in run.json, its agent never started, its outputs written as for any run (the sweep goes on)."""
    fake = FakeNvidiaSmi(tmp_path, [gpu(0), gpu(1, utilization=85, used_mib=30_000)])
    monkeypatch.setenv("PATH", f"{fake.bin}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    started = workspace / "code" / "started"
    record = run_agent(spec_for(workspace, tiny_model, gsm8k_data, ["bash", "-c", f"touch {started}"]))
    run = read_json(workspace.parent / "run.json")
    assert record.status == run["status"] == "error" and not started.exists()
    assert run["error"].startswith("GPU pre-flight failed, the agent was not started: GPU 1 is in use")
    assert "30000 MiB used" in run["error"] and "85 %" in run["error"]
    assert run["preflight"]["ok"] is False and run["preflight"]["checked"] is True
    assert [g["index"] for g in run["preflight"]["gpus"]] == ["1"] and run["gpus"] == ["1"]
    assert (workspace / "run_meta.json").is_file() and run["submissions"] == 0


def test_gpu_preflight_passes_idle_gpus_and_the_agent_runs(workspace, tiny_model, gsm8k_data, tmp_path, monkeypatch):
    fake = FakeNvidiaSmi(tmp_path, [gpu(0), gpu(1, utilization=0, used_mib=2)])
    monkeypatch.setenv("PATH", f"{fake.bin}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "1")
    started = workspace / "code" / "started"
    record = run_agent(spec_for(workspace, tiny_model, gsm8k_data, ["bash", "-c", f"touch {started}"]))
    assert record.status == "completed" and started.exists()
    assert record.preflight["ok"] and record.preflight["message"] == "the GPUs given (1) exist and are idle"


def test_gpu_preflight_checks_existence_idleness_and_expected_memory(tmp_path, monkeypatch):
    fake = FakeNvidiaSmi(tmp_path, [gpu(0, used_mib=IDLE_MEMORY_MIB), gpu(1, total_mib=40_960)])
    monkeypatch.setenv("PATH", f"{fake.bin}{os.pathsep}{os.environ['PATH']}")
    ok = gpu_preflight(["0", "GPU-fake-1"], environ={})
    assert ok["ok"] and ok["checked"] and [g["index"] for g in ok["gpus"]] == ["0", "1"]
    assert ok["message"] == "the GPUs given (0,GPU-fake-1) exist and are idle"
    missing = gpu_preflight(["0", "3"], environ={})
    assert not missing["ok"] and missing["message"] == "GPU 3 does not exist (nvidia-smi lists GPUs 0, 1)"
    small = gpu_preflight(["0", "1"], environ={EXPECTED_MEMORY_VAR: "80000"})
    assert not small["ok"]
    assert small["message"] == f"GPU 1 has 40960 MiB of memory, less than the 80000 MiB expected ({EXPECTED_MEMORY_VAR})"
    assert gpu_preflight(["0"], environ={EXPECTED_MEMORY_VAR: "80000"})["message"] == (
        "the GPUs given (0) exist and are idle, each with at least 80000 MiB"
    )
    assert "positive whole number" in gpu_preflight(["0"], environ={EXPECTED_MEMORY_VAR: "80GB"})["message"]
    fake.set("fail")
    broken = gpu_preflight(["0"], environ={})
    assert not broken["ok"] and "could not be checked" in broken["message"] and "NVIDIA driver" in broken["message"]
    # A CPU run passes trivially, and so do GPUs nothing can check (no nvidia-smi), each saying so.
    cpu = gpu_preflight([], environ={})
    assert cpu["ok"] and not cpu["checked"] and "a CPU run" in cpu["message"]
    monkeypatch.setenv("PATH", "/nonexistent")
    unchecked = gpu_preflight(["0"], environ={})
    assert unchecked["ok"] and not unchecked["checked"] and "nvidia-smi is not on PATH" in unchecked["message"]


def test_agent_not_ready_is_recorded_not_raised(workspace, tiny_model, gsm8k_data):
    spec = spec_for(workspace, tiny_model, gsm8k_data, ["no-such-agent-binary"])
    spec.agent["requires"] = {"binaries": ["no-such-agent-binary"], "env": ["RLBENCH_TEST_UNSET_KEY"]}
    record = run_agent(spec)
    assert record.status == "error"
    assert "no-such-agent-binary" in record.error and "RLBENCH_TEST_UNSET_KEY" in record.error


def test_agent_gets_the_contract_environment(workspace, tiny_model, gsm8k_data):
    script = "env | grep -E '^(TASK|BASE_MODEL|WORKSPACE|MODEL_PATH|DATA_PATH|OUTPUT_DIR|GRADING_SERVER_URL)=' > code/env.txt; pwd >> code/env.txt"
    run_agent(spec_for(workspace, tiny_model, gsm8k_data, ["bash", "-c", script]))
    lines = (workspace / "code" / "env.txt").read_text().splitlines()
    env = dict(line.split("=", 1) for line in lines[:-1])
    assert env["TASK"] == "gsm8k" and env["BASE_MODEL"] == "rlbench/tiny-qwen2"
    assert Path(env["MODEL_PATH"]) == workspace.resolve() / "models" / "rlbench" / "tiny-qwen2"
    assert Path(env["DATA_PATH"], "train.jsonl").exists()
    assert env["GRADING_SERVER_URL"].startswith("http://127.0.0.1:")
    assert Path(lines[-1]) == workspace.resolve()


@pytest.mark.sandbox
@pytest.mark.skipif(not bubblewrap_available()[0], reason="bubblewrap cannot run here")
def test_sandbox_hides_held_out_split_and_keeps_grader_reachable(workspace, tiny_model, gsm8k_data):
    eval_file = gsm8k_data[1] / "eval.jsonl"
    script = f"{SUBMIT_BASE} > code/submit.txt; cat {eval_file} > code/stolen.txt 2>&1; ls {gsm8k_data[1]} > code/ls.txt 2>&1; true"
    record = run_agent(
        spec_for(workspace, tiny_model, gsm8k_data, ["bash", "-c", script], sandbox_backend="bubblewrap")
    )
    assert record.sandbox == "bubblewrap" and record.valid_submissions == 1
    assert json.loads((workspace / "code" / "submit.txt").read_text())["score"] == 0.0
    assert "No such file" in (workspace / "code" / "stolen.txt").read_text()
    assert eval_file.exists()  # hidden from the agent, not removed


def test_workspace_holds_no_held_out_file(workspace, gsm8k_data):
    held_out = {p.read_bytes() for p in gsm8k_data[1].iterdir()}
    for path in workspace.rglob("*"):
        if path.is_file():
            assert path.read_bytes() not in held_out, path


def test_workspace_tells_the_agent_its_mode(tmp_path, tiny_model, gsm8k_data):
    from rlbench.tasks.gsm8k import GSM8K
    from rlbench.agent_run.workspace import prepare_workspace
    from support.settings import TINY_SPEC

    ws = tmp_path / "ws"
    manifest = prepare_workspace(ws, GSM8K(), GSM8K_SETTINGS, tiny_model, TINY_SPEC["hf_id"], gsm8k_data[0], mode="sft-only")
    assert "Mode: SFT only" in (ws / "instructions.md").read_text() and manifest["mode"] == "sft-only"
    assert "task.py" in manifest["files"] and "data/train.jsonl" in manifest["files"]


@pytest.mark.sandbox
@pytest.mark.skipif(not bubblewrap_available()[0], reason="bubblewrap cannot run here")
def test_sandbox_keeps_visible_paths_under_private_tmp(tmp_path):
    import subprocess

    from rlbench.sandbox.bubblewrap import plan

    tool = tmp_path / "tool" / "hello.sh"  # pytest's tmp_path lives under /tmp
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\necho hello\n")
    tool.chmod(0o755)
    workspace = tmp_path / "ws"
    workspace.mkdir()
    hidden_plan = plan([str(tool)], workspace, hidden=[], readonly_inside=[], backend="bubblewrap")
    assert subprocess.run(hidden_plan.argv, capture_output=True).returncode != 0
    shown = plan([str(tool)], workspace, hidden=[], readonly_inside=[], backend="bubblewrap", visible=[tool.parent])
    assert subprocess.run(shown.argv, capture_output=True, text=True).stdout == "hello\n"


def test_interrupted_runner_stops_the_agent_and_records_it(workspace, tiny_model, gsm8k_data, tmp_path):
    import pickle
    import signal
    import subprocess
    import sys

    pid_file = workspace / "code" / "agent.pid"
    spec = spec_for(workspace, tiny_model, gsm8k_data, ["bash", "-c", f"echo $$ > {pid_file}; sleep 1000"])
    spec_file = tmp_path / "spec.pkl"
    spec_file.write_bytes(pickle.dumps(spec))
    runner = subprocess.Popen(
        [sys.executable, "-c", f"import pickle,sys; sys.path.insert(0, {str(Path(__file__).parents[1] / 'scripts')!r}); "
         f"from rlbench.agent_run.runner import run_agent; run_agent(pickle.load(open({str(spec_file)!r}, 'rb')))"],
    )
    deadline = time.time() + 60
    while not pid_file.exists() or not pid_file.read_text().strip():
        assert time.time() < deadline and runner.poll() is None
        time.sleep(0.2)
    agent_pid = int(pid_file.read_text())
    runner.send_signal(signal.SIGTERM)
    runner.wait(timeout=60)
    assert read_json(workspace.parent / "run.json")["status"] == "interrupted"
    assert not psutil.pid_exists(agent_pid) or psutil.Process(agent_pid).status() == psutil.STATUS_ZOMBIE


def test_interrupted_runner_does_not_wait_for_an_evaluation_in_flight(workspace, tiny_model, gsm8k_data, tmp_path):
    """A cancelled job (Ctrl-C, a dead Snakemake) stops in seconds even while a long evaluation runs."""
    import os
    import pickle
    import signal
    import subprocess
    import sys

    from rlbench.tasks.base import EVAL_FILE

    split = tmp_path / "fifo-split"
    split.mkdir()
    os.mkfifo(split / EVAL_FILE)  # the evaluation child blocks reading it: an evaluation that never ends
    pid_file = workspace / "code" / "agent.pid"
    script = (
        'cp -r "$MODEL_PATH" output/v1 && echo new > output/v1/notes.txt && '  # new content: really evaluated
        "(python3 -c \"import json,os,urllib.request as u; "
        "u.urlopen(u.Request(os.environ['GRADING_SERVER_URL']+'/submit', "
        "json.dumps({'model_path':'output/v1'}).encode()))\" &) ; "
        f"echo $$ > {pid_file}; sleep 1000"
    )
    spec = spec_for(workspace, tiny_model, gsm8k_data, ["bash", "-c", script], kill_grace_s=1)
    spec.eval_dir = split
    spec_file = tmp_path / "spec.pkl"
    spec_file.write_bytes(pickle.dumps(spec))
    runner = subprocess.Popen(
        [sys.executable, "-c", f"import pickle,sys; sys.path.insert(0, {str(Path(__file__).parents[1] / 'scripts')!r}); "
         f"from rlbench.agent_run.runner import run_agent; run_agent(pickle.load(open({str(spec_file)!r}, 'rb')))"],
    )

    def evaluation_children() -> list[psutil.Process]:
        try:
            children = psutil.Process(runner.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []
        found = []
        for child in children:
            try:  # a short-lived child (the agent's submit script) can be gone or a zombie by now
                if "rlbench.evaluation" in " ".join(child.cmdline()):
                    found.append(child)
            except psutil.Error:
                continue
        return found

    deadline = time.time() + 120
    while not evaluation_children():
        assert time.time() < deadline and runner.poll() is None, "no evaluation started"
        time.sleep(0.2)
    child = evaluation_children()[0]
    time.sleep(1)
    sent = time.time()
    runner.send_signal(signal.SIGTERM)
    runner.wait(timeout=60)
    assert time.time() - sent < 20  # kill_grace_s of drain, a few seconds of shutdown: not the evaluation
    run = read_json(workspace.parent / "run.json")
    assert run["status"] == "interrupted"
    child.wait(timeout=10)  # the abandoned evaluation died with its grader
    entries = list(read_jsonl(workspace.parent / "grader" / "ledger.jsonl"))
    assert all(not entry.get("pending") for entry in entries)  # every written line is a whole entry
