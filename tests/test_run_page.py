"""The run explorer (rlbench.explorer, `rlbench view`): the page's data from a run directory, the command,
and the page in headless Chromium on a recorded coding-agent run (the real tool, the real LLM gateway and
grader, the scripted endpoint), as the issue asks: every turn and every submission appear, clicking a
submission shows its diff, the filters work, no page errors, the timeline and the resource plot drawn."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from rlbench.explorer.build import build_page, is_stale, page_path
from rlbench.explorer.data import RESOURCE_POINTS, budget_cuts, page_data, run_header
from rlbench.fileio.jsonio import write_json
from rlbench.recording.repository import CodeRepository
from support.browser import BOX, chromium_or_skip, coloured_pixels, dark_pixels
from support.settings import REPO

RLBENCH = [sys.executable, "-m", "rlbench.cli"]


def _commit(repo: CodeRepository, tmp: Path, files: dict[str, str], n: int) -> str:
    tree = tmp / f"tree{n}"
    tree.mkdir()
    for name, text in files.items():
        (tree / name).write_text(text)
    return repo.commit(tree, f"submission {n}", when=1_000_000 + n)


def recorded_run(tmp_path: Path) -> Path:
    """A run directory as the runner and grader leave it, written by hand: three submissions (the second
    without a code revision, the third changing one line), a resource trace and an agent.log."""
    run_dir = tmp_path / "runs" / "gsm8k" / "tiny" / "sft" / "0"
    (run_dir / "grader").mkdir(parents=True)
    (run_dir / "workspace").mkdir()
    start = 1_000_000.0
    write_json(run_dir / "run.json", {
        "status": "timeout", "exit_code": -9, "timed_out": True, "start_time": start, "end_time": start + 130,
        "duration_s": 130.0, "time_limit_s": 120, "labels": {"task": "gsm8k", "model": "tiny", "agent": "sft", "seed": 0},
        "agent_kind": "script",
    })
    repo = CodeRepository(run_dir / "grader" / "code.git")
    first = _commit(repo, tmp_path, {"train.py": "lr = 1e-5\nsteps = 10\n"}, 1)
    third = _commit(repo, tmp_path, {"train.py": "lr = 5e-6\nsteps = 10\n", "notes.md": "try a lower lr\n"}, 3)
    entries = [
        {"submission_id": 1, "submitted_at": start + 30, "status": "scored", "score": 12.0, "improvement": 2.0,
         "model_path": "output/v1", "code_revision": first, "metrics": {"accuracy": 12.0}, "primary_metric": "accuracy"},
        {"submission_id": 2, "submitted_at": start + 50, "status": "refused", "reason": "invalid_model_path",
         "error": "no model at output/none", "score": 0.0, "model_path": "output/none"},
        {"submission_id": 3, "submitted_at": start + 90, "status": "scored", "score": 15.0, "improvement": 5.0,
         "model_path": "output/v2", "code_revision": third, "metrics": {"accuracy": 15.0}},
        {"submission_id": 4, "pending": True},
    ]
    (run_dir / "grader" / "ledger.jsonl").write_text("".join(json.dumps(e) + "\n" for e in entries))
    (run_dir / "grader" / "snapshots" / "0001").mkdir(parents=True)
    write_json(run_dir / "grader" / "snapshots" / "0001" / "checkpoint.json", {
        "fingerprint": "abc", "method": "copy", "config": {"model_type": "llama"},
        "files": [{"name": "model.safetensors", "size": 1234, "sha256": "f" * 64}],
    })
    (run_dir / "workspace" / "agent.log").write_text("loading model\ntraining step 1\nTraceback (most recent call last):\n")
    samples = [{"ts": start + 5 * k, "cpu_percent": 100.0 + k, "rss_bytes": 2**30, "workspace_bytes": 10 * k,
                "agent_log_bytes": 14 * min(k, 3)} for k in range(1, 26)]
    (run_dir / "resources.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    return run_dir


def test_page_data_of_a_recorded_run(tmp_path):
    run_dir = recorded_run(tmp_path)
    data = page_data(run_dir)
    assert data["title"] == "gsm8k / tiny / sft / seed 0"
    assert [s["id"] for s in data["submissions"]] == [1, 2, 3]  # the pending entry is not a submission yet
    first, refused, third = data["submissions"]
    assert first["t"] == 30.0 and first["diff_against"] is None and "+lr = 1e-5" in first["diff"]
    assert first["checkpoint"]["files"][0]["name"] == "model.safetensors" and first["metrics"]["accuracy"] == 12.0
    assert refused["diff"] is None and refused["reason"] == "invalid_model_path" and refused["checkpoint"] is None
    # The third's diff is against the first (the latest earlier submission with code): one changed line, one new file.
    assert third["diff_against"] == 1
    assert "-lr = 1e-5" in third["diff"] and "+lr = 5e-6" in third["diff"] and "+try a lower lr" in third["diff"]
    assert sorted(third["code_files"]) == ["notes.md", "train.py"]
    # The budget and what cut the run.
    assert [(c["kind"], c["t"]) for c in data["cuts"]] == [("budget", 120.0), ("timeout", 130.0)]
    # The resource trace on the same axis; agent.log's lines are the turns of a reference agent.
    assert data["resources"]["t"][0] == 5.0 and data["resources"]["cpu_percent"][0] == 101.0
    assert [t["kind"] for t in data["turns"]] == ["log"] * 3
    assert [t["ok"] for t in data["turns"]] == [True, True, False]
    assert data["summary"] is None and data["final"] is None
    assert {"summary.json", "final.json", "integrity.json"} <= set(data["missing"])
    assert "grader/code.git" not in data["missing"] and "workspace/agent.log" not in data["missing"]


def test_page_data_of_an_empty_or_hostile_run_directory(tmp_path):
    run_dir = tmp_path / "run"
    (run_dir / "grader").mkdir(parents=True)
    (run_dir / "run.json").write_text("[1, 2]")  # not an object
    (run_dir / "grader" / "ledger.jsonl").write_text('{"submission_id": "x", "code_revision": "not-a-sha"}\n[3]\n{"torn')
    data = page_data(run_dir)
    assert data["title"] == "? / None / None / seed None"
    assert data["turns"] == [] and data["resources"] is None and data["cuts"] == []
    assert [s["id"] for s in data["submissions"]] == ["x"] and data["submissions"][0]["diff"] is None
    assert {"grader/code.git", "resources.jsonl", "workspace/agent.log"} <= set(data["missing"])
    json.dumps(data)  # the page embeds it as JSON


def test_budget_cuts_say_what_ended_the_run():
    header = run_header({"status": "stopped", "start_time": 0, "end_time": 40, "time_limit_s": 60,
                         "stopped_by": {"kind": "llm_limit", "detail": "the token limit was reached"}}, {}, None)
    assert budget_cuts(header) == [
        {"t": 60.0, "kind": "budget", "detail": "budget 60 s"},
        {"t": 40, "kind": "stopped", "detail": "stopped: the token limit was reached"},
    ]


def test_a_long_resource_trace_is_thinned_keeping_the_peaks(tmp_path):
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_json(run_dir / "run.json", {"start_time": 0.0, "labels": {}})
    n = 12 * 3600 // 5  # twelve hours at the runner's 5-second interval
    with open(run_dir / "resources.jsonl", "w") as handle:
        for k in range(n):
            handle.write(json.dumps({"ts": 5.0 * k, "cpu_percent": 900.0 if k == 4321 else 50.0, "rss_bytes": k,
                                     "workspace_bytes": 0, "gpu_utilization_percent": {"0": k % 100},
                                     "gpu_memory_used_mib": {"0": 1000}, "gpu_memory_total_mib": {"0": 80000}}) + "\n")
    resources = page_data(run_dir)["resources"]
    assert len(resources["t"]) <= RESOURCE_POINTS and max(resources["cpu_percent"]) == 900.0
    assert resources["rss_bytes"][-1] == n - 1 and resources["gpus"]["0"]["memory_total_mib"] == 80000


def test_the_page_is_rebuilt_when_a_record_is_newer(tmp_path):
    run_dir = recorded_run(tmp_path)
    assert is_stale(run_dir)
    page = build_page(run_dir)
    assert page == page_path(run_dir) and page.is_file() and not is_stale(run_dir)
    later = time.time() + 5
    os.utime(run_dir / "grader" / "ledger.jsonl", (later, later))
    assert is_stale(run_dir)


def _rlbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO / "scripts")}
    return subprocess.run([*RLBENCH, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=120)


def test_rlbench_view_lists_builds_and_refuses_what_is_no_run(tmp_path):
    run_dir = recorded_run(tmp_path)
    listing = _rlbench("view", "--results", str(tmp_path), cwd=tmp_path)
    assert listing.returncode == 0 and str(run_dir) in listing.stdout and "missing" in listing.stdout
    built = _rlbench("view", str(run_dir), "--no-open", cwd=tmp_path)
    assert built.returncode == 0 and "built" in built.stdout and page_path(run_dir).is_file()
    again = _rlbench("view", str(run_dir), "--no-open", cwd=tmp_path)
    assert "up to date" in again.stdout
    assert "yes" in _rlbench("view", "--results", str(tmp_path), cwd=tmp_path).stdout
    nothing = _rlbench("view", str(tmp_path), "--no-open", cwd=tmp_path)
    assert nothing.returncode == 2 and "not a run's directory" in nothing.stderr
    empty = _rlbench("view", "--results", str(tmp_path / "none"), cwd=tmp_path)
    assert empty.returncode == 1 and "no recorded runs" in empty.stdout


def test_rlbench_view_serves_the_page_on_localhost_without_a_browser(tmp_path):
    run_dir = recorded_run(tmp_path)
    env = {k: v for k, v in os.environ.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    env["PYTHONPATH"] = str(REPO / "scripts")
    proc = subprocess.Popen([*RLBENCH, "view", str(run_dir)], cwd=tmp_path, env=env, stdout=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        url = next(line.split(" at ", 1)[1].split()[0] for line in lines if "serving" in line)
        assert url.startswith("http://127.0.0.1:") and url.endswith("/run.html")
        body = urllib.request.urlopen(url, timeout=30).read().decode()
        assert '<script type="application/json" id="run-data">' in body
    finally:
        proc.terminate()
        proc.wait(timeout=30)


# -- the page in Chromium, on a recorded coding-agent run ----------------------------------------------------------

# The second training changes one line of the first's code (the diff the page must show).
RETRAIN = "sed -i 's/+ 0.01/+ 0.02/' code/perturb_step.py && python code/perturb_step.py"
FAILING = "cat no-such-file.txt"


def coding_agent_script() -> list[dict]:
    """Claude Code against the scripted endpoint: train, submit, change the code and train again, submit, a
    command that fails, then finish."""
    import support.cli_agents as harness

    return [
        {"command": harness.CHEAP_TRAIN},
        {"command": harness.SUBMIT},
        {"command": RETRAIN},
        {"command": harness.SUBMIT},
        {"command": FAILING},
        {"finish": "Trained and submitted output/v1 twice."},
    ]


VISIBLE_ROWS = "Array.from(document.querySelectorAll('#turns .turn-row')).map(r => Number(r.dataset.i))"


@pytest.mark.browser
@pytest.mark.tools
def test_the_page_of_a_recorded_coding_agent_run_in_chromium(tmp_path, workspace, tiny_model, gsm8k_data, monkeypatch):
    import support.cli_agents as harness
    from scripted_llm import ScriptedLLM
    from rlbench.analysis.browser import Page

    chromium_or_skip()
    harness.require_tool("claude-code")
    upstream_log = tmp_path / "upstream.jsonl"
    with ScriptedLLM(coding_agent_script(), upstream_log) as llm:
        run = harness.run_cli(workspace, tiny_model, gsm8k_data, harness.cli_entry("claude-code", llm.url), upstream_log,
                              monkeypatch=monkeypatch)
    assert run.run["status"] == "completed", (run.run.get("error"), run.run.get("llm"))
    transcript = [json.loads(line) for line in (run.run_dir / "gateway" / "transcript.jsonl").read_text().splitlines()]
    submissions = [e for e in run.ledger if not e.get("pending")]
    assert len(submissions) == 2 and all(e["status"] in ("scored", "cached") for e in submissions), run.ledger

    page = build_page(run.run_dir)
    data = page_data(run.run_dir)
    assert len(data["turns"]) == len(transcript) == len(coding_agent_script())
    second = data["submissions"][1]
    assert second["diff_against"] == data["submissions"][0]["id"]
    assert "-weights[name] = weights[name] + 0.01" in second["diff"] and "+weights[name] = weights[name] + 0.02" in second["diff"]

    with Page(width=1280, height=1400) as browser:
        browser.open(page.as_uri())
        browser.wait_for("window.runPage && window.runPage.ready === true")
        # Every turn appears in the list (the list renders what is in view: scroll to each) and every submission.
        seen = set()
        for turn in data["turns"]:
            browser.evaluate(f"window.runPage.scrollToTurn({turn['i']})")
            seen |= set(browser.evaluate(VISIBLE_ROWS))
        assert seen == {t["i"] for t in data["turns"]}
        rows = browser.evaluate("Array.from(document.querySelectorAll('#submissions .submission-row')).map(r => r.dataset.id)")
        assert rows == [str(s["id"]) for s in data["submissions"]]
        # Clicking the second submission shows its diff: the changed line, removed and added.
        browser.evaluate(f"document.querySelector('#submissions .submission-row[data-id=\"{second['id']}\"]').click()")
        browser.wait_for("document.querySelector('#submission-detail .diff') !== null")
        removed = browser.evaluate("Array.from(document.querySelectorAll('#submission-detail .diff .del')).map(e => e.textContent)")
        added = browser.evaluate("Array.from(document.querySelectorAll('#submission-detail .diff .add')).map(e => e.textContent)")
        assert any("+ 0.01" in line for line in removed) and any("+ 0.02" in line for line in added)
        # Filters: text, tool, errors only, each against what the data says.
        def filtered() -> list[int]:
            return browser.evaluate("window.runPage.filtered.slice()")

        def set_filter(selector: str, js_value: str, event: str) -> None:
            browser.evaluate(
                f"(e => {{ {js_value}; e.dispatchEvent(new Event('{event}', {{bubbles: true}})); }})"
                f"(document.querySelector('{selector}'))"
            )

        every = [t["i"] for t in data["turns"]]
        assert filtered() == every
        set_filter("#filter-text", "e.value = 'no-such-file'", "input")
        texts = {t["i"]: json.dumps([t["label"], t["messages"], t["response"]]).lower() for t in data["turns"]}
        expected = [i for i in every if "no-such-file" in texts[i]]
        assert expected and filtered() == expected
        assert browser.evaluate("document.querySelector('#turn-count').textContent").startswith(f"{len(expected)} of {len(every)}")
        set_filter("#filter-text", "e.value = ''", "input")
        tool = data["tools"][0]
        set_filter("#filter-tool", f"e.value = {json.dumps(tool)}", "change")
        assert filtered() == [t["i"] for t in data["turns"] if tool in t["tools"]] != []
        set_filter("#filter-tool", "e.value = ''", "change")
        set_filter("#filter-errors", "e.checked = true", "change")
        errors = [t["i"] for t in data["turns"] if not t["ok"] or any(m.get("error") for m in t["messages"])]
        assert errors and filtered() == errors  # the failed command's output
        set_filter("#filter-errors", "e.checked = false", "change")
        assert filtered() == every
        # The timeline and the resource plot are drawn.
        shot = browser.screenshot(tmp_path / "run_page.png")
        for canvas in ("#timeline", "#resources"):
            box = browser.evaluate(BOX % f"document.querySelector('{canvas}')")
            assert box["bottom"] > box["top"] and dark_pixels(shot, box) + coloured_pixels(shot, box) > 200, canvas
        assert browser.errors == [], browser.errors
