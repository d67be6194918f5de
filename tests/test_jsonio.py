"""Records the grader writes into agent-writable directories cannot be redirected by symlinks."""

from __future__ import annotations

import json
import os

from rlbench.jsonio import write_json


def test_write_json_never_follows_planted_symlinks(tmp_path):
    workspace, outside = tmp_path / "workspace", tmp_path / "outside.txt"
    workspace.mkdir()
    outside.write_text("precious\n")
    # The agent plants symlinks at the record's name and at the old predictable temp name.
    (workspace / "scores.json").symlink_to(outside)
    (workspace / ".scores.json.tmp").symlink_to(outside)

    write_json(workspace / "scores.json", [{"score": 1.0}])

    assert outside.read_text() == "precious\n"
    assert not (workspace / "scores.json").is_symlink()
    assert json.loads((workspace / "scores.json").read_text()) == [{"score": 1.0}]
    leftovers = [p.name for p in workspace.iterdir() if p.name not in ("scores.json", ".scores.json.tmp")]
    assert leftovers == []  # no temporary file left behind
    assert oct(os.stat(workspace / "scores.json").st_mode & 0o777) == oct(0o644)
