"""Warm evaluation workers (rlbench.evaluation.workers): reused across submissions, scored exactly as a fresh
process scores, and contained: a worker that dies, hangs or fails costs only its own submission.

The default tier keeps reuse, a worker killed while idle, fresh mode, bad modes, a worker that cannot
start and a worker dying with its grader; the other failure paths (a kill right before a submission,
a worker dying before or while taking a job, a hang past the timeout, an evaluation error, a GPU
worker's idle replacement) are in the slow tier, about 13-21 s each."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest
import requests

from rlbench.config import ConfigError
from rlbench.evaluation.child import run_in_child
from rlbench.fileio.jsonio import read_json
from rlbench.evaluation.workers import WorkerPool
from support.grader import assert_consistent, evaluation_children, gone, pool_workers, wait_for
from support.models import copy_model, perturb
from support.settings import EVALUATION, GSM8K_SETTINGS

REPO = Path(__file__).resolve().parents[1]


def submit(server, path: str) -> requests.Response:
    return requests.post(f"{server.url}/submit", json={"model_path": path}, timeout=300)


def items(result: dict) -> list:
    return [item.get("completion") for item in result["items"]]


def test_one_warm_worker_answers_every_submission_as_a_fresh_process_would(workspace, start_grader, tiny_model, gsm8k_data, tmp_path):
    server = start_grader(workspace, own_workers=True)
    for k in (1, 2):
        model = copy_model(tiny_model, workspace / "output" / f"v{k}")
        for _ in range(k):
            perturb(model)
    first, second = submit(server, "output/v1"), submit(server, "output/v2")
    assert first.status_code == second.status_code == 200
    assert [first.json()["status"], second.json()["status"]] == ["scored", "scored"]
    assert server.grader.workers.starts == 1  # one process for both (plus none waiting to replace it)
    timing = [e["eval_timing"] for e in server.grader.entries]
    assert [t["worker"]["reused"] for t in timing] == [False, True]
    assert set(timing[1]["phase_seconds"]) >= {"setup", "loading", "generating", "scoring"}
    assert "eval_timing" not in second.json()  # the grader's own bookkeeping, not the agent's
    # The reused worker's evaluation of v2 is the one a fresh interpreter gives, completion for completion.
    warm = read_json(server.grader.snapshots / "0002" / "eval" / "result.json")
    fresh = run_in_child(GSM8K_SETTINGS, workspace / "output" / "v2", gsm8k_data[1], EVALUATION, tmp_path / "fresh")
    assert items(warm) == items(fresh) and warm["score"] == fresh["score"] == second.json()["score"]
    assert_consistent(server)


def kill_idle_worker(server) -> psutil.Process:
    """SIGKILL the slot's own worker (the one that evaluated submission 1), once it is idle."""
    pool = server.grader.workers
    assert pool.wait_ready(timeout=60)
    pid = pool.worker_pid()
    assert pid is not None
    worker = psutil.Process(pid)
    assert "--worker" in worker.cmdline()
    worker.send_signal(signal.SIGKILL)
    return worker


def two_versions(workspace, tiny_model) -> None:
    perturb(copy_model(tiny_model, workspace / "output" / "v1"))
    second = copy_model(tiny_model, workspace / "output" / "v2")
    perturb(second)
    perturb(second)


def test_a_worker_killed_while_idle_costs_no_submission(workspace, start_grader, tiny_model):
    """The pool notices an idle worker's death by itself and has a new one ready before the next
    submission comes (no submission is needed to find out, and none pays for it)."""
    server = start_grader(workspace, own_workers=True)
    two_versions(workspace, tiny_model)
    assert submit(server, "output/v1").status_code == 200
    pool = server.grader.workers
    assert pool.starts == 1
    worker = kill_idle_worker(server)
    wait_for(lambda: pool.starts == 2, timeout=60)  # replaced, with no submission in between
    assert pool.wait_ready(timeout=120)
    assert gone(worker) and pool.worker_pid() not in (None, worker.pid)
    assert len(server.grader.entries) == 1 and pool.crashes == 0
    response = submit(server, "output/v2")
    assert response.status_code == 200 and response.json()["status"] == "scored"
    assert pool.starts == 2
    assert server.grader.entries[-1]["eval_timing"]["worker"]["handed_over"] is False
    assert [e["status"] for e in assert_consistent(server)] == ["scored", "scored"]


@pytest.mark.slow
def test_a_submission_right_after_an_idle_worker_is_killed_is_scored(workspace, start_grader, tiny_model):
    """Submitted while the killed worker may still be exiting (psutil calls it a zombie, the pool may
    not know yet): the job goes to a fresh worker, either the pool's replacement or, when it was
    handed to the dying one, a new one (it had not accepted the job). It is scored either way."""
    server = start_grader(workspace, own_workers=True)
    two_versions(workspace, tiny_model)
    assert submit(server, "output/v1").status_code == 200
    kill_idle_worker(server)
    response = submit(server, "output/v2")
    assert response.status_code == 200 and response.json()["status"] == "scored"
    assert server.grader.workers.starts == 2 and server.grader.workers.crashes == 0
    assert server.grader.entries[-1]["eval_timing"]["worker"]["reused"] is False
    assert [e["status"] for e in assert_consistent(server)] == ["scored", "scored"]


@pytest.mark.slow
def test_a_job_handed_to_a_worker_that_dies_before_accepting_it_goes_to_a_new_worker(tmp_path, tiny_model, gsm8k_data):
    """The race itself, made certain: the slot is kept from noticing the death, so the job is
    written to the dead worker; that never accepted it, so a fresh worker evaluates it."""
    pool = WorkerPool.from_settings(tmp_path / "workers", {})
    try:
        pool.evaluate(GSM8K_SETTINGS, tiny_model, gsm8k_data[1], EVALUATION, tmp_path / "eval1")
        slot = pool._slots[None]
        # Blind to the death (as in the instant before the kernel reports it): the job is handed to the dead worker.
        slot._died = lambda: False
        slot._alive = lambda: slot.proc is not None
        worker = psutil.Process(pool.worker_pid())
        worker.send_signal(signal.SIGKILL)
        wait_for(lambda: gone(worker), timeout=30)
        result = pool.evaluate(GSM8K_SETTINGS, tiny_model, gsm8k_data[1], EVALUATION, tmp_path / "eval2")
        assert result["worker"]["handed_over"] is True and result["worker"]["reused"] is False
        assert "score" in result and pool.starts == 2 and pool.crashes == 0
        assert pool.worker_pid() not in (None, worker.pid)
    finally:
        pool.close()


@pytest.mark.slow
def test_a_job_that_kills_every_worker_before_it_is_accepted_fails_once(tmp_path, tiny_model, gsm8k_data, monkeypatch):
    """Only one transparent retry per job: a request that kills workers is still contained."""
    import rlbench.evaluation.workers as workers

    pool = WorkerPool.from_settings(tmp_path / "workers", {})
    try:
        pool.evaluate(GSM8K_SETTINGS, tiny_model, gsm8k_data[1], EVALUATION, tmp_path / "eval1")
        real_hand = workers._Slot._hand

        def killing_hand(slot, proc, job, message):  # the worker dies as the job reaches it
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            return real_hand(slot, proc, job, message)

        monkeypatch.setattr(workers._Slot, "_hand", killing_hand)
        with pytest.raises(workers.GraderFault, match="SIGKILL while starting"):
            pool.evaluate(GSM8K_SETTINGS, tiny_model, gsm8k_data[1], EVALUATION, tmp_path / "eval2")
        assert pool.crashes == 1
        wait_for(lambda: pool.starts == 3, timeout=60)  # the first worker, the one new one the job got, a replacement
        assert pool.wait_ready(timeout=120)
        assert pool.starts == 3
    finally:
        pool.close()


@pytest.mark.slow
def test_a_worker_past_the_timeout_is_stopped_and_replaced(workspace, start_grader, tiny_model, tmp_path):
    """The held-out split is a FIFO nobody writes: the evaluation hangs until the timeout."""
    from rlbench.tasks.gsm8k import EVAL_FILE

    server = start_grader(workspace, own_workers=True)
    server.grader.config.evaluation = {**EVALUATION, "eval_timeout_s": 10}
    split = tmp_path / "fifo-split"
    split.mkdir()
    os.mkfifo(split / EVAL_FILE)
    real_split, server.grader.config.eval_dir = server.grader.config.eval_dir, split
    perturb(copy_model(tiny_model, workspace / "output" / "v1"))
    hung = []
    with ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(submit, server, "output/v1")
        hung = wait_for(lambda: pool_workers(server))
        response = pending.result()
    assert response.status_code == 422 and "longer than 10 s" in response.json()["error"]
    wait_for(lambda: all(gone(p) for p in hung), timeout=30)  # the hung worker was killed
    server.grader.config.eval_dir = real_split
    again = submit(server, "output/v1")
    assert again.status_code == 200 and again.json()["status"] == "scored"  # failures are not cached
    assert server.grader.workers.starts == 2


def test_fresh_mode_starts_a_process_per_evaluation(workspace, start_grader, tiny_model):
    server = start_grader(workspace, own_workers=True)
    server.grader.workers.mode = "fresh"
    perturb(copy_model(tiny_model, workspace / "output" / "v1"))
    response = submit(server, "output/v1")
    assert response.status_code == 200 and response.json()["status"] == "scored"
    assert server.grader.workers.starts == 0
    assert server.grader.entries[-1]["eval_timing"]["worker"] == {"mode": "fresh", "reused": False}


def test_unknown_worker_mode_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="'worker' is 'hot'; allowed values: warm, fresh"):
        WorkerPool.from_settings(tmp_path, {"worker": "hot"})


POOL_PARENT = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from rlbench.evaluation.workers import WorkerPool
import json
settings, model, eval_dir, work = sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5]
pool = WorkerPool.from_settings(Path(work) / "workers", {})
pool.evaluate(json.loads(settings), Path(model), Path(eval_dir), {"backend": "hf", "batch_size": 8}, Path(work))
"""


def test_a_warm_worker_dies_with_its_grader(tmp_path, tiny_model):
    """kill -9 of the grader while its worker evaluates leaves no worker behind (the lifeline is
    tied to the worker slot's own thread, which lives as long as the grader)."""
    from rlbench.tasks.gsm8k import EVAL_FILE

    eval_dir = tmp_path / "split"
    eval_dir.mkdir()
    os.mkfifo(eval_dir / EVAL_FILE)  # the worker blocks reading it, mid-evaluation
    parent = subprocess.Popen(
        [sys.executable, "-c", POOL_PARENT, str(REPO / "scripts"), json.dumps(GSM8K_SETTINGS), str(tiny_model),
         str(eval_dir), str(tmp_path / "eval")]
    )
    worker = None
    try:
        worker = wait_for(lambda: evaluation_children(psutil.Process(parent.pid)), timeout=60)[0]
        phase = tmp_path / "eval" / "phase.json"
        wait_for(lambda: phase.exists() and read_json(phase).get("phase") == "generating", timeout=120)
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait(timeout=30)
        wait_for(lambda: gone(worker), timeout=30)
    finally:
        if parent.poll() is None:
            parent.kill()
        if worker is not None and not gone(worker):
            worker.kill()


@pytest.mark.slow
def test_evaluation_error_of_a_worker_is_the_models(workspace, start_grader, tiny_model):
    """A checkpoint that cannot load fails its submission (422) and the worker that tried is not reused."""
    server = start_grader(workspace, own_workers=True)
    broken = copy_model(tiny_model, workspace / "output" / "broken")
    config = json.loads((broken / "config.json").read_text())
    config["hidden_size"] = config["hidden_size"] * 2  # the weights no longer fit the architecture
    (broken / "config.json").write_text(json.dumps(config))
    response = submit(server, "output/broken")
    assert response.status_code == 422 and response.json()["reason"] == "evaluation_failed"
    perturb(copy_model(tiny_model, workspace / "output" / "v1"))
    assert submit(server, "output/v1").status_code == 200
    assert server.grader.workers.starts == 2  # the failed one was replaced


def test_a_worker_that_cannot_be_started_fails_one_evaluation_and_the_pool_lives_on(tmp_path, tiny_model, gsm8k_data, monkeypatch):
    import rlbench.evaluation.workers as workers

    real, calls = workers.subprocess.Popen, []

    def popen(*args, **kwargs):
        calls.append(args)
        if len(calls) <= 2:  # the job's start, then the replacement started ahead of need
            raise OSError(11, "Resource temporarily unavailable")
        return real(*args, **kwargs)

    monkeypatch.setattr(workers.subprocess, "Popen", popen)
    pool = WorkerPool.from_settings(tmp_path / "workers", {})
    try:
        with pytest.raises(OSError, match="temporarily unavailable"):
            pool.evaluate(GSM8K_SETTINGS, tiny_model, gsm8k_data[1], EVALUATION, tmp_path / "eval1")
        result = pool.evaluate(GSM8K_SETTINGS, tiny_model, gsm8k_data[1], EVALUATION, tmp_path / "eval2")
        assert result["worker"]["mode"] == "warm" and "score" in result
    finally:
        pool.close()


@pytest.mark.slow
def test_a_worker_idle_on_a_gpu_is_replaced_once_and_a_fresh_one_is_kept(tmp_path, tiny_model, gsm8k_data):
    """worker_idle_s after an evaluation on a GPU set (here a fake one), the worker is replaced by a
    fresh one (which holds no GPU memory); that one has not evaluated, so it is kept, however long
    it is idle (the watch for idle deaths does not replace it)."""
    import time

    pool = WorkerPool.from_settings(tmp_path / "workers", {"worker_idle_s": 2})
    try:
        pool.evaluate(GSM8K_SETTINGS, tiny_model, gsm8k_data[1], EVALUATION, tmp_path / "eval1", gpu="0")
        first = pool.worker_pid("0")
        wait_for(lambda: pool.starts == 2, timeout=60)
        assert pool.wait_ready("0", timeout=120)
        fresh = pool.worker_pid("0")
        assert fresh not in (None, first)
        time.sleep(4)  # twice idle_s: the fresh worker stays
        assert pool.starts == 2 and pool.worker_pid("0") == fresh
    finally:
        pool.close()
