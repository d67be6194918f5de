"""Benchmark: batched vs one-at-a-time evaluation on the tiny model, measured in one run.

    .venv/bin/python tests/benchmarks/bench_eval_batching.py [--prompts 50] [--max-new-tokens 32]

Prints both timings and their ratio (machines are shared and noisy: compare ratios, not seconds).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from rlbench.generation.backends import HFBackend  # noqa: E402
from rlbench.models.materialise import prepare_model  # noqa: E402
from rlbench.tasks.base import new_salt  # noqa: E402
from rlbench.tasks.gsm8k import GSM8K  # noqa: E402
from rlbench.tasks.gsm8k import public as gsm8k_public  # noqa: E402
from rlbench.fileio.jsonio import read_jsonl  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=50)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        prepare_model({"name": "tiny", "source": "tiny", "hf_id": "rlbench/tiny-qwen2", "seed": 0}, root / "model")
        settings = {"source": "offline", "train_size": 1, "eval_size": args.prompts, "data_seed": 0}
        GSM8K().prepare(settings, root / "train", root / "eval", salt=new_salt())
        prompts = [gsm8k_public.format_prompt(r) for r in read_jsonl(root / "eval" / "eval.jsonl")]
        timings = {}
        for batch_size in (1, args.prompts):
            backend = HFBackend(root / "model", batch_size=batch_size, device="cpu")
            backend.generate_chat(prompts[:2], 4)  # warm-up
            started = time.perf_counter()
            backend.generate_chat(prompts, args.max_new_tokens)
            timings[batch_size] = time.perf_counter() - started
    print(f"{args.prompts} prompts x {args.max_new_tokens} new tokens on the tiny model (CPU)")
    print(f"batch size 1:  {timings[1]:.2f} s")
    print(f"batch size {args.prompts}: {timings[args.prompts]:.2f} s")
    print(f"speed-up of batching: {timings[1] / timings[args.prompts]:.1f}x")


if __name__ == "__main__":
    main()
