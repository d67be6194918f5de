"""rlbench.fileio.staging: a directory's replacement takes its place only once complete (issue 25, item 7)."""

from __future__ import annotations

import os

import pytest

from rlbench.fileio.staging import building, install, previous_path, staging_path


def tree(directory) -> dict[str, bytes]:
    return {str(p.relative_to(directory)): p.read_bytes() for p in sorted(directory.rglob("*")) if p.is_file()}


@pytest.fixture
def recorded(tmp_path):
    final = tmp_path / "split"
    (final / "games").mkdir(parents=True)
    (final / "eval.jsonl").write_text("recorded\n")
    (final / "games" / "g1.json").write_text("{}")
    return final


def test_a_failed_build_leaves_the_recorded_directory_and_nothing_beside_it(recorded):
    before = tree(recorded)
    with pytest.raises(RuntimeError):
        with building(recorded) as staging:
            (staging / "eval.jsonl").write_text("half")
            os.chmod(staging, 0o500)  # read-only, as a workspace's folders can be: still removed
            raise RuntimeError("source unreachable")
    assert tree(recorded) == before
    assert sorted(p.name for p in recorded.parent.iterdir()) == ["split"]


def test_an_installed_build_replaces_everything_the_recorded_one_held(recorded):
    with building(recorded) as staging:
        (staging / "eval.jsonl").write_text("new\n")
        install(staging, recorded)
    assert tree(recorded) == {"eval.jsonl": b"new\n"}
    assert sorted(p.name for p in recorded.parent.iterdir()) == ["split"]


def test_a_build_killed_before_install_is_cleared_by_the_next(recorded):
    staging_path(recorded).mkdir()
    (staging_path(recorded) / "eval.jsonl").write_text("half")
    with building(recorded) as staging:
        assert list(staging.iterdir()) == []
    assert tree(recorded)["eval.jsonl"] == b"recorded\n"


def test_an_install_killed_between_its_renames_gets_the_recorded_directory_back(recorded):
    os.replace(recorded, previous_path(recorded))  # the first rename done, the second not
    with building(recorded):
        assert tree(recorded)["eval.jsonl"] == b"recorded\n"
    assert not previous_path(recorded).exists()
