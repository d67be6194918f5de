"""The session sweep's addition-control runs with a final split (config scoring.feedback: split, as the default
sweep): final.json and summary.json carry the Δ family, the negative control's at exactly 0, and the
leaderboard and the selection_gap table show it. Reads the session sweep (tests/conftest.py), so it runs there."""

from __future__ import annotations

import csv

from rlbench.fileio.jsonio import read_json, read_jsonl
from support.workflow import CONTROL_TASK

MODEL = "smollm2-135m-instruct"
FAMILY = ("feedback_delta", "clean_delta", "oracle_delta", "selection_gap")


def test_the_controls_report_the_delta_family_and_copy_stays_at_zero(session_sweep):
    results = session_sweep / "results"
    partition = read_json(results / "data" / CONTROL_TASK / "partition.json")
    assert partition["feedback"]["n"] + partition["final"]["n"] == partition["n"]
    assert partition["final"]["n"] == round(0.5 * partition["n"])
    baseline = read_json(results / "baselines" / CONTROL_TASK / f"{MODEL}.json")
    assert baseline["feedback_mode"] == "split" and baseline["n"] == partition["feedback"]["n"]
    assert baseline["final_split"]["n"] == partition["final"]["n"]
    for agent in ("copy", "sft"):
        run = results / "runs" / CONTROL_TASK / MODEL / agent / "0"
        final, summary = read_json(run / "final.json"), read_json(run / "summary.json")
        assert final["feedback_mode"] == summary["feedback_mode"] == "split"
        for name in FAMILY:
            assert final[name] == summary[name] and final[f"{name}_band"] == summary[f"{name}_band"]
        # the private record of every scored submission holds its final-split score
        scored = [e for e in read_jsonl(run / "grader" / "ledger.jsonl") if e.get("status") in ("scored", "cached")]
        assert scored and all(e["final"]["partition"] == partition["digest"] for e in scored)
        if agent == "copy":  # the negative control: exactly the base model on both parts
            assert final["delta"] == 0.0
            assert [final[name] for name in FAMILY] == [0.0, 0.0, 0.0, 0.0]
        else:
            assert final["feedback_delta"] == final["delta"]
            assert final["selection_gap"] == round(final["feedback_delta"] - final["clean_delta"], 4)
            assert final["oracle_delta"] >= final["clean_delta"]
    rows = [r for r in csv.DictReader(open(results / "report" / "leaderboard.csv")) if r["task"] == CONTROL_TASK]
    copy = next(r for r in rows if r["agent"] == "copy")
    assert float(copy["clean_delta"]) == float(copy["selection_gap"]) == 0.0
    gsm8k = next(r for r in csv.DictReader(open(results / "report" / "leaderboard.csv")) if r["task"] == "gsm8k")
    assert gsm8k["clean_delta"] == gsm8k["selection_gap"] == ""  # full mode: blank
    table = list(csv.DictReader(open(results / "report" / "selection_gap.csv")))
    assert {r["agent"] for r in table} == {"copy", "sft"} and {r["task"] for r in table} == {CONTROL_TASK}
