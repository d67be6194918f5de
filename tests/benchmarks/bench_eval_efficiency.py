"""Benchmark: tokens/s sustained during a grader evaluation against a bare batched generate, measured in one run.

    .venv/bin/python tests/benchmarks/bench_eval_efficiency.py [--model smollm2-135m-instruct]
        [--task addition-control] [--prompts 200] [--max-new-tokens 32] [--batch-size 32] [--workers fresh warm]
        [--threads N]

The default task is the addition control (short prompts, short answers): there the grader's own
costs weigh most against the generation, so it is the demanding case for the ratio, and 200 prompts
take seconds on a CPU. `--task gsm8k` measures the paper's L1 protocol instead (8-shot prompts of
~1,550 tokens: on 2 CPU cores SmolLM2 needs ~4 minutes per 32 prompts, and the ratio approaches 1).

The bare side: the model loaded once with transformers, the same held-out prompts rendered with
the same chat template, left-padded batches of the same size in the split's order, one greedy
`model.generate` per batch; only the generate calls are timed and the new tokens (up to each
row's end of sequence) counted. The grader side: a live grading server answering one /submit of
the same weights, timed from request to answer, its worker started with the grader (as the runner does); its tokens/s are the same new
tokens over that time (the completions are checked to be the bare ones). Prints both rates, their ratio
(the target: >= 80 % on SmolLM2 with 200 prompts on CPU) and where the grader's time went:
start-up (the worker's interpreter and imports, when it was not warm), loading, generation,
scoring and the grader's own work (snapshot, fingerprint, checks, ledger, HTTP). It also prints the
generation phase alone against the bare generate (the same prompts, batches and new tokens: the
target is >= 95 % for the warm worker), which leaves the grader's fixed costs out. Compare ratios,
not seconds: the machines are shared and noisy. `--threads N` runs both sides on N CPU threads
(torch.set_num_threads here, OMP_NUM_THREADS for the worker): on a busy machine, two threads that
wait for each other at every operation make the figures swing; one thread steadies them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
from pathlib import Path

import requests
from grader_setup import model_spec, prepare, start_server, task_settings, variant

from rlbench.fileio.jsonio import read_json, read_jsonl
from rlbench.tasks import get_task

TARGET = 0.80
GENERATION_TARGET = 0.95  # the warm worker's generation phase against the bare generate


def bare_generate(model_dir: Path, conversations: list[list[dict]], max_new_tokens: int, batch_size: int):
    """(new tokens, seconds in generate, completions) of plain batched transformers generation."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from rlbench.generation.backends import eos_ids
    from rlbench.generation.chat_format import ChatFormat

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    eos = eos_ids(tokenizer.eos_token_id, model.generation_config.eos_token_id)
    chat_format = ChatFormat.for_model(tokenizer)  # the model's own template, as the grader renders these weights
    prompts = [chat_format.render(c) for c in conversations]
    tokens, seconds, completions = 0, 0.0, []
    for start in range(0, len(prompts), batch_size):
        batch = tokenizer(prompts[start : start + batch_size], add_special_tokens=False, padding=True, return_tensors="pt")
        started = time.perf_counter()
        with torch.inference_mode():
            out = model.generate(
                **batch, max_new_tokens=max_new_tokens, do_sample=False, temperature=None, top_p=None, top_k=None,
                pad_token_id=tokenizer.pad_token_id, eos_token_id=eos,
            )
        seconds += time.perf_counter() - started
        for row in out[:, batch["input_ids"].shape[1] :].tolist():
            ended = next((i + 1 for i, t in enumerate(row) if t in eos), len(row))
            tokens += ended
            completions.append(tokenizer.decode(row[:ended], skip_special_tokens=True))
    return tokens, seconds, completions


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--task", default="addition-control", choices=["addition-control", "gsm8k"])
    parser.add_argument("--prompts", type=int, default=200)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--workers", nargs="+", default=["fresh", "warm"], choices=["fresh", "warm"])
    parser.add_argument("--threads", type=int, default=None, help="CPU threads of both sides (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        import torch

        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the worker's torch reads it when it starts
        torch.set_num_threads(args.threads)
    settings = task_settings(args.task, args.prompts, args.max_new_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        model_dir, train, eval_dir = prepare(root, args.model, settings)
        rollout = get_task(settings).rollout(settings)
        rows = list(read_jsonl(eval_dir / "eval.jsonl"))
        conversations = [rollout.prompt(row) for row in rows]
        # Weights other than the base model's (the grader answers those from its cache), on both sides.
        weights = variant(model_dir, root / "weights", 1)
        bare_generate(weights, conversations[:2], 4, args.batch_size)  # warm-up
        tokens, bare_s, bare_completions = bare_generate(weights, conversations, args.max_new_tokens, args.batch_size)
        bare_rate = tokens / bare_s
        threads = f"{args.threads} thread(s)" if args.threads else "default threads"
        print(f"{args.model}, {args.task} offline: {len(rows)} prompts, <= {args.max_new_tokens} new tokens, batch size "
              f"{args.batch_size}, CPU, {threads}")
        print(f"bare batched generate: {tokens} new tokens in {bare_s:.2f} s = {bare_rate:.1f} tokens/s")
        verdict, generation_verdict = None, None
        for mode in args.workers:
            evaluation = {"backend": "hf", "batch_size": args.batch_size, "eval_timeout_s": 3600, "worker": mode}
            server, workspace = start_server(
                root / mode, model_dir, model_spec(args.model)["hf_id"], train, eval_dir, settings, evaluation
            )
            try:
                shutil.copytree(weights, workspace / "output" / "v1")  # the same weights as the bare side
                started = time.perf_counter()
                response = requests.post(f"{server.url}/submit", json={"model_path": "output/v1"}, timeout=3600)
                round_trip = time.perf_counter() - started
                response.raise_for_status()
                entry = server.grader.entries[-1]
                result = read_json(server.grader.snapshots / f"{entry['submission_id']:04d}" / "eval" / "result.json")
            finally:
                server.stop()
            same = [item.get("completion") for item in result.get("items", [])] == bare_completions
            phases = (entry.get("eval_timing") or {}).get("phase_seconds") or {}
            evaluation_s = float(entry.get("eval_seconds") or 0.0)
            worker = (entry.get("eval_timing") or {}).get("worker") or {}
            rate = tokens / round_trip
            print(f"\nworker {mode}: /submit answered in {round_trip:.2f} s = {rate:.1f} tokens/s = "
                  f"{rate / bare_rate:.0%} of the bare rate (completions identical to the bare ones: {same})")
            parts = {
                "outside the evaluation (the grader's checks, snapshot and ledger, a new process's start, HTTP)":
                    round_trip - evaluation_s,
                "setup (imports, task, split)": phases.get("setup", 0.0),
                "loading": phases.get("loading", 0.0),
                "generation": phases.get("generating", 0.0),
                "scoring": phases.get("scoring", 0.0),
            }
            print(f"  where the time went (worker reused: {worker.get('reused', False)}):")
            for name, seconds in parts.items():
                print(f"    {name}: {seconds:.2f} s ({seconds / round_trip:.0%})")
            generating = phases.get("generating", 0.0)
            generation_ratio = bare_s / generating if generating else 0.0
            print(f"  generation phase: {generating:.2f} s for the bare generate's {bare_s:.2f} s = "
                  f"{tokens / generating if generating else 0.0:.1f} tokens/s = {generation_ratio:.0%} of the bare rate")
            if mode == "warm":
                verdict, generation_verdict = rate / bare_rate, generation_ratio
        if verdict is not None:
            print(f"\nwarm grader evaluation / bare generate = {verdict:.0%} (target >= {TARGET:.0%}): "
                  f"{'met' if verdict >= TARGET else 'NOT met'}")
            print(f"warm worker's generation phase / bare generate = {generation_verdict:.0%} "
                  f"(target >= {GENERATION_TARGET:.0%}): {'met' if generation_verdict >= GENERATION_TARGET else 'NOT met'}")


if __name__ == "__main__":
    main()
