"""Build a directory's replacement beside it, and let it take the directory's place only once complete.

What every rule that rewrites recorded files relies on (a task's splits, a run's workspace): a build that
fails, or is killed, leaves the recorded directory as it was and nothing else behind the next build keeps.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def remove_tree(path: Path) -> None:
    """Remove a directory tree, read-only files and folders included (a workspace's base model and data)."""
    if not path.exists() and not path.is_symlink():
        return
    if path.is_symlink() or not path.is_dir():
        path.unlink()
        return
    for entry in [path, *path.rglob("*")]:
        if not entry.is_symlink():
            entry.chmod(entry.stat().st_mode | stat.S_IWUSR | (stat.S_IXUSR if entry.is_dir() else 0))
    shutil.rmtree(path)


def staging_path(final: Path) -> Path:
    """Where the replacement of `final` is built: a hidden sibling (same file system, so a rename moves it)."""
    return final.with_name(f".{final.name}.building")


@contextmanager
def building(final: Path) -> Iterator[Path]:
    """A fresh, empty directory beside `final` to build its replacement in.

    The caller fills it and, once it is complete, installs it with install(); whatever the block raises
    (or a kill before install) leaves `final` untouched, and the half-built directory is removed (at the
    latest by the next build of the same directory)."""
    final = Path(final)
    staging = staging_path(final)
    previous = previous_path(final)
    if previous.exists() and not final.exists():  # an install killed between its two renames
        os.replace(previous, final)
    remove_tree(staging)  # what a killed build left
    final.parent.mkdir(parents=True, exist_ok=True)
    staging.mkdir()
    try:
        yield staging
    finally:
        remove_tree(staging)  # installed: gone already; failed: the half-built replacement


def previous_path(final: Path) -> Path:
    """Where install() moves the directory it replaces, for as long as the replacement takes."""
    return final.with_name(f".{final.name}.previous")


def install(staging: Path, final: Path) -> None:
    """Put the complete directory `staging` in the place of `final` (removed: whatever it held is replaced)."""
    final = Path(final)
    previous = previous_path(final)
    remove_tree(previous)
    if final.exists() or final.is_symlink():
        os.replace(final, previous)
    os.replace(staging, final)
    remove_tree(previous)
