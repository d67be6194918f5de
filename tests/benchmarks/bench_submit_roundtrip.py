"""Benchmark: the round trip of a /submit against the bare evaluation of the same checkpoint, measured in one run.

    .venv/bin/python tests/benchmarks/bench_submit_roundtrip.py [--models tiny smollm2-135m-instruct]
        [--prompts 32] [--max-new-tokens 64] [--submissions 2]

For each model: the bare evaluation (rlbench.evaluation.evaluate.evaluate_model in a process of its own,
already warm: its generation + scoring, the faster of two, and its loading apart), then a live grading server with each
worker mode, `fresh` (a new interpreter per submission, the grader before warm workers) and `warm`
(rlbench.evaluation.workers, started when the grader starts, as the runner does), answering `--submissions`
submissions of new weights over HTTP. Prints the median round trip, where the last evaluation's
time went, and the ratios round trip / bare (the target: warm <= 1.3x on both models). GSM8K's
8-shot prompts are ~1,550 tokens: on 2 CPU cores SmolLM2 reads ~400 prompt tokens/s, hence the
modest default --prompts. CPU only; compare ratios, not seconds (the machines are shared and noisy).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import requests
from grader_setup import gsm8k_settings, model_spec, prepare, start_server, variant

from rlbench.evaluation.evaluate import evaluate_model

TARGET = 1.3


def bare(settings: dict, model_dir: Path, eval_dir: Path, evaluation: dict) -> dict:
    """bare_in_this_process, run in a process of its own (started as a worker is), so that both
    sides run in the same conditions (a process that has built models and run servers is slower)."""
    request = json.dumps({"settings": settings, "model_dir": str(model_dir), "eval_dir": str(eval_dir), "evaluation": evaluation})
    out = subprocess.run(
        [sys.executable, __file__, "--bare", request], check=True, capture_output=True, text=True
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def bare_in_this_process(settings: dict, model_dir: Path, eval_dir: Path, evaluation: dict) -> dict:
    """The evaluation alone, in this process, after a 2-prompt call that warms it up: the faster
    of two (the stricter baseline for the ratio)."""
    small = eval_dir.parent / "eval-warm-up"
    small.mkdir(exist_ok=True)
    lines = (eval_dir / "eval.jsonl").read_text().splitlines(keepends=True)[:2]
    (small / "eval.jsonl").write_text("".join(lines))
    evaluate_model(settings, model_dir, small, evaluation)
    runs = []
    for _ in range(2):
        phases = evaluate_model(settings, model_dir, eval_dir, evaluation)["phase_seconds"]
        runs.append(
            {
                "generation_scoring": phases.get("generating", 0.0) + phases.get("scoring", 0.0),
                "loading": phases.get("loading", 0.0),
            }
        )
    return min(runs, key=lambda run: run["generation_scoring"])


def round_trips(root: Path, model: str, model_dir: Path, train: Path, eval_dir: Path, settings: dict, evaluation: dict, n: int):
    server, workspace = start_server(root, model_dir, model_spec(model)["hf_id"], train, eval_dir, settings, evaluation)
    try:
        times, timings = [], []
        for k in range(n):
            path = f"output/v{k}"
            variant(model_dir, workspace / path, k + 1)
            started = time.perf_counter()
            response = requests.post(f"{server.url}/submit", json={"model_path": path}, timeout=3600)
            elapsed = time.perf_counter() - started
            body = response.json()
            if response.status_code != 200 or body.get("status") != "scored":
                raise SystemExit(f"submission {path} was not scored: {response.status_code} {body}")
            entry = server.grader.entries[-1]
            times.append(elapsed)
            timings.append(entry.get("eval_timing") or {})
        return times, timings, server.grader.workers.starts
    finally:
        server.stop()


def main() -> None:
    if sys.argv[1:2] == ["--bare"]:
        request = json.loads(sys.argv[2])
        result = bare_in_this_process(
            request["settings"], Path(request["model_dir"]), Path(request["eval_dir"]), request["evaluation"]
        )
        print(json.dumps(result))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["tiny", "smollm2-135m-instruct"])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--submissions", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    settings = gsm8k_settings(args.prompts, args.max_new_tokens)
    print(f"GSM8K offline, {args.prompts} held-out prompts x <= {args.max_new_tokens} new tokens, batch size {args.batch_size}, CPU")
    verdicts = []
    for model in args.models:
        with tempfile.TemporaryDirectory() as tmp:
            root = Path(tmp)
            model_dir, train, eval_dir = prepare(root, model, settings)
            evaluation = {"backend": "hf", "batch_size": args.batch_size, "eval_timeout_s": 3600}
            reference = bare(settings, model_dir, eval_dir, evaluation)
            print(f"\n{model}: bare evaluation: generation + scoring {reference['generation_scoring']:.2f} s "
                  f"(loading {reference['loading']:.2f} s apart)")
            for mode in ("fresh", "warm"):
                times, timings, starts = round_trips(
                    root / mode, model, model_dir, train, eval_dir, settings, {**evaluation, "worker": mode}, args.submissions
                )
                median = statistics.median(times)
                ratio = median / reference["generation_scoring"]
                phases = timings[-1].get("phase_seconds") or {}
                shown = ", ".join(f"{name} {seconds:.2f} s" for name, seconds in phases.items())
                shown_times = ", ".join(f"{t:.2f}" for t in times)
                print(f"  worker {mode:5s}: round trips {shown_times} s, median {median:.2f} s = {ratio:.2f}x the bare "
                      f"evaluation ({starts} worker process(es) started)")
                print(f"                  last evaluation's phases: {shown}")
                if mode == "warm":
                    verdicts.append((model, ratio))
    print()
    for model, ratio in verdicts:
        print(f"{model}: warm round trip / bare evaluation = {ratio:.2f}x (target <= {TARGET}x): "
              f"{'met' if ratio <= TARGET else 'NOT met'}")


if __name__ == "__main__":
    main()
