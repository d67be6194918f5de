"""The workspace's size and final state: what an agent's workspace holds, walked without following a link
(the resource trace samples it during a run; the run's artifacts list it at the end).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from rlbench.fileio import nofollow

# The workspace walk of the resource sampler and of the final state: entries looked at, depth.
WORKSPACE_MAX_ENTRIES = 200_000
WORKSPACE_MAX_DEPTH = 64
BY_TOP_MAX = 200  # top-level names listed one by one; the rest are counted under "(other)"


def workspace_usage(workspace: Path, max_entries: int = WORKSPACE_MAX_ENTRIES, listing: int = 0) -> dict:
    """What the workspace holds, walked without following a link (directories opened with
    O_NOFOLLOW relative to their parent): files, bytes (apparent sizes; a file hard-linked
    several times counted once), allocated_bytes (what they take on disk, as du counts it), dirs, links, other entries, per top-level name (files and bytes;
    top-level files under "."); stops after max_entries entries (`truncated`). listing: also the
    first that many files (path, size), in sorted walk order."""
    usage: dict = {"files": 0, "bytes": 0, "allocated_bytes": 0, "dirs": 0, "links": 0, "other": 0, "truncated": False, "by_top": {}}
    if listing:
        usage["listing"] = []
    seen_inodes: set[tuple[int, int]] = set()
    try:
        top = os.open(workspace, nofollow.DIR_FLAGS)
    except OSError as exc:
        usage["error"] = f"{workspace}: {exc.strerror or exc}"
        return usage
    try:
        walk = nofollow.walk(top, WORKSPACE_MAX_DEPTH, skip_unreadable=True)
        try:
            for count, entry in enumerate(walk, 1):
                if count > max_entries:
                    usage["truncated"] = True
                    break
                mode = entry.st.st_mode
                if stat.S_ISDIR(mode):
                    usage["dirs"] += 1
                    continue
                if stat.S_ISLNK(mode):
                    usage["links"] += 1
                    continue
                if not stat.S_ISREG(mode):
                    usage["other"] += 1
                    continue
                usage["files"] += 1
                size = entry.st.st_size
                if entry.st.st_nlink > 1:
                    key = (entry.st.st_dev, entry.st.st_ino)
                    size = 0 if key in seen_inodes else size
                    seen_inodes.add(key)
                usage["bytes"] += size
                usage["allocated_bytes"] += entry.st.st_blocks * 512 if size else 0  # on disk (holes not)
                group = entry.rel.parts[0] if len(entry.rel.parts) > 1 else "."
                if group not in usage["by_top"] and len(usage["by_top"]) >= BY_TOP_MAX:
                    group = "(other)"
                bucket = usage["by_top"].setdefault(group, {"files": 0, "bytes": 0})
                bucket["files"] += 1
                bucket["bytes"] += size
                if listing and len(usage["listing"]) < listing:
                    usage["listing"].append({"path": str(entry.rel), "size": entry.st.st_size})
        finally:
            walk.close()
    finally:
        os.close(top)
    if listing:
        usage["listing_truncated"] = usage["files"] > len(usage["listing"]) or usage["truncated"]
    return usage
