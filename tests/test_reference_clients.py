"""The reference harness's own clients, replayed against our live grading server.

Agents and wrappers written for RD-Agent's AutoRL-Bench (rdagent/scenarios/rl/autorl_bench) must
work unchanged here. Their submit commands are run as they are written there (real curl through
bash, real requests calls), and every field those clients and documents read is checked for type
and meaning.

What the reference's clients and documents read (path under rdagent/scenarios/rl/autorl_bench/):
  POST /submit response
    core/server.py                  submission_id, timestamp (datetime.now().isoformat() when the
                                    evaluation finished), model_path, score, baseline_score,
                                    improvement (score - baseline), elapsed_seconds (that
                                    evaluation's duration), error (only on error), best (the
                                    max-score entry of scores.json), total_submissions (its length)
    core/instructions.md, README.md submission_id, score, baseline_score, improvement,
                                    best.submission_id, best.score, total_submissions
    agents/example_agent/train.py   status_code == 200, then .json().get('score')
    core/utils.py                   raise_for_status(), .get('score')        (submit_to_grading_server)
    ../train/runner.py              .get('score'), .get('improvement'), .get('best', {}).get('score')
    test/test_benchmark.py          GET /health == 200; .get('score', 0)
    agents/*/AGENTS.md, core/skill.md   score, improvement, best (from the response or scores.json)
  scores.json (a list)              core/metrics.py: score, timestamp (datetime.fromisoformat),
                                    model_path; best = max(score)
  run_meta.json                     core/utils.py, core/metrics.py, core/instructions.md: start_time,
                                    timeout_s, last_submit_time, end_time (int unix seconds; end_time
                                    and last_submit_time null until set; end_time set after the run)
  GET /time                         core/server.py, core/instructions.md: run_meta + now, remaining
  GET /health                       core/server.py: status, task, workspace, available_gpus
  timer.sh                          agents/{claude,codex,gemini}/start.sh: `bash timer.sh` prints
                                    "Remaining: H:MM" or "Timer expired!"
  "gpu" in /submit                  core/server.py (_validate_gpu), core/instructions.md: "0", "2,3";
                                    ids outside CUDA_VISIBLE_DEVICES are a 400 naming the available ones
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import requests

from rlbench.fileio.jsonio import read_json, read_jsonl
from rlbench.recording.ledger import REFERENCE_FIELDS, is_submission
from rlbench.sandbox.bubblewrap import bubblewrap_available
from support.models import copy_model, perturb

pytestmark = pytest.mark.skipif(shutil.which("curl") is None, reason="curl is not installed")

# agents/{claude,codex,gemini}/start.sh, step 6 of the prompt, inside PROMPT="..." (bash expands
# it there; the agent then runs what it reads). Quoted verbatim.
CLI_WRAPPER_PROMPT_LINE = (
    r"""curl -X POST ${GRADING_SERVER_URL}/submit -H 'Content-Type: application/json' """
    r"""-d '{\\\"model_path\\\": \\\"${OUTPUT_DIR}/v1\\\"}'"""
)
# core/instructions.md, "## API", verbatim (the three submit forms, then /time and /health).
INSTRUCTIONS_SUBMIT = """curl -X POST "$GRADING_SERVER_URL/submit" \\
    -H "Content-Type: application/json" \\
    -d '{"model_path": "'$OUTPUT_DIR'/v1"}'"""
INSTRUCTIONS_SUBMIT_GPU = """curl -X POST "$GRADING_SERVER_URL/submit" \\
    -H "Content-Type: application/json" \\
    -d '{"model_path": "'$OUTPUT_DIR'/v1", "gpu": "0"}'"""
INSTRUCTIONS_SUBMIT_MULTI_GPU = """curl -X POST "$GRADING_SERVER_URL/submit" \\
    -H "Content-Type: application/json" \\
    -d '{"model_path": "'$OUTPUT_DIR'/v1", "gpu": "2,3"}'"""
INSTRUCTIONS_TIME = 'curl "$GRADING_SERVER_URL/time"'
INSTRUCTIONS_HEALTH = 'curl "$GRADING_SERVER_URL/health"'
# README.md, "my_agent/start.sh" example, verbatim (the URL unquoted).
README_SUBMIT = """curl -X POST $GRADING_SERVER_URL/submit \\
    -H "Content-Type: application/json" \\
    -d '{"model_path": "'$OUTPUT_DIR'/v1"}'"""

TIMER_OUTPUT = re.compile(r"^(Remaining: \d+:[0-5]\d|Timer expired!)$")


def agent_env(server, workspace: Path) -> dict:
    root = workspace.resolve()
    return dict(
        os.environ,
        GRADING_SERVER_URL=server.url,
        WORKSPACE=str(root),
        OUTPUT_DIR=str(root / "output"),
        MODEL_PATH=str(root / "models" / "rlbench" / "tiny-qwen2"),
        DATA_PATH=str(root / "data"),
        TASK="gsm8k",
        BASE_MODEL="rlbench/tiny-qwen2",
    )


def shell(script: str, server, workspace: Path) -> str:
    """Run a shell snippet as an agent would: bash, in the workspace, with the contract's env."""
    out = subprocess.run(
        ["bash", "-c", script],
        cwd=workspace,
        env=agent_env(server, workspace),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


def curl_json(script: str, server, workspace: Path) -> dict:
    return json.loads(shell(script, server, workspace))


def from_iso(value: str) -> float:
    return datetime.fromisoformat(value).timestamp()


def assert_reference_response(body: dict, server, workspace: Path) -> None:
    """A /submit answer read as the reference's clients read it, checked against scores.json."""
    scores = read_json(workspace / "scores.json")
    assert isinstance(body["submission_id"], int) and body["submission_id"] >= 1
    assert isinstance(body["score"], float) and 0.0 <= body["score"] <= 100.0
    assert body["baseline_score"] == server.grader.config.baseline_score
    assert body["improvement"] == round(body["score"] - body["baseline_score"], 6)
    # timestamp: ISO 8601 local time when the evaluation finished, i.e. when the answer was ready.
    assert abs(from_iso(body["timestamp"]) - body["responded_at"]) < 1e-3
    # elapsed_seconds: this evaluation's duration, receipt to response (not time since the start).
    assert body["elapsed_seconds"] >= 0
    assert abs(body["elapsed_seconds"] - (body["responded_at"] - body["submitted_at"])) <= 0.01
    assert body["since_start_s"] == pytest.approx(body["submitted_at"] - server.grader.config.start_time, abs=1e-3)
    assert ("error" in body) == (body["status"] not in ("scored", "cached"))
    # best and total_submissions: computed over scores.json, as the reference does.
    assert body["total_submissions"] == len(scores)
    assert body["best"] == max(scores, key=lambda e: e.get("score", 0))
    assert isinstance(body["best"]["score"], float) and isinstance(body["best"]["submission_id"], int)


def test_cli_wrapper_prompt_curl_line_is_accepted_as_the_agent_reads_it(workspace, start_grader, tiny_model):
    server = start_grader(workspace)
    copy_model(tiny_model, workspace / "output" / "v1")
    # Expand the line as start.sh does inside PROMPT="...", then run what the agent reads:
    # the JSON body arrives with its quotes still escaped ({\"model_path\": ...}).
    shown = shell(f'printf "%s" "{CLI_WRAPPER_PROMPT_LINE}"', server, workspace)
    assert '{\\"model_path\\": \\"' in shown and str(workspace.resolve() / "output" / "v1") in shown
    body = curl_json(shown, server, workspace)
    assert body["status"] == "cached" and body["score"] == server.grader.config.baseline_score
    assert body["model_path"] == str(workspace.resolve() / "output" / "v1")  # as sent: absolute
    assert_reference_response(body, server, workspace)


def test_instructions_and_readme_curl_lines(workspace, start_grader, tiny_model):
    server = start_grader(workspace, gpus=["3", "0", "2", "1"])
    copy_model(tiny_model, workspace / "output" / "v1")
    for number, line in enumerate([INSTRUCTIONS_SUBMIT, INSTRUCTIONS_SUBMIT_GPU, INSTRUCTIONS_SUBMIT_MULTI_GPU, README_SUBMIT], 1):
        body = curl_json(line, server, workspace)
        # The same path with the same weights again: the reference's cache repeats the first
        # result and records no new submission.
        assert body["submission_id"] == number and body["total_submissions"] == 1, body
        assert body.get("repeat_of") == (None if number == 1 else 1)
        assert body["status"] == "cached" and body["improvement"] == 0.0
        assert_reference_response(body, server, workspace)
    assert [e["gpu"] for e in read_jsonl(server.grader.ledger_path)] == ["0", "0", "2,3", "0"]
    health = curl_json(INSTRUCTIONS_HEALTH, server, workspace)
    assert health["status"] == "ok" and health["task"] == "gsm8k"
    assert health["workspace"] == str(server.grader.config.workspace)
    assert health["available_gpus"] == ["0", "1", "2", "3"]  # sorted, as the reference
    info = curl_json(INSTRUCTIONS_TIME, server, workspace)
    # The last submission the reference records: the three repeats after the first are answered from its cache
    # and record nothing (they may well fall into the next second on a loaded machine).
    recorded = [e for e in read_jsonl(server.grader.ledger_path) if is_submission(e)]
    assert len(recorded) == 1 and info["last_submit_time"] == int(recorded[-1]["responded_at"])


def test_our_instructions_commands_work_as_written(workspace, start_grader, tiny_model):
    """instructions.md's own examples: curl with a relative path, and the requests one-liner."""
    server = start_grader(workspace)
    copy_model(tiny_model, workspace / "output" / "v1")
    text = (workspace / "instructions.md").read_text()
    commands = [line.strip() for line in text.splitlines() if line.startswith("    curl ")]
    assert commands and all('"output/v1"' in c for c in commands)
    for command in commands:
        assert curl_json(command, server, workspace)["score"] == 0.0
    python = [line.strip() for line in text.splitlines() if line.startswith("    requests.post(")]
    assert len(python) == 1
    out = subprocess.run(
        [sys.executable, "-c", f"import os, requests, json; print(json.dumps({python[0]}))"],
        cwd=workspace, env=agent_env(server, workspace), capture_output=True, text=True, timeout=300,
    )
    assert json.loads(out.stdout)["status"] == "cached", out.stderr
    # And without the content type, as `curl -d` alone sends it.
    body = curl_json('curl -s -X POST "$GRADING_SERVER_URL/submit" -d \'{"model_path": "output/v1"}\'', server, workspace)
    assert body["model_path"] == "output/v1" and body["status"] == "cached"


def test_example_agent_requests_and_what_it_reads(workspace, start_grader, tiny_model):
    """agents/example_agent/train.py: submit_for_grading() with absolute paths under OUTPUT_DIR,
    the last one OUTPUT_DIR itself; ../train/runner.py and core/utils.py read the same answer."""
    server = start_grader(workspace)
    grading_url, output_dir = server.url, str(workspace.resolve() / "output")
    checkpoint_dir = f"{output_dir}/checkpoint-epoch1"
    perturb(copy_model(tiny_model, Path(checkpoint_dir)))
    for path in tiny_model.iterdir():  # trainer.save_model(OUTPUT_DIR): a model in output/ itself
        if path.is_file():
            shutil.copyfile(path, Path(output_dir) / path.name)
    for model_path in (checkpoint_dir, output_dir):
        resp = requests.post(f"{grading_url}/submit", json={"model_path": model_path}, timeout=600)
        assert resp.status_code == 200, resp.text
        resp.raise_for_status()
        result = resp.json()
        assert isinstance(result.get("score"), float)
        assert isinstance(result.get("improvement"), float)
        assert isinstance(result.get("best", {}).get("score"), float)
        assert result["status"] == "scored" and result["model_path"] == model_path
        assert result["elapsed_seconds"] >= result["eval_seconds"]  # the evaluation is inside it
        assert_reference_response(result, server, workspace)


def test_scores_run_meta_and_best_as_the_reference_reads_them(workspace, start_grader, tiny_model):
    server = start_grader(workspace)
    grader = server.grader
    url = f"{server.url}/submit"
    # A request error: the reference answers 400 and never records it; our ledger does.
    refused = requests.post(url, json={"model_path": "../grader"}, timeout=60)
    assert refused.status_code == 403 and refused.json()["reason"] == "outside_workspace"
    assert "best" not in refused.json() and refused.json()["total_submissions"] == 0
    assert read_json(workspace / "scores.json") == []
    assert read_json(workspace / "run_meta.json")["last_submit_time"] is None
    # A failed evaluation: score 0.0, improvement = 0.0 - baseline, error kept, not the best model.
    broken = copy_model(tiny_model, workspace / "output" / "broken")
    (broken / "model.safetensors").write_bytes(b"garbage")
    failed = requests.post(url, json={"model_path": "output/broken"}, timeout=600)
    assert failed.status_code == 422
    failed = failed.json()
    assert failed["score"] == 0.0 and failed["improvement"] == -grader.config.baseline_score and failed["error"]
    assert_reference_response(failed, server, workspace)
    copy_model(tiny_model, workspace / "output" / "v1")
    perturb(copy_model(tiny_model, workspace / "output" / "v2"))
    for model_path in ("output/v1", "output/v2"):
        body = requests.post(url, json={"model_path": model_path}, timeout=600).json()
        assert "error" not in body
        assert_reference_response(body, server, workspace)

    scores = read_json(workspace / "scores.json")
    assert [e["submission_id"] for e in scores] == [2, 3, 4]  # the request error is not a submission
    for entry in scores:
        assert set(entry) == set(REFERENCE_FIELDS) | ({"error"} if entry["submission_id"] == 2 else set())
        datetime.fromisoformat(entry["timestamp"])
    # The grader's own best (best_model/, final evaluation) is a real score, never the 0.0 failure,
    # even where the reference's best (max score, first wins) is that failure.
    assert read_json(workspace.parent / "grader" / "best.json")["submission_id"] in (3, 4)
    assert grader.best["submission_id"] in (3, 4)
    ours = read_json(workspace / "submissions.json")
    assert [e["status"] for e in ours["submissions"]] == ["refused", "failed", "cached", "scored"]
    assert ours["submissions"][0]["reason"] == "outside_workspace" and ours["best"] == {
        k: v for k, v in grader.best.items() if k != "fingerprint"
    }
    ledger = list(read_jsonl(grader.ledger_path))
    assert [e["submission_id"] for e in ledger] == [1, 2, 3, 4]

    meta = read_json(workspace / "run_meta.json")
    assert set(meta) >= {"start_time", "timeout_s", "last_submit_time", "end_time"}
    assert meta["start_time"] == int(grader.config.start_time) and meta["timeout_s"] == 600
    assert meta["last_submit_time"] == int(ledger[-1]["responded_at"]) and meta["end_time"] is None
    end = time.time()
    grader.finish(end)  # what the runner does once the agent has stopped
    meta = read_json(workspace / "run_meta.json")
    assert meta["end_time"] == int(end) and requests.get(f"{server.url}/time", timeout=30).json()["end_time"] == int(end)

    # core/metrics.py's arithmetic on these files: int seconds and ISO timestamps mix as there.
    start = meta["start_time"]
    best = max(scores, key=lambda x: x.get("score", 0.0))
    time_to_best = int(from_iso(best["timestamp"]) - start)
    assert 0 <= time_to_best <= meta["end_time"] - start
    assert 0 <= (meta["end_time"] - start) / meta["timeout_s"] <= 1
    assert 0 <= meta["end_time"] - meta["last_submit_time"] <= 1 + end - ledger[-1]["responded_at"]


def test_time_endpoint_counts_down_in_whole_seconds(workspace, start_grader):
    server = start_grader(workspace, timeout_s=3600)
    first = curl_json(INSTRUCTIONS_TIME, server, workspace)
    time.sleep(1.2)
    second = requests.get(f"{server.url}/time", timeout=30).json()
    for info in (first, second):
        assert all(isinstance(info[k], int) for k in ("start_time", "timeout_s", "now", "remaining"))
        assert info["last_submit_time"] is None and info["end_time"] is None
        # The reference's formula, within the second our exact deadline adds.
        assert abs(info["remaining"] - max(info["timeout_s"] - (info["now"] - info["start_time"]), 0)) <= 1
    assert 1 <= first["remaining"] - second["remaining"] <= 3
    assert second["deadline"] == server.grader.config.start_time + 3600


def test_health_lists_no_gpus_on_a_cpu_grader(workspace, start_grader):
    server = start_grader(workspace)
    health = curl_json(INSTRUCTIONS_HEALTH, server, workspace)
    assert health["available_gpus"] == [] and health["status"] == "ok" and health["task"] == "gsm8k"
    assert Path(health["workspace"]) == workspace


def test_timer_sh_prints_the_time_left_of_the_run(workspace, start_grader):
    # The workspace was prepared earlier; the timer counts from the run's start (grader start).
    start_grader(workspace, timeout_s=7200, start_time=time.time() - 3600)
    timer = workspace / "timer.sh"
    assert os.access(timer, os.X_OK)
    out = subprocess.run(["env", "-i", "/bin/bash", "timer.sh"], cwd=workspace, capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout in ("Remaining: 1:00\n", "Remaining: 0:59\n"), out


def test_timer_sh_says_when_time_is_up(workspace, start_grader):
    start_grader(workspace, timeout_s=60, start_time=time.time() - 120)
    out = subprocess.run(["bash", "timer.sh"], cwd=workspace, capture_output=True, text=True)
    assert out.stdout == "Timer expired!\n"


@pytest.mark.sandbox
@pytest.mark.skipif(not bubblewrap_available()[0], reason="bubblewrap cannot run here")
def test_run_in_sandbox_timer_time_and_end_time(workspace, tiny_model, gsm8k_data):
    """A reference-style agent in the sandbox: bash timer.sh, run_meta.json, curl /time, submit;
    the runner then records the run's end in run_meta.json as the reference does."""
    from rlbench.agent_run.runner import run_agent
    from support.runs import spec_for

    script = (
        "bash timer.sh > code/timer.txt; cp run_meta.json code/meta.txt; "
        + INSTRUCTIONS_TIME + " > code/time.txt; "
        + 'cp -r "$MODEL_PATH" "$OUTPUT_DIR/v1" && '
        + INSTRUCTIONS_SUBMIT + " > code/submit.txt"
    )
    spec = spec_for(workspace, tiny_model, gsm8k_data, ["bash", "-c", script], sandbox_backend="bubblewrap")
    record = run_agent(spec)
    assert record.sandbox == "bubblewrap" and record.status == "completed"
    code = workspace / "code"
    assert TIMER_OUTPUT.match((code / "timer.txt").read_text().strip()).group(0).startswith("Remaining: 0:")
    during = json.loads((code / "meta.txt").read_text())
    assert during["end_time"] is None and during["last_submit_time"] is None and during["timeout_s"] == 60
    assert json.loads((code / "time.txt").read_text())["remaining"] <= 60
    submitted = json.loads((code / "submit.txt").read_text())
    assert submitted["score"] == 0.0 and submitted["total_submissions"] == 1
    after = read_json(workspace / "run_meta.json")
    assert after["end_time"] == int(record.end_time) and after["start_time"] == int(record.start_time)
    assert after["last_submit_time"] == int(submitted["responded_at"])


class TestGpuParameter:
    """core/server.py _validate_gpu: ids from CUDA_VISIBLE_DEVICES only; a 400 names the available ones."""

    @pytest.mark.parametrize("gpu", ["7", "a", "", "2,7", " , "])
    def test_unknown_or_malformed_gpu_is_refused_and_recorded(self, workspace, start_grader, tiny_model, gpu):
        server = start_grader(workspace, gpus=["3", "2"])
        copy_model(tiny_model, workspace / "output" / "v1")
        response = requests.post(f"{server.url}/submit", json={"model_path": "output/v1", "gpu": gpu}, timeout=60)
        body = response.json()
        assert response.status_code == 400 and body["reason"] == "invalid_gpu"
        assert "2, 3" in body["error"] and body["available_gpus"] == ["2", "3"]
        entry = list(read_jsonl(server.grader.ledger_path))[-1]
        assert entry["reason"] == "invalid_gpu" and entry["status"] == "refused"
        assert read_json(workspace / "scores.json") == []  # not a submission, as the reference

    def test_multi_gpu_request_is_evaluated_on_both(self, workspace, start_grader, tiny_model):
        server = start_grader(workspace, gpus=["2", "3"])
        perturb(copy_model(tiny_model, workspace / "output" / "v1"))
        copy_model(tiny_model, workspace / "output" / "v2")
        body = curl_json(INSTRUCTIONS_SUBMIT_MULTI_GPU, server, workspace)
        assert body["status"] == "scored" and body["gpu"] == "2,3"
        eval_log = workspace.parent / "grader" / "snapshots" / "0001" / "eval"
        assert eval_log.is_dir()
        # The default is the first available GPU; an int id is read as the reference reads it.
        default = requests.post(f"{server.url}/submit", json={"model_path": "output/v2"}, timeout=60).json()
        number = requests.post(f"{server.url}/submit", json={"model_path": "output/v2", "gpu": 3}, timeout=60).json()
        assert default["gpu"] == "2" and number["gpu"] == "3"

    def test_locks_are_taken_in_one_order(self, workspace, start_grader):
        grader = start_grader(workspace, gpus=["10", "2", "3"]).grader
        assert grader.gpu_locks.locks_for(["3", "2"]) == grader.gpu_locks.locks_for(["2", "3"])
        assert grader.gpu_locks.locks_for(["10", "2"]) == [grader.gpu_locks.locks["2"], grader.gpu_locks.locks["10"]]

    def test_cpu_grader_refuses_any_gpu_and_accepts_none(self, workspace, start_grader, tiny_model):
        server = start_grader(workspace)
        copy_model(tiny_model, workspace / "output" / "v1")
        refused = curl_json(INSTRUCTIONS_SUBMIT_GPU, server, workspace)
        assert refused["reason"] == "invalid_gpu" and refused["available_gpus"] == []
        assert 'omit "gpu"' in refused["error"]
        accepted = curl_json(INSTRUCTIONS_SUBMIT, server, workspace)
        assert accepted["status"] == "cached" and accepted["gpu"] is None
        assert requests.post(
            f"{server.url}/submit", json={"model_path": "output/v1", "gpu": None}, timeout=60
        ).json()["status"] == "cached"
