"""Records the grader writes into agent-writable directories cannot be redirected by symlinks."""

from __future__ import annotations

import json
import os

from rlbench.fileio.jsonio import write_json


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


def test_write_json_durable_flag_skips_only_the_fsync(tmp_path, monkeypatch):
    from rlbench.fileio import jsonio

    synced = []
    real = os.fsync
    monkeypatch.setattr(jsonio.os, "fsync", lambda fd: (synced.append(fd), real(fd))[1])
    write_json(tmp_path / "durable.json", {"a": 1})
    assert len(synced) == 1
    write_json(tmp_path / "derived.json", {"a": 1}, durable=False)  # atomic all the same
    assert len(synced) == 1
    assert (tmp_path / "derived.json").read_text() == (tmp_path / "durable.json").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["derived.json", "durable.json"]


def test_encoded_list_is_the_json_of_its_items():
    from rlbench.fileio.jsonio import encoded_list

    items = [{"b": 1, "a": [1, 2]}, "x", None]
    for indent in (0, 2, 4):
        text = encoded_list([json.dumps(i) for i in items], indent)
        assert json.loads(text) == items
        assert text.endswith(" " * indent + "]")
    assert encoded_list([]) == "[]"
    document = '{\n  "list": ' + encoded_list([json.dumps(i) for i in items], 2) + "\n}"
    assert json.loads(document) == {"list": items}
