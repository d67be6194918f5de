"""The grader's snapshot of a submission and its fingerprint, taken in one read (grader.snapshot, grader.fingerprint).

take_snapshot copies (or clones) the checkpoint following no link and hashes it in the same pass;
its manifest must be exactly checkpoint_manifest of the copy, the fingerprint must follow from the
files' own sha256, and every safety property of the copy must hold whichever way the bytes got there.
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from rlbench.grader import fingerprint as grader_fingerprint
from rlbench.grader import snapshot as grader_snapshot
from rlbench.grader.fingerprint import (
    checkpoint_manifest,
    fingerprint,
    fingerprint_matches,
    manifest_fingerprint,
    workspace_checkpoint_manifest,
)
from rlbench.grader.snapshot import snapshot_checkpoint, take_snapshot
from rlbench.grader.submission import SubmissionRefused, checkpoint_files

ODD_NAME = os.fsdecode(b"odd \xff\n name.json")  # not UTF-8, a newline, spaces: still one file


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def noise(size: int, seed: int = 0) -> bytes:
    out, counter = bytearray(), 0
    while len(out) < size:
        out += hashlib.sha256(b"%d %d" % (seed, counter)).digest()
        counter += 1
    return bytes(out[:size])


def make_layout(model: Path, layout: str) -> Path:
    write(model / "config.json", b'{"model_type": "qwen2"}')
    write(model / "tokenizer.json", b'{"version": "1.0"}')
    if layout == "single":
        write(model / "model.safetensors", noise(100_003))
    elif layout == "shards":
        write(model / "model-00001-of-00002.safetensors", noise(70_001, 1))
        write(model / "model-00002-of-00002.safetensors", noise(50_000, 2))
        write(
            model / "model.safetensors.index.json",
            b'{"weight_map": {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}}',
        )
    elif layout == "subdirectory":
        write(model / "model.safetensors", noise(30_000))
        write(model / "additional_chat_templates" / "tool.jinja", b"{{ messages }}")
        write(model / "a" / "z.json", b"[]")  # a/z.json sorts before a.txt by component
        write(model / "a.txt", b"after the directory a")
    elif layout == "empty_files":
        write(model / "model.safetensors", b"")
        write(model / "merges.txt", b"")
        write(model / "vocab.json", b"{}")
    elif layout == "odd_names":
        write(model / "model.safetensors", noise(5000))
        write(model / ODD_NAME, b"{}")
        write(model / "ünï cödé.txt", b"x")
    # Never part of a checkpoint: not copied, not fingerprinted.
    write(model / "optimizer.npz", noise(4096, 9))
    write(model / "training_args.bin", b"pickle")
    write(model / "logs" / "events.out", b"log")
    return model


LAYOUTS = ["single", "shards", "subdirectory", "empty_files", "odd_names"]


@pytest.fixture(params=["one_block", "pipelined"])
def block(request, monkeypatch):
    """Both ways a file is streamed: whole in one block, or through the threads block by block."""
    if request.param == "pipelined":
        monkeypatch.setattr(grader_fingerprint, "STREAM_BLOCK", 4096)
        monkeypatch.setattr(grader_fingerprint, "STREAM_BUFFERS", 3)
    return request.param


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_snapshot_manifest_is_the_copys_manifest(tmp_path, layout, block):
    workspace = tmp_path / "ws"
    model = make_layout(workspace / "output" / "v1", layout)
    copy = tmp_path / "snap" / "model"
    snapshot = take_snapshot(workspace, model, copy)
    assert snapshot.method in ("copy", "clone", "empty")
    assert snapshot.names == sorted(p.name for p in model.iterdir() if not p.is_dir())
    # The copy holds the checkpoint files, byte for byte, and nothing else.
    expected = {str(rel): (model / rel).read_bytes() for rel in checkpoint_files(model)}
    assert tree(copy) == expected and "optimizer.npz" not in tree(copy)
    manifest = checkpoint_manifest(copy)
    assert snapshot.manifest == manifest
    assert [f["name"] for f in manifest["files"]] == [str(rel) for rel in checkpoint_files(copy)]
    for f in manifest["files"]:
        data = (copy / f["name"]).read_bytes()
        assert f["size"] == len(data) and f["sha256"] == hashlib.sha256(data).hexdigest()  # as sha256sum says
    assert manifest["fingerprint"] == manifest_fingerprint(manifest["files"]) == fingerprint(copy) == fingerprint(model)
    in_workspace = workspace_checkpoint_manifest(workspace, model)
    assert in_workspace["fingerprint"] == manifest["fingerprint"] and in_workspace["files"] == manifest["files"]
    assert in_workspace["skipped"] == [] and in_workspace["truncated"] is None


def test_subdirectory_files_come_in_component_order(tmp_path):
    model = make_layout(tmp_path / "ws" / "m", "subdirectory")
    names = [f["name"] for f in take_snapshot(tmp_path / "ws", model, tmp_path / "copy").manifest["files"]]
    assert names.index("a/z.json") < names.index("a.txt")


def test_fingerprint_is_stable_and_changes_with_any_byte_or_name(tmp_path):
    model = make_layout(tmp_path / "m", "shards")
    first = fingerprint(model)
    assert fingerprint(model) == first and len(first) == 64
    seen = {first}

    def changed() -> str:
        value = fingerprint(model)
        assert value not in seen
        seen.add(value)
        return value

    shard = model / "model-00002-of-00002.safetensors"
    data = bytearray(shard.read_bytes())
    data[12345] ^= 1
    shard.write_bytes(bytes(data))
    changed()
    shard.write_bytes(bytes(data) + b"\0")  # one byte more
    changed()
    (model / "tokenizer.json").rename(model / "tokenizer2.json")  # a name
    changed()
    (model / "tokenizer2.json").rename(tmp_path / "t.json")
    write(model / "sub" / "tokenizer2.json", (tmp_path / "t.json").read_bytes())  # same file, moved down
    changed()
    write(model / "empty.txt", b"")  # an empty file counts
    changed()
    (model / "notes.md").write_text("not a checkpoint file")  # ... a non-checkpoint file does not
    assert fingerprint(model) in seen


def test_manifest_encoding_is_unambiguous():
    sha = "0" * 64
    one = manifest_fingerprint([{"name": "a.json", "size": 12, "sha256": sha}])
    assert one != manifest_fingerprint([{"name": "a.json", "size": 1, "sha256": sha}])
    assert one != manifest_fingerprint([{"name": "a.json1", "size": 2, "sha256": sha}])
    assert manifest_fingerprint([]) == hashlib.sha256(grader_fingerprint.FINGERPRINT_TAG).hexdigest()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fingerprint_matches_the_checkpoints_own_fingerprint_only(tmp_path, layout):
    model = make_layout(tmp_path / "m", layout)
    recorded = fingerprint(model)
    assert fingerprint_matches(model, recorded) and fingerprint_matches(model, recorded, current=recorded)
    other = make_layout(tmp_path / "other", layout)
    (other / "tokenizer.json").write_text("{}")
    for wrong in (None, "", "0" * 64, fingerprint(other)):
        assert not fingerprint_matches(model, wrong)
    (model / "config.json").write_text("{}")  # changed since recorded
    assert not fingerprint_matches(model, recorded)


# -- clones -------------------------------------------------------------------------------------------
def byte_clone(src_fd: int, dest_fd: int) -> None:
    """A stand-in for FICLONE where the file system has none: the whole source file, as it is now."""
    os.ftruncate(dest_fd, 0)
    offset = 0
    while block := os.pread(src_fd, 1 << 20, offset):
        os.pwrite(dest_fd, block, offset)
        offset += len(block)


def test_unsupported_clone_falls_back_to_copy_once(tmp_path, monkeypatch, block):
    calls = []

    def unsupported(src_fd, dest_fd):
        calls.append(src_fd)
        raise OSError(errno.EOPNOTSUPP, "Operation not supported")

    monkeypatch.setattr(grader_snapshot, "_clone", unsupported)
    model = make_layout(tmp_path / "ws" / "m", "shards")
    snapshot = take_snapshot(tmp_path / "ws", model, tmp_path / "copy")
    assert len(calls) == 1 and snapshot.method == "copy"  # not retried for the other files
    assert snapshot.manifest == checkpoint_manifest(tmp_path / "copy") and snapshot.manifest[
        "fingerprint"
    ] == fingerprint(model)


def test_other_clone_failures_copy_that_file_and_try_again(tmp_path, monkeypatch):
    calls = []

    def flaky(src_fd, dest_fd):
        calls.append(src_fd)
        if len(calls) == 1:
            os.write(dest_fd, b"partial")  # whatever a failed clone left, the copy starts from empty
            raise OSError(errno.EIO, "I/O error")
        byte_clone(src_fd, dest_fd)

    monkeypatch.setattr(grader_snapshot, "_clone", flaky)
    model = make_layout(tmp_path / "ws" / "m", "shards")
    snapshot = take_snapshot(tmp_path / "ws", model, tmp_path / "copy")
    non_empty = [rel for rel in checkpoint_files(model) if (model / rel).stat().st_size]
    assert len(calls) == len(non_empty) and snapshot.method == "mixed"
    assert snapshot.manifest == checkpoint_manifest(tmp_path / "copy") and snapshot.manifest[
        "fingerprint"
    ] == fingerprint(model)


def test_cloned_snapshot_is_hashed_from_the_clone(tmp_path, monkeypatch, block):
    monkeypatch.setattr(grader_snapshot, "_clone", byte_clone)
    model = make_layout(tmp_path / "ws" / "m", "subdirectory")
    snapshot = take_snapshot(tmp_path / "ws", model, tmp_path / "copy")
    assert snapshot.method == "clone"
    assert snapshot.manifest == checkpoint_manifest(tmp_path / "copy") and snapshot.manifest[
        "fingerprint"
    ] == fingerprint(model)
    assert tree(tmp_path / "copy") == {str(rel): (model / rel).read_bytes() for rel in checkpoint_files(model)}


def test_empty_checkpoint_files_need_no_clone(tmp_path, monkeypatch):
    monkeypatch.setattr(grader_snapshot, "_clone", lambda s, d: pytest.fail("an empty file has nothing to clone"))
    model = tmp_path / "ws" / "m"
    write(model / "config.json", b"")
    write(model / "model.safetensors", b"")
    snapshot = take_snapshot(tmp_path / "ws", model, tmp_path / "copy")
    assert snapshot.method == "empty" and [f["size"] for f in snapshot.manifest["files"]] == [0, 0]


# -- a checkpoint that changes while it is copied ----------------------------------------------------
def clone_failing(src_fd, dest_fd):
    raise OSError(errno.EIO, "I/O error")  # not "unsupported": tried again (and copied) for each file


def on_target(change, how: str, target: str = "model.safetensors"):
    """A _clone that first applies `change` to the file being snapshotted if it is `target` (after
    the snapshot opened it and took its size), then clones it (byte_clone) or fails (the copy path)."""

    def clone(src_fd, dest_fd):
        if os.readlink(f"/proc/self/fd/{src_fd}").endswith("/" + target):
            change(f"/proc/self/fd/{src_fd}")
        return (clone_failing if how == "copy" else byte_clone)(src_fd, dest_fd)

    return clone


def append(path: str) -> None:
    with open(path, "ab") as handle:
        handle.write(b"written after the open")


needs_proc = pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="needs /proc/self/fd to reach the open file")


@needs_proc
@pytest.mark.parametrize("how", ["copy", "clone"])
def test_a_growing_file_is_cut_at_its_size_when_opened(tmp_path, monkeypatch, block, how):
    model = make_layout(tmp_path / "ws" / "m", "single")
    original = (model / "model.safetensors").read_bytes()
    monkeypatch.setattr(grader_snapshot, "_clone", on_target(append, how))
    snapshot = take_snapshot(tmp_path / "ws", model, tmp_path / "copy")
    assert (model / "model.safetensors").read_bytes() != original  # it did grow
    assert (tmp_path / "copy" / "model.safetensors").read_bytes() == original
    assert snapshot.method == ("copy" if how == "copy" else "clone")
    files = {f["name"]: f for f in snapshot.manifest["files"]}
    assert files["model.safetensors"] == {
        "name": "model.safetensors",
        "size": len(original),
        "sha256": hashlib.sha256(original).hexdigest(),
    }
    assert snapshot.manifest == checkpoint_manifest(tmp_path / "copy")


@needs_proc
@pytest.mark.parametrize("how", ["copy", "clone"])
def test_a_file_truncated_while_copied_gives_what_there_was(tmp_path, monkeypatch, block, how):
    model = make_layout(tmp_path / "ws" / "m", "single")
    monkeypatch.setattr(grader_snapshot, "_clone", on_target(lambda path: os.truncate(path, 1000), how))
    snapshot = take_snapshot(tmp_path / "ws", model, tmp_path / "copy")
    assert (tmp_path / "copy" / "model.safetensors").read_bytes() == (model / "model.safetensors").read_bytes()
    assert {f["name"]: f["size"] for f in snapshot.manifest["files"]}["model.safetensors"] == 1000
    assert snapshot.manifest == checkpoint_manifest(tmp_path / "copy")


def hook_before(monkeypatch, target: str, action):
    """Run `action` just before the snapshot opens the file named `target` (the race, won every time)."""
    real = grader_snapshot._Snapshotter.open_at

    def open_at(self, dir_fd, name, dest):
        if name == target:
            action()
        return real(self, dir_fd, name, dest)

    monkeypatch.setattr(grader_snapshot._Snapshotter, "open_at", open_at)


def test_file_swapped_for_a_link_mid_snapshot_is_refused_not_followed(tmp_path, monkeypatch):
    secret = write(tmp_path / "host-secret.txt", b"a host file the grader must not copy\n")
    model = make_layout(tmp_path / "ws" / "m", "shards")

    def swap():
        (model / "tokenizer.json").unlink()
        (model / "tokenizer.json").symlink_to(secret)

    hook_before(monkeypatch, "tokenizer.json", swap)
    with pytest.raises(SubmissionRefused) as refused:
        take_snapshot(tmp_path / "ws", model, tmp_path / "copy")
    assert refused.value.reason == "not_a_regular_file" and "tokenizer.json" in refused.value.message
    assert [p for p in (tmp_path / "copy").rglob("*") if p.is_file() and p.read_bytes() == secret.read_bytes()] == []


def test_fifo_is_refused_without_blocking(tmp_path):
    model = make_layout(tmp_path / "ws" / "m", "single")
    os.mkfifo(model / "notes.txt")
    with pytest.raises(SubmissionRefused) as refused:
        take_snapshot(tmp_path / "ws", model, tmp_path / "copy")
    assert refused.value.reason == "not_a_regular_file"


def test_file_vanishing_mid_snapshot_is_checkpoint_changed(tmp_path, monkeypatch):
    model = make_layout(tmp_path / "ws" / "m", "shards")
    hook_before(monkeypatch, "tokenizer.json", lambda: (model / "tokenizer.json").unlink())
    with pytest.raises(SubmissionRefused) as refused:
        take_snapshot(tmp_path / "ws", model, tmp_path / "copy")
    assert refused.value.reason == "checkpoint_changed"


def test_read_error_is_unreadable_checkpoint(tmp_path, monkeypatch, block):
    model = make_layout(tmp_path / "ws" / "m", "single")

    def failing_readv(fd, buffers):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(grader_fingerprint.os, "readv", failing_readv)
    with pytest.raises(SubmissionRefused) as refused:
        take_snapshot(tmp_path / "ws", model, tmp_path / "copy")
    assert refused.value.reason == "unreadable_checkpoint"


def test_write_failure_is_the_graders_and_stops_the_threads(tmp_path, monkeypatch):
    monkeypatch.setattr(grader_fingerprint, "STREAM_BLOCK", 4096)
    model = make_layout(tmp_path / "ws" / "m", "single")
    writes = []

    def disk_full(fd, view):
        writes.append(len(view))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(grader_fingerprint, "_write_all", disk_full)
    monkeypatch.setattr(grader_snapshot, "_kernel_copy", lambda *args: None)  # no copy_file_range: through the process
    before = threading.active_count()
    with pytest.raises(OSError) as failure:
        take_snapshot(tmp_path / "ws", model, tmp_path / "copy")
    assert not isinstance(failure.value, SubmissionRefused) and failure.value.errno == errno.ENOSPC
    # Files are snapshot in parallel: each stopped at its first failed write, and no thread is left.
    assert sorted(writes) == [18, 23, 4096] and threading.active_count() == before


@pytest.mark.parametrize("error, reason", [(errno.ENOSPC, None), (errno.EIO, "unreadable_checkpoint")])
def test_kernel_copy_failures_are_told_apart(tmp_path, monkeypatch, error, reason):
    """copy_file_range cannot say which side failed: a full disk is the grader's (a plain OSError),
    anything else reading the agent's file is the agent's (unreadable_checkpoint)."""
    monkeypatch.setattr(grader_fingerprint, "STREAM_BLOCK", 4096)
    model = make_layout(tmp_path / "ws" / "m", "single")
    real = os.copy_file_range
    calls = []

    def failing(src, dst, count, *args):
        calls.append(count)
        if len(calls) > 1:
            raise OSError(error, os.strerror(error))
        return real(src, dst, min(count, 4096), *args)

    monkeypatch.setattr(grader_snapshot.os, "copy_file_range", failing)
    with pytest.raises((OSError, SubmissionRefused)) as failure:
        take_snapshot(tmp_path / "ws", model, tmp_path / "copy")
    if reason is None:
        assert not isinstance(failure.value, SubmissionRefused) and failure.value.errno == error
    else:
        assert isinstance(failure.value, SubmissionRefused) and failure.value.reason == reason


def test_kernel_copy_unsupported_falls_back_to_a_copy_through_the_process(tmp_path, monkeypatch):
    monkeypatch.setattr(grader_fingerprint, "STREAM_BLOCK", 4096)
    model = make_layout(tmp_path / "ws" / "m", "shards")

    def unsupported(*args):
        raise OSError(errno.EXDEV, "Invalid cross-device link")

    monkeypatch.setattr(grader_snapshot.os, "copy_file_range", unsupported)
    snapshot = take_snapshot(tmp_path / "ws", model, tmp_path / "copy")
    assert snapshot.manifest == checkpoint_manifest(tmp_path / "copy")
    assert fingerprint(tmp_path / "copy") == fingerprint(model)


def test_names_are_refused_before_anything_is_copied(tmp_path):
    model = make_layout(tmp_path / "ws" / "m", "single")
    write(model / "pytorch_model.bin", b"pickle")
    with pytest.raises(SubmissionRefused) as refused:
        take_snapshot(tmp_path / "ws", model, tmp_path / "copy")
    assert refused.value.reason == "pickle_weights" and not (tmp_path / "copy").exists()


def test_snapshot_checkpoint_still_returns_the_names(tmp_path):
    model = make_layout(tmp_path / "ws" / "m", "shards")
    (model / "latest").symlink_to(model / "logs", target_is_directory=True)  # a link, not followed
    names = snapshot_checkpoint(tmp_path / "ws", model, tmp_path / "copy")
    assert "latest" in names and "optimizer.npz" in names and "logs" not in names
    assert fingerprint(tmp_path / "copy") == fingerprint(model) and not (tmp_path / "copy" / "latest").exists()


# -- a real copy-on-write file system ----------------------------------------------------------------
def clones(directory: Path) -> bool:
    a, b = directory / ".clone-probe-a", directory / ".clone-probe-b"
    try:
        a.write_bytes(b"probe")
        with open(a, "rb") as src, open(b, "wb") as dest:
            grader_snapshot._clone(src.fileno(), dest.fileno())
        return True
    except OSError:
        return False
    finally:
        a.unlink(missing_ok=True)
        b.unlink(missing_ok=True)


@pytest.fixture
def reflink_dir(tmp_path):
    """A directory on a file system with copy-on-write clones: tmp_path itself if it has them, else
    $RLBENCH_REFLINK_DIR, else (as root, with mkfs.xfs) a loop-mounted XFS image made for the test."""
    if clones(tmp_path):
        yield tmp_path
        return
    given = os.environ.get("RLBENCH_REFLINK_DIR")
    if given and clones(Path(given)):
        own = Path(given) / f"rlbench-test-{os.getpid()}-{tmp_path.name}"
        own.mkdir()
        yield own
        shutil.rmtree(own, ignore_errors=True)
        return
    if os.geteuid() != 0 or not shutil.which("mkfs.xfs") or not shutil.which("mount"):
        pytest.skip(
            "no copy-on-write file system here: tmp_path has no FICLONE, RLBENCH_REFLINK_DIR is not "
            "set, and an XFS image needs root and mkfs.xfs (xfsprogs)"
        )
    image, mountpoint = tmp_path / "reflink.img", tmp_path / "reflink"
    mountpoint.mkdir()
    with open(image, "wb") as handle:
        handle.truncate(512 << 20)  # sparse; XFS needs 300 MB at least
    made = subprocess.run(
        ["mkfs.xfs", "-q", "-m", "reflink=1", str(image)], check=False, capture_output=True, text=True, timeout=60
    )
    if made.returncode != 0:
        pytest.skip(f"could not make a reflink XFS image: {made.stderr.strip()[:200]}")
    mounted = subprocess.run(
        ["mount", "-o", "loop", str(image), str(mountpoint)], check=False, capture_output=True, text=True, timeout=60
    )
    if mounted.returncode != 0:
        pytest.skip(
            f"could not loop-mount an XFS image (no loop devices, or no mount permission): "
            f"{mounted.stderr.strip()[:200]}"
        )
    try:
        yield mountpoint
    finally:
        subprocess.run(["umount", str(mountpoint)], check=False, capture_output=True, timeout=60)


@pytest.mark.reflink
def test_real_clone_on_a_reflink_file_system(reflink_dir, monkeypatch):
    monkeypatch.setattr(grader_fingerprint, "STREAM_BLOCK", 4096)
    model = make_layout(reflink_dir / "ws" / "m", "shards")
    copy = reflink_dir / "snap" / "model"
    snapshot = take_snapshot(reflink_dir / "ws", model, copy)
    assert snapshot.method == "clone"
    assert snapshot.manifest == checkpoint_manifest(copy) and snapshot.manifest["fingerprint"] == fingerprint(model)
    shard = model / "model-00001-of-00002.safetensors"
    before = (copy / shard.name).read_bytes()
    with open(shard, "r+b") as handle:  # the agent overwrites its file in place: the clone keeps its bytes
        handle.write(b"overwritten")
    assert (copy / shard.name).read_bytes() == before != shard.read_bytes()
    assert checkpoint_manifest(copy) == snapshot.manifest
