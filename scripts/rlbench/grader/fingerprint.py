"""A checkpoint's content fingerprint and manifest (each checkpoint file's name, size and sha256), read once.

The fingerprint is what the grader's cache, the ledger and the final evaluation know a checkpoint by:
equal checkpoint files, equal fingerprint. The streaming hasher here reads each file once, in big
blocks, hashing (and, for the snapshot's copy, writing) each block while the next is read.
"""

from __future__ import annotations

import hashlib
import os
import queue
import stat
import threading
from pathlib import Path, PurePosixPath

from rlbench.fileio import nofollow
from rlbench.grader.submission import CHECKPOINT_MAX_DEPTH, checkpoint_files, is_checkpoint_file

# A checkpoint's fingerprint is a digest of its manifest: sha256 over this tag, then for each
# checkpoint file, in checkpoint_files order, its relative name (as bytes; a name holds no NUL),
# NUL, its size in decimal, NUL, its own sha256 (64 hex digits), LF. Each file's sha256 is the
# plain one (`sha256sum FILE`), so one sha256 pass over each byte gives both, and anyone can
# recompute the fingerprint from a checkpoint.json (manifest_fingerprint).
FINGERPRINT_TAG = b"rlbench checkpoint fingerprint v2\n"
# How checkpoint files are read: in blocks of STREAM_BLOCK bytes, through STREAM_BUFFERS reusable
# buffers, each block hashed (and written, for a copy) in threads while the next one is read.
STREAM_BLOCK = 8 << 20
STREAM_BUFFERS = 4


def manifest_order(name: str) -> tuple[str, ...]:
    """The sort key of a manifest's file names: the order of checkpoint_files (by path component)."""
    return PurePosixPath(name).parts


def manifest_fingerprint(files: list[dict]) -> str:
    """The fingerprint of a checkpoint from its manifest's files ({"name", "size", "sha256"}, in
    manifest_order): what fingerprint() and checkpoint_manifest() give, without reading a byte."""
    digest = hashlib.sha256(FINGERPRINT_TAG)
    for f in files:
        digest.update(b"%s\0%d\0%s\n" % (os.fsencode(f["name"]), f["size"], f["sha256"].encode("ascii")))
    return digest.hexdigest()


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view) :]


class Streamer:
    """Reads a file once, in big blocks through a few reusable buffers (bounded memory), hashing
    each block and, for a copy, writing it. The calling thread reads; a hashing thread and a
    writing thread take each block in turn (hashlib and os.write release the GIL on big buffers),
    so reading, hashing and writing overlap: the cost is the slowest of the three, not their sum."""

    def __init__(self, block: int | None = None, buffers: int | None = None):
        self.block = block or STREAM_BLOCK
        self.count = max(buffers or STREAM_BUFFERS, 2)
        self._buffers: list[bytearray] = []

    def buffers(self) -> list[bytearray]:
        if not self._buffers:
            self._buffers = [bytearray(self.block) for _ in range(self.count)]
        return self._buffers

    def stream(self, src: int, size: int, out: int | None = None, name: str = "") -> tuple[int, str]:
        """Read src (a blocking descriptor, from its current offset) up to `size` bytes or its end
        (a file truncated meanwhile: what there was), writing every block to `out` when given;
        returns (bytes read, their sha256). A read error raises nofollow.Unreadable (named `name`); a write
        error stays a plain OSError."""
        digest = hashlib.sha256()
        if size <= self.block:  # one block (config.json, tokenizer files): no threads
            view = memoryview(self._buffers[0] if self._buffers else bytearray(size))
            total = 0
            while total < size:
                n = self._read(src, view[total:size], name)
                if n == 0:
                    break
                total += n
            digest.update(view[:total])
            if out is not None:
                _write_all(out, view[:total])
            return total, digest.hexdigest()
        return self._pipelined(src, size, out, name, digest)

    @staticmethod
    def _read(src: int, view: memoryview, name: str) -> int:
        try:
            return os.readv(src, [view])
        except OSError as exc:
            raise nofollow.Unreadable(exc.errno, exc.strerror, name) from None

    def _pipelined(self, src: int, size: int, out: int | None, name: str, digest) -> tuple[int, str]:
        free: queue.SimpleQueue = queue.SimpleQueue()
        to_hash: queue.SimpleQueue = queue.SimpleQueue()
        to_write: queue.SimpleQueue | None = queue.SimpleQueue() if out is not None else None
        failed: list[BaseException] = []  # a worker's first error; the others then only pass blocks on
        for buffer in self.buffers():
            free.put(buffer)

        def hasher() -> None:
            while (item := to_hash.get()) is not None:
                if not failed:
                    try:
                        digest.update(memoryview(item[0])[: item[1]])
                    except BaseException as exc:  # noqa: BLE001 - handed to the reading thread
                        failed.append(exc)
                (to_write or free).put(item if to_write is not None else item[0])
            if to_write is not None:
                to_write.put(None)

        def writer() -> None:
            while (item := to_write.get()) is not None:
                if not failed:
                    try:
                        _write_all(out, memoryview(item[0])[: item[1]])
                    except BaseException as exc:  # noqa: BLE001 - handed to the reading thread
                        failed.append(exc)
                free.put(item[0])

        threads = [threading.Thread(target=hasher, name="snapshot-hash", daemon=True)]
        if to_write is not None:
            threads.append(threading.Thread(target=writer, name="snapshot-write", daemon=True))
        for thread in threads:
            thread.start()
        total = 0
        try:
            while total < size and not failed:
                buffer = free.get()
                n = self._read(src, memoryview(buffer)[: min(size - total, self.block)], name)
                if n == 0:
                    break  # truncated while read: what there was
                total += n
                to_hash.put((buffer, n))
        finally:
            to_hash.put(None)
            for thread in threads:
                thread.join()
        if failed:
            raise failed[0]
        return total, digest.hexdigest()


def file_entry(rel, size: int, sha256: str) -> dict:
    """One file of a manifest: its name relative to the checkpoint, its size and its sha256."""
    return {"name": str(rel), "size": size, "sha256": sha256}


def fingerprint(model_dir: Path) -> str:
    """The checkpoint's fingerprint (see FINGERPRINT_TAG): equal checkpoint files, equal fingerprint."""
    return checkpoint_manifest(model_dir)["fingerprint"]


def checkpoint_manifest(model_dir: Path) -> dict:
    """The fingerprint (the same value as fingerprint()) and each checkpoint file's name, size and
    sha256, all from one read of the files. For the grader's own copies (it follows no link in
    model_dir's tree, as checkpoint_files, but checks nothing): see workspace_checkpoint_manifest
    for a directory of the agent's, take_snapshot for the copy and its manifest in one read."""
    streamer = Streamer()
    files = []
    for rel in checkpoint_files(model_dir):
        fd = os.open(model_dir / rel, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size, sha256 = streamer.stream(fd, os.fstat(fd).st_size, name=str(rel))
        finally:
            os.close(fd)
        files.append(file_entry(rel, size, sha256))
    return {"fingerprint": manifest_fingerprint(files), "files": files}


def fingerprint_matches(model_dir: Path, expected: str | None, current: str | None = None) -> bool:
    """Whether model_dir's checkpoint files are those `expected` fingerprints. `current`: model_dir's
    fingerprint() when the caller already has it (saves a read)."""
    if not isinstance(expected, str) or not expected:
        return False
    return (current if current is not None else fingerprint(model_dir)) == expected


def workspace_checkpoint_manifest(workspace: Path, model_dir: Path, max_bytes: int | None = None) -> dict:
    """checkpoint_manifest of a directory inside the agent's workspace, read as the grader reads a
    submission: following no link (a checkpoint file that is a link, a FIFO or a device is left out
    and named in `skipped`), each file opened relative to its directory with O_NOFOLLOW and read up
    to the size it had when opened. The fingerprint is the one the grader would give the same
    regular files (None when something was skipped, unreadable, or when the files hold more than
    max_bytes: then `files` lists names and sizes only, and `truncated` says why)."""
    root = Path(os.path.realpath(workspace))
    result: dict = {"fingerprint": None, "files": [], "skipped": [], "truncated": None}
    try:
        top = nofollow.open_directory_inside(root, Path(os.path.realpath(model_dir)))
    except (OSError, ValueError) as exc:
        result["truncated"] = f"not a directory of the workspace ({exc.__class__.__name__})"
        return result
    streamer = Streamer()
    hashed: list[dict] = []
    total = 0
    try:
        walk = nofollow.walk(top, CHECKPOINT_MAX_DEPTH, skip_unreadable=True)
        try:
            for entry in walk:
                if stat.S_ISDIR(entry.st.st_mode) or not is_checkpoint_file(entry.name):
                    continue
                if not stat.S_ISREG(entry.st.st_mode):
                    result["skipped"].append(str(entry.rel))
                    continue
                total += entry.st.st_size
                if result["truncated"] is None and max_bytes is not None and total > max_bytes:
                    result["truncated"] = f"more than {max_bytes} bytes: not hashed"
                if result["truncated"] is not None:
                    result["files"].append({"name": str(entry.rel), "size": entry.st.st_size, "sha256": None})
                    continue
                try:
                    fd = os.open(entry.name, nofollow.FILE_FLAGS, dir_fd=entry.dir_fd)
                except OSError:
                    result["skipped"].append(str(entry.rel))
                    continue
                try:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode):
                        result["skipped"].append(str(entry.rel))
                        continue
                    os.set_blocking(fd, True)
                    size, sha256 = streamer.stream(fd, st.st_size, name=str(entry.rel))
                    hashed.append(file_entry(entry.rel, size, sha256))
                except OSError:
                    result["skipped"].append(str(entry.rel))
                    result["truncated"] = result["truncated"] or "a file could not be read"
                finally:
                    os.close(fd)
        finally:
            walk.close()
    finally:
        os.close(top)
    hashed.sort(key=lambda f: manifest_order(f["name"]))
    if result["truncated"] is None and not result["skipped"]:
        result["fingerprint"] = manifest_fingerprint(hashed)
    result["files"] = hashed + result["files"]  # hashed, then those left unhashed
    result["files"].sort(key=lambda f: manifest_order(f["name"]))
    result["bytes"] = total
    return result

