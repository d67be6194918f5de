"""The grader's copies of a submission that follow no link: the checkpoint, fingerprinted in the same read, and code/.

The agent owns its workspace and may change it at any moment, including while the grader looks at
it. So the grader never loads, hashes or inspects the workspace itself: it copies the checkpoint
first, without following a single symbolic link (every directory and file opened relative to its
parent's descriptor with O_NOFOLLOW) and fingerprinting it in the same read (or, where the file
system offers copy-on-write clones, cloning each file and hashing the clone), then inspects and
evaluates the copy. Whatever the agent swaps in between, what gets scored is what was copied, and
the copy holds only regular files that were inside the workspace.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import queue
import shutil
import stat
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from rlbench.fileio import nofollow
from rlbench.grader.fingerprint import Streamer, file_entry, manifest_fingerprint, manifest_order
from rlbench.grader.submission import (
    CHECKPOINT_MAX_DEPTH,
    SHOWN_PATH_CHARS,
    SubmissionRefused,
    agent_error,
    checkpoint_changed,
    file_refused,
    inspect_names,
    is_checkpoint_file,
    unreadable_checkpoint,
)
from rlbench.recording.ledger import safe_text

# The grader's audit copy of the agent's code/ at each submission: small files only, bounded.
CODE_SNAPSHOT_MAX_FILE_BYTES = 1 << 20
CODE_SNAPSHOT_MAX_FILES = 2000
CODE_SNAPSHOT_MAX_TOTAL_BYTES = 16 << 20
CODE_SNAPSHOT_MAX_ENTRIES = 50_000  # entries looked at (a virtualenv in code/ must not cost minutes)
CODE_SNAPSHOT_MAX_DEPTH = 16
# A kernel copy (copy_file_range) goes this many bytes at a time, each hashed from the copy while
# the next is copied; checkpoint files are snapshot by up to SNAPSHOT_THREADS threads at once (a
# sharded checkpoint is hashed on several cores).
KERNEL_COPY_BLOCK = 32 << 20
SNAPSHOT_THREADS = max(1, min(4, os.cpu_count() or 1))

# Linux's FICLONE ioctl (linux/fs.h: _IOW(0x94, 9, int)): make dest share src's extents (reflink).
FICLONE = 0x40049409
# What a file system without reflinks (ext4, tmpfs, overlayfs) or a clone across file systems
# answers: the snapshot copies the bytes instead, and tries no other clone.
_CLONE_UNSUPPORTED = frozenset(
    {errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EINVAL, errno.ENOTTY, errno.ENOSYS, errno.EPERM}
)


def _clone(src_fd: int, dest_fd: int) -> None:
    """Make dest_fd's file a copy-on-write clone of src_fd's whole file (OSError where unsupported)."""
    if sys.platform != "linux":
        raise OSError(errno.EOPNOTSUPP, "no FICLONE outside Linux")
    import fcntl

    fcntl.ioctl(dest_fd, FICLONE, src_fd)


# copy_file_range errors that are the copy's (the grader's disk), not the agent's file.
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})
# copy_file_range errors that mean "not between these files here": copy through the process instead.
_KERNEL_COPY_UNSUPPORTED = frozenset({errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP})


def _kernel_copy(src: int, out: int, size: int, name: str, streamer: Streamer) -> tuple[int, str] | None:
    """Copy `size` bytes (or what there is) of src into out with copy_file_range, in blocks,
    while a thread hashes each block as it reads it back from the copy: (bytes, sha256) of the
    copy, or None when the kernel will not copy between these two files (nothing copied yet).
    A write failure (a full disk) stays a plain OSError; any other is nofollow.Unreadable (the agent's file)."""
    blocks: queue.SimpleQueue = queue.SimpleQueue()
    digest = hashlib.sha256()
    failed: list[BaseException] = []
    buffer = memoryview(bytearray(streamer.block))

    def hasher() -> None:
        while (item := blocks.get()) is not None:
            if failed:
                continue
            offset, length = item
            try:
                while length:
                    got = os.preadv(out, [buffer[: min(length, len(buffer))]], offset)
                    if got == 0:
                        raise OSError(errno.EIO, "the copy is shorter than what was copied")
                    digest.update(buffer[:got])
                    offset, length = offset + got, length - got
            except BaseException as exc:  # noqa: BLE001 - handed to the copying thread
                failed.append(exc)

    thread = threading.Thread(target=hasher, name="snapshot-hash", daemon=True)
    total = 0
    started = False
    try:
        while total < size and not failed:
            try:
                n = os.copy_file_range(src, out, min(size - total, KERNEL_COPY_BLOCK))
            except OSError as exc:
                if total == 0 and exc.errno in _KERNEL_COPY_UNSUPPORTED:
                    return None
                if exc.errno in _WRITE_ERRNOS:
                    raise
                raise nofollow.Unreadable(exc.errno, exc.strerror, name) from None
            if n == 0:
                break  # truncated while copied: what there was
            if not started:
                thread.start()
                started = True
            blocks.put((total, n))
            total += n
    finally:
        blocks.put(None)
        if started:
            thread.join()
    if failed:
        raise failed[0]
    return total, digest.hexdigest()


@dataclass
class CheckpointSnapshot:
    """What take_snapshot made: `names`, the top-level names of the agent's directory as listed
    (inspect_checkpoint's `names`); `manifest`, the copy's checkpoint_manifest (fingerprint, each
    file's name, size, sha256); `method`, how the bytes got there: "clone" (every non-empty file a
    copy-on-write clone), "copy" (none), "mixed" (some), "empty" (no bytes at all)."""

    names: list[str]
    manifest: dict
    method: str


class _Snapshotter:
    """Copies checkpoint files and hashes them in the same read; clones them where it can."""

    def __init__(self) -> None:
        self.try_clone = True
        self.try_kernel_copy = hasattr(os, "copy_file_range")
        self.cloned = 0
        self.copied = 0
        self._lock = threading.Lock()  # files are snapshot in parallel (take_snapshot)

    def open_at(self, dir_fd: int, name: str, dest: Path) -> tuple[int, int, int]:
        """Open one checkpoint file relative to dir_fd without following a link, and create its
        copy (exclusively): (source fd, its size at open, copy fd), both to be closed by copy().
        Raises nofollow.NotRegularFile for anything that is not a regular file, nofollow.Unreadable when it cannot be
        opened, FileNotFoundError when it vanished."""
        fd, st, out = nofollow.open_regular_at(dir_fd, name, dest)
        return fd, st.st_size, out

    def copy(self, fd: int, size: int, out: int, name: str) -> tuple[int, str]:
        """Snapshot an opened file (open_at) into its copy and close both: the copy's (size,
        sha256). A clone where the file system offers one, else a copy in the kernel
        (copy_file_range: no byte crosses into this process to be written back), else a copy
        through this process; either way every byte of the copy is hashed once, from the copy
        itself (in the page cache, just written), while the next part is copied."""
        streamer = Streamer()
        try:
            if size > 0 and self.try_clone and self._clone_to(fd, out, size):
                with self._lock:
                    self.cloned += 1
                return streamer.stream(out, os.fstat(out).st_size, name=name)
            if size > 0:
                with self._lock:
                    self.copied += 1
            if size > streamer.block and self.try_kernel_copy:
                copied = _kernel_copy(fd, out, size, name, streamer)
                if copied is not None:
                    return copied
                self.try_kernel_copy = False  # not here (another file system, an old kernel)
                os.ftruncate(out, 0)
                os.lseek(out, 0, os.SEEK_SET)
                os.lseek(fd, 0, os.SEEK_SET)
            return streamer.stream(fd, size, out=out, name=name)
        finally:
            os.close(out)
            os.close(fd)

    def file_at(self, dir_fd: int, name: str, dest: Path) -> tuple[int, str]:
        """Snapshot one regular file, opened relative to dir_fd without following a link, to dest
        (created exclusively); returns the copy's (size, sha256), both of the copy itself. The copy
        holds exactly the size the file had when opened (a file still growing is cut there: a
        snapshot is of one moment; one truncated meanwhile: what there was). Raises nofollow.NotRegularFile
        for anything that is not a regular file, nofollow.Unreadable when it cannot be read, OSError when
        the copy cannot be written.

        Where the file system can, dest is a copy-on-write clone of the opened file (FICLONE on the
        descriptor opened with O_NOFOLLOW, so it is the file checked), cut back to the size at open
        (the clone takes the file as it is at the clone, which may have grown since), and then read
        once for its sha256: the hash is of the copy that gets evaluated, whatever the agent writes
        after. Elsewhere its bytes are read once, each block written to dest and hashed."""
        fd, size, out = self.open_at(dir_fd, name, dest)
        return self.copy(fd, size, out, name)

    def _clone_to(self, fd: int, out: int, size: int) -> bool:
        try:
            _clone(fd, out)
        except OSError as exc:
            if exc.errno in _CLONE_UNSUPPORTED:
                self.try_clone = False  # this file system (or pair of them) will not: copy the rest
            os.ftruncate(out, 0)  # nothing should be there, but the copy starts from empty, at 0
            os.lseek(out, 0, os.SEEK_SET)
            return False
        if os.fstat(out).st_size > size:
            os.ftruncate(out, size)  # it grew since it was opened: the snapshot is of that moment
        return True

    @property
    def method(self) -> str:
        if self.cloned and self.copied:
            return "mixed"
        return "clone" if self.cloned else "copy" if self.copied else "empty"


class ShortOfSpace(OSError):
    """The grader's disk would fall below its free-space reserve with this copy: the grader's
    problem (answered 503, retryable), never the submission's."""


@dataclass(frozen=True)
class SnapshotLimits:
    """What one snapshot may cost: `max_bytes`, the checkpoint files' total apparent size (None: no
    bound; a larger checkpoint is refused before a byte is copied); `reserve_bytes`, the free space
    the copy must leave on dest's file system."""

    max_bytes: int | None = None
    reserve_bytes: int = 0


def _too_large(model_dir: Path, total: int, max_bytes: int) -> SubmissionRefused:
    return SubmissionRefused(
        413,
        "checkpoint_too_large",
        f"the checkpoint files in {safe_text(model_dir.name, SHOWN_PATH_CHARS)} total {total:,} bytes, over the "
        f"{max_bytes:,} a submission may hold (a multiple of the base model's size): save only the model "
        "(model.save_pretrained(dir), tokenizer.save_pretrained(dir)) in the submitted directory, in the base "
        "model's dtype, without optimizer state or extra weight files",
    )


def _sparse(model_dir: Path, rel: PurePosixPath) -> SubmissionRefused:
    return file_refused(
        model_dir,
        rel,
        "sparse_file",
        "has holes (a sparse file: parts never written): the grader does not copy them; write the file out "
        "in full (model.save_pretrained(dir) does)",
    )


def _has_hole(fd: int, size: int) -> bool:
    """Whether the open file has a hole before its end (a file system without holes answers no).
    The end of a file counts as a hole for SEEK_HOLE: a file cut shorter since it was opened is
    not sparse for that (the copy takes what there is)."""
    if size == 0:
        return False
    try:
        before = os.fstat(fd).st_size  # the file may be cut and written back around the lseek
        hole = os.lseek(fd, 0, os.SEEK_HOLE)
        return hole < min(size, before, os.fstat(fd).st_size)
    except OSError:
        return False
    finally:
        os.lseek(fd, 0, os.SEEK_SET)  # the copy reads from the file's offset


def _check_room(model_dir: Path, top: int, dest_parent: Path, limits: SnapshotLimits) -> int:
    """The checkpoint files' total apparent size, listed before anything is copied: refused when
    over limits.max_bytes; ShortOfSpace when the copy would leave less than the reserve free."""
    walk = nofollow.walk(top, CHECKPOINT_MAX_DEPTH)
    total = 0
    try:
        for entry in walk:
            if stat.S_ISREG(entry.st.st_mode) and is_checkpoint_file(entry.name):
                total += entry.st.st_size
    finally:
        walk.close()
    if limits.max_bytes is not None and total > limits.max_bytes:
        raise _too_large(model_dir, total, limits.max_bytes)
    free = shutil.disk_usage(dest_parent).free
    if free - total < limits.reserve_bytes:
        raise ShortOfSpace(
            errno.ENOSPC,
            f"the grader's disk has {free:,} bytes free: a copy of {total:,} bytes would leave less than its "
            f"reserve of {limits.reserve_bytes:,} (grader.disk_reserve_bytes); free space on it",
        )
    return total


def take_snapshot(
    workspace: Path, model_dir: Path, dest: Path, limits: SnapshotLimits = SnapshotLimits()
) -> CheckpointSnapshot:
    """Copy the checkpoint files (not the agent's optimizer state) of model_dir, a real directory
    inside the workspace (resolve_submission), to dest, following no link, and fingerprint the
    copy in the same read: a CheckpointSnapshot whose manifest is checkpoint_manifest(dest).

    What the names alone condemn (inspect_names) is refused before anything is copied. A checkpoint
    file that is a symbolic link (or a FIFO, a device...) when the grader opens it is refused
    (not_a_regular_file), whatever it was when resolve_submission looked: that is the
    time-of-check/time-of-use race a link swapped in since would otherwise win. Links that are not
    checkpoint files (a `latest` link to a subdirectory) are neither followed nor copied. A file
    or directory the grader may not read is refused (unreadable_checkpoint); one that vanishes
    meanwhile, or a directory swapped, is checkpoint_changed; a failure to write the copy is the
    grader's (OSError). Each file is read once: cloned where the file system offers copy-on-write
    clones and then hashed, else copied and hashed block by block (_Snapshotter.file_at).

    limits: the checkpoint files' total is listed first and refused over limits.max_bytes
    (checkpoint_too_large), or answered ShortOfSpace when the copy would eat into the reserve; a
    file grown since, past the bound, is refused as it is opened; a sparse file (holes) is refused
    (sparse_file): its copy would write every hole out."""
    root = Path(os.path.realpath(workspace))
    if dest.exists():
        shutil.rmtree(dest)
    try:
        top = nofollow.open_directory_inside(root, model_dir)
    except OSError as exc:
        if exc.errno in nofollow.GRADER_ERRNOS:
            raise
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise unreadable_checkpoint(model_dir, ".", exc) from None
        raise checkpoint_changed(model_dir, "the directory (or a directory above it)") from None
    except ValueError:
        raise checkpoint_changed(model_dir, "the directory (or a directory above it)") from None
    snapshotter = _Snapshotter()
    files: list[dict] = []
    pending: list[tuple[PurePosixPath, Future]] = []
    # Each file is opened (and checked) here, in walk order; its copy and hash run in the pool.
    pool = ThreadPoolExecutor(max_workers=SNAPSHOT_THREADS, thread_name_prefix="snapshot")
    try:
        try:
            names = nofollow.top_level_names(top)
        except nofollow.Unreadable as exc:
            raise agent_error(model_dir, exc.filename, exc) from None
        inspect_names(names)
        dest.mkdir(parents=True)
        try:
            _check_room(model_dir, top, dest, limits)
        except nofollow.Unreadable as exc:
            raise agent_error(model_dir, exc.filename, exc) from None
        opened_bytes = 0
        walk = nofollow.walk(top, CHECKPOINT_MAX_DEPTH)
        try:
            for entry in walk:
                if stat.S_ISDIR(entry.st.st_mode) or not is_checkpoint_file(entry.name):
                    continue
                try:
                    fd, size, out = snapshotter.open_at(entry.dir_fd, entry.name, dest / entry.rel)
                except nofollow.NotRegularFile:
                    raise _not_regular(model_dir, entry.rel) from None
                except FileNotFoundError:
                    raise checkpoint_changed(model_dir, safe_text(str(entry.rel), SHOWN_PATH_CHARS)) from None
                opened_bytes += size
                refusal = None
                if limits.max_bytes is not None and opened_bytes > limits.max_bytes:
                    refusal = _too_large(model_dir, opened_bytes, limits.max_bytes)  # grown since listed
                elif _has_hole(fd, size):
                    refusal = _sparse(model_dir, entry.rel)
                if refusal is not None:
                    os.close(fd)
                    os.close(out)
                    raise refusal
                pending.append((entry.rel, pool.submit(snapshotter.copy, fd, size, out, entry.name)))
            for rel, future in pending:
                size, sha256 = future.result()
                files.append(file_entry(rel, size, sha256))
        except nofollow.Unreadable as exc:  # the agent's side: a race (checkpoint_changed) or its permissions
            raise agent_error(model_dir, exc.filename, exc) from None
        finally:
            walk.close()
            pool.shutdown(wait=True)  # every descriptor closed (copy closes its own), even on failure
    finally:
        os.close(top)
    files.sort(key=lambda f: manifest_order(f["name"]))
    manifest = {"fingerprint": manifest_fingerprint(files), "files": files}
    return CheckpointSnapshot(names=names, manifest=manifest, method=snapshotter.method)


def snapshot_checkpoint(workspace: Path, model_dir: Path, dest: Path) -> list[str]:
    """take_snapshot's copy, returning only the names of the files at model_dir's top level, as
    listed then (inspect_checkpoint's `names`); see take_snapshot for what is copied and refused."""
    return take_snapshot(workspace, model_dir, dest).names


def _not_regular(model_dir: Path, rel: PurePosixPath) -> SubmissionRefused:
    return file_refused(
        model_dir,
        rel,
        "not_a_regular_file",
        "is not a regular file (a symbolic link, a FIFO...): the grader copies checkpoint files without "
        "following links. Put the files themselves in the directory (cp --dereference, or save the model there)",
    )


def snapshot_code(workspace: Path, dest: Path) -> dict:
    """The grader's audit copy of the agent's code/ (small files only, bounded), following no link.

    A code/ that is itself a link is not copied at all (a link to the held-out directory, or to /,
    would have the grader copy it); links and special files inside are skipped, real
    subdirectories descended into. Stops at CODE_SNAPSHOT_MAX_FILES files,
    CODE_SNAPSHOT_MAX_TOTAL_BYTES bytes or CODE_SNAPSHOT_MAX_ENTRIES entries looked at; returns
    what it did (also written to dest/.snapshot.json when anything was left out)."""
    summary = {"files": 0, "bytes": 0, "skipped": 0, "truncated": False}
    root = Path(os.path.realpath(workspace))
    try:
        code = nofollow.open_directory_inside(root, root / "code")
    except OSError as exc:
        summary["not_copied"] = f"code/ is not a directory of the workspace ({errno.errorcode.get(exc.errno, exc)})"
        return summary
    try:
        walk = nofollow.walk(code, CODE_SNAPSHOT_MAX_DEPTH, skip_unreadable=True)
        try:
            for seen, entry in enumerate(walk, 1):
                if seen > CODE_SNAPSHOT_MAX_ENTRIES or summary["files"] >= CODE_SNAPSHOT_MAX_FILES:
                    summary["truncated"] = True
                    break
                if not stat.S_ISREG(entry.st.st_mode):
                    summary["skipped"] += not stat.S_ISDIR(entry.st.st_mode)
                    continue
                room = CODE_SNAPSHOT_MAX_TOTAL_BYTES - summary["bytes"]
                if entry.st.st_size > min(CODE_SNAPSHOT_MAX_FILE_BYTES, room):
                    summary["skipped"] += 1
                    summary["truncated"] |= entry.st.st_size <= CODE_SNAPSHOT_MAX_FILE_BYTES
                    continue
                try:
                    limit = min(CODE_SNAPSHOT_MAX_FILE_BYTES, room)  # it may have grown since listed
                    summary["bytes"] += nofollow.copy_file_at(entry.dir_fd, entry.name, dest / entry.rel, limit=limit)
                    summary["files"] += 1
                except OSError:  # swapped, vanished, grown: an audit copy skips it
                    summary["skipped"] += 1
        finally:
            walk.close()
    finally:
        os.close(code)
    if summary["truncated"] or summary["skipped"]:
        dest.mkdir(parents=True, exist_ok=True)
        (dest / ".snapshot.json").write_text(json.dumps(summary) + "\n")
    return summary

