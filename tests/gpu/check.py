"""The GPU check: what only a CUDA machine can show, in one call of at most ten minutes.

On a bare CUDA machine (Python 3.12 with torch built for CUDA, transformers, accelerate, peft and
safetensors; no network), with the wheels that tests/gpu/wheels.txt lists fetched beforehand into
tests/gpu/wheels/ (tests/gpu/fetch_wheels.sh, on a machine with the package registry), from the
repository's root:

    pip install -q --no-index --no-deps --find-links tests/gpu/wheels --target /tmp/rlbench/site-packages -r tests/gpu/wheels.txt && PYTHONPATH=/tmp/rlbench/site-packages python3 tests/gpu/check.py --json /tmp/gpu-check.json

(--no-deps: pip --target ignores what is installed already, so it would look for torch among the
wheels; the list holds every package the checks need beyond the machine's own. The target's name
ends in site-packages because dill, which datasets pickles with, treats modules outside a
site-packages directory or sys.prefix as user code and pickles them by value.) opencompass is in
the list for one file, the GSM8K protocol's dataset config (rlbench.tasks.opencompass_config
reads it as data; nothing imports opencompass): fetch_wheels.sh cuts its wheel down to that file
and its metadata. Size: the wheels take about 56 MiB (41 MiB of it pyarrow), within a 64 MiB
carry with the working tree (about 4 MiB): that is why the list pins
datasets 4.7.0 with pyarrow 21.0.0, the oldest that TRL accepts, where the project's environment
has newer ones (datasets 5 needs pyarrow >= 24, whose wheel alone is 49 MB).
tests/test_gpu_check.py (slow tier) runs this script's dry run on a bare machine's packages
(torch, transformers, accelerate, peft, safetensors and what they require) plus those wheels, and
checks the size of the carry.

The GSM8K rows the checks use (16 training, 8 held out) are committed beside this script
(gsm8k_rows.json): the task's offline source draws them with reasoning_gym, too large to carry.
`check.py --write-rows` draws them again (where reasoning_gym is installed); tests/test_gpu_check.py
checks that they are what the offline source draws with the check's settings.

It prints one row per check (check, result ok / FAIL / skipped, figure, seconds) and exits with
status 1 when a check failed. The checks, on the project's real code:

  model          the tiny model built offline (rlbench.models.materialise.prepare_model; --model
                 names another config/models entry that builds offline)
  hf_eval        one GSM8K evaluation through a warm evaluation worker (rlbench.evaluation.workers,
                 the grader's path) with the hf backend: on CUDA in bfloat16 (the backend's CUDA
                 dtype), the worker's device memory seen to grow while it evaluates
  prefix_cache   CachedBatchGenerator against FullPromptGenerator (greedy, two calls, the second
                 extending the first's prompts), in bfloat16 and float32: identical texts, or how
                 many differ
  trl_sft        one TRL SFT step; trl_grpo: one TRL GRPO step (bf16 on CUDA), the loss finite
  gpu_locks      two evaluations submitted at once on two GPU sets, each taking the grader's GPU
                 locks (rlbench.grader.gpu_locks) first: with two GPUs they overlap, with one GPU
                 (or the CPU) both go to the same set and must take turns
  memory_release the warm worker holds device memory after an evaluation, and after worker_idle_s
                 seconds idle it is replaced and the device's memory is back to the level measured
                 at the start, before any worker ran (CUDA only)

--dry (or --device cpu) runs the same checks on the CPU with the tiny model in well under a minute
(tests/test_gpu_check.py runs it in the default tier, so that the script does not rot). --only
hf_eval,trl_sft runs the model's build and the checks named (prefix_cache names both of its rows).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "scripts"))
os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")

from rlbench.evaluation.workers import WorkerPool  # noqa: E402
from rlbench.fileio.jsonio import read_jsonl, write_jsonl  # noqa: E402
from rlbench.grader.gpu_locks import GpuLocks  # noqa: E402
from rlbench.models.materialise import prepare_model  # noqa: E402
from rlbench.models.spec import load_spec  # noqa: E402
from rlbench.tasks.base import EVAL_FILE, TRAIN_FILE  # noqa: E402
from rlbench.tasks.gsm8k import GSM8K  # noqa: E402

GSM8K_SETTINGS = {
    "name": "gsm8k",
    "level": "L1",
    "module": "gsm8k",
    "source": "offline",
    "train_size": 16,
    "eval_size": 8,
    "data_seed": 0,
    "max_new_tokens": 16,
}
EVALUATION = {"backend": "hf", "batch_size": 8, "eval_timeout_s": 300}
SALT = "rlbench-gpu-check"
IDLE_S = 3.0  # worker_idle_s of the check's pool: a GPU worker idle this long is replaced
RELEASE_TOLERANCE_MIB = 64  # device memory above the starting level still counted as released
READY_TIMEOUT_S = 180  # for a worker's imports (torch, transformers): well within the call's ten minutes
ROWS = Path(__file__).with_name("gsm8k_rows.json")  # {"train": [...], "eval": [...]}: see the module's text
VERSIONS = ("torch", "transformers", "accelerate", "peft", "trl", "datasets", "pyarrow")
MAX_NEW_TOKENS = 24


# What --only can name, in the order they run (after the model's build).
CHECKS = ("hf_eval", "memory_release", "gpu_locks", "prefix_cache", "trl_sft", "trl_grpo")


class Table:
    """The check's rows, printed as they come and at the end; with a JSON path, written there after
    every row (a call cut off by its time limit still leaves the rows it finished)."""

    def __init__(self, json_path: Path | None = None, header: dict | None = None) -> None:
        self.rows: list[dict] = []
        self.json_path, self.header = json_path, header or {}

    def save(self) -> None:
        if self.json_path is not None:
            self.json_path.write_text(json.dumps({**self.header, "rows": self.rows}, indent=2) + "\n")

    def run(self, name: str, check) -> object:
        """Run check() -> (result, figure[, value]); an exception is a FAIL with its message."""
        started = time.perf_counter()
        value = None
        try:
            outcome = check()
            result, figure = outcome[0], outcome[1]
            value = outcome[2] if len(outcome) > 2 else None
        except Exception as exc:  # noqa: BLE001 - a failed check is a row, not the end of the run
            traceback.print_exc(file=sys.stderr)
            result, figure = "FAIL", f"{type(exc).__name__}: {exc}"[:300]
        row = {"check": name, "result": result, "figure": figure, "seconds": round(time.perf_counter() - started, 1)}
        self.rows.append(row)
        self.save()
        print(f"[gpu-check] {name}: {result} ({figure}) in {row['seconds']} s", file=sys.stderr, flush=True)
        return value

    def text(self) -> str:
        widths = [max(len(str(r[k])) for r in [*self.rows, {k: k for k in ("check", "result", "figure", "seconds")}])
                  for k in ("check", "result", "figure", "seconds")]
        lines = []
        for row in [{k: k for k in ("check", "result", "figure", "seconds")}, *self.rows]:
            cells = [str(row[k]).ljust(w) for k, w in zip(("check", "result", "figure", "seconds"), widths)]
            lines.append("  ".join(cells).rstrip())
        return "\n".join(lines)


class Device:
    """The device the checks run on: its GPU ids (as the grader gets them: CUDA_VISIBLE_DEVICES's entries, or
    0..n-1), and the memory used on one of them (torch.cuda.mem_get_info: the whole device, every process)."""

    def __init__(self, kind: str):
        import torch

        self.kind, self.torch = kind, torch
        if kind == "cuda":
            if not torch.cuda.is_available():
                raise SystemExit("--device cuda: torch sees no CUDA device (use --dry for the CPU run)")
            visible = [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]
            self.gpus = visible or [str(i) for i in range(torch.cuda.device_count())]
        else:
            self.gpus = []
        # Each GPU's memory in use before any evaluation worker exists (this process's own CUDA context,
        # which the first reading creates, included): what memory_release expects to come back to.
        self.baseline = {gpu: self.used_mib(gpu) for gpu in self.gpus}

    def used_mib(self, gpu: str) -> int:
        free, total = self.torch.cuda.mem_get_info(self.gpus.index(gpu))
        return (total - free) >> 20

    def dtype_name(self) -> str:
        return "bfloat16" if self.kind == "cuda" else "float32"

    def names(self) -> list[str]:
        return [self.torch.cuda.get_device_name(i) for i in range(len(self.gpus))]


class Peak:
    """The highest device memory used on `gpu` while the context runs (sampled every 20 ms)."""

    def __init__(self, device: Device, gpu: str):
        self.device, self.gpu, self.peak = device, gpu, 0
        self._stop = threading.Event()

    def __enter__(self) -> "Peak":
        def sample() -> None:
            while not self._stop.wait(0.02):
                self.peak = max(self.peak, self.device.used_mib(self.gpu))

        self._thread = threading.Thread(target=sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()


def evaluate(pool: WorkerPool, work: Path, model_dir: Path, eval_dir: Path, gpu: str | None, tag: str) -> dict:
    return pool.evaluate(GSM8K_SETTINGS, model_dir, eval_dir, EVALUATION, work / "evals" / tag, gpu=gpu)


def check_hf_eval(device, pool, work, model_dir, eval_dir):
    gpu = device.gpus[0] if device.gpus else None
    if gpu is None:
        result = evaluate(pool, work, model_dir, eval_dir, None, "first")
        growth = None
    else:
        before = device.used_mib(gpu)
        with Peak(device, gpu) as peak:
            result = evaluate(pool, work, model_dir, eval_dir, gpu, "first")
        growth = peak.peak - before
    if result.get("n") != GSM8K_SETTINGS["eval_size"] or result.get("backend") != "hf":
        return "FAIL", f"n {result.get('n')}, backend {result.get('backend')}: expected {GSM8K_SETTINGS['eval_size']} items on hf"
    figure = f"{device.kind} {device.dtype_name()}: score {result['score']}, n {result['n']}, eval {result['eval_seconds']} s"
    if growth is not None:
        figure += f", +{growth} MiB on GPU {gpu} while evaluating"
        if growth <= 0:
            return "FAIL", figure + " (the worker did not use the GPU)"
    return "ok", figure


def check_memory_release(device, pool, work, model_dir, eval_dir):
    if not device.gpus:
        return "skipped", "CPU: no device memory (the idle replacement is for GPU workers)"
    gpu = device.gpus[0]
    pool.prestart(gpu)  # the slot's worker may not exist yet (--only memory_release)
    if not pool.wait_ready(gpu, timeout=READY_TIMEOUT_S):
        return "FAIL", f"GPU {gpu}'s evaluation worker was not ready after {READY_TIMEOUT_S} s (see workers/worker-{gpu}.log)"
    first = pool.worker_pid(gpu)
    evaluate(pool, work, model_dir, eval_dir, gpu, "release")
    # Against the level before any worker ran: the warm worker keeps its CUDA context (its cached blocks
    # emptied), which this must see, or the reading after the idle time would prove nothing.
    warm = device.used_mib(gpu) - device.baseline[gpu]
    time.sleep(IDLE_S + 3)
    ready = pool.wait_ready(gpu, timeout=READY_TIMEOUT_S)
    now = pool.worker_pid(gpu)
    after = device.used_mib(gpu) - device.baseline[gpu]
    replaced = ready and now is not None and now != first
    figure = (
        f"against the start: {warm:+d} MiB after the evaluation (warm worker), {after:+d} MiB after {IDLE_S:g} s idle; "
        f"worker replaced: {replaced}" + ("" if ready else f" (no new worker ready after {READY_TIMEOUT_S} s)")
    )
    released = replaced and warm > RELEASE_TOLERANCE_MIB and after <= RELEASE_TOLERANCE_MIB
    return ("ok" if released else "FAIL"), figure


def check_gpu_locks(device, pool, work, model_dir, eval_dir):
    locks = GpuLocks(device.gpus)
    sets = [[g] for g in locks.available[:2]] if len(locks.available) >= 2 else [locks.available[:1]] * 2
    for gpus in {tuple(s) for s in sets}:
        pool.prestart(",".join(gpus) or None)
        if not pool.wait_ready(",".join(gpus) or None, timeout=READY_TIMEOUT_S):
            return "FAIL", f"the evaluation worker of {','.join(gpus) or 'cpu'} was not ready after {READY_TIMEOUT_S} s"
    spans: list[tuple[float, float]] = [None, None]
    errors: list[BaseException] = []

    def submit(k: int) -> None:
        try:
            held = locks.locks_for(sets[k])
            for lock in held:
                lock.acquire()
            try:
                started = time.monotonic()
                evaluate(pool, work, model_dir, eval_dir, ",".join(sets[k]) or None, f"locks-{k}")
                spans[k] = (started, time.monotonic())
            finally:
                for lock in reversed(held):
                    lock.release()
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=submit, args=(k,)) for k in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    overlap = min(end for _, end in spans) - max(start for start, _ in spans)
    named = " | ".join(",".join(s) or "cpu" for s in sets)
    if sets[0] != sets[1]:
        return ("ok" if overlap > 0 else "FAIL"), f"sets {named}: overlap {overlap:.2f} s (concurrent expected)"
    why = "one GPU" if device.gpus else "no GPU"
    return ("ok" if overlap <= 0 else "FAIL"), f"{why}: both on {named.split(' | ')[0]}, gap {-overlap:.2f} s (serialised expected)"


def format_prompt(row: dict) -> list[dict]:
    """The chat messages GSM8K's evaluation sends for a row (its OpenCompass few-shot protocol)."""
    return GSM8K().rollout(GSM8K_SETTINGS).prompt(row)


def short_prompt(row: dict) -> list[dict]:
    """The question alone, for the training steps: GSM8K's few-shot prompt is longer than the tiny model's context."""
    return [{"role": "user", "content": row["question"]}]


def prompts_of(generator, train_rows: list[dict], n: int) -> dict:
    return {k: generator.chat_prompt(format_prompt(row)) for k, row in enumerate(train_rows[:n])}


def check_prefix_cache(device, model_dir, train_rows, dtype_name):
    from rlbench.generation.full_prompt import FullPromptGenerator
    from rlbench.generation.prefix_cache import CachedBatchGenerator

    dtype = getattr(device.torch, dtype_name)
    cached = CachedBatchGenerator(model_dir, device=device.kind, dtype=dtype)
    full = FullPromptGenerator(model_dir, device=device.kind, dtype=dtype)
    prompts = prompts_of(cached, train_rows, 6 if device.kind == "cuda" else 3)
    differ, total = 0, 0
    for call in range(2):
        a = cached.generate(prompts, MAX_NEW_TOKENS, None)
        b = full.generate(prompts, MAX_NEW_TOKENS, None)
        differ += sum(a[k] != b[k] for k in prompts)
        total += len(prompts)
        # The next call extends each prompt by its completion: the cached generator reuses its KV cache.
        prompts = {k: prompts[k] + (a[k] or "") + "\nAgain:" for k in prompts}
    reused = cached.stats["prompt_tokens_reused"]
    del cached, full
    if device.kind == "cuda":
        device.torch.cuda.empty_cache()
    figure = f"{total - differ}/{total} identical over 2 calls, {reused} prompt tokens reused"
    return ("ok" if differ == 0 and reused > 0 else "FAIL"), figure


def load_for_training(device, model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dtype = device.torch.bfloat16 if device.kind == "cuda" else device.torch.float32
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, use_safetensors=True)
    return model, AutoTokenizer.from_pretrained(model_dir)


def training_args(device, out: Path) -> dict:
    return dict(
        output_dir=str(out),
        max_steps=1,
        per_device_train_batch_size=2,
        learning_rate=1e-5,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        seed=0,
        use_cpu=device.kind == "cpu",
        bf16=device.kind == "cuda",
        disable_tqdm=True,
    )


def loss_of(trainer) -> float:
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    losses += [e["train_loss"] for e in trainer.state.log_history if "train_loss" in e]
    if not losses:
        raise RuntimeError(f"the trainer logged no loss: {trainer.state.log_history}")
    return float(losses[0])


def check_sft(device, work, model_dir, train_rows):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    model, tokenizer = load_for_training(device, model_dir)
    rows = [{"prompt": short_prompt(r), "completion": [{"role": "assistant", "content": r["answer"]}]} for r in train_rows[:4]]
    trainer = SFTTrainer(
        model=model,
        args=SFTConfig(**training_args(device, work / "sft")),
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
    )
    trainer.train()
    loss = loss_of(trainer)
    return ("ok" if math.isfinite(loss) else "FAIL"), f"1 step on {model.device} ({model.dtype}), loss {loss:.4g}"


def check_grpo(device, work, model_dir, train_rows):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    model, tokenizer = load_for_training(device, model_dir)

    def reward_length(completions, **kwargs):
        return [float(len(str(c))) / 100 for c in completions]

    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward_length],
        args=GRPOConfig(
            **training_args(device, work / "grpo"), num_generations=2, max_completion_length=8, use_vllm=False
        ),
        train_dataset=Dataset.from_list([{"prompt": short_prompt(r)} for r in train_rows[:4]]),
        processing_class=tokenizer,
    )
    trainer.train()
    loss = loss_of(trainer)
    return ("ok" if math.isfinite(loss) else "FAIL"), f"1 step on {model.device} ({model.dtype}), loss {loss:.4g}"


def draw_rows() -> dict:
    """The check's GSM8K rows as the task's offline source draws them (needs reasoning_gym)."""
    with tempfile.TemporaryDirectory(prefix="rlbench-gpu-rows-") as scratch:
        train_dir, eval_dir = Path(scratch) / "train", Path(scratch) / "eval"
        GSM8K().prepare(GSM8K_SETTINGS, train_dir, eval_dir, salt=SALT)
        return {
            split: list(read_jsonl(where / name))
            for split, where, name in (("train", train_dir, TRAIN_FILE), ("eval", eval_dir, EVAL_FILE))
        }


def place_rows(train_dir: Path, eval_dir: Path) -> list[dict]:
    """The committed rows written where the task's prepare would write them; the training rows."""
    rows = json.loads(ROWS.read_text())
    write_jsonl(train_dir / TRAIN_FILE, rows["train"])
    write_jsonl(eval_dir / EVAL_FILE, rows["eval"])
    return rows["train"]


def versions() -> dict:
    from importlib import metadata

    found = {}
    for name in VERSIONS:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--dry", action="store_true", help="the same checks on the CPU with the tiny model (fast)")
    parser.add_argument("--model", default="tiny", help="a config/models entry that builds offline (default tiny)")
    parser.add_argument("--work", type=Path, help="where the model, data and logs go (default: a temporary directory)")
    parser.add_argument("--json", type=Path, help="also write the rows here as JSON")
    parser.add_argument("--only", help=f"comma-separated checks to run after the model's build (of {', '.join(CHECKS)})")
    parser.add_argument("--write-rows", action="store_true", help=f"draw the GSM8K rows again into {ROWS.name} and stop")
    args = parser.parse_args(argv)
    if args.write_rows:
        ROWS.write_text(json.dumps(draw_rows(), indent=1, sort_keys=True) + "\n")
        print(f"wrote {ROWS}", file=sys.stderr)
        return 0
    only = set(CHECKS) if args.only is None else {name.strip() for name in args.only.split(",") if name.strip()}
    if not only or only - set(CHECKS):
        parser.error(f"--only: unknown or no check in {args.only!r}; the checks: {', '.join(CHECKS)}")
    kind = "cpu" if args.dry else args.device
    work = args.work or Path(tempfile.mkdtemp(prefix="rlbench-gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    device = Device(kind)
    header = {"device": kind, "gpus": device.gpus, "gpu_names": device.names(), "versions": versions()}
    table = Table(args.json, header)
    print(
        f"[gpu-check] device {kind}, GPUs {device.gpus or 'none'} {header['gpu_names'] or ''}, "
        f"memory in use at the start (MiB) {device.baseline or '-'}, work {work}\n"
        f"[gpu-check] versions {header['versions']}",
        file=sys.stderr, flush=True,
    )

    model_dir = work / "model"
    if model_dir.exists():  # a --work reused from an earlier check: the model is built again
        shutil.rmtree(model_dir)

    def build():
        summary = prepare_model(load_spec(REPO / "config" / "models" / f"{args.model}.yaml"), model_dir)
        return "ok", f"{summary['name']}: {summary['num_parameters']} parameters, built in {summary['build_seconds']} s"

    table.run("model", build)
    train_dir, eval_dir = work / "data" / "train", work / "data" / "eval"
    train_rows = place_rows(train_dir, eval_dir)
    pool = WorkerPool(work / "workers", "warm", IDLE_S)
    try:
        for name, check in (("hf_eval", check_hf_eval), ("memory_release", check_memory_release), ("gpu_locks", check_gpu_locks)):
            if name in only:
                table.run(name, lambda check=check: check(device, pool, work, model_dir, eval_dir))
    finally:
        pool.close()
    if "prefix_cache" in only:
        for dtype_name in ("bfloat16", "float32"):
            table.run(f"prefix_cache_{dtype_name}", lambda d=dtype_name: check_prefix_cache(device, model_dir, train_rows, d))
    if "trl_sft" in only:
        table.run("trl_sft", lambda: check_sft(device, work, model_dir, train_rows))
    if "trl_grpo" in only:
        table.run("trl_grpo", lambda: check_grpo(device, work, model_dir, train_rows))
    print(table.text(), flush=True)
    return 1 if any(r["result"] == "FAIL" for r in table.rows) else 0


if __name__ == "__main__":
    sys.exit(main())
