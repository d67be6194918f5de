"""Operating modes (free, sft-only, rl-only) audited from the recorded code revisions.

The workspace's instructions state the mode (workspace.MODE_RULES); nothing stops an agent from
ignoring it while it runs. Afterwards, the code recorded at each submission (grader/code.git, see
rlbench.recording.repository) says which training methods it used (agent_code.training_methods: grpo, ppo,
preference, sft), and this module judges them against the mode:

* free: never a violation.
* sft-only: any RL or preference method (grpo, ppo, preference: DPO and the like) in any revision.
* rl-only: a revision whose code shows SFT and no RL method (SFT may only warm up an RL run); and a
  run that submitted trained weights while none of its revisions shows an RL method. RL methods
  are the online ones, grpo and ppo (RLOO counted with PPO): a preference method (DPO) is not RL.

A revision is (submission_id, methods); the final state of code/ is one too, with the id "final".
"""

from __future__ import annotations

FREE, SFT_ONLY, RL_ONLY = "free", "sft-only", "rl-only"
MODES = (FREE, SFT_ONLY, RL_ONLY)
RL_METHODS = frozenset({"grpo", "ppo"})
PREFERENCE_METHODS = frozenset({"preference"})
SFT_METHODS = frozenset({"sft"})
FINAL = "final"  # the submission_id of the final state of code/


def audit_mode(
    mode: str | None,
    revisions: list[tuple[object, set[str]]],
    submitted_trained_weights: bool = False,
    evidence: str = "code revisions",
) -> dict:
    """Judge the training methods of each revision against the run's mode.

    revisions: (submission_id, methods) in order, the final code/ state last as (FINAL, methods);
    submitted_trained_weights: a submission whose weights are not the base model's was scored
    (rl-only: such a run must show an RL method somewhere). An unknown mode is audited as free and
    says so in `note`; None (a run recorded before modes) is free.

    Returns {"mode", "methods_used" (sorted), "violation", "violations": [{"submission_id",
    "methods" (sorted), "why"}], "evidence", "revisions": [{"submission_id", "methods"}]}."""
    audited = mode or FREE
    used: set[str] = set()
    violations: list[dict] = []
    listed = []
    for submission_id, methods in revisions:
        methods = set(methods)
        used |= methods
        listed.append({"submission_id": submission_id, "methods": sorted(methods)})
        if audited == SFT_ONLY:
            forbidden = methods & (RL_METHODS | PREFERENCE_METHODS)
            if forbidden:
                violations.append(
                    {
                        "submission_id": submission_id,
                        "methods": sorted(methods),
                        "why": f"sft-only, but the code uses {', '.join(sorted(forbidden))}",
                    }
                )
        elif audited == RL_ONLY and methods & SFT_METHODS and not methods & RL_METHODS:
            violations.append(
                {
                    "submission_id": submission_id,
                    "methods": sorted(methods),
                    "why": "rl-only, but the code trains with SFT and no RL method (SFT may only warm up an RL run)",
                }
            )
    if audited == RL_ONLY and submitted_trained_weights and not used & RL_METHODS:
        violations.append(
            {
                "submission_id": None,
                "methods": sorted(used),
                "why": "rl-only, but trained weights were submitted and no recorded code uses an RL method",
            }
        )
    result = {
        "mode": audited,
        "methods_used": sorted(used),
        "violation": bool(violations),
        "violations": violations,
        "evidence": evidence,
        "revisions": listed,
    }
    if mode is not None and mode not in MODES:
        result["note"] = f"unknown mode {mode!r}: audited as free"
    return result
