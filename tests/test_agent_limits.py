"""The agent's own memory and process limits, and its OOM score above the grader's (issue 26, item 4).

Before, the agent shared one memory limit with Snakemake, the runner and the evaluation worker, had no process
limit (uid 0 is exempt from RLIMIT_NPROC) and oom_score_adj 0 like everyone: at rest the OOM killer picked the
grader's worker first. Through the real runner, in the real sandbox and without one: a memory hog and a fork
bomb are stopped inside the agent's cgroup, and the grader goes on scoring the same run's submission.
"""

from __future__ import annotations

import pytest

from rlbench.agent_run.runner import run_agent
from rlbench.sandbox.limits import AgentCgroup
from support.runs import BACKENDS, BWRAP_OK, BWRAP_WHY, spec_for

SUBMIT = (
    'cp -r "$MODEL_PATH" output/v1 && '
    "python3 -c \"import json,os,urllib.request as u; print(u.urlopen(u.Request(os.environ['GRADING_SERVER_URL']+'/submit', "
    "json.dumps({'model_path':'output/v1'}).encode(), {'Content-Type': 'application/json'}), timeout=120).status)\""
    " > code/submitted.txt"
)


def cgroups_here() -> str | None:
    with AgentCgroup("rlbench-limits-probe", 1 << 30, 100) as probe:
        return probe.version


needs_cgroups = pytest.mark.skipif(cgroups_here() is None, reason="no cgroup can be made here for the agent's limits")


def run(workspace, tiny_model, gsm8k_data, backend, script, limits):
    entry = {"name": "test", "command": ["bash", "-c", script], "limits": limits}
    return run_agent(spec_for(workspace, tiny_model, gsm8k_data, agent=entry, sandbox_backend=backend, time_limit_s=120))


@pytest.mark.parametrize("backend", BACKENDS)
def test_every_agent_process_is_the_oom_killers_first_choice(workspace, tiny_model, gsm8k_data, backend):
    script = "cat /proc/self/oom_score_adj > code/oom.txt; bash -c 'cat /proc/self/oom_score_adj > code/oom_child.txt' & wait"
    record = run(workspace, tiny_model, gsm8k_data, backend, script, {})
    assert record.status == "completed", (record.exit_code, record.error, record.limits, (workspace / "agent.log").read_text())
    assert (workspace / "code" / "oom.txt").read_text().strip() == "1000", (workspace / "agent.log").read_text()
    assert (workspace / "code" / "oom_child.txt").read_text().strip() == "1000"
    with open("/proc/self/oom_score_adj") as own:  # the runner (and so the grader and its worker) keep theirs
        assert own.read().strip() != "1000"
    assert record.limits["memory_bytes"] > 0 and record.limits["processes"] == 4096


@needs_cgroups
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_memory_hog_is_killed_inside_its_limit_and_the_grader_goes_on_scoring(workspace, tiny_model, gsm8k_data, backend):
    hog = "python3 -c 'blocks = [bytearray(32 << 20) for _ in range(64)]; print(\"survived\")' > code/hog.txt 2>&1; echo $? > code/hog_status.txt"
    record = run(workspace, tiny_model, gsm8k_data, backend, f"{hog}; {SUBMIT}", {"memory_bytes": 256 << 20})
    assert record.status == "completed", (record.exit_code, record.error, record.limits, (workspace / "agent.log").read_text())
    assert "survived" not in (workspace / "code" / "hog.txt").read_text()
    assert (workspace / "code" / "hog_status.txt").read_text().strip() == "137"  # SIGKILL, by the kernel
    assert record.limits["enforced_by"] in ("cgroup v1", "cgroup v2") and record.limits["oom_kills"] >= 1
    assert (workspace / "code" / "submitted.txt").read_text().strip() == "200"
    assert record.valid_submissions == 1


@needs_cgroups
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fork_bomb_runs_out_of_process_slots_and_the_grader_goes_on_scoring(workspace, tiny_model, gsm8k_data, backend):
    bomb = (
        "python3 -c 'import os, time\n"
        "pids = []\n"
        "for _ in range(300):\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError:\n"
        "        break\n"
        "    if pid == 0:\n"
        "        time.sleep(20)\n"
        "        os._exit(0)\n"
        "    pids.append(pid)\n"
        "for pid in pids:\n"
        "    os.kill(pid, 9)\n"
        "    os.waitpid(pid, 0)\n"
        "open(\"code/started.txt\", \"w\").write(str(len(pids)))'"
    )
    record = run(workspace, tiny_model, gsm8k_data, backend, f"{bomb}; {SUBMIT}", {"processes": 64})
    assert record.status == "completed", (record.exit_code, record.error, record.limits, (workspace / "agent.log").read_text())
    assert int((workspace / "code" / "started.txt").read_text()) < 64
    assert record.limits["enforced_by"] in ("cgroup v1", "cgroup v2") and record.limits["processes"] == 64
    assert (workspace / "code" / "submitted.txt").read_text().strip() == "200"
    assert record.valid_submissions == 1


@needs_cgroups
@pytest.mark.sandbox
@pytest.mark.skipif(not BWRAP_OK, reason=f"bubblewrap cannot run here: {BWRAP_WHY}")
def test_the_sandbox_tmpfs_counts_against_the_memory_limit(workspace, tiny_model, gsm8k_data):
    """The sandbox's /tmp (and its masks) are RAM-backed: without a bound, four of them took 47 GiB on a 23 GiB
    host. Their pages are charged to the agent's cgroup, so memory_bytes bounds them too."""
    fill = (
        "dd if=/dev/zero of=/tmp/fill bs=1M count=1024 2>/dev/null; echo $? > code/dd_status.txt; "
        "(du -m /tmp/fill 2>/dev/null || echo '0 none') | cut -f1 > code/filled_mb.txt; rm -f /tmp/fill"
    )
    record = run(workspace, tiny_model, gsm8k_data, "bubblewrap", fill, {"memory_bytes": 256 << 20})
    # The kernel kills one of the agent's processes at the limit (its shell, often: tmpfs pages belong to none);
    # either way the file never grows past the limit.
    assert record.limits["oom_kills"] >= 1, record.limits
    if record.status != "completed":  # the agent's own shell was the one killed: the run says why it ended
        assert record.status == "stopped" and record.stopped_by["kind"] == "memory_limit", record.stopped_by
    filled = (workspace / "code" / "filled_mb.txt")
    assert not filled.exists() or int(filled.read_text().split()[0]) < 300
