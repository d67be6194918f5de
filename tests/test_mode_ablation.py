"""The mode ablation table (the paper's Table 3 layout) and the multi-task runs' member summaries in the other
tables, the leaderboard and the figures, from hand-made summaries.

The sweep: model "tiny", tasks gsm8k (baseline 10), alpaca-eval (50) and alfworld (5):
- claude (claude-code / claude-opus) in free mode on the three tasks, seeds 0 and 1;
- claude in multi mode, one multi-task run over the three tasks per seed (0, 1); seed 1 has nothing evaluated
  on alfworld;
- sft (reference, sft-only) on gsm8k and alpaca-eval only, seeds 0 and 1;
- grpo (reference, rl-only) on the three tasks, seed 0;
- copy (reference, multi) in two multi-task runs of seed 0: over the three tasks and over alpaca-eval+gsm8k;
- multi-sft (reference, multi/sft-only) over alpaca-eval+gsm8k, seed 0;
and model "small" (gsm8k baseline 20) with one free claude run on gsm8k.
"""

from __future__ import annotations

import csv

import pytest

from rlbench.analysis import figures
from rlbench.analysis.catalogue import FIGURES, build_tables
from rlbench.analysis.report import LEADERBOARD_COLUMNS, write_leaderboard_rows
from rlbench.analysis.stats import config_key, config_label, group_runs, mode_rank
from rlbench.analysis.tablefiles import BLANK_MD, markdown, write_tables

BASELINES = {"tiny": {"gsm8k": 10.0, "alpaca-eval": 50.0, "alfworld": 5.0}, "small": {"gsm8k": 20.0}}
ALL3 = "alfworld+alpaca-eval+gsm8k"
TWO = "alpaca-eval+gsm8k"
OPUS = ("claude-code", "claude-opus")
REF = ("reference", None)
TOKENS = {"calls": 4, "input_tokens": 100, "output_tokens": 10, "total_tokens": 110, "cost_usd": 0.5}


def summary(task, agent, seed, delta, mode, tool=REF, model="tiny", group=None, tokens=None, **extra) -> dict:
    baseline = BASELINES[model][task]
    labels = {"task": task, "model": model, "agent": agent, "seed": str(seed)}
    out = {
        "labels": labels,
        "level": "L3" if task == "alfworld" else "L1",
        "status": "completed",
        "baseline": baseline,
        "best": None if delta is None else baseline + delta,
        "delta": delta,
        "submissions": 1,
        "route": "SFT-only",
        "mode": mode,
        "scaffold": tool[0],
        "driver": tool[1],
        "tokens": tokens,
        "cost_usd": None if tokens is None else tokens["cost_usd"],
        "primary_metric": "accuracy",
        "budget_s": 1000,
        "timeline": [{"iteration": 1, "since_start_s": 100, "score": baseline + (delta or 0), "scored": delta is not None,
                      "train_type": "SFT-only"}],
        "exec_success": delta is not None,
    }
    if group:
        labels["multi"] = group
    out.update(extra)
    return out


def multi_run(agent, seed, deltas: dict, mode, tool=REF, tokens=None) -> list[dict]:
    """The member summaries of one multi-task run over deltas' tasks (as summarize_run.py writes them)."""
    group = "+".join(sorted(deltas))
    known = [d for d in deltas.values() if d is not None]
    block = {"group": group, "tasks": sorted(deltas), "deltas": deltas,
             "mean_delta": sum(known) / len(known) if len(known) == len(deltas) else None,
             "distinct_best_models": 1, "joint": None}
    return [summary(task, agent, seed, delta, mode, tool, group=group, tokens=tokens, multi=block)
            for task, delta in sorted(deltas.items())]


@pytest.fixture
def sweep() -> list[dict]:
    runs = []
    for seed, deltas in ((0, {"gsm8k": 2.0, "alpaca-eval": 1.0, "alfworld": 0.0}),
                         (1, {"gsm8k": 4.0, "alpaca-eval": 3.0, "alfworld": 2.0})):
        runs += [summary(task, "claude", seed, d, "free", OPUS, tokens=TOKENS) for task, d in deltas.items()]
    runs += multi_run("claude", 0, {"gsm8k": 1.0, "alpaca-eval": 0.0, "alfworld": 1.0}, "multi", OPUS, tokens=TOKENS)
    runs += multi_run("claude", 1, {"gsm8k": 3.0, "alpaca-eval": 1.0, "alfworld": None}, "multi", OPUS, tokens=TOKENS)
    for seed, deltas in ((0, {"gsm8k": 1.0, "alpaca-eval": 3.0}), (1, {"gsm8k": 2.0, "alpaca-eval": 3.0})):
        runs += [summary(task, "sft", seed, d, "sft-only") for task, d in deltas.items()]
    runs += [summary(t, "grpo", 0, d, "rl-only") for t, d in {"gsm8k": 0.5, "alpaca-eval": -1.0, "alfworld": 4.0}.items()]
    runs += multi_run("copy", 0, {"gsm8k": 0.0, "alpaca-eval": 0.0, "alfworld": 0.0}, "multi")
    runs += multi_run("copy", 0, {"gsm8k": 0.0, "alpaca-eval": 0.0}, "multi")
    runs += multi_run("multi-sft", 0, {"gsm8k": 2.0, "alpaca-eval": 1.0}, "multi/sft-only")
    runs.append(summary("gsm8k", "claude", 0, 5.0, "free", OPUS, model="small"))
    return runs


def row_of(table, **match) -> dict:
    (row,) = [r for r in table.rows if all(r.get(k) == v for k, v in match.items())]
    return row


def test_mode_order():
    modes = ["other", "multi/rl-only", "multi", "rl-only", "multi/sft-only", "free", "multi/zzz", "sft-only"]
    assert sorted(modes, key=mode_rank) == ["free", "sft-only", "rl-only", "multi", "multi/sft-only", "multi/rl-only",
                                            "multi/zzz", "other"]


def test_mode_ablation_rows_order_and_cells(sweep):
    table = build_tables(sweep, {})["mode_ablation"]
    assert table.columns == ["mode", "model", "agent", "scaffold", "driver", "multi", "alfworld", "alpaca-eval",
                             "gsm8k", "mean_delta", "n"]
    order = [(r["model"], r["agent"], r["mode"], r["multi"]) for r in table.rows]
    assert order == [
        ("small", "baseline", None, None),
        ("small", "claude", "free", None),
        ("tiny", "baseline", None, None),
        # claude-code / claude-opus: free, then multi
        ("tiny", "claude", "free", None),
        ("tiny", "claude", "multi", ALL3),
        # reference: sft-only, rl-only, multi (by the run's tasks), multi/sft-only
        ("tiny", "sft", "sft-only", None),
        ("tiny", "grpo", "rl-only", None),
        ("tiny", "copy", "multi", ALL3),
        ("tiny", "copy", "multi", TWO),
        ("tiny", "multi-sft", "multi/sft-only", TWO),
    ]
    base = row_of(table, model="tiny", agent="baseline")
    assert (base["gsm8k"], base["alpaca-eval"], base["alfworld"], base["mean_delta"], base["n"]) == (10.0, 50.0, 5.0, None, None)
    small_base = row_of(table, model="small", agent="baseline")
    assert small_base["gsm8k"] == 20.0 and small_base["alfworld"] is None
    free = row_of(table, model="tiny", agent="claude", mode="free")
    assert (free["gsm8k"], free["alpaca-eval"], free["alfworld"]) == (13.0, 52.0, 6.0)
    assert free["mean_delta"] == pytest.approx((3.0 + 2.0 + 1.0) / 3) and free["n"] == "2"
    assert (free["scaffold"], free["driver"]) == OPUS
    multi = row_of(table, model="tiny", agent="claude", mode="multi")
    # seed 1 has nothing evaluated on alfworld: that cell is seed 0's alone, the row's n a range
    assert (multi["gsm8k"], multi["alpaca-eval"], multi["alfworld"]) == (12.0, 50.5, 6.0)
    assert multi["mean_delta"] == pytest.approx((2.0 + 0.5 + 1.0) / 3) and multi["n"] == "1-2"
    sft = row_of(table, agent="sft")
    assert (sft["gsm8k"], sft["alpaca-eval"], sft["alfworld"]) == (11.5, 53.0, None)
    assert sft["mean_delta"] == pytest.approx((1.5 + 3.0) / 2)  # over its own tasks (not run on alfworld)
    grpo = row_of(table, agent="grpo")
    assert grpo["mean_delta"] == pytest.approx((0.5 - 1.0 + 4.0) / 3) and grpo["n"] == "1"
    copy3 = row_of(table, agent="copy", multi=ALL3)
    assert copy3["mean_delta"] == 0.0 and (copy3["gsm8k"], copy3["alfworld"]) == (10.0, 5.0) and copy3["n"] == "1"
    copy2 = row_of(table, agent="copy", multi=TWO)
    assert copy2["alfworld"] is None and copy2["mean_delta"] == 0.0 and copy2["n"] == "1"
    msft = row_of(table, agent="multi-sft")
    assert (msft["gsm8k"], msft["alpaca-eval"], msft["mean_delta"]) == (12.0, 51.0, 1.5)  # the run's headline
    # small ran gsm8k only: its rows' mean_delta is over that task
    assert row_of(table, model="small", agent="claude")["mean_delta"] == 5.0


def test_mode_ablation_notes_and_markdown(sweep, tmp_path):
    table = build_tables(sweep, {})["mode_ablation"]
    notes = "\n".join(table.notes)
    assert "one agent run with one workspace, one base model and one budget for several tasks" in notes
    assert "best submission on that task within the run, re-evaluated" in notes
    assert "this benchmark's own design" in notes and "does not publish" in notes
    assert "mean over seeds of the runs' best score" in notes and "mean_delta:" in notes
    assert "free, sft-only, rl-only, multi, multi/<mode>" in notes
    text = markdown(table)
    assert text.startswith("# Mode ablation (free, sft-only, rl-only, multi): mean best score per task\n")
    assert "| mode | model | agent | scaffold | driver | multi | alfworld | alpaca-eval | gsm8k | mean_delta | n |" in text
    assert f"| {BLANK_MD} | tiny | baseline | {BLANK_MD} | {BLANK_MD} | {BLANK_MD} | 5.00 | 50.00 | 10.00 | {BLANK_MD} | {BLANK_MD} |" in text
    assert f"| multi | tiny | claude | claude-code | claude-opus | {ALL3} | 6.00 | 50.50 | 12.00 | 1.17 | 1-2 |" in text
    assert f"| multi/sft-only | tiny | multi-sft | reference | {BLANK_MD} | {TWO} | {BLANK_MD} | 51.00 | 12.00 | 1.50 | 1 |" in text
    write_tables({"mode_ablation": table}, tmp_path)
    rows = list(csv.DictReader(open(tmp_path / "mode_ablation.csv")))
    assert rows[0]["mode"] == "" and rows[0]["agent"] == "baseline"
    claude = next(r for r in rows if r["agent"] == "claude" and r["mode"] == "multi")
    assert (claude["multi"], claude["mean_delta"], claude["alfworld"]) == (ALL3, "1.17", "6.0")


def test_a_single_task_sweep_has_no_multi_column(sweep):
    single = [s for s in sweep if "multi" not in s["labels"]]
    tables = build_tables(single, {})
    assert tables["mode_ablation"].columns == ["mode", "model", "agent", "scaffold", "driver", "alfworld",
                                               "alpaca-eval", "gsm8k", "mean_delta", "n"]
    for name in ("leaderboard_paper", "delta_matrix", "multirun_stats", "workspace_stats", "tokens_cost"):
        assert "multi" not in tables[name].columns, name
        assert not any("multi" in note for note in tables[name].notes), name
    assert "multi" in build_tables(sweep, {})["delta_matrix"].columns


def test_two_multi_runs_over_different_tasks_are_two_configurations(sweep):
    """copy seed 0 ran gsm8k in two multi-task runs: two cells of one seed each, never one cell with seed 0 twice."""
    copy = [s for s in sweep if s["labels"]["agent"] == "copy"]
    assert config_key(copy[0])[4] in (ALL3, TWO)
    groups = group_runs(copy)
    assert sorted((key[4], task, len(runs)) for (key, task, _), runs in groups.items() if task == "gsm8k") == [
        (ALL3, "gsm8k", 1), (TWO, "gsm8k", 1)]
    for (key, task, model), runs in group_runs(sweep).items():
        seeds = [s["labels"]["seed"] for s in runs]
        assert len(seeds) == len(set(seeds)), (key, task)
    assert config_label(config_key(copy[0])) == f"copy (reference, multi: {config_key(copy[0])[4]})"
    tables = build_tables(sweep, {})
    matrix = [r for r in tables["delta_matrix"].rows if r["agent"] == "copy" and r["task"] == "gsm8k"]
    assert sorted((r["multi"], r["n"]) for r in matrix) == [(ALL3, 1), (TWO, 1)]
    paper = [r for r in tables["leaderboard_paper"].rows if r["agent"] == "copy"]
    assert [r["multi"] for r in paper] == [ALL3, TWO]
    stats = [r for r in tables["multirun_stats"].rows if r["agent"] == "claude" and r["model"] == "tiny" and r["task"] == "alfworld"]
    assert sorted((r["mode"], r["runs"], r["n"]) for r in stats) == [("free", 2, 2), ("multi", 2, 1)]


def test_per_run_tables_count_a_multi_run_once_where_it_is_one_run(sweep):
    tables = build_tables(sweep, {})
    ws = tables["workspace_stats"]
    assert ws.columns[:5] == ["task", "model", "agent", "seed", "multi"]
    # a row per task of a multi-task run (its view of the run), told apart from the single-task runs
    claude0 = [(r["task"], r["multi"]) for r in ws.rows if r["agent"] == "claude" and r["model"] == "tiny" and r["seed"] == "0"]
    assert sorted(claude0, key=str) == sorted([(t, None) for t in ("alfworld", "alpaca-eval", "gsm8k")]
                                              + [(t, ALL3) for t in ("alfworld", "alpaca-eval", "gsm8k")], key=str)
    cost = tables["tokens_cost"]
    claude_multi = [r for r in cost.rows if r["agent"] == "claude" and r["multi"]]
    # one row per multi-task run (its members share one gateway), the run's tasks as its task
    assert [(r["task"], r["seed"], r["cost_usd"]) for r in claude_multi] == [(ALL3, "0", 0.5), (ALL3, "1", 0.5)]
    assert sum(r["cost_usd"] or 0 for r in cost.rows) == pytest.approx(0.5 * (6 + 2))  # 6 free runs + 2 multi runs
    copy = [(r["task"], r["multi"]) for r in cost.rows if r["agent"] == "copy"]
    assert sorted(copy) == [(ALL3, ALL3), (TWO, TWO)]
    # per task: a multi-task run counts as a run of each of its tasks
    gsm = next(r for r in tables["routes"].rows if r["task"] == "gsm8k" and r["model"] == "tiny")
    assert gsm["runs"] == 2 + 2 + 2 + 1 + 2 + 1
    assert any("counts as a run of each of its tasks" in n for n in tables["routes"].notes)


def test_flagged_multi_members_are_named_with_their_run(sweep):
    flagged = [{**s, "integrity": {"status": "flagged"}} if s["labels"]["agent"] == "copy" and s["labels"].get("multi") == TWO else s
               for s in sweep]
    note = build_tables(flagged, {"flagged": "drop"})["mode_ablation"].notes[-1]
    assert f"gsm8k/tiny/copy/0 (multi {TWO})" in note and "2 flagged run(s) left out" in note
    assert not any(r["agent"] == "copy" and r["multi"] == TWO for r in build_tables(flagged, {"flagged": "drop"})["mode_ablation"].rows)


def test_leaderboard_has_the_multi_column_last(sweep, tmp_path):
    out = tmp_path / "leaderboard.csv"
    assert write_leaderboard_rows(sweep, out) == len(sweep)
    reader = csv.DictReader(open(out))
    assert tuple(reader.fieldnames) == LEADERBOARD_COLUMNS and LEADERBOARD_COLUMNS[-1] == "multi"
    rows = list(reader)
    members = [r for r in rows if r["multi"]]
    assert len(members) == 3 + 3 + 3 + 2 + 2
    assert sorted((r["task"], r["seed"], r["mode"]) for r in members if r["agent"] == "claude") == [
        (t, s, "multi") for t in ("alfworld", "alpaca-eval", "gsm8k") for s in ("0", "1")]
    assert {r["multi"] for r in members if r["agent"] == "copy"} == {ALL3, TWO}
    assert next(r for r in members if r["agent"] == "multi-sft")["mode"] == "multi/sft-only"
    single = [r for r in rows if not r["multi"]]
    assert len(single) == 6 + 4 + 3 + 1 and {r["mode"] for r in single} == {"free", "sft-only", "rl-only"}
    # the copy runs of seed 0 on gsm8k: one row per multi-task run, in a fixed order
    assert [r["multi"] for r in rows if r["agent"] == "copy" and r["task"] == "gsm8k"] == [ALL3, TWO]


def test_the_figures_draw_multi_members(sweep, tmp_path):
    cells = figures.heatmap_cells(sweep)["tiny"]
    assert cells[(f"copy (reference, multi: {ALL3})", "gsm8k")]["n"] == 1
    assert cells[(f"copy (reference, multi: {TWO})", "gsm8k")]["n"] == 1
    assert cells[("claude (claude-code / claude-opus, free)", "gsm8k")]["mean"] == 3.0
    for name, item in FIGURES.items():
        png, svg = tmp_path / f"{name}.png", tmp_path / f"{name}.svg"
        item.builder(sweep, {"decimals": 2, "budget_cuts": [0.5, 1.0]}, png, svg)
        assert png.stat().st_size > 1000 and svg.stat().st_size > 1000
