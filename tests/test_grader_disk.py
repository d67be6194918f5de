"""The grader's disk against a hostile checkpoint and workspace: a size bound checked before a byte
is copied, no sparse file written out, a free-space reserve, and an agent stopped at its disk limit."""

from __future__ import annotations

import os
import shutil
import sys

import requests

from rlbench.fileio.jsonio import read_json
from rlbench.agent_run.runner import run_agent
from support.grader import assert_consistent, strict_json
from support.models import copy_model
from support.runs import spec_for

HOLE = 2 << 30  # 2 GiB of nothing: half a megabyte on disk in the attack


def submit(server, model_path: str = "output/v1") -> tuple[int, dict]:
    response = requests.post(f"{server.url}/submit", json={"model_path": model_path}, timeout=300)
    return response.status_code, strict_json(response.content)


def snapshot_bytes(workspace) -> int:
    snapshots = workspace.parent / "grader" / "snapshots"
    return sum(p.stat().st_blocks * 512 for p in snapshots.rglob("*") if p.is_file())


def sparse_checkpoint(workspace, tiny_model, hole: int = HOLE):
    """The tiny model with a sparse file the loader never reads: apparent size `hole`, no blocks."""
    model = copy_model(tiny_model, workspace / "output" / "v1")
    with open(model / "extra.safetensors", "wb") as f:
        f.truncate(hole)
    assert (model / "extra.safetensors").stat().st_blocks * 512 < 1 << 20
    return model


def test_a_checkpoint_over_the_size_bound_is_refused_before_a_byte_is_copied(start_grader, workspace, tiny_model):
    sparse_checkpoint(workspace, tiny_model)
    bound = 4 * sum(p.stat().st_size for p in tiny_model.iterdir() if p.is_file())
    server = start_grader(workspace, max_checkpoint_bytes=bound)
    status, body = submit(server)
    assert (status, body["reason"]) == (413, "checkpoint_too_large"), body
    assert f"{bound:,}" in body["error"] and "save_pretrained" in body["error"]
    assert snapshot_bytes(workspace) == 0
    assert_consistent(server)
    # the same model without the extra file is within it, and scored
    os.remove(workspace / "output" / "v1" / "extra.safetensors")
    status, body = submit(server)
    assert status == 200 and body["status"] in ("scored", "cached"), (body.get("reason"), body.get("error"))


def test_a_sparse_file_is_refused_not_written_out(start_grader, workspace, tiny_model):
    sparse_checkpoint(workspace, tiny_model, hole=64 << 20)
    server = start_grader(workspace)  # no size bound: the holes themselves are refused
    status, body = submit(server)
    assert (status, body["reason"]) == (422, "sparse_file"), body
    assert "extra.safetensors" in body["error"]
    assert snapshot_bytes(workspace) < 8 << 20


def test_a_copy_that_would_eat_into_the_reserve_is_a_retryable_grader_error(start_grader, workspace, tiny_model):
    copy_model(tiny_model, workspace / "output" / "v1")
    free = shutil.disk_usage(workspace).free
    server = start_grader(workspace, disk_reserve_bytes=free + (1 << 30))
    status, body = submit(server)
    assert status == 503 and body["retryable"] is True and body["reason"] == "grader_error", body
    assert "reserve" in body["error"]
    assert snapshot_bytes(workspace) == 0
    assert_consistent(server)


def test_an_agent_whose_workspace_outgrows_its_disk_limit_is_stopped(workspace, tiny_model, gsm8k_data):
    writer = (
        "import os, time\n"
        "with open('output/ballast.bin', 'wb') as f:\n"
        "    for _ in range(64):\n"
        "        f.write(os.urandom(1 << 20)); f.flush(); os.fsync(f.fileno()); time.sleep(0.05)\n"
        "time.sleep(60)\n"
    )
    base = sum(p.stat().st_blocks * 512 for p in workspace.rglob("*") if p.is_file() and not p.is_symlink())
    agent = {"name": "test", "command": [sys.executable, "-c", writer], "limits": {"disk_bytes": base + (16 << 20)}}
    record = run_agent(spec_for(workspace, tiny_model, gsm8k_data, agent=agent, time_limit_s=90))
    run = read_json(workspace.parent / "run.json")
    assert record.status == "stopped" and run["status"] == "stopped", run
    assert run["stopped_by"]["kind"] == "disk_limit" and "limits.disk_bytes" in run["stopped_by"]["detail"]
    assert run["duration_s"] < 60
