"""A small file system that fills up: a bounded tmpfs in a private mount namespace.

`run_on_small_fs` runs a command inside `unshare --user --map-root-user --mount` (plain `unshare
--mount` as root where user namespaces are off) after mounting a tmpfs of a few pages and binding
files of it over the given paths: whatever the command writes to those paths lands on the small file
system, everything else on the real disk. The mounts vanish with the command, so it copies out what
the test must see. `unavailable_reason` says why this cannot work here (None when it can).

`python -m support.full_disk CONFIG` is the grader driver the ledger test runs there (see main).
"""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

MOUNT_SCRIPT = """\
set -e
small="$1"; shift
mount -t tmpfs -o size={size} rlbench-small "$small"
while [ "$1" != "--" ]; do
    : > "$small/$(basename "$1")"
    mount --bind "$small/$(basename "$1")" "$1"
    shift
done
shift
exec "$@"
"""
TESTS = Path(__file__).resolve().parents[1]


def _prefixes() -> list[list[str]]:
    prefixes = [["unshare", "--user", "--map-root-user", "--mount"]]
    if os.geteuid() == 0:
        prefixes.append(["unshare", "--mount"])
    return prefixes


def _prefix() -> tuple[list[str] | None, str]:
    """The unshare command that lets an unprivileged mount of a tmpfs succeed, or (None, why not)."""
    if not shutil.which("unshare") or not shutil.which("mount"):
        return None, "unshare and mount (util-linux) are not installed"
    why = ""
    probe = Path(os.environ.get("TMPDIR", "/tmp"))
    for prefix in _prefixes():
        done = subprocess.run(
            [*prefix, "sh", "-c", 'mount -t tmpfs -o size=16k rlbench-probe "$0"', str(probe)],
            capture_output=True, text=True, timeout=30, check=False,
        )
        if done.returncode == 0:
            return prefix, ""
        why = done.stderr.strip()[:200]
    return None, f"cannot mount a tmpfs in a private mount namespace here (no user namespaces?): {why}"


def unavailable_reason() -> str | None:
    return _prefix()[1] or None


def run_on_small_fs(
    small: Path, bound: list[Path], command: list[str], size: str = "64k", timeout: float = 600, **kwargs
) -> subprocess.CompletedProcess:
    """Run `command` with a tmpfs of `size` at `small` and each path in `bound` (an existing file)
    a bind mount of a file of the same name on it."""
    prefix, why = _prefix()
    if prefix is None:
        raise RuntimeError(why)
    script = MOUNT_SCRIPT.format(size=size)
    return subprocess.run(
        [*prefix, "sh", "-c", script, "sh", str(small), *map(str, bound), "--", *command],
        capture_output=True, text=True, timeout=timeout, check=False, **kwargs,
    )


def fill(directory: Path) -> Path:
    """Write a ballast file into `directory` until its file system refuses (ENOSPC)."""
    ballast = directory / "ballast"
    with open(ballast, "wb", buffering=0) as handle:
        for block in (1 << 16, 1 << 12, 1):
            while True:
                try:
                    if handle.write(b"\0" * block) < block:
                        break
                except OSError as exc:
                    if exc.errno != errno.ENOSPC:
                        raise
                    break
    return ballast


def main(config_path: str) -> None:
    """The grader on a ledger that lives on the small file system: one cached submission while
    there is room, the file system filled, submissions until a few were refused (or 12 were made),
    the ballast removed, one more submission. Writes responses.json, health.json and a copy of the
    ledger into config["out"]."""
    import requests

    from rlbench.grader.fingerprint import fingerprint
    from rlbench.grader.grading import Grader, GraderConfig
    from rlbench.grader.server import GradingServer, new_secret
    from support.models import base_resources
    from support.settings import EVALUATION, GSM8K_SETTINGS

    config = json.loads(Path(config_path).read_text())
    workspace, grader_dir, out = Path(config["workspace"]), Path(config["grader_dir"]), Path(config["out"])
    grader = Grader(
        GraderConfig(
            workspace=workspace,
            grader_dir=grader_dir,
            task_settings=GSM8K_SETTINGS,
            eval_dir=Path(config["eval_dir"]),
            baseline_score=0.0,
            baseline_fingerprint=fingerprint(Path(config["tiny_model"])),
            start_time=time.time(),
            timeout_s=600,
            secret=new_secret(),
            evaluation=EVALUATION,
            resources=base_resources(Path(config["tiny_model"])),
        )
    )
    responses = []

    def submit(model_path: str, phase: str) -> dict:
        response = requests.post(f"{server.url}/submit", json={"model_path": model_path}, timeout=120)
        responses.append(
            {
                "phase": phase,
                "status": response.status_code,
                "retry_after": response.headers.get("Retry-After"),
                "body": response.json(),
                "ledger_bytes": grader.ledger_path.stat().st_size,
            }
        )
        return responses[-1]

    with GradingServer(grader) as server:
        submit("output/v1", "room")
        ballast = fill(Path(config["small"]))
        refused = 0
        for n in range(12):
            answer = submit("output/v1" if n % 2 == 0 else "output/missing", "full")
            refused += answer["status"] == 503
            if refused >= 3:
                break
        ballast.unlink()
        submit("output/v1", "freed")
        health = requests.get(f"{server.url}/health", timeout=30).json()
    (out / "responses.json").write_text(json.dumps(responses, indent=1))
    (out / "health.json").write_text(json.dumps(health))
    shutil.copyfile(grader.ledger_path, out / "ledger.jsonl")


if __name__ == "__main__":
    main(sys.argv[1])
