"""Reading a directory the agent controls without following a single link.

The agent may change its workspace at any moment, including while the harness reads it. Everything here
opens each directory and file relative to its parent's descriptor with O_NOFOLLOW, so a component swapped
for a symbolic link fails instead of leading outside, and copies exactly what was there when opened.
The grader's snapshots, the recording of the workspace and the run summaries read the workspace this way.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterator

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a file swapped for a FIFO after it was listed must not block the grader in open().
FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# What is the reader's own state, whichever path it names (its descriptors, its memory): never the agent's doing.
GRADER_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})


def is_inside(root: Path, path: str) -> bool:
    return path == str(root) or path.startswith(str(root).rstrip("/") + "/")


def open_directory_inside(root: Path, directory: Path) -> int:
    """An O_NOFOLLOW descriptor of `directory`, a real path inside the real path `root`.

    Opened one component at a time from root, each relative to its parent's descriptor with
    O_NOFOLLOW: a component swapped for a symlink since the path was resolved fails (ELOOP or
    ENOTDIR) instead of leading elsewhere. The open directory's path is then checked again through
    /proc/self/fd (where there is one). Raises OSError (or ValueError if directory is not under root)."""
    parts = directory.relative_to(root).parts
    fd = os.open(root, DIR_FLAGS)
    try:
        for part in parts:
            child = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            where = None  # no /proc: the component-wise O_NOFOLLOW walk is the guarantee
        if where is not None and not is_inside(root, where):
            raise OSError(errno.EXDEV, f"the opened directory is outside {root}: {where}")
        return fd
    except BaseException:
        os.close(fd)
        raise


@dataclass
class Entry:
    rel: PurePosixPath  # path relative to the walked directory
    name: str
    dir_fd: int  # the descriptor of its directory (valid while the walk is at this entry)
    st: os.stat_result  # lstat: a link is a link


def walk(
    dir_fd: int, max_depth: int, rel: PurePosixPath = PurePosixPath(), depth: int = 0, skip_unreadable: bool = False
) -> Iterator[Entry]:
    """Every entry below an open directory, sorted, depth first, never following a link: real
    subdirectories are opened with O_NOFOLLOW relative to their parent and descended into (up to
    max_depth); entries that vanish while walked are skipped. A directory that cannot be read
    raises Unreadable, or is skipped (skip_unreadable). Closing the generator closes every
    descriptor it opened."""
    try:
        names = listing(dir_fd)
    except OSError as exc:  # ENOENT: the directory was removed since it was opened
        if skip_unreadable:
            return
        raise source_error(exc, str(rel)) from None
    for name in names:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if skip_unreadable:
                continue
            raise source_error(exc, str(rel / name)) from None
        yield Entry(rel / name, name, dir_fd, st)
        if stat.S_ISDIR(st.st_mode) and depth < max_depth:
            try:
                child = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
            except OSError as exc:
                # Removed, or swapped for a file (ENOTDIR) or a link (ELOOP) since its lstat: skipped
                # where that is allowed; else the checkpoint changed while copied (Unreadable,
                # classified by the caller), never a directory followed elsewhere.
                if skip_unreadable:
                    continue
                raise source_error(exc, str(rel / name)) from None
            try:
                yield from walk(child, max_depth, rel / name, depth + 1, skip_unreadable)
            finally:
                os.close(child)


class NotRegularFile(OSError):
    """What was opened as a checkpoint file is not a regular file (any more)."""


class Unreadable(OSError):
    """The agent's file or directory cannot be read (its permissions, most likely), or changed
    while read (rlbench.grader: a race or its permissions): its doing, not the grader's, unlike a failure to write the
    copy (a full disk), which stays a plain OSError. The grader turns it into a refusal
    (checkpoint_changed or unreadable_checkpoint, by its errno)."""


def source_error(exc: OSError, name: str) -> OSError:
    """An OSError of the agent's side (listing, stat, open, read) as Unreadable named `name`,
    unless it is the grader's own (GRADER_ERRNOS: out of descriptors or memory), left as it is."""
    if exc.errno in GRADER_ERRNOS:
        return exc
    return Unreadable(exc.errno, exc.strerror, name)


def listing(dir_fd: int) -> list[str]:
    """The names in an open directory, sorted, each once: a directory changing while it is read
    may list a renamed entry twice (POSIX leaves it unspecified), which must not be copied twice."""
    return sorted(set(os.listdir(dir_fd)))


def open_regular_at(dir_fd: int, name: str, dest: Path, limit: int | None = None) -> tuple[int, os.stat_result, int]:
    """Open one file relative to dir_fd without following a link and create its copy `dest`
    (exclusively, read-write): (source fd, its stat at open, copy fd), both the caller's to close.
    Raises NotRegularFile for anything that is not a regular file (or, with `limit`, a bigger one),
    Unreadable when it cannot be opened, FileNotFoundError when it vanished."""
    try:
        fd = os.open(name, FILE_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFile(errno.ELOOP, "a symbolic link", name) from None
        if exc.errno in (errno.ENXIO, errno.ENODEV, errno.EISDIR):  # a socket, a device, a directory
            raise NotRegularFile(exc.errno, "not a regular file", name) from None
        raise source_error(exc, name) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", name)
        if limit is not None and st.st_size > limit:
            raise NotRegularFile(errno.EFBIG, "too large", name)
        os.set_blocking(fd, True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        out = os.open(dest, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    except BaseException:
        os.close(fd)
        raise
    return fd, st, out


def copy_file_at(dir_fd: int, name: str, dest: Path, limit: int | None = None) -> int:
    """Copy one regular file, opened relative to dir_fd without following a link, to dest (created
    exclusively); returns its size. Copies exactly the size it had when opened (a file still
    growing is cut there: a snapshot is of one moment). Raises NotRegularFile for anything that is
    not a regular file, OSError when it cannot be read; `limit`: refuse (NotRegularFile) bigger ones."""
    fd, st, out = open_regular_at(dir_fd, name, dest, limit)
    try:
        left = st.st_size
        while left > 0:
            try:
                block = os.read(fd, min(left, 8 << 20))
            except OSError as exc:
                raise Unreadable(exc.errno, exc.strerror, name) from None
            if not block:
                break  # truncated while copied: the copy holds what there was
            left -= len(block)
            view = memoryview(block)
            while view:
                view = view[os.write(out, view) :]
        return st.st_size - left
    finally:
        os.close(out)
        os.close(fd)


def top_level_names(dir_fd: int) -> list[str]:
    """The names of the non-directory entries directly in a directory (links included, unfollowed)."""
    try:
        listed = listing(dir_fd)
    except OSError as exc:  # ENOENT: the directory was removed since it was opened
        raise source_error(exc, ".") from None
    names = []
    for name in listed:
        try:
            if not stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                names.append(name)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise source_error(exc, name) from None
    return names
