"""The fixed settings of the test suite: the tiny model, a small offline GSM8K split, the evaluation."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TINY_SPEC = {"name": "tiny", "source": "tiny", "hf_id": "rlbench/tiny-qwen2", "seed": 0}
GSM8K_SETTINGS = {
    "name": "gsm8k",
    "level": "L1",
    "module": "gsm8k",
    "source": "offline",
    "train_size": 16,
    "eval_size": 4,
    "data_seed": 0,
    "max_new_tokens": 8,
}
# A small addition-control split (a second single-turn task beside GSM8K: multi-task tests).
ADDITION = {
    "name": "addition-control",
    "level": "control",
    "module": "addition_control",
    "source": "offline",
    "train_size": 20,
    "eval_size": 4,
    "data_seed": 0,
    "max_new_tokens": 8,
}
EVALUATION = {"backend": "hf", "batch_size": 8, "eval_timeout_s": 300}
# A fixed salt, so that the test splits are the same on every machine (installations draw a random one).
TEST_SALT = "rlbench-test-salt"
