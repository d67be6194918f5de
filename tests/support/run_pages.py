"""A synthetic run's page data (rlbench.explorer's schema), as large as asked: for the run explorer's browser
tests and its speed benchmark (tests/benchmarks/bench_run_page.py)."""

from __future__ import annotations

import random

TOOLS = ("Bash", "Read", "Edit", "Write")
WORDS = "train model reward loss step learning rate checkpoint submit eval accuracy batch lora grpo data".split()


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


def _diff(k: int) -> str:
    return (
        f"diff --git a/code/train.py b/code/train.py\nindex {k:07x}..{k + 1:07x} 100644\n--- a/code/train.py\n"
        f"+++ b/code/train.py\n@@ -1,3 +1,3 @@\n import trl\n-lr = {k}e-6\n+lr = {k + 1}e-6\n steps = 100\n"
    )


def synthetic_page_data(turns: int = 10_000, submissions: int = 40, hours: float = 12.0, seed: int = 0) -> dict:
    """A run of `hours` with `turns` LLM turns (some failed calls, some tool errors) and `submissions`
    submissions (scored, refused, failed; diffs, checkpoints, metrics), a 5-second resource trace thinned
    to 3,000 points, budget cuts, a summary with iterations and verdicts."""
    rng = random.Random(seed)
    span = hours * 3600
    items = []
    for i in range(turns):
        t = round(span * (i + 1) / (turns + 1), 3)
        ok = rng.random() > 0.02
        tools = sorted(rng.sample(TOOLS, rng.choice((0, 1, 1, 2))))
        messages = [{"role": "tool", "name": tools[0] if tools else "Bash", "text": _text(rng, 60)}]
        if rng.random() < 0.05:
            messages[0]["error"] = True
        if rng.random() < 0.3:
            messages.append({"role": "user", "text": _text(rng, 40)})
        response = [{"role": "assistant", "text": _text(rng, 30)}]
        response += [{"role": "tool_call", "name": name, "text": "command: " + _text(rng, 8)} for name in tools]
        items.append({
            "i": i, "t": t, "t_exact": True, "kind": "llm", "ok": ok, "error": None if ok else "upstream 500",
            "label": ("error: upstream 500" if not ok else "; ".join(f"{n}: {_text(rng, 5)}" for n in tools) or _text(rng, 8)),
            "tools": tools, "model": "driver-model", "tokens_in": 1000 + i, "tokens_out": rng.randint(5, 400),
            "latency_s": round(rng.uniform(0.5, 20), 2), "messages": messages, "response": response,
        })  # fmt: skip
    subs = []
    statuses = ("scored", "scored", "scored", "cached", "refused", "failed")
    for k in range(1, submissions + 1):
        status = statuses[k % len(statuses)]
        scored = status in ("scored", "cached")
        subs.append({
            "id": k, "t": round(span * k / (submissions + 1), 3), "status": status,
            "reason": None if scored else "invalid_model_path" if status == "refused" else None,
            "error": None if scored else "the evaluation failed" if status == "failed" else "no model at output/x",
            "score": round(10 + 20 * rng.random(), 2) if scored else 0.0, "improvement": round(rng.uniform(-2, 10), 2),
            "model_path": f"output/v{k}", "code_revision": f"{k:040x}", "code_files": ["code/train.py", "code/data.py"],
            "diff_against": k - 1 if k > 1 else None,
            "diff": None if status == "refused" else ("" if k % 7 == 0 else _diff(k)),
            "checkpoint": {"fingerprint": f"{k:016x}", "method": "copy", "config": {"model_type": "llama"},
                           "files": [{"name": "model.safetensors", "size": 5_000_000 + k, "sha256": f"{k:064x}"}]},
            "metrics": {"accuracy": 12.5, "n": 200} if scored else None,
        })  # fmt: skip
    n = int(span // 5)
    size = -(-n // 3000)
    times = [5.0 * j for j in range(0, n, size)]
    resources = {
        "t": times,
        "cpu_percent": [round(100 + 80 * rng.random(), 1) for _ in times],
        "rss_bytes": [int(2**31 + 2**30 * rng.random()) for _ in times],
        "workspace_bytes": [int(2**30 * j / len(times)) for j in range(len(times))],
        "gpus": {"0": {"utilization_percent": [rng.randint(0, 100) for _ in times],
                       "memory_used_mib": [rng.randint(1000, 70000) for _ in times], "memory_total_mib": 81920}},
        "unreadable_lines": 0,
    }  # fmt: skip
    return {
        "schema": 1,
        "title": "gsm8k / Qwen2.5-0.5B / claude-code / seed 0",
        "run": {"labels": {"task": "gsm8k", "model": "Qwen2.5-0.5B", "agent": "claude-code", "seed": 0}, "status": "timeout",
                "exit_code": -9, "timed_out": True, "error": None, "stopped_by": None, "start_time": 0.0, "end_time": span,
                "budget_s": span, "duration_s": span, "mode": "free", "scaffold": "claude-code", "driver": "driver-model",
                "tokens": {"total": 123456789}, "sandbox": "bwrap", "attempt": 1},
        "cuts": [{"t": span, "kind": "budget", "detail": f"budget {span:.0f} s"},
                 {"t": span, "kind": "timeout", "detail": "the budget ran out: the agent was killed"}],
        "final": {"score": 25.0, "baseline_score": 10.0, "delta": 15.0, "primary_metric": "accuracy", "metrics": {"accuracy": 25.0}},
        "summary": {"best": 25.0, "delta": 15.0, "baseline": 10.0, "route": "sft", "failure_type": None,
                    "iterations": [{"iteration": s["id"], "since_start_s": s["t"], "status": s["status"], "score": s["score"],
                                    "what_was_done": "changed lr", "why": "the previous score"} for s in subs]},
        "verdicts": {"integrity": {"status": "clean", "label": "clean", "reasons": [], "incomplete": []},
                     "mode_audit": {"mode": "free", "violation": False, "methods_used": ["sft"], "evidence": None}},
        "turns": items,
        "tools": sorted({name for turn in items for name in turn["tools"]}),
        "submissions": subs,
        "resources": resources,
        "missing": [],
    }  # fmt: skip
