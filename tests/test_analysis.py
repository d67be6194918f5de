"""The cross-run tables (rlbench.analysis.tables, built through rlbench.analysis.catalogue) against values
computed by hand from hand-made summaries.

The fixture: model "tiny", tasks gsm8k (baseline 10, noise band 0.5) and alpaca-eval (baseline 50, band
1.0); configurations sft (reference, sft-only) and claude (claude-code / claude-sonnet-4, free) with 3
seeds each; grpo (reference, rl-only) with 1 seed on gsm8k; one L3 alfworld run of grpo with an
interactive failure and no recorded budget, timeline or noise band (like an older summary).
Every run has a budget of 1000 s.
"""

from __future__ import annotations

import csv
import math
import re

import pytest

from rlbench.analysis.catalogue import TABLES, build_tables
from rlbench.analysis.stats import bootstrap_ci, config_key, config_label, delta_at_cut, group_runs, pass_at_k, within_noise
from rlbench.analysis.tablefiles import BLANK_MD, markdown, write_tables
from rlbench.config import ConfigError

# Configurations as stats.config_key gives them: (agent, scaffold, driver, mode, multi); multi "" for single-task runs.
SFT = ("sft", "reference", "", "sft-only", "")
CLAUDE = ("claude", "claude-code", "claude-sonnet-4", "free", "")
GRPO = ("grpo", "reference", "", "rl-only", "")
SETTINGS = {"decimals": 2, "budget_cuts": [0.25, 0.5, 1.0], "pass_at_k": [1, 3, 5],
            "bootstrap": {"resamples": 2000, "confidence": 0.95, "seed": 0}}


def item(i: int, since: float | None, score: float, scored: bool = True, train_type: str = "SFT-only") -> dict:
    return {"iteration": i, "since_start_s": since, "score": score, "scored": scored, "train_type": train_type}


def run(task, config, seed, delta, *, timeline, route, exec_success, failure_type=None, tokens=None, **extra) -> dict:
    agent, scaffold, driver, mode, _ = config
    baseline = {"gsm8k": 10.0, "alpaca-eval": 50.0, "alfworld": 4.85}[task]
    summary = {
        "labels": {"task": task, "model": "tiny", "agent": agent, "seed": str(seed)},
        "level": "L3" if task == "alfworld" else "L1",
        "status": "completed",
        "baseline": baseline,
        "best": None if delta is None else baseline + delta,
        "delta": delta,
        "submissions": len(timeline or []),
        "route": route,
        "coding_success": route in ("GRPO", "PPO", "DPO", "SFT-only", "SFT+RL"),
        "failure_type": failure_type,
        "scaffold": scaffold,
        "driver": driver or None,
        "mode": mode,
        "tokens": tokens,
        "cost_usd": None if tokens is None else tokens["cost_usd"],
        "primary_metric": "length_controlled_winrate" if task == "alpaca-eval" else "accuracy",
        "eval_metrics": {"lc_method": "glm"} if task == "alpaca-eval" else {"accuracy": 0.0},
        "grader_noise": {"band": {"gsm8k": 0.5, "alpaca-eval": 1.0}[task], "repeats": 3} if task != "alfworld" else None,
        "budget_s": 1000,
        "exec_success": exec_success,
        "timeline": timeline,
        "interactive_failure": None,
    }
    summary.update(extra)
    return summary


TOKENS = {"calls": 10, "input_tokens": 1000, "output_tokens": 200, "total_tokens": 1200, "cost_usd": 0.01234}


@pytest.fixture
def summaries() -> list[dict]:
    return [
        # sft on gsm8k: deltas [1, 2, 4].
        run("gsm8k", SFT, 0, 1.0, route="SFT-only", exec_success=True,
            timeline=[item(1, 100, 10.5), item(2, 600, 11.0)], gpu_hours_busy=1.23456, gpu_hours_idle=0.5),
        run("gsm8k", SFT, 1, 2.0, route="SFT-only", exec_success=True, timeline=[item(1, 300, 12.0)]),
        run("gsm8k", SFT, 2, 4.0, route="SFT-only", exec_success=False,
            timeline=[item(1, 200, 0.0, scored=False), item(2, 900, 14.0)],
            code_files=3, model_versions=2, zero_score_share=0.5, best_index=2, routes_used=["SFT-only"]),
        # claude on gsm8k: deltas [-0.5, 0, 1], one submission each at 800 s; seed 0 has tokens.
        run("gsm8k", CLAUDE, 0, -0.5, route="Copy", exec_success=False, failure_type="training_diverged",
            timeline=[item(1, 800, 9.5, train_type="GRPO")], tokens=TOKENS, routes_used=["GRPO", "SFT-only"]),
        run("gsm8k", CLAUDE, 1, 0.0, route="Placeholder/Missing", exec_success=False,
            failure_type="copy_model_fallback", timeline=[item(1, 800, 10.0)]),
        run("gsm8k", CLAUDE, 2, 1.0, route="GRPO", exec_success=True, timeline=[item(1, 800, 11.0)]),
        # grpo on gsm8k, 1 seed: delta 3; its route is not recognized and it is not coding success.
        run("gsm8k", GRPO, 0, 3.0, route="mystery", exec_success=True, timeline=[item(1, 400, 13.0)]),
        # sft on alpaca-eval: deltas [2, 2, 2]; seed 0 also submitted after the budget (1100 s > 1000 s).
        run("alpaca-eval", SFT, 0, 2.0, route="SFT-only", exec_success=True,
            timeline=[item(1, 200, 52.0), item(2, 1100, 60.0)]),
        run("alpaca-eval", SFT, 1, 2.0, route="SFT-only", exec_success=True, timeline=[item(1, 600, 52.0)]),
        run("alpaca-eval", SFT, 2, 2.0, route="SFT-only", exec_success=True, timeline=[item(1, 600, 52.0)]),
        # claude on alpaca-eval: deltas [0.5, 3.0] and a run with nothing evaluated (delta None).
        run("alpaca-eval", CLAUDE, 0, 0.5, route="DPO", exec_success=True, timeline=[item(1, 500, 50.5)]),
        run("alpaca-eval", CLAUDE, 1, 3.0, route="DPO", exec_success=True, timeline=[item(1, 1000, 53.0)]),
        run("alpaca-eval", CLAUDE, 2, None, route="Placeholder/Missing", exec_success=False,
            failure_type="timeout_no_submission", timeline=[]),
        # L3 run without budget, timeline, noise band or exec_success (older summary fields).
        run("alfworld", GRPO, 0, 0.0, route="GRPO", exec_success=None, failure_type="training_diverged",
            timeline=None, budget_s=None,
            interactive_failure={"type": "training_collapse", "evidence": ["reward fell to 0"]}),
    ]


def rows_by(table, **match) -> list[dict]:
    return [r for r in table.rows if all(r.get(k) == v for k, v in match.items())]


def one(table, **match) -> dict:
    (row,) = rows_by(table, **match)
    return row


def cell(table, config, task, **more) -> dict:
    agent, scaffold, driver, mode, multi = config
    return one(table, agent=agent, scaffold=scaffold, driver=driver, mode=mode, multi=multi or None, task=task, **more)


# -- the definitions -------------------------------------------------------------------------------------
def test_pass_at_k_by_hand():
    # [1, 2, 4]: pass@1 = mean = 7/3; pass@3 = C(2,2)/C(3,3) * 4 = 4; n < 5 -> None.
    assert pass_at_k([4, 1, 2], 1) == pytest.approx(7 / 3)
    assert pass_at_k([1, 2, 4], 3) == pytest.approx(4.0)
    assert pass_at_k([1, 2, 4], 5) is None
    # [0..4]: C(5,3) = 10; pass@3 = (C(2,2)*2 + C(3,2)*3 + C(4,2)*4) / 10 = (2 + 9 + 24) / 10 = 3.5.
    assert pass_at_k([3, 0, 4, 1, 2], 3) == pytest.approx(3.5)
    assert pass_at_k([0, 1, 2, 3, 4], 5) == pytest.approx(4.0)
    assert pass_at_k([], 1) is None and pass_at_k([1.0], 0) is None


def test_bootstrap_ci_exact_cases():
    # n = 2, a < b: 1/4 of the resamples are (a, a) and 1/4 (b, b), so the 2.5% / 97.5% quantiles are a and b.
    assert bootstrap_ci([3.0, 0.5], 10000, 0.95, 0) == (0.5, 3.0)
    assert bootstrap_ci([0.1, 0.1, 0.1], 10000, 0.95, 0) == (0.1, 0.1)
    assert bootstrap_ci([1.0], 10000, 0.95, 0) is None and bootstrap_ci([], 100, 0.95, 0) is None
    lo, hi = bootstrap_ci([1.0, 2.0, 4.0], 5000, 0.95, 7)
    assert 1.0 <= lo < 7 / 3 < hi <= 4.0
    assert bootstrap_ci([1.0, 2.0, 4.0], 5000, 0.95, 7) == (lo, hi)  # seeded: reproducible


def test_within_noise():
    assert within_noise(0.5, 0.5) is True and within_noise(-0.6, 0.5) is False
    assert within_noise(0.0, 0.0) is True and within_noise(0.01, 0.0) is False  # deterministic grader
    assert within_noise(0.30000000000000004, 0.3) is True  # floating-point best - baseline
    assert within_noise(None, 1.0) is None and within_noise(1.0, None) is None


def test_delta_at_cut_by_hand(summaries):
    sft2 = summaries[2]  # failed submission at 200 s, 14.0 at 900 s, baseline 10, budget 1000 s
    assert delta_at_cut(sft2, 0.25) == 0.0  # the failed one is not evaluated: the base model stands
    assert delta_at_cut(sft2, 0.9) == pytest.approx(4.0)  # 900 <= 900: inclusive
    assert delta_at_cut(summaries[7], 1.0) == pytest.approx(2.0)  # 60.0 came after the budget
    assert delta_at_cut(summaries[3], 1.0) == pytest.approx(-0.5)  # worse than the baseline counts
    assert delta_at_cut(summaries[-1], 1.0) is None  # no budget, no timeline
    no_time = {**sft2, "timeline": [item(1, None, 20.0)]}
    assert delta_at_cut(no_time, 1.0) == 0.0
    older = {k: v for k, v in sft2.items() if k != "budget_s"} | {"run_meta": {"timeout_s": 1000}}
    assert delta_at_cut(older, 0.9) == pytest.approx(4.0)  # budget from run_meta.timeout_s
    assert delta_at_cut({**sft2, "baseline": None}, 1.0) is None


def test_config_key_label_and_groups(summaries):
    assert config_key(summaries[0]) == SFT and config_key(summaries[3]) == CLAUDE
    assert config_key({"labels": {"agent": "x"}}) == ("x", "reference", "", "free", "")
    assert config_label(SFT) == "sft (reference, sft-only)"
    assert config_label(CLAUDE) == "claude (claude-code / claude-sonnet-4, free)"
    groups = group_runs(list(reversed(summaries)))
    assert [s["labels"]["seed"] for s in groups[(SFT, "gsm8k", "tiny")]] == ["0", "1", "2"]
    assert len(groups) == 6 and len(groups[(GRPO, "alfworld", "tiny")]) == 1


# -- the tables --------------------------------------------------------------------------------------------
def test_leaderboard_paper(summaries):
    table = build_tables(summaries, SETTINGS)["leaderboard_paper"]
    assert table.columns == ["model", "agent", "scaffold", "driver", "mode", "alfworld", "alpaca-eval", "gsm8k", "n"]
    assert [r["agent"] for r in table.rows] == ["baseline", "claude", "grpo", "sft"]
    base = one(table, agent="baseline")
    assert (base["alfworld"], base["alpaca-eval"], base["gsm8k"], base["n"]) == (4.85, 50.0, 10.0, None)
    claude = one(table, agent="claude")
    assert claude["alfworld"] is None
    assert claude["alpaca-eval"] == pytest.approx((50.5 + 53.0) / 2)  # seed 2 has no best score
    assert claude["gsm8k"] == pytest.approx((9.5 + 10.0 + 11.0) / 3)
    assert claude["n"] == "2-3"
    sft = one(table, agent="sft")
    assert sft["gsm8k"] == pytest.approx((11 + 12 + 14) / 3) and sft["alpaca-eval"] == pytest.approx(52.0)
    assert sft["n"] == "3"
    grpo = one(table, agent="grpo")
    assert grpo["alfworld"] == pytest.approx(4.85) and grpo["gsm8k"] == pytest.approx(13.0) and grpo["n"] == "1"
    notes = "\n".join(table.notes)
    assert "alpaca-eval: length_controlled_winrate (protocol: lc_method=glm)" in notes
    assert "gsm8k: accuracy" in notes and "gsm8k: accuracy (" not in notes  # no variants: nothing to say


def test_mode_ablation_of_a_single_task_sweep(summaries):
    table = build_tables(summaries, SETTINGS)["mode_ablation"]
    assert table.columns == ["mode", "model", "agent", "scaffold", "driver", "alfworld", "alpaca-eval", "gsm8k",
                             "mean_delta", "n"]
    # claude-code before reference; the reference agents' modes in the order sft-only, rl-only
    assert [(r["agent"], r["mode"]) for r in table.rows] == [("baseline", None), ("claude", "free"), ("sft", "sft-only"),
                                                             ("grpo", "rl-only")]
    # the mean Δ of a row is over its own tasks (the baseline row has none)
    assert one(table, agent="baseline")["mean_delta"] is None
    for row in table.rows[1:]:
        runs = [s for s in summaries if s["labels"]["agent"] == row["agent"] and s.get("delta") is not None]
        by_task = {}
        for s in runs:
            by_task.setdefault(s["labels"]["task"], []).append(s["delta"])
        assert row["mean_delta"] == pytest.approx(sum(sum(v) / len(v) for v in by_task.values()) / len(by_task))
    assert one(table, agent="sft")["gsm8k"] == pytest.approx((11 + 12 + 14) / 3)


def test_delta_matrix(summaries):
    table = build_tables(summaries, SETTINGS)["delta_matrix"]
    assert table.columns == ["model", "agent", "scaffold", "driver", "mode", "task", "n", "mean_delta",
                             "ci_low", "ci_high", "noise_band", "within_noise"]
    sft = cell(table, SFT, "gsm8k")
    assert sft["n"] == 3 and sft["mean_delta"] == pytest.approx(7 / 3)
    assert 1.0 <= sft["ci_low"] < 7 / 3 < sft["ci_high"] <= 4.0
    assert (sft["noise_band"], sft["within_noise"]) == (0.5, "no")  # 2.33 > 0.5
    claude = cell(table, CLAUDE, "gsm8k")
    assert claude["mean_delta"] == pytest.approx(0.5 / 3) and claude["within_noise"] == "yes"  # 0.17 <= 0.5
    same = cell(table, SFT, "alpaca-eval")
    assert (same["ci_low"], same["ci_high"]) == (2.0, 2.0)  # identical deltas
    two = cell(table, CLAUDE, "alpaca-eval")
    assert two["n"] == 2 and (two["ci_low"], two["ci_high"]) == (0.5, 3.0)  # n = 2: (a, b)
    assert two["mean_delta"] == pytest.approx(1.75) and two["within_noise"] == "no"  # 1.75 > 1.0
    single = cell(table, GRPO, "gsm8k")
    assert single["n"] == 1 and single["ci_low"] is None and single["ci_high"] is None
    l3 = cell(table, GRPO, "alfworld")
    assert l3["noise_band"] is None and l3["within_noise"] is None
    # The Markdown is wide: tasks as columns, "≈" inside the noise band, the CI where n >= 2.
    text = markdown(table)
    assert "| model | agent | scaffold | driver | mode | alfworld | alpaca-eval | gsm8k | n |" in text
    assert "≈ +0.17 [" in text
    assert "+1.75 [+0.50, +3.00]" in text and "+2.00 [+2.00, +2.00]" in text
    grpo_line = next(line for line in text.splitlines() if "| grpo |" in line)
    assert "| +0.00 | – | +3.00 | 1 |" in grpo_line  # alfworld, alpaca-eval blank, gsm8k without CI


def test_multirun_stats(summaries):
    table = build_tables(summaries, SETTINGS)["multirun_stats"]
    sft = cell(table, SFT, "gsm8k")
    # [1, 2, 4]: mean 7/3; deviations -4/3, -1/3, 5/3 -> squares 42/9, / (n-1) = 7/3 -> std sqrt(7/3).
    assert sft["mean_delta"] == pytest.approx(7 / 3) and sft["std_delta"] == pytest.approx(math.sqrt(7 / 3))
    assert sft["max_delta"] == 4.0 and sft["improve_sr"] == pytest.approx(100.0)
    assert sft["exec_sr"] == pytest.approx(200 / 3)  # 2 of 3 runs executed a valid train -> submit cycle
    claude = cell(table, CLAUDE, "gsm8k")
    # [-0.5, 0, 1]: mean 1/6; deviations -2/3, -1/6, 5/6 -> squares 42/36, / 2 = 7/12.
    assert claude["std_delta"] == pytest.approx(math.sqrt(7 / 12)) and claude["max_delta"] == 1.0
    assert claude["improve_sr"] == pytest.approx(100 / 3) and claude["exec_sr"] == pytest.approx(100 / 3)
    two = cell(table, CLAUDE, "alpaca-eval")
    # runs 3, n 2: improve SR over all runs (2 of 3), std of [0.5, 3] = |3 - 0.5| / sqrt(2).
    assert (two["runs"], two["n"]) == (3, 2) and two["improve_sr"] == pytest.approx(200 / 3)
    assert two["std_delta"] == pytest.approx(2.5 / math.sqrt(2))
    single = cell(table, GRPO, "gsm8k")
    assert single["std_delta"] is None and single["ci_low"] is None and single["max_delta"] == 3.0
    assert cell(table, GRPO, "alfworld")["exec_sr"] is None  # exec_success not recorded


def test_budget_scaling(summaries):
    table = build_tables(summaries, SETTINGS)["budget_scaling"]
    assert len(table.rows) == 6 * 3
    sft = {r["fraction"]: r for r in rows_by(table, agent="sft", task="gsm8k")}
    # 250 s: seed 0 has 10.5 (+0.5), seed 1 nothing yet, seed 2 only a failed one -> (0.5 + 0 + 0) / 3.
    assert sft[0.25]["mean_delta"] == pytest.approx(0.5 / 3) and sft[0.25]["n"] == 3
    # 500 s: 0.5, 2.0 (at 300 s), 0 -> 2.5 / 3; 1000 s: 1, 2, 4 -> 7/3.
    assert sft[0.5]["mean_delta"] == pytest.approx(2.5 / 3)
    assert sft[1.0]["mean_delta"] == pytest.approx(7 / 3)
    assert sft[0.25]["cut_hours"] == pytest.approx(0.25 * 1000 / 3600)
    claude = {r["fraction"]: r for r in rows_by(table, agent="claude", task="alpaca-eval")}
    # 50.5 at 500 s, 53.0 at 1000 s (inclusive), nothing for seed 2 (counts 0: the base model stands).
    assert claude[0.25]["mean_delta"] == 0.0
    assert claude[0.5]["mean_delta"] == pytest.approx(0.5 / 3)
    assert claude[1.0]["mean_delta"] == pytest.approx(3.5 / 3) and claude[1.0]["n"] == 3
    same = {r["fraction"]: r for r in rows_by(table, agent="sft", task="alpaca-eval")}
    # 52 at 200 s for seed 0 only before 500 s; 60 at 1100 s is after the budget.
    assert same[0.5]["mean_delta"] == pytest.approx(2 / 3)
    assert same[1.0]["mean_delta"] == pytest.approx(2.0) and (same[1.0]["ci_low"], same[1.0]["ci_high"]) == (2.0, 2.0)
    grpo = {r["fraction"]: r for r in rows_by(table, agent="grpo", task="gsm8k")}
    assert (grpo[0.25]["mean_delta"], grpo[0.5]["mean_delta"]) == (0.0, 3.0) and grpo[0.5]["ci_low"] is None
    l3 = rows_by(table, agent="grpo", task="alfworld")
    assert all(r["n"] == 0 and r["mean_delta"] is None and r["cut_hours"] is None for r in l3)


def test_pass_at_k_table(summaries):
    table = build_tables(summaries, SETTINGS)["pass_at_k"]
    assert table.columns[-4:] == ["n", "pass_at_1", "pass_at_3", "pass_at_5"]
    sft = cell(table, SFT, "gsm8k")
    assert (sft["pass_at_1"], sft["pass_at_3"], sft["pass_at_5"]) == (pytest.approx(7 / 3), pytest.approx(4.0), None)
    claude = cell(table, CLAUDE, "gsm8k")  # [-0.5, 0, 1]: pass@3 = the max = 1
    assert claude["pass_at_1"] == pytest.approx(1 / 6) and claude["pass_at_3"] == pytest.approx(1.0)
    two = cell(table, CLAUDE, "alpaca-eval")
    assert two["n"] == 2 and two["pass_at_1"] == pytest.approx(1.75) and two["pass_at_3"] is None
    other = build_tables(summaries, {"pass_at_k": [2]})["pass_at_k"]
    # [1, 2, 4], k = 2: (C(1,1)*2 + C(2,1)*4) / C(3,2) = (2 + 8) / 3.
    assert cell(other, SFT, "gsm8k")["pass_at_2"] == pytest.approx(10 / 3)


def test_workspace_stats(summaries):
    table = build_tables(summaries, SETTINGS)["workspace_stats"]
    assert len(table.rows) == len(summaries)
    row = one(table, task="gsm8k", agent="sft", seed="2")
    assert row == {"task": "gsm8k", "model": "tiny", "agent": "sft", "seed": "2", "submissions": 2, "code_files": 3,
                   "model_versions": 2, "zero_score_pct": 50.0, "best_index": 2, "strategies": "SFT-only",
                   "route": "SFT-only", "failure_type": None}
    assert one(table, task="gsm8k", agent="claude", seed="0")["strategies"] == "GRPO+SFT-only"
    blank = one(table, task="gsm8k", agent="sft", seed="0")  # fields not recorded for this run
    assert blank["code_files"] is None and blank["zero_score_pct"] is None and blank["strategies"] is None
    assert [r["seed"] for r in rows_by(table, task="gsm8k", agent="sft")] == ["0", "1", "2"]


def test_routes(summaries):
    table = build_tables(summaries, SETTINGS)["routes"]
    gsm = one(table, task="gsm8k")
    # sft x3 SFT-only; claude Copy, Placeholder/Missing, GRPO; grpo "mystery" -> unknown.
    assert gsm["runs"] == 7
    assert (gsm["SFT-only"], gsm["Copy"], gsm["Placeholder/Missing"], gsm["GRPO"], gsm["unknown"]) == (3, 1, 1, 1, 1)
    assert gsm["PPO"] == gsm["DPO"] == gsm["SFT+RL"] == 0
    assert gsm["coding_sr"] == pytest.approx(400 / 7)  # 3 SFT-only + 1 GRPO of 7
    assert gsm["improve_sr"] == pytest.approx(500 / 7)  # deltas 1, 2, 4, 1, 3 > 0
    alpaca = one(table, task="alpaca-eval")
    assert (alpaca["DPO"], alpaca["Placeholder/Missing"]) == (2, 1)
    assert alpaca["coding_sr"] == pytest.approx(500 / 6) and alpaca["improve_sr"] == pytest.approx(500 / 6)


def test_tokens_cost(summaries):
    table = build_tables(summaries, SETTINGS)["tokens_cost"]
    llm = one(table, task="gsm8k", agent="claude", seed="0")
    assert (llm["scaffold"], llm["driver"], llm["calls"], llm["input_tokens"], llm["output_tokens"],
            llm["total_tokens"], llm["cost_usd"]) == ("claude-code", "claude-sonnet-4", 10, 1000, 200, 1200, 0.01234)
    ref = one(table, task="gsm8k", agent="sft", seed="0")
    assert ref["scaffold"] == "reference" and ref["driver"] is None
    assert all(ref[c] is None for c in ("calls", "input_tokens", "output_tokens", "total_tokens", "cost_usd"))
    # GPU-hours busy and idle (summary.json's, from the resource trace); blank for a run without a GPU trace.
    assert table.columns[-2:] == ["gpu_hours_busy", "gpu_hours_idle"]
    assert (ref["gpu_hours_busy"], ref["gpu_hours_idle"]) == (1.23456, 0.5)
    assert llm["gpu_hours_busy"] is None and llm["gpu_hours_idle"] is None
    assert "gpu_hours_busy / gpu_hours_idle" in " ".join(table.notes)


def test_failures(summaries):
    table = build_tables(summaries, SETTINGS)["failures"]
    gsm = one(table, task="gsm8k")
    assert (gsm["runs"], gsm["no_failure"], gsm["training_diverged"], gsm["copy_model_fallback"]) == (7, 5, 1, 1)
    assert gsm["training_collapse"] == 0
    alpaca = one(table, task="alpaca-eval")
    assert (alpaca["runs"], alpaca["no_failure"], alpaca["timeout_no_submission"]) == (6, 5, 1)
    l3 = one(table, task="alfworld")
    assert (l3["training_diverged"], l3["training_collapse"], l3["rollout_construction_failure"]) == (1, 1, 0)


# -- files, defaults, older and malformed summaries -------------------------------------------------------
def test_csv_round_trip_and_markdown(summaries, tmp_path):
    tables = build_tables(summaries, SETTINGS)
    assert list(tables) == list(TABLES)  # every table of the catalogue, in its order
    paths = write_tables(tables, tmp_path)
    assert sorted(p.name for p in paths) == sorted(path for item in TABLES.values() for path in item.files.values())
    assert all(p.stat().st_size > 0 for p in paths)
    for name, table in tables.items():
        with open(tmp_path / f"{name}.csv", newline="") as handle:
            reader = csv.DictReader(handle)
            rows = list(reader)
        assert reader.fieldnames == table.columns and len(rows) == len(table.rows)
        text = (tmp_path / f"{name}.csv").read_text() + (tmp_path / f"{name}.md").read_text()
        assert not re.search(r"\bnan\b", text, re.I) and "None" not in text
        md = (tmp_path / f"{name}.md").read_text()
        assert table.name == name and table.title == TABLES[name].title
        assert md.startswith(f"# {table.title}\n") and "Notes:" in md
    rows = list(csv.DictReader(open(tmp_path / "multirun_stats.csv")))
    sft = next(r for r in rows if r["agent"] == "sft" and r["task"] == "gsm8k")
    assert (sft["mean_delta"], sft["std_delta"], sft["improve_sr"], sft["exec_sr"]) == ("2.33", "1.53", "100.0", "66.67")
    single = next(r for r in rows if r["agent"] == "grpo" and r["task"] == "gsm8k")
    assert single["std_delta"] == "" and single["ci_low"] == "" and single["within_noise"] == "no"
    pk = list(csv.DictReader(open(tmp_path / "pass_at_k.csv")))
    assert next(r for r in pk if r["agent"] == "sft" and r["task"] == "gsm8k")["pass_at_5"] == ""
    cost = list(csv.DictReader(open(tmp_path / "tokens_cost.csv")))
    assert next(r for r in cost if r["agent"] == "claude" and r["seed"] == "0" and r["task"] == "gsm8k")["cost_usd"] == "0.0123"
    sft_cost = next(r for r in cost if r["agent"] == "sft" and r["seed"] == "0" and r["task"] == "gsm8k")
    assert (sft_cost["gpu_hours_busy"], sft_cost["gpu_hours_idle"]) == ("1.235", "0.5")
    md = (tmp_path / "pass_at_k.md").read_text()
    sft_line = next(line for line in md.splitlines() if "| sft |" in line and "| gsm8k |" in line)
    assert sft_line.endswith(f"| 3 | 2.33 | 4.00 | {BLANK_MD} |")  # the blank pass@5 is rendered


def test_settings_defaults():
    tables = build_tables([], {})
    assert tables["pass_at_k"].columns[-3:] == ["pass_at_1", "pass_at_3", "pass_at_5"]
    assert all(not t.rows or t.name == "leaderboard_paper" for t in tables.values())
    assert "_No runs._" in markdown(tables["delta_matrix"])
    assert build_tables([], None)["budget_scaling"].rows == []
    # the defaults and the allowed values are the schema's (rlbench.config.report_settings)
    with pytest.raises(ConfigError, match="unknown key 'decimal'"):
        build_tables([], {"decimal": 3})
    with pytest.raises(ConfigError, match="pass_at_k"):
        build_tables([], {"pass_at_k": [0]})


def test_older_and_malformed_summaries_give_blanks(tmp_path):
    older = {  # a summary from before the new fields: no budget_s, timeline, exec_success, code_files ...
        "labels": {"task": "gsm8k", "model": "tiny", "agent": "sft", "seed": "0"},
        "level": "L1", "status": "timeout", "baseline": 10.0, "best": None, "delta": None, "submissions": 0,
        "route": "Placeholder/Missing", "coding_success": False, "failure_type": "timeout_no_submission",
        "run_meta": {"start_time": 0, "timeout_s": 300}, "scaffold": "reference", "driver": None, "mode": "free",
        "tokens": None, "grader_noise": None,
    }
    malformed = {
        "labels": {"task": "gsm8k", "model": "tiny", "agent": "odd", "seed": "x"},
        "delta": "nan", "best": float("nan"), "baseline": "10", "grader_noise": "bad", "timeline": "oops",
        "tokens": "x", "routes_used": None, "zero_score_share": "half", "budget_s": -5, "interactive_failure": 3,
        "exec_success": "yes", "code_files": 2.5,
    }
    tables = build_tables([older, malformed, {"labels": None}], SETTINGS)
    stats = one(tables["multirun_stats"], agent="sft")
    assert stats["n"] == 0 and stats["mean_delta"] is None and stats["std_delta"] is None
    assert stats["improve_sr"] == 0.0 and stats["exec_sr"] is None and stats["within_noise"] is None
    odd = one(tables["multirun_stats"], agent="odd")
    assert odd["mean_delta"] is None and odd["noise_band"] is None
    cuts = rows_by(tables["budget_scaling"], agent="sft")
    assert [r["cut_hours"] for r in cuts] == pytest.approx([0.25 * 300 / 3600, 0.5 * 300 / 3600, 300 / 3600])
    assert all(r["mean_delta"] is None and r["n"] == 0 for r in cuts)
    ws = one(tables["workspace_stats"], agent="odd")
    assert ws["zero_score_pct"] is None and ws["code_files"] is None and ws["strategies"] is None
    assert one(tables["tokens_cost"], agent="odd")["calls"] is None
    assert one(tables["failures"], task="gsm8k")["timeout_no_submission"] == 1
    for path in write_tables(tables, tmp_path):
        text = path.read_text()
        assert not re.search(r"\bnan\b", text, re.I) and "None" not in text
