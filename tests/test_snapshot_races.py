"""Paths of a submission swapped while the grader checks and copies them (grader.submission, grader.snapshot).

A hostile agent flips what a submitted path is (a regular file, a symbolic link to a host file, a
FIFO, a directory, nothing; a subdirectory or the checkpoint directory itself for a link to a host
directory; a file truncated and grown again) while the grader resolves, checks and copies it. Each
submission must then be either a copy of the agent's own regular files or a refusal of the
submission (SubmissionRefused, 4xx, a stable reason): never an error of the grader's (a 503
grader_error in the ledger), whatever the timing, and never a copy holding a host file's bytes.

The races are real: a separate process (FLIPPER, no GIL shared with the grader) swaps the paths
while the real resolve_submission and take_snapshot (and, in the last test, a live grading server)
run, hundreds of swaps per test.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
import time
import traceback
from pathlib import Path

import pytest
import requests

from rlbench.grader import fingerprint as grader_fingerprint
from rlbench.grader.fingerprint import checkpoint_manifest, fingerprint
from rlbench.grader.snapshot import take_snapshot
from rlbench.grader.submission import SubmissionRefused, resolve_submission
from support.grader import assert_consistent
from support.models import copy_model

MARKER = b"HOST FILE THE GRADER MUST NEVER COPY"
MIN_SWAPS = 200
# The refusals a race may end in: the path is a link or not a regular file any more, it changed
# under the grader, it leads outside the workspace, or it is not there at all (or not a directory).
RACE_REASONS = {"not_a_regular_file", "checkpoint_changed", "outside_workspace", "missing_path", "not_a_directory"}

# The flipping process: swaps paths until the stop file exists, then prints how many swaps it made.
# Replacements are made under temporary names next to the checkpoint directory (never inside it,
# so that no listing sees them) and renamed over the target: each state is there whole.
FLIPPER = r"""
import json, os, random, sys, time

spec = json.loads(sys.argv[1])
mode, target, stop = spec["mode"], spec["target"], spec["stop"]
scratch = spec["scratch"]
hold = spec["hold_s"]
swaps = 0


def fresh(name):  # a temporary name beside the checkpoint, nothing left under it
    path = os.path.join(scratch, name)
    if os.path.lexists(path):
        os.unlink(path)
    return path


def pause():
    time.sleep(random.uniform(0, hold))


def put_link(to):
    link = fresh("link")
    os.symlink(to, link)
    os.replace(link, target)


def put_regular():
    if os.path.isdir(target) and not os.path.islink(target):
        os.rmdir(target)  # a directory cannot be renamed over: for a moment there is nothing
    if not os.path.lexists(target):
        os.link(spec["regular"], target)
        return
    regular = fresh("regular")
    os.link(spec["regular"], regular)
    os.replace(regular, target)


def put_fifo():
    fifo = fresh("fifo")
    os.mkfifo(fifo)
    os.replace(fifo, target)


def remove():
    if os.path.isdir(target) and not os.path.islink(target):
        os.rmdir(target)
    elif os.path.lexists(target):
        os.unlink(target)


def swap_directory(directory, to):
    parked = os.path.join(scratch, "parked")
    os.rename(directory, parked)
    os.symlink(to, directory)
    pause()
    os.unlink(directory)
    os.rename(parked, directory)


original = open(spec["regular"], "rb").read() if mode == "resized" else b""
while not os.path.exists(stop):
    if mode == "file_link":
        put_link(spec["secret"]); pause(); put_regular(); pause(); swaps += 2
    elif mode == "file_kinds":
        for state in ("link", "regular", "fifo", "regular", "directory", "regular", "removed", "regular"):
            if state == "link":
                put_link(spec["secret"])
            elif state == "regular":
                put_regular()
            elif state == "fifo":
                put_fifo()
            elif state == "directory":
                remove()
                os.mkdir(target)
            elif state == "removed":
                remove()
            pause()
            swaps += 1
    elif mode == "directory_link":  # a subdirectory, or the checkpoint directory itself
        swap_directory(target, spec["host_dir"]); pause(); swaps += 2
    elif mode == "file_and_directory_link":  # file_link, then a subdirectory for a link and back
        put_link(spec["secret"]); pause(); put_regular(); pause()
        swap_directory(spec["directory"], spec["host_dir"]); pause()
        swaps += 4
    elif mode == "resized":  # truncated in place, then grown back to what it was
        cut = random.randrange(len(original))
        os.truncate(target, cut)
        pause()
        fd = os.open(target, os.O_WRONLY)
        try:
            os.pwrite(fd, original[cut:], cut)
        finally:
            os.close(fd)
        pause()
        swaps += 2
print(swaps, flush=True)
"""


class Flipper:
    """The flipping process, started on entry; on exit it is stopped and `swaps` says how many it made."""

    def __init__(self, scratch: Path, mode: str, target: Path, hold_s: float = 0.0001, **paths: Path):
        self.stop = scratch / "flipper.stop"
        self.spec = {"mode": mode, "target": str(target), "stop": str(self.stop), "scratch": str(scratch),
                     "hold_s": hold_s, **{k: str(v) for k, v in paths.items()}}
        self.swaps = 0

    def __enter__(self) -> Flipper:
        self.stop.unlink(missing_ok=True)
        self.process = subprocess.Popen([sys.executable, "-c", FLIPPER, json.dumps(self.spec)],
                                        stdout=subprocess.PIPE, text=True)
        time.sleep(0.05)  # under way before the first check
        assert self.process.poll() is None, "the flipper died at once"
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop.touch()
        try:
            out, _ = self.process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.communicate()
            raise
        assert self.process.returncode == 0, f"the flipper failed (exit {self.process.returncode})"
        self.swaps = int(out.strip())


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def noise(size: int) -> bytes:
    out, counter = bytearray(), 0
    while len(out) < size:
        out += hashlib.sha256(b"%d" % counter).digest()
        counter += 1
    return bytes(out[:size])


def make_checkpoint(model: Path) -> dict[str, bytes]:
    """A small checkpoint with a top-level file and a subdirectory to swap; its files' bytes."""
    files = {
        "config.json": b'{"model_type": "qwen2"}',
        "model.safetensors": noise(64 << 10),
        "notes.txt": b"the agent's own notes\n",
        "sub/extra.json": b'{"the agent": "own"}',
    }
    for name, data in files.items():
        write(model / name, data)
    return files


@pytest.fixture
def race(tmp_path):
    """A workspace holding output/m (make_checkpoint), the host's files to link to, a scratch
    directory beside the checkpoint for the flipper's temporary names."""
    workspace = tmp_path / "ws"
    model = workspace / "output" / "m"
    files = make_checkpoint(model)
    host = tmp_path / "host"
    secret = write(host / "secret.txt", MARKER + b"\n")
    host_dir = host / "checkpoint"  # a directory of the host's: what a swapped-in link leads to
    for name in files:
        write(host_dir / name, MARKER + b" " + name.encode())
    write(host / "sub" / "extra.json", MARKER + b" sub")
    regular = write(workspace / "output" / "regular-notes.txt", files["notes.txt"])
    original_weights = write(tmp_path / "weights.safetensors", files["model.safetensors"])
    scratch = workspace / "output"
    return {"workspace": workspace, "model": model, "files": files, "secret": secret, "host_dir": host_dir,
            "host_sub": host / "sub", "regular": regular, "weights": original_weights, "scratch": scratch,
            "dest": tmp_path / "copy"}


def hammer(r: dict, flipper: Flipper, *, allowed_missing: set[str] = frozenset(), prefix_of: str | None = None,
           checks_only: int = 3, min_calls: int = 150, min_s: float = 1.5, max_s: float = 8.0) -> dict:
    """While `flipper` swaps, check and copy r's checkpoint again and again as the grader does
    (resolve_submission, then take_snapshot of what it resolved), snapshot it straight away
    (take_snapshot of the path, whatever resolve_submission would say: the snapshot itself meets
    every state), and check it alone `checks_only` times more (resolve_submission is cheaper than
    a copy, and its walk races too). Every outcome must be a refusal for a race (4xx,
    RACE_REASONS), a successful check, or a copy of the agent's regular files: r's files byte for
    byte (those in allowed_missing may be missing, the file prefix_of may be cut anywhere and hold
    the zeros a truncation leaves), its manifest the copy's own, no host bytes."""
    outcomes: dict[str, int] = {}
    errors: list[str] = []
    wrong: list[str] = []
    calls = 0
    started = time.monotonic()
    with flipper:
        while time.monotonic() - started < max_s and (calls < min_calls or time.monotonic() - started < min_s):
            for how in ("as_the_grader", "snapshot_only") + ("check_only",) * checks_only:
                calls += 1
                try:
                    model_dir = r["model"] if how == "snapshot_only" else resolve_submission(r["workspace"], "output/m")
                    snapshot = None if how == "check_only" else take_snapshot(r["workspace"], model_dir, r["dest"])
                except SubmissionRefused as refused:
                    key = f"refused:{refused.reason}"
                    if refused.reason not in RACE_REASONS or not 400 <= refused.status < 500:
                        wrong.append(f"{refused.status} {refused.reason}: {refused.message}")
                except Exception:  # noqa: BLE001 - what the grader would answer as its own fault (503)
                    key = "ERROR"
                    errors.append(traceback.format_exc())
                else:
                    key = "checked" if snapshot is None else "copied"
                    if snapshot is not None:
                        wrong.extend(copy_problems(r, snapshot, allowed_missing, prefix_of))
                outcomes[key] = outcomes.get(key, 0) + 1
    summary = {"calls": calls, "swaps": flipper.swaps, "outcomes": outcomes}
    print(summary)  # shown with -s
    assert not errors, f"{len(errors)} grader errors ({summary}); the first:\n{errors[0]}"
    assert not wrong, f"{len(wrong)} wrong outcomes ({summary}): {wrong[:5]}"
    assert flipper.swaps >= MIN_SWAPS, summary
    return summary


def copy_problems(r: dict, snapshot, allowed_missing, prefix_of) -> list[str]:
    copy = r["dest"]
    copied = {str(p.relative_to(copy)): p.read_bytes() for p in sorted(copy.rglob("*")) if p.is_file()}
    problems = [f"{name} holds the host file's bytes" for name, data in copied.items() if MARKER in data]
    for name, data in copied.items():
        expected = r["files"].get(name)
        if expected is None:
            problems.append(f"{name} copied, not a file of the checkpoint")
        elif name == prefix_of:
            # A read racing a truncation may see the zeros it leaves in the page cut: still the agent's bytes.
            if len(data) > len(expected) or not (
                expected.startswith(data) or all(d in (0, e) for d, e in zip(data, expected))
            ):
                problems.append(f"{name} is not its own bytes (or zeros), cut somewhere")
        elif data != expected:
            problems.append(f"{name} is not the agent's regular file ({data[:60]!r})")
    missing = set(r["files"]) - set(copied) - set(allowed_missing)
    if missing:
        problems.append(f"missing from the copy: {sorted(missing)}")
    if snapshot.manifest != checkpoint_manifest(copy):
        problems.append("the snapshot's manifest is not the copy's")
    return problems


# -- the snapshot itself, called directly --------------------------------------------------------------------
def test_file_flipped_between_regular_and_link_to_a_host_file(race):
    """flip_main of the adversarial agent: notes.txt a hard link of the regular file, then a link
    to a host file, again and again; resolve_submission's own walk meets it too."""
    # Each state held up to 20 us: the race inside one realpath() (lstat, then readlink) is met often.
    flipper = Flipper(race["scratch"], "file_link", race["model"] / "notes.txt", hold_s=0.00002,
                      secret=race["secret"], regular=race["regular"])
    summary = hammer(race, flipper, checks_only=10, min_s=2.5)
    assert summary["outcomes"].get("copied") and summary["outcomes"].get("refused:not_a_regular_file"), summary


def test_file_swapped_for_a_link_a_fifo_a_directory_or_nothing(race):
    """notes.txt a link, regular, a FIFO, regular, an (empty) directory, regular, gone, regular:
    an empty directory or a file gone when listed leaves nothing to copy; anything else is refused."""
    flipper = Flipper(race["scratch"], "file_kinds", race["model"] / "notes.txt", secret=race["secret"],
                      regular=race["regular"])
    hammer(race, flipper, allowed_missing={"notes.txt"})


def test_subdirectory_swapped_for_a_link_to_a_host_directory(race):
    flipper = Flipper(race["scratch"], "directory_link", race["model"] / "sub", host_dir=race["host_sub"])
    hammer(race, flipper, allowed_missing={"sub/extra.json"})


def test_checkpoint_directory_swapped_for_a_link_to_a_host_directory(race):
    flipper = Flipper(race["scratch"], "directory_link", race["model"], host_dir=race["host_dir"])
    summary = hammer(race, flipper)
    assert summary["outcomes"].get("refused:checkpoint_changed") or summary["outcomes"].get(
        "refused:outside_workspace"
    ), summary


def test_file_truncated_and_grown_while_copied(race, monkeypatch):
    """The weights truncated and written back in place: the copy holds some cut of them, its
    manifest that cut's. Small blocks, so the pipelined and copy_file_range paths run too."""
    monkeypatch.setattr(grader_fingerprint, "STREAM_BLOCK", 4096)
    monkeypatch.setattr(grader_fingerprint, "STREAM_BUFFERS", 3)
    # The flipper writes its own bytes back: it must not write through a hard link of the checkpoint's.
    flipper = Flipper(race["scratch"], "resized", race["model"] / "model.safetensors", hold_s=0.0005,
                      regular=race["weights"])
    hammer(race, flipper, prefix_of="model.safetensors", min_calls=100)


# -- through a live grading server --------------------------------------------------------------------------
def test_live_grader_refuses_swapped_paths_and_never_errs(workspace, start_grader, tiny_model, tmp_path):
    """Submissions of a copy of the base model (answered from the cache: the baseline) while a
    checkpoint file flips between a hard link of its regular self and a link to a host file, and a
    subdirectory (holding no checkpoint file) between itself and a link to a host directory (that
    holds one): every answer is the baseline from the cache or a 4xx refusal for the race; the
    ledger holds no grader_error, and nothing holding a host file was ever scored, or copied."""
    server = start_grader(workspace)
    model = copy_model(tiny_model, workspace / "output" / "race")
    write(model / "logs" / "events.log", b"not a checkpoint file: never copied")
    host_logs = tmp_path / "host-logs"
    write(host_logs / "events.log", MARKER + b" log")
    write(host_logs / "extra.json", MARKER + b" json")  # a checkpoint file: copied, were the link followed
    flipped = "generation_config.json"
    regular = workspace / "output" / "regular-generation-config.json"
    shutil.copyfile(model / flipped, regular)
    secret = write(tmp_path / "host-secret.json", MARKER + b"\n")
    baseline = fingerprint(tiny_model)
    assert fingerprint(model) == baseline  # so every copy of the agent's own files is answered from the cache
    with_secret = tmp_path / "with-secret"
    shutil.copytree(model, with_secret)
    shutil.copyfile(secret, with_secret / flipped)
    outside = fingerprint(with_secret)

    answers: list[tuple[int, str | None]] = []
    flipper = Flipper(workspace / "output", "file_and_directory_link", model / flipped, hold_s=0.0002,
                      secret=secret, regular=regular, directory=model / "logs", host_dir=host_logs)
    with flipper:
        started = time.monotonic()
        while time.monotonic() - started < 25 and (len(answers) < 200 or time.monotonic() - started < 4):
            response = requests.post(f"{server.url}/submit", json={"model_path": "output/race"}, timeout=120)
            body = response.json()
            answers.append((response.status_code, body.get("reason") or body.get("status")))
    statuses: dict[str, int] = {}
    for status, what in answers:
        statuses[f"{status} {what}"] = statuses.get(f"{status} {what}", 0) + 1
    summary = {"submissions": len(answers), "swaps": flipper.swaps, "answers": statuses}
    print(summary)  # shown with -s
    assert flipper.swaps >= MIN_SWAPS, summary
    entries = assert_consistent(server)
    assert len(entries) == len(answers), summary
    grader_errors = [e.get("error") for e in entries if e.get("status") == "grader_error"]
    assert not grader_errors, (summary, grader_errors[:3])
    for status, what in answers:
        assert status == 200 or (400 <= status < 500 and what in RACE_REASONS), summary
    for entry in entries:
        assert entry["status"] in ("cached", "refused"), (entry["status"], entry.get("error"), summary)
        assert entry["fingerprint"] != outside, summary
        if entry["status"] == "cached":
            assert entry["fingerprint"] == baseline, summary
    leaked = [str(p) for p in server.grader.snapshots.rglob("*") if p.is_file() and MARKER in p.read_bytes()]
    assert leaked == [], summary
    assert {e["status"] for e in entries} == {"cached", "refused"}, summary
