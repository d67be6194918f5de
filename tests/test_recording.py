"""Runtime recording: code revisions (grader/code.git), checkpoint records, the resource trace, the
final state of a run, and a run reconstructed from its record alone.

Real grading servers over HTTP (the base model resubmitted: answered from the cache, no
evaluation), real git, a real child process for the sampler.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import types
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from rlbench import cli
from rlbench.summaries.artifacts import collect_artifacts
from rlbench.grader.fingerprint import (
    checkpoint_manifest,
    fingerprint,
    fingerprint_matches,
    manifest_fingerprint,
    workspace_checkpoint_manifest,
)
from rlbench.grader.submission import checkpoint_files
from rlbench.fileio.jsonio import read_json, read_jsonl, write_json
from rlbench.recording import repository
from rlbench.recording.reconstruct import reconstruct
from rlbench.recording.repository import CODE_GIT, CodeRepository, code_revisions, git_env
from rlbench.recording.trace import (
    GPU_BUSY_ABOVE_PERCENT,
    GpuQueryError,
    ResourceSampler,
    gpu_hours,
    gpu_row,
    gpu_sample,
    query_gpus,
    summarize_trace,
    tree_of,
)
from rlbench.recording.workspace_state import workspace_usage
from support.models import copy_model
from support.nvidia_smi import FakeNvidiaSmi, gpu

pytestmark = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def submit(server, model_path: str) -> dict:
    response = requests.post(f"{server.url}/submit", json={"model_path": model_path}, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def git(git_dir: Path, *args: str) -> str:
    env = git_env(git_dir)
    return subprocess.run(
        ["git", "--git-dir", str(git_dir), *args], capture_output=True, text=True, check=True, env=env
    ).stdout


# -- code revisions ------------------------------------------------------------------------------
def test_each_submission_commits_the_code_as_it_was(workspace, start_grader, tiny_model):
    server = start_grader(workspace)
    copy_model(tiny_model, workspace / "output" / "v1")
    (workspace / "code" / "train.py").write_text("lr = 1e-5\n")
    first = submit(server, "output/v1")
    (workspace / "code" / "train.py").write_text("lr = 5e-4\n")
    (workspace / "code" / "sub").mkdir()
    (workspace / "code" / "sub" / "grpo.py").write_text("GRPOTrainer(model=m)\n")
    copy_model(tiny_model, workspace / "output" / "v2")
    second = submit(server, "output/v2")
    (workspace / "code" / "sub" / "grpo.py").unlink()
    third = submit(server, "output/v2")  # a repeat of submission 2: still a revision of its own
    entries = list(read_jsonl(server.grader.ledger_path))
    revisions = [e["code_revision"] for e in entries]
    assert all(revisions) and len(set(revisions)) == 3
    # The agent may see its own revision id; scores.json keeps the reference's fields only.
    assert [first["code_revision"], second["code_revision"], third["code_revision"]] == revisions
    assert all("code_revision" not in s for s in read_json(workspace / "scores.json"))
    git_dir = workspace.parent / "grader" / CODE_GIT
    assert git(git_dir, "show", f"{revisions[0]}:train.py") == "lr = 1e-5\n"
    assert git(git_dir, "show", f"{revisions[1]}:train.py") == "lr = 5e-4\n"
    assert git(git_dir, "show", f"{revisions[1]}:sub/grpo.py") == "GRPOTrainer(model=m)\n"
    assert git(git_dir, "ls-tree", "-r", "--name-only", revisions[2]).split() == ["train.py"]
    log = git(git_dir, "log", "--format=%H|%s|%an <%ae>|%cn|%at|%ct", "main").splitlines()
    assert [line.split("|")[:2] for line in reversed(log)] == [
        [r, f"submission {i}"] for i, r in enumerate(revisions, 1)
    ]
    for line, entry in zip(reversed(log), entries):
        _, _, author, committer, authored, committed = line.split("|")
        assert author == "rlbench grader <grader@rlbench.invalid>" and committer == "rlbench grader"
        assert int(authored) == int(committed) == int(entry["submitted_at"])
    assert (
        subprocess.run(
            ["git", "--git-dir", str(git_dir), "fsck", "--strict"], capture_output=True, env=git_env(git_dir)
        ).returncode
        == 0
    )
    # The grader's own reading of the repository, as collect_artifacts records it.
    assert [(r["sha"], r["submission"]) for r in code_revisions(git_dir.parent)] == list(
        zip(revisions, [1, 2, 3])
    )


def test_a_relative_grader_dir_works_from_anywhere(tmp_path, monkeypatch):
    """The runner gives relative run directories (results/runs/...); git runs in other directories."""
    monkeypatch.chdir(tmp_path)
    tree = tmp_path / "snapshot"
    tree.mkdir()
    (tree / "train.py").write_text("x = 1\n")
    repo = CodeRepository(Path("results/runs/t/m/a/0/grader") / CODE_GIT)
    sha = repo.commit(tree, "submission 1", time.time())
    assert (tmp_path / "results/runs/t/m/a/0/grader" / CODE_GIT / "HEAD").is_file()
    assert sorted(p.name for p in (tmp_path / "results/runs/t/m/a/0/grader").iterdir()) == [CODE_GIT]
    assert repo.show(sha, "train.py") == b"x = 1\n"
    assert [r["sha"] for r in code_revisions(Path("results/runs/t/m/a/0/grader"))] == [sha]


def test_an_unchanged_or_missing_code_dir_still_gets_a_revision(workspace, start_grader, tiny_model):
    server = start_grader(workspace)
    copy_model(tiny_model, workspace / "output" / "v1")
    first = submit(server, "output/v1")["code_revision"]
    shutil.rmtree(workspace / "code")
    second = submit(server, "output/v1")["code_revision"]
    assert first and second and first != second
    git_dir = workspace.parent / "grader" / CODE_GIT
    empty_tree = git(git_dir, "rev-parse", f"{first}^{{tree}}").strip()
    assert git(git_dir, "rev-parse", f"{second}^{{tree}}").strip() == empty_tree


def test_concurrent_submissions_get_distinct_commits_in_one_line(workspace, start_grader, tiny_model):
    server = start_grader(workspace)
    for i in range(8):
        copy_model(tiny_model, workspace / "output" / f"v{i}")
        (workspace / "code" / f"f{i}.py").write_text(f"x = {i}\n")
    with ThreadPoolExecutor(8) as pool:
        bodies = list(pool.map(lambda i: submit(server, f"output/v{i}"), range(8)))
    revisions = [b["code_revision"] for b in bodies]
    assert all(revisions) and len(set(revisions)) == 8
    git_dir = workspace.parent / "grader" / CODE_GIT
    chain = git(git_dir, "rev-list", "--first-parent", "main").split()
    assert sorted(chain) == sorted(revisions)  # one linear history holding every commit
    messages = git(git_dir, "log", "--format=%s", "main").splitlines()
    assert sorted(messages) == sorted(f"submission {b['submission_id']}" for b in bodies)
    assert (
        subprocess.run(
            ["git", "--git-dir", str(git_dir), "fsck", "--strict"], capture_output=True, env=git_env(git_dir)
        ).returncode
        == 0
    )
    assert not (git_dir / "rlbench-index").exists()


def test_a_hostile_code_dir_changes_nothing(workspace, start_grader, tiny_model, tmp_path, monkeypatch):
    """Links, attributes asking for filters and conversions, hooks, a nested repository in code/,
    and a hostile git configuration in the environment: the revision holds the copied files as
    they are, and nothing of the agent's or the user's git setup runs."""
    marker = tmp_path / "ran"
    evil = f"sh -c 'touch {marker}; cat'"
    home = tmp_path / "home"
    (home / "hooks").mkdir(parents=True)
    hook = home / "hooks" / "post-commit"
    hook.write_text(f"#!/bin/sh\ntouch {marker}\n")
    hook.chmod(0o755)
    (home / ".gitconfig").write_text(
        f'[filter "evil"]\n\tclean = {evil}\n\tsmudge = {evil}\n\trequired = true\n[core]\n\thooksPath = {home / "hooks"}\n'
        f"\tautocrlf = true\n\tfsmonitor = {hook}\n"
    )
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(home))
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(home / ".gitconfig"))
    monkeypatch.setenv("GIT_DIR", str(tmp_path / "elsewhere.git"))
    monkeypatch.setenv("GIT_WORK_TREE", str(tmp_path))
    code = workspace / "code"
    (code / "train.py").write_bytes(b"# $Id$\r\nprint('mine')\n")
    (code / ".gitattributes").write_text("* filter=evil text eol=crlf ident\n")
    (code / ".gitignore").write_text("*\n")
    (code / "etc").symlink_to("/etc", target_is_directory=True)
    (code / "passwd").symlink_to("/etc/passwd")
    (code / "hooks").mkdir()
    (code / "hooks" / "post-commit").write_text(f"#!/bin/sh\ntouch {marker}\n")
    (code / "hooks" / "post-commit").chmod(0o755)
    nested = code / "vendored"
    (nested / ".git" / "hooks").mkdir(parents=True)
    (nested / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (nested / ".git" / "config").write_text(f"[core]\n\tfsmonitor = {hook}\n\thooksPath = {home / 'hooks'}\n")
    (nested / "lib.py").write_text("x = 1\n")
    (code / "sub").mkdir()
    (code / "sub" / ".git").write_text("gitdir: /etc\n")
    server = start_grader(workspace)
    copy_model(tiny_model, workspace / "output" / "v1")
    revision = submit(server, "output/v1")["code_revision"]
    assert revision
    git_dir = workspace.parent / "grader" / CODE_GIT
    monkeypatch.delenv("GIT_DIR")
    monkeypatch.delenv("GIT_WORK_TREE")
    repo = CodeRepository(git_dir)
    names = sorted(f["path"] for f in repo.files(revision))
    # .snapshot.json: the grader's note of what its copy skipped (the links); no .git path is recorded.
    assert names == [
        ".gitattributes",
        ".gitignore",
        ".snapshot.json",
        "hooks/post-commit",
        "train.py",
        "vendored/lib.py",
    ]
    assert repo.show(revision, "train.py") == b"# $Id$\r\nprint('mine')\n"  # no filter, eol or ident
    assert not marker.exists()
    assert not (tmp_path / "elsewhere.git").exists()
    assert sorted(p.name for p in git_dir.iterdir()) == ["HEAD", "config", "objects", "refs"]  # no hooks, no index
    assert "evil" not in (git_dir / "config").read_text()


def test_a_code_dir_that_is_a_link_records_an_empty_revision(workspace, start_grader, tiny_model):
    server = start_grader(workspace)
    copy_model(tiny_model, workspace / "output" / "v1")
    shutil.rmtree(workspace / "code")
    (workspace / "code").symlink_to("/etc", target_is_directory=True)
    revision = submit(server, "output/v1")["code_revision"]
    assert revision and CodeRepository(workspace.parent / "grader" / CODE_GIT).files(revision) == []


def test_without_git_the_submission_is_answered_and_the_revision_is_null(
    workspace, start_grader, tiny_model, monkeypatch
):
    monkeypatch.setattr(repository, "shutil", types.SimpleNamespace(which=lambda name: None))
    server = start_grader(workspace)
    copy_model(tiny_model, workspace / "output" / "v1")
    body = submit(server, "output/v1")
    assert body["status"] == "cached" and body["code_revision"] is None
    assert list(read_jsonl(server.grader.ledger_path))[0]["code_revision"] is None


# -- checkpoint records ------------------------------------------------------------------------------
def test_checkpoint_record_per_submission(workspace, start_grader, tiny_model):
    server = start_grader(workspace)
    model = copy_model(tiny_model, workspace / "output" / "v1")
    (model / "extra").mkdir()
    (model / "extra" / "notes.txt").write_text("nested\n")
    submit(server, "output/v1")
    entry = list(read_jsonl(server.grader.ledger_path))[0]
    record = read_json(workspace.parent / "grader" / "snapshots" / "0001" / "checkpoint.json")
    assert record["fingerprint"] == entry["fingerprint"] == fingerprint(model) == manifest_fingerprint(record["files"])
    expected = [
        {
            "name": str(rel),
            "size": (model / rel).stat().st_size,
            "sha256": hashlib.sha256((model / rel).read_bytes()).hexdigest(),
        }
        for rel in checkpoint_files(model)
    ]
    assert record["files"] == expected and "extra/notes.txt" in [f["name"] for f in expected]
    assert record["config"] == json.loads((model / "config.json").read_text())
    assert abs(record["recorded_at"] - time.time()) < 120


def test_the_fingerprint_is_the_manifests_and_matches_itself(tiny_model):
    manifest = checkpoint_manifest(tiny_model)
    assert fingerprint(tiny_model) == manifest["fingerprint"] == manifest_fingerprint(manifest["files"])
    assert fingerprint_matches(tiny_model, fingerprint(tiny_model))
    assert not fingerprint_matches(tiny_model, "0" * 64)


def test_workspace_checkpoint_manifest_follows_no_link(tmp_path, tiny_model):
    ws = tmp_path / "ws"
    model = copy_model(tiny_model, ws / "output" / "v1")
    assert workspace_checkpoint_manifest(ws, model)["fingerprint"] == fingerprint(tiny_model)
    bounded = workspace_checkpoint_manifest(ws, model, max_bytes=10)
    assert (
        bounded["fingerprint"] is None and bounded["truncated"] and all(f["sha256"] is None for f in bounded["files"])
    )
    secret = tmp_path / "secret.txt"
    secret.write_text("host\n")
    (model / "notes.txt").symlink_to(secret)
    os.mkfifo(model / "vocab.txt")  # would block a reader that opens it
    manifest = workspace_checkpoint_manifest(ws, model)
    assert manifest["fingerprint"] is None and sorted(manifest["skipped"]) == ["notes.txt", "vocab.txt"]
    assert workspace_checkpoint_manifest(ws, tmp_path)["truncated"]  # outside the workspace


# -- the resource trace ------------------------------------------------------------------------------
def test_resource_sampler_samples_a_real_child(tmp_path):
    ws = tmp_path / "ws"
    (ws / "code").mkdir(parents=True)
    (ws / "code" / "a.bin").write_bytes(b"x" * 10_000)
    (ws / "root").symlink_to("/", target_is_directory=True)  # not followed
    out = tmp_path / "run" / "resources.jsonl"
    busy = "import time\nx = bytearray(64 << 20)\nt = time.time()\nwhile time.time() - t < 4: pass\n"
    # A parent that waits for a busy child: the sampler measures the whole tree.
    child = subprocess.Popen(
        [sys.executable, "-c", f"import subprocess, sys\nsubprocess.run([sys.executable, '-c', {busy!r}])"]
    )

    def processes():
        return tree_of(child.pid) + tree_of(child.pid)  # listed twice, counted once

    try:
        with ResourceSampler(processes, ws, out, interval_s=0.5) as sampler:
            time.sleep(2.2)
            (ws / "code" / "b.bin").write_bytes(b"y" * 5_000)
            time.sleep(1.0)
    finally:
        for proc in tree_of(child.pid)[::-1]:
            proc.kill()
        child.wait()
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(lines) == sampler.samples >= 5
    assert {
        "ts",
        "cpu_percent",
        "rss_bytes",
        "n_processes",
        "workspace_bytes",
        "workspace_files",
        "workspace_truncated",
    } <= set(lines[0])
    alive = [s for s in lines if s["n_processes"] == 2]
    assert alive and max(s["rss_bytes"] for s in alive) > 64 << 20
    assert max(s["cpu_percent"] for s in alive) > 30  # a busy loop: most of a core
    assert lines[0]["workspace_bytes"] == 10_000 and lines[-1]["workspace_bytes"] == 15_000
    # The workspace is walked at most every 30 s (and at the end): samples in between repeat the last walk.
    assert lines[1]["workspace_ts"] == lines[-2]["workspace_ts"] == lines[0]["workspace_ts"] < lines[-1]["workspace_ts"]
    if shutil.which("nvidia-smi") is None:
        assert all("gpu_memory_used_mib" not in s for s in lines)
    summary = summarize_trace(out)
    assert summary["samples"] == len(lines) and summary["peak_rss_bytes"] > 64 << 20
    assert summary["peak_workspace_bytes"] == summary["final_workspace_bytes"] == 15_000
    assert summary["peak_cpu_percent"] > 30 and summary["workspace_truncated"] is False
    assert summarize_trace(tmp_path / "none.jsonl") is None


def wait_for_samples(sampler: ResourceSampler, count: int, timeout_s: float = 60) -> None:
    deadline = time.monotonic() + timeout_s
    while sampler.samples < count:
        assert time.monotonic() < deadline, f"fewer than {count} samples after {timeout_s} s"
        time.sleep(0.05)


def test_resource_sampler_records_gpu_utilisation_and_memory(tmp_path, monkeypatch):
    """Per GPU, nvidia-smi's utilisation, memory used and memory total go into every sample (a fake
    nvidia-smi on PATH), and the summary counts GPU-hours busy and idle over the run's GPUs."""
    fake = FakeNvidiaSmi(tmp_path, [gpu(0, utilization=0, used_mib=3), gpu(1, utilization=0, used_mib=5)])
    monkeypatch.setenv("PATH", f"{fake.bin}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "resources.jsonl"
    with ResourceSampler(lambda: [], tmp_path, out, interval_s=0.3) as sampler:
        # Waits for samples, not for seconds: on a loaded machine a sample can come late. Two idle
        # samples (an idle interval), then two more after the switch (the last reads it: a busy one).
        wait_for_samples(sampler, 2)
        fake.set([gpu(0, utilization=97, used_mib=40_000), {**gpu(1, used_mib=5), "utilization.gpu": "[N/A]"}])
        wait_for_samples(sampler, sampler.samples + 2)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines[0]["gpu_utilization_percent"] == {"0": 0, "1": 0}
    assert lines[0]["gpu_memory_used_mib"] == {"0": 3, "1": 5}
    assert lines[0]["gpu_memory_total_mib"] == {"0": 81559, "1": 81559}
    # A value nvidia-smi does not report is left out, never written as 0.
    assert lines[-1]["gpu_utilization_percent"] == {"0": 97} and lines[-1]["gpu_memory_used_mib"]["0"] == 40_000
    summary = summarize_trace(out, gpus=["0"])
    assert summary["peak_gpu_memory_mib"] == {"0": 40_000, "1": 5}
    assert summary["peak_gpu_memory_total_mib"] == 40_005
    assert summary["peak_gpu_utilization_percent"] == {"0": 97, "1": 0}
    hours = summary["gpu_hours"]
    assert hours["gpus"] == ["0"] and hours["busy"] > 0 and hours["idle"] > 0
    assert hours["busy"] + hours["idle"] == pytest.approx((lines[-1]["ts"] - lines[0]["ts"]) / 3600, abs=1e-5)
    # Without nvidia-smi: no GPU field at all, and no GPU-hours (never fake zeros).
    monkeypatch.setenv("PATH", str(Path(sys.executable).parent))
    assert query_gpus() is None
    bare = tmp_path / "bare.jsonl"
    with ResourceSampler(lambda: [], tmp_path, bare, interval_s=0.1):
        time.sleep(0.15)
    assert all(not any(k.startswith("gpu_") for k in json.loads(line)) for line in bare.read_text().splitlines())
    bare_summary = summarize_trace(bare)
    assert bare_summary["gpu_hours"] is None and bare_summary["peak_gpu_utilization_percent"] is None


def test_on_a_shared_node_the_trace_holds_only_the_runs_gpus(tmp_path, monkeypatch):
    """Four GPUs on the node, two busy with other jobs; the run was given GPU 2 by its UUID (as SLURM
    may set CUDA_VISIBLE_DEVICES). Its trace, peaks and GPU-hours are GPU 2's alone: no other job's
    memory or busy time counted as the run's (before: every GPU, since a UUID is not an index)."""
    node = [gpu(0, utilization=97, used_mib=71_234), gpu(1, utilization=71, used_mib=71_234), gpu(2, used_mib=4), gpu(3)]
    fake = FakeNvidiaSmi(tmp_path, node)
    monkeypatch.setenv("PATH", f"{fake.bin}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "resources.jsonl"
    with ResourceSampler(lambda: [], tmp_path, out, interval_s=0.2, gpus=["GPU-fake-2"]) as sampler:
        wait_for_samples(sampler, 3)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert all(line["gpu_memory_used_mib"] == {"2": 4} for line in lines), lines[0]
    summary = summarize_trace(out, gpus=["GPU-fake-2"])
    assert summary["peak_gpu_memory_total_mib"] == 4 and summary["peak_gpu_utilization_percent"] == {"2": 0}
    assert summary["gpu_hours"]["gpus"] == ["2"] and summary["gpu_hours"]["busy"] == 0
    # Given by index, the same; a MIG instance matches no GPU row: no GPU figures rather than the node's.
    assert gpu_sample(["2"])["gpu_memory_used_mib"] == {"2": 4}
    assert gpu_sample(["MIG-0f3e"]) == {"gpu_utilization_percent": {}, "gpu_memory_used_mib": {}, "gpu_memory_total_mib": {}}
    assert gpu_sample(None)["gpu_memory_used_mib"] == {"0": 71_234, "1": 71_234, "2": 4, "3": 0}  # all visible


def test_a_cuda_visible_devices_entry_names_a_gpu_by_index_uuid_or_unique_uuid_prefix():
    rows = [{"index": "0", "uuid": "GPU-5f2c11aa"}, {"index": "1", "uuid": "GPU-5f2d22bb"}, {"index": "10", "uuid": "GPU-77"}]
    assert gpu_row(rows, "1")["uuid"] == "GPU-5f2d22bb"
    assert gpu_row(rows, "GPU-5f2c11aa")["index"] == "0"
    assert gpu_row(rows, "GPU-5f2c")["index"] == "0"  # a unique prefix, as CUDA accepts
    assert gpu_row(rows, "GPU-5f2") is None  # two GPUs start so: neither
    assert gpu_row(rows, "MIG-5f2c") is None and gpu_row(rows, "2") is None


def test_a_sample_records_the_agent_logs_size_when_given_its_path(tmp_path):
    log = tmp_path / "agent.log"
    sampler = ResourceSampler(lambda: [], tmp_path, tmp_path / "r.jsonl", log_path=log)
    assert sampler.sample()["agent_log_bytes"] == 0  # not written yet
    log.write_text("loading model\n")
    assert sampler.sample()["agent_log_bytes"] == 14
    assert "agent_log_bytes" not in ResourceSampler(lambda: [], tmp_path, tmp_path / "r.jsonl").sample()


def test_a_failing_nvidia_smi_is_a_clear_error_and_no_gpu_sample(tmp_path, monkeypatch):
    fake = FakeNvidiaSmi(tmp_path, "fail")
    monkeypatch.setenv("PATH", f"{fake.bin}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(GpuQueryError, match="exit status 1: NVIDIA-SMI has failed"):
        query_gpus()
    sample = ResourceSampler(lambda: [], tmp_path, tmp_path / "r.jsonl").sample()
    assert not any(key.startswith("gpu_") for key in sample)


def test_gpu_hours_count_each_interval_by_the_utilisation_at_its_end():
    def sample(ts, **utilisation):
        return {"ts": ts, "gpu_utilization_percent": {k.lstrip("g"): v for k, v in utilisation.items()}}

    samples = [sample(0, g0=0, g1=50), sample(3600, g0=80, g1=0), sample(5400, g0=0, g1=0), sample(7200, g0=1)]
    # GPU 0: the first hour ends at 80 % (busy), the next half hour at 0 % (idle), the last at 1 % (busy).
    assert gpu_hours(samples, ["0"]) == {"busy": 1.5, "idle": 0.5, "gpus": ["0"], "busy_above_percent": GPU_BUSY_ABOVE_PERCENT}
    # Both GPUs (none given: all were visible), summed; GPU 1 has no reading at the last sample: not counted.
    both = gpu_hours(samples, [])
    assert both["gpus"] == ["0", "1"] and (both["busy"], both["idle"]) == (1.5, 0.5 + 1.5)
    # Ids that are not nvidia-smi's indices (UUIDs): every GPU the trace saw.
    assert gpu_hours(samples, ["GPU-abc"])["gpus"] == ["0", "1"]
    assert gpu_hours([{"ts": 0}, {"ts": 5, "gpu_memory_used_mib": {"0": 1}}]) is None


def test_resource_sampler_survives_a_failing_process_source(tmp_path):
    out = tmp_path / "resources.jsonl"

    def processes():
        raise RuntimeError("gone")

    with ResourceSampler(processes, tmp_path, out, interval_s=0.1):
        time.sleep(0.35)
    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert lines and all(s["n_processes"] == 0 for s in lines)


def test_workspace_usage_is_bounded_and_grouped(tmp_path):
    for top in ("code", "output"):
        for i in range(3):
            (tmp_path / top / f"d{i}").mkdir(parents=True)
            (tmp_path / top / f"d{i}" / "f").write_bytes(b"z" * 100)
    (tmp_path / "top.txt").write_bytes(b"t" * 7)
    os.link(tmp_path / "top.txt", tmp_path / "code" / "hardlink.txt")  # counted once
    usage = workspace_usage(tmp_path, listing=3)
    assert usage["files"] == 8 and usage["bytes"] == 607 and not usage["truncated"]
    # code/ is walked before top.txt: the hard-linked content is counted there, once.
    assert usage["by_top"] == {
        "code": {"files": 4, "bytes": 307},
        "output": {"files": 3, "bytes": 300},
        ".": {"files": 1, "bytes": 0},
    }
    assert len(usage["listing"]) == 3 and usage["listing_truncated"]
    assert workspace_usage(tmp_path, max_entries=4)["truncated"] is True


# -- collect_artifacts and reconstruct on a run the grader recorded --------------------------------------
def recorded_run(workspace, start_grader, tiny_model) -> Path:
    """A run directory as run_agent leaves it, with two submissions and code that changed."""
    run_dir = workspace.parent
    server = start_grader(workspace)
    copy_model(tiny_model, workspace / "output" / "v1")
    (workspace / "code" / "sft.py").write_text("trainer = SFTTrainer(model=m)\n")
    submit(server, "output/v1")
    (workspace / "code" / "grpo.py").write_text("trainer = GRPOTrainer(model=m, reward_funcs=[r])\n")
    copy_model(tiny_model, workspace / "output" / "v2" / "checkpoint-10")
    submit(server, "output/v2/checkpoint-10")
    start = server.grader.config.start_time
    write_json(
        run_dir / "run.json",
        {
            "status": "completed",
            "exit_code": 0,
            "start_time": start,
            "end_time": time.time(),
            "time_limit_s": 600,
            "labels": {"task": "gsm8k", "model": "tiny", "agent": "test", "seed": 0},
            "best": server.grader.best,
        },
    )
    write_json(run_dir / "workspace.json", {"model": "models/rlbench/tiny-qwen2", "mode": "sft-only"})
    with open(run_dir / "resources.jsonl", "w") as handle:
        for i in range(3):
            handle.write(
                json.dumps(
                    {
                        "ts": start + 5 * i,
                        "cpu_percent": 50.0 * i,
                        "rss_bytes": 1000 * i,
                        "n_processes": 1,
                        "workspace_bytes": 10 * i,
                        "workspace_files": i,
                        "workspace_truncated": False,
                    }
                )
                + "\n"
            )
    return run_dir


def test_collect_artifacts_records_the_final_state(workspace, start_grader, tiny_model):
    run_dir = recorded_run(workspace, start_grader, tiny_model)
    (workspace / "output" / "link").symlink_to(tiny_model, target_is_directory=True)  # not followed
    artifacts = collect_artifacts(run_dir, read_json(run_dir / "workspace.json"))
    json.dumps(artifacts)
    entries = list(read_jsonl(run_dir / "grader" / "ledger.jsonl"))
    assert [(r["sha"], r["submission"]) for r in artifacts["code_revisions"]] == [
        (e["code_revision"], e["submission_id"]) for e in entries
    ]
    versions = {v["path"]: v for v in artifacts["models"]["versions"]}
    assert sorted(versions) == ["output/v1", "output/v2/checkpoint-10"]
    assert versions["output/v1"]["fingerprint"] == fingerprint(tiny_model) and versions["output/v1"][
        "submitted_as"
    ] == [1, 2]
    assert versions["output/v1"]["bytes"] == sum(f["size"] for f in versions["output/v1"]["files"])
    assert artifacts["model_versions"] == ["output/v1", "output/v2/checkpoint-10"]
    state = artifacts["final_state"]
    assert state["by_top"]["output"]["files"] == 2 * len(checkpoint_files(tiny_model)) and state["links"] == 1
    assert {"path": "code/sft.py", "size": (workspace / "code" / "sft.py").stat().st_size} in state["listing"]
    assert artifacts["resources"]["samples"] == 3 and artifacts["resources"]["peak_cpu_percent"] == 100.0
    assert artifacts["mode"] == "sft-only" and artifacts["final_code_route"] == "SFT+RL"


def test_reconstruct_a_run_from_its_record(workspace, start_grader, tiny_model, capsys):
    run_dir = recorded_run(workspace, start_grader, tiny_model)
    (run_dir / "agent").mkdir()
    (run_dir / "agent" / "prompt.md").write_text("Improve the model.\n")
    (run_dir / "gateway").mkdir()
    (run_dir / "gateway" / "transcript.jsonl").write_text('{"role": "user"}\n{"role": "assistant"}\n')
    shutil.rmtree(workspace / "code")  # the code at each submission comes from code.git alone
    shutil.rmtree(run_dir / "grader" / "snapshots" / "0001" / "code")
    story = reconstruct(run_dir)
    assert story["prompt"]["text"] == "Improve the model.\n" and story["transcript"]["records"] == 2
    assert story["mode"] == "sft-only" and story["missing"] == []
    assert [s["code_files"] for s in story["submissions"]] == [["sft.py"], ["grpo.py", "sft.py"]]
    assert [s["score"] for s in story["submissions"]] == [0.0, 0.0]
    assert story["submissions"][0]["checkpoint"]["fingerprint"] == fingerprint(tiny_model)
    assert [r["submission"] for r in story["code_revisions"]] == [1, 2]
    assert story["resources"]["samples"] == 3
    assert cli.main(["reconstruct", str(run_dir)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["submissions"][1]["code_revision"] == story["submissions"][1]["code_revision"]
    assert cli.main(["reconstruct", str(run_dir / "nope")]) == 1


def test_reconstruct_says_what_is_missing(tmp_path):
    story = reconstruct(tmp_path)
    assert story["submissions"] == [] and story["prompt"] is None and story["transcript"] is None
    assert set(story["missing"]) == {
        "agent/prompt.md",
        "gateway/transcript.jsonl",
        "grader/ledger.jsonl",
        f"grader/{CODE_GIT}",
    }
