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


# -- the ledger's JSON lines: an append is whole or absent, a torn last line is skipped ----------------
def test_a_failed_append_is_truncated_back(tmp_path, monkeypatch):
    from rlbench.fileio import jsonio

    path = tmp_path / "ledger.jsonl"
    jsonio.append_jsonl(path, {"submission_id": 1})
    before = path.read_bytes()
    real_write = os.write

    def short_then_full(fd, data):
        if len(data) > 8:
            return real_write(fd, bytes(data[:8]))  # a partial write, as a nearly full disk gives
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(jsonio.os, "write", short_then_full)
    try:
        jsonio.append_jsonl(path, {"submission_id": 2, "padding": "x" * 100})
    except OSError as exc:
        assert exc.errno == 28
    else:
        raise AssertionError("the append reported success on a full disk")
    monkeypatch.undo()
    assert path.read_bytes() == before  # the partial line is gone
    jsonio.append_jsonl(path, {"submission_id": 2})
    assert list(jsonio.read_jsonl(path)) == [{"submission_id": 1}, {"submission_id": 2}]


def test_an_append_cuts_a_torn_tail_off_first(tmp_path):
    from rlbench.fileio.jsonio import append_jsonl, read_jsonl

    path = tmp_path / "ledger.jsonl"
    path.write_text('{"submission_id": 1}\n{"submission_id": 2, "sco')  # a crash mid-write
    append_jsonl(path, {"submission_id": 2})
    assert path.read_text() == '{"submission_id": 1}\n{"submission_id": 2}\n'
    assert list(read_jsonl(path)) == [{"submission_id": 1}, {"submission_id": 2}]


def test_a_reader_skips_a_torn_last_line_but_not_a_corrupt_middle(tmp_path, capsys):
    import pytest

    from rlbench.fileio.jsonio import read_jsonl

    path = tmp_path / "ledger.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": 3, "b": [1, ')
    assert list(read_jsonl(path)) == [{"a": 1}, {"a": 2}]
    assert "torn" in capsys.readouterr().err
    path.write_text('{"a": 1}\n{"a": 2}')  # complete JSON without its newline is still a record
    assert list(read_jsonl(path)) == [{"a": 1}, {"a": 2}]
    path.write_text('{"a": 1}\n{"a": 2, "b\n{"a": 3}\n')  # a torn line with another glued on: corrupt
    with pytest.raises(ValueError, match=r"line 2"):
        list(read_jsonl(path))
    path.write_text('{"a": 1}\n{"a": 2, "b\n')  # a whole last line (newline and all) that is not JSON
    with pytest.raises(ValueError, match=r"line 2"):
        list(read_jsonl(path))
