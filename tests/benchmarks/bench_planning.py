"""Benchmark: how long `snakemake -n` takes to plan a large sweep (target: < 20 s for >= 700 runs).

    .venv/bin/python tests/benchmarks/bench_planning.py [--seeds 59]

The sweep is 1 task x 4 models x 3 agents x N seeds (59 seeds = 708 runs, about 5,000 jobs),
planned in an empty working directory. A 12-run sweep is planned in the same run for scale:
compare the ratio, not the seconds, on a shared machine.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]


def plan(seeds: int) -> tuple[float, int, int]:
    """(seconds, runs, jobs) of one dry run."""
    config = {
        "sweep": {
            "tasks": ["gsm8k"],
            "models": ["tiny", "smollm2-135m-instruct", "qwen2.5-7b-instruct", "qwen3-8b-base"],
            "agents": ["copy", "sft", "grpo"],
            "seeds": list(range(seeds)),
        },
        "budget": {"time_limit_s": 43200},
        "tasks": {"gsm8k": {"source": "offline"}},
    }
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "config").mkdir()
        (Path(tmp) / "config" / "config.yaml").write_text(yaml.safe_dump(config))
        started = time.perf_counter()
        proc = subprocess.run(
            [sys.executable, "-m", "snakemake", "-n", "--quiet", "rules", "-s", str(REPO / "Snakefile"), "-d", tmp],
            capture_output=True,
            text=True,
        )
        seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise SystemExit(proc.stderr[-3000:])
    total = re.search(r"^total\s+(\d+)", proc.stdout + proc.stderr, re.M)
    return seconds, 12 * seeds, int(total.group(1)) if total else -1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=59)
    args = parser.parse_args()
    small = plan(1)
    large = plan(args.seeds)
    for seconds, runs, jobs in (small, large):
        print(f"{runs:5d} runs, {jobs:6d} jobs: snakemake -n took {seconds:6.2f} s")
    print(f"ratio large/small: {large[0] / small[0]:.1f}x for {large[1] / small[1]:.0f}x the runs")
    print(f"target < 20 s for the large sweep: {'met' if large[0] < 20 else 'NOT met'}")


if __name__ == "__main__":
    main()
