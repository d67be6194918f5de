"""The grading server over real HTTP: refusals, caching, ledger and the agent-visible files."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time

import pytest
import requests

from rlbench.fileio.jsonio import read_json, read_jsonl
from support.models import copy_model, perturb


def submit(server, body, **kwargs) -> requests.Response:
    return requests.post(f"{server.url}/submit", json=body, timeout=120, **kwargs)


def ledger(server) -> list[dict]:
    return list(read_jsonl(server.grader.ledger_path))


def assert_refused(response, status: int, reason: str, server) -> dict:
    body = response.json()
    assert response.status_code == status, body
    assert body["reason"] == reason
    assert body["error"]
    # As the reference: a submission that could not be scored scores 0.0 (not null).
    assert body["score"] == 0.0 and body["improvement"] == body["score"] - body["baseline_score"]
    assert ledger(server)[-1]["reason"] == reason  # every refusal is recorded
    return body


def test_untouched_base_model_scores_baseline_without_evaluation(workspace, start_grader, tiny_model):
    server = start_grader(workspace)
    copy_model(tiny_model, workspace / "output" / "v1")
    response = submit(server, {"model_path": "output/v1"})
    body = response.json()
    assert response.status_code == 200, body
    assert body["cached"] is True and body["score"] == 0.0 and body["improvement"] == 0.0
    assert body["best"]["submission_id"] == 1 and body["total_submissions"] == 1
    assert not (workspace.parent / "grader" / "snapshots" / "0001" / "eval").exists()


def test_changed_weights_are_evaluated_once_then_cached(workspace, start_grader, tiny_model):
    server = start_grader(workspace)
    perturb(copy_model(tiny_model, workspace / "output" / "v1"))
    copy_model(workspace / "output" / "v1", workspace / "output" / "v2")
    first = submit(server, {"model_path": "output/v1"}).json()
    assert first["status"] == "scored" and first["cached"] is False
    assert 0.0 <= first["score"] <= 100.0 and first["n"] == 4
    second = submit(server, {"model_path": str(workspace / "output" / "v2")}).json()  # absolute path
    assert second["status"] == "cached" and second["score"] == first["score"]
    entries = ledger(server)
    assert [e["submission_id"] for e in entries] == [1, 2]
    assert entries[0]["fingerprint"] == entries[1]["fingerprint"]
    assert (workspace.parent / "grader" / "best_model" / "model.safetensors").exists()
    scores = read_json(workspace / "scores.json")  # the reference's format: a list of submissions
    assert [s["submission_id"] for s in scores] == [1, 2]
    # The reference's last_submit_time: int unix seconds of the last recorded submission.
    assert read_json(workspace / "run_meta.json")["last_submit_time"] == int(entries[1]["responded_at"])


def test_resubmitting_an_unchanged_path_repeats_its_result_and_is_not_a_new_submission(
    workspace, start_grader, tiny_model
):
    # The reference's cache answers the same path with unchanged weights from memory and records
    # nothing; the same weights under a new path are a new submission there (and here).
    server = start_grader(workspace)
    copy_model(tiny_model, workspace / "output" / "v1")
    first = submit(server, {"model_path": "output/v1"}).json()
    again = submit(server, {"model_path": "./output/v1/"}).json()
    assert again["status"] == "cached" and again["repeat_of"] == 1 and again["score"] == first["score"]
    copy_model(tiny_model, workspace / "output" / "v2")
    other = submit(server, {"model_path": "output/v2"}).json()
    assert other.get("repeat_of") is None and other["total_submissions"] == 2
    assert [e["submission_id"] for e in ledger(server)] == [1, 2, 3]
    assert [s["submission_id"] for s in read_json(workspace / "scores.json")] == [1, 3]


def test_curl_as_reference_agents_send_it_is_accepted(workspace, start_grader, tiny_model):
    if shutil.which("curl") is None:
        pytest.skip("curl is not installed")
    server = start_grader(workspace)
    copy_model(tiny_model, workspace / "output" / "v1")
    env = dict(os.environ, GRADING_SERVER_URL=server.url, OUTPUT_DIR=str(workspace / "output"))
    out = subprocess.run(
        ["bash", "-c", 'curl -s -X POST "$GRADING_SERVER_URL/submit" -d \'{"model_path": "\'$OUTPUT_DIR\'/v1"}\''],
        env=env, capture_output=True, text=True, check=True,
    )
    assert json.loads(out.stdout)["score"] == 0.0


def test_submit_outside_workspace_is_refused(workspace, start_grader, tiny_model):
    server = start_grader(workspace)
    assert_refused(submit(server, {"model_path": str(tiny_model)}), 403, "outside_workspace", server)
    assert_refused(submit(server, {"model_path": "../grader"}), 403, "outside_workspace", server)


def test_symlink_out_of_workspace_is_refused(workspace, start_grader, tiny_model):
    server = start_grader(workspace)
    (workspace / "output" / "link").symlink_to(tiny_model, target_is_directory=True)
    assert_refused(submit(server, {"model_path": "output/link"}), 403, "outside_workspace", server)
    inner = copy_model(tiny_model, workspace / "output" / "v1")
    (inner / "model.safetensors").unlink()
    (inner / "model.safetensors").symlink_to(tiny_model / "model.safetensors")
    assert_refused(submit(server, {"model_path": "output/v1"}), 403, "outside_workspace", server)


def test_missing_path_is_refused(workspace, start_grader):
    server = start_grader(workspace)
    assert_refused(submit(server, {"model_path": "output/nope"}), 404, "missing_path", server)


def test_lora_adapter_is_refused_with_merge_advice(workspace, start_grader):
    server = start_grader(workspace)
    adapter = workspace / "output" / "adapter"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    (adapter / "adapter_model.safetensors").write_bytes(b"")
    body = assert_refused(submit(server, {"model_path": "output/adapter"}), 422, "lora_adapter", server)
    assert "merge" in body["error"]


def test_pickle_weights_are_refused(workspace, start_grader, tiny_model):
    server = start_grader(workspace)
    model = copy_model(tiny_model, workspace / "output" / "v1")
    (model / "pytorch_model.bin").write_bytes(b"not loaded")
    body = assert_refused(submit(server, {"model_path": "output/v1"}), 422, "pickle_weights", server)
    assert "safetensors" in body["error"]


def test_remote_code_config_is_refused(workspace, start_grader, tiny_model):
    server = start_grader(workspace)
    model = copy_model(tiny_model, workspace / "output" / "v1")
    config = json.loads((model / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_evil.EvilModel"}
    (model / "config.json").write_text(json.dumps(config))
    assert_refused(submit(server, {"model_path": "output/v1"}), 422, "remote_code", server)


def test_submission_after_deadline_is_refused(workspace, start_grader, tiny_model):
    server = start_grader(workspace, timeout_s=1, start_time=time.time() - 10)
    copy_model(tiny_model, workspace / "output" / "v1")
    assert_refused(submit(server, {"model_path": "output/v1"}), 403, "deadline_passed", server)


def test_malformed_requests_are_refused_and_recorded(workspace, start_grader):
    server = start_grader(workspace)
    response = requests.post(f"{server.url}/submit", data=b"{not json", timeout=30)
    assert_refused(response, 400, "malformed_request", server)
    assert_refused(submit(server, {"path": "output/v1"}), 400, "malformed_request", server)


def test_unknown_secret_is_not_found(workspace, start_grader):
    server = start_grader(workspace)
    base = server.url.rsplit("/", 1)[0]
    assert requests.get(f"{base}/wrong-secret/health", timeout=30).status_code == 404
    assert requests.post(f"{base}/wrong-secret/submit", json={"model_path": "x"}, timeout=30).status_code == 404
    assert ledger(server) == []


def test_time_and_health_endpoints(workspace, start_grader):
    server = start_grader(workspace, timeout_s=100)
    info = requests.get(f"{server.url}/time", timeout=30).json()
    assert set(info) == {"start_time", "timeout_s", "last_submit_time", "end_time", "deadline", "now", "remaining"}
    # end_time is the run's actual end, null while it goes on; the deadline is our own field.
    assert 0 < info["remaining"] <= 100 and info["end_time"] is None
    assert info["deadline"] == server.grader.config.start_time + 100
    health = requests.get(f"{server.url}/health", timeout=30).json()
    assert health["status"] == "ok" and health["task"] == "gsm8k"


def test_broken_checkpoint_is_recorded_as_failed_and_not_cached(workspace, start_grader, tiny_model):
    server = start_grader(workspace)
    model = copy_model(tiny_model, workspace / "output" / "v1")
    (model / "model.safetensors").write_bytes(b"garbage")
    first = submit(server, {"model_path": "output/v1"})
    assert first.status_code == 422 and first.json()["reason"] == "evaluation_failed"
    second = submit(server, {"model_path": "output/v1"})
    assert second.json()["reason"] == "evaluation_failed"  # retried, not served from a cache
    assert second.json()["score"] == 0.0 and second.json()["error"]
    assert [e["status"] for e in ledger(server)] == ["failed", "failed"]
