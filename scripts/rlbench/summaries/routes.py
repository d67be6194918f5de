"""The training route (SPEC §4) of a submission and of a run: GRPO, PPO, DPO, SFT-only, SFT+RL from the
code's training methods, Copy for the base model, Placeholder/Missing, unknown; and coding success.
"""

from __future__ import annotations

from pathlib import Path

from rlbench.recording.ledger import SCORED, is_scored
from rlbench.summaries.agent_code import training_methods
from rlbench.summaries.submissions import is_base_path, is_base_weights

# Route labels (SPEC §4). TRAINING_ROUTES are real training routes ("coding success").
GRPO, PPO, DPO, SFT_ONLY, SFT_RL = "GRPO", "PPO", "DPO", "SFT-only", "SFT+RL"
COPY, MISSING, UNKNOWN = "Copy", "Placeholder/Missing", "unknown"
TRAINING_ROUTES = (GRPO, PPO, DPO, SFT_ONLY, SFT_RL)
ROUTE_LABELS = TRAINING_ROUTES + (COPY, MISSING, UNKNOWN)
ONLINE_RL_ROUTES = frozenset({GRPO, PPO, SFT_RL})  # routes that build rollouts of the policy


def detect_route(code_dir: Path | None) -> str | None:
    """GRPO, PPO, DPO, SFT-only or SFT+RL from the code; None when no training method shows.

    SFT+RL is SFT plus an online RL method (GRPO/PPO); SFT before DPO stays DPO (a preference
    method, not online RL). Several RL methods: GRPO before PPO before DPO."""
    return route_of(training_methods(code_dir))


def route_of(methods: set[str]) -> str | None:
    """detect_route's label for a set of training methods."""
    if methods & {"grpo", "ppo"} and "sft" in methods:
        return SFT_RL
    for method, label in (("grpo", GRPO), ("ppo", PPO), ("preference", DPO), ("sft", SFT_ONLY)):
        if method in methods:
            return label
    return None


def train_type(
    entry: dict,
    code_dir: Path | None,
    *,
    baseline_fingerprint: str | None,
    workspace: Path,
    base_model: str | None,
) -> str:
    """The iteration's route label: Copy for the base weights (by fingerprint or by path); else the
    route of the code snapshot; else unknown for evaluated weights (trained by code outside code/)
    and Placeholder/Missing for a submission with nothing evaluable and no training code."""
    if is_base_weights(entry, baseline_fingerprint) or is_base_path(entry, workspace, base_model):
        return COPY
    route = detect_route(code_dir)
    if route:
        return route
    return UNKNOWN if is_scored(entry) else MISSING


def scored_records(records: list[dict]) -> list[dict]:
    """The iteration records the grader evaluated (grader_status in ledger.SCORED)."""
    return [r for r in records if r["grader_status"] in SCORED]


def run_route(records: list[dict]) -> str:
    """The run's route: Placeholder/Missing when nothing was evaluated, Copy when every evaluated
    submission was the base model, else the train type of the best evaluated non-copy submission
    (the first of tied ones); when that one's code shows no method, the latest that does."""
    scored = scored_records(records)
    if not scored:
        return MISSING
    trained = [r for r in scored if r["train_type"] != COPY]
    if not trained:
        return COPY
    best = max(trained, key=lambda r: r["score"])
    if best["train_type"] in TRAINING_ROUTES:
        return best["train_type"]
    return next((r["train_type"] for r in reversed(trained) if r["train_type"] in TRAINING_ROUTES), best["train_type"])


def coding_success(route: str) -> bool:
    """SPEC §4: the run's route is a real training route."""
    return route in TRAINING_ROUTES
