"""What a checkpoint may not carry, and what a refusal may not say (issue 25, items 3 and 8).

Over real HTTP to a live grader: LoRA adapter files beside a full model (transformers would apply
the adapter, vLLM would ignore it), tokenizer_config.json keys that name files outside the
checkpoint or ask for remote code (and auto_map in the processor configs), and refusal messages,
which quote paths only as the agent named them, never where a link leads on the grader's host.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import requests

from rlbench.grader.submission import SubmissionRefused, inspect_names
from support.grader import assert_consistent, strict_json
from support.models import copy_model


def submit(server, model_path: str) -> requests.Response:
    return requests.post(f"{server.url}/submit", json={"model_path": model_path}, timeout=300)


def refused(response: requests.Response, status: int, reason: str) -> dict:
    body = strict_json(response.content)
    assert response.status_code == status, body
    assert body["reason"] == reason and body["error"], body
    return body


def evaluations_run(server) -> int:
    return len(list(server.grader.snapshots.glob("*/eval/result.json")))


# -- item 3: LoRA adapter files in a full checkpoint -------------------------------------------------
def save_lora_adapter(model_dir: Path, into: Path) -> None:
    """A real (non-zero) LoRA adapter of model_dir, saved by peft into `into`: adapter_config.json
    and adapter_model.safetensors, as an agent that trains with peft and forgets to merge has."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(model_dir)
    lora = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    lora.save_pretrained(into)


@pytest.mark.parametrize(
    "kept",
    [
        ("adapter_config.json", "adapter_model.safetensors"),
        ("adapter_config.json",),
        ("adapter_model.safetensors",),
    ],
    ids=["config-and-weights", "config-only", "weights-only"],
)
def test_adapter_files_beside_a_full_model_are_refused(workspace, start_grader, tiny_model, tmp_path, kept):
    """transformers' from_pretrained applies the adapter of a directory that holds config.json and
    adapter_config.json (vLLM ignores it): the score would depend on the backend. Any adapter file
    is refused, before an evaluation, with the merge advice."""
    server = start_grader(workspace)
    model = copy_model(tiny_model, workspace / "output" / "v1")
    save_lora_adapter(tiny_model, tmp_path / "adapter")
    for name in kept:
        shutil.copyfile(tmp_path / "adapter" / name, model / name)
    body = refused(submit(server, "output/v1"), 422, "lora_adapter")
    assert "merge_and_unload" in body["error"] and "save_pretrained" in body["error"]
    assert all(name in body["error"] for name in kept), body["error"]
    assert evaluations_run(server) == 0
    assert_consistent(server)


@pytest.mark.parametrize(
    "adapter",
    [
        "adapter_config.json",
        "adapter_model.safetensors",
        "adapter_model.bin",
        "adapter_model-00001-of-00002.safetensors",
    ],
)
def test_inspect_names_refuses_any_adapter_file(adapter):
    names = ["config.json", "model.safetensors", "tokenizer.json", adapter]
    with pytest.raises(SubmissionRefused) as caught:
        inspect_names(names)
    assert caught.value.reason == "lora_adapter" and "merge" in caught.value.message


def test_inspect_names_accepts_a_full_model():
    inspect_names(["config.json", "model.safetensors", "tokenizer.json", "adapter_notes.txt"])


# -- item 8a: refusals quote paths as the agent named them ----------------------------------------
def host_paths(server, outside: Path) -> list[str]:
    """Paths of the grader's host that no refusal may quote: the workspace's real location, the
    grader's directory, and a directory outside the workspace that a link leads to."""
    workspace = server.grader.config.workspace
    return [
        os.path.realpath(workspace),
        str(workspace),
        os.path.realpath(server.grader.config.grader_dir),
        os.path.realpath(outside),
        outside.name,
    ]


@pytest.mark.parametrize("how", ["link", "link-below", "dotdot"])
def test_outside_workspace_refusal_quotes_no_host_path(workspace, start_grader, tiny_model, tmp_path, how):
    """A link out of the workspace (to where other runs' results live, say): the refusal names the
    model_path as sent, and never where it resolves to on the host, nor the workspace's location."""
    server = start_grader(workspace)
    outside = tmp_path / "other-run-results-7f3a"
    copy_model(tiny_model, outside)
    if how == "link":
        (workspace / "output").mkdir(exist_ok=True)
        (workspace / "output" / "best").symlink_to(outside, target_is_directory=True)
        model_path = "output/best"
    elif how == "link-below":  # a link through a directory: output/hop -> outside's parent
        (workspace / "output").mkdir(exist_ok=True)
        (workspace / "output" / "hop").symlink_to(outside.parent, target_is_directory=True)
        model_path = f"output/hop/{outside.name}"
    else:
        model_path = os.path.relpath(outside, workspace)
    body = refused(submit(server, model_path), 403, "outside_workspace")
    error = body["error"]
    assert model_path in error
    leaks = [p for p in host_paths(server, outside) if p in error and p not in model_path]
    assert not leaks, f"refusal quotes host paths {leaks}: {error}"
    assert "output/v1" in error  # says what to send instead
    assert_consistent(server)


def test_directory_named_like_an_index_quotes_no_grader_path(workspace, start_grader, tiny_model, tmp_path):
    """A directory named like a shard index is copied into the grader's snapshot with the rest (it is
    no index: transformers reads only a file of that name). Whatever the answer, it never quotes the
    path of the grader's copy (it did: "Is a directory: '/.../grader/snapshots/0001/model/...'")."""
    server = start_grader(workspace)
    model = copy_model(tiny_model, workspace / "output" / "v1")
    (model / "model.safetensors.index.json").mkdir()
    (model / "model.safetensors.index.json" / "inner.json").write_text("{}")
    response = submit(server, "output/v1")
    leaks = [p for p in host_paths(server, tmp_path) if p in response.text]
    assert not leaks and "snapshots" not in response.text, response.text
    assert response.status_code == 200 and response.json()["status"] == "scored", response.text
    assert_consistent(server)


# -- item 8c: tokenizer_config.json and the processor configs ---------------------------------------
@pytest.mark.parametrize(
    "key, value",
    [
        ("tokenizer_file", "/etc/elsewhere/tokenizer.json"),
        ("tokenizer_file", "../v0/tokenizer.json"),
        ("tokenizer_file", "absent.json"),
        ("vocab_file", "/etc/elsewhere/vocab.json"),
        ("merges_file", "../v0/merges.txt"),
        ("special_tokens_map_file", "/home/someone/special_tokens_map.json"),
        ("tokenizer_file", ["tokenizer.json"]),
    ],
)
def test_tokenizer_config_file_keys_must_name_checkpoint_files(workspace, start_grader, tiny_model, key, value):
    """tokenizer_config.json's *_file keys reach the tokenizer's constructor as paths (transformers
    4.x lets them override the checkpoint's own files, 5.x still reads merges_file and vocab_file
    where tokenizer.json is missing): a plain file name of the checkpoint, or nothing."""
    server = start_grader(workspace)
    copy_model(tiny_model, workspace / "output" / "v0")
    model = copy_model(tiny_model, workspace / "output" / "v1")
    config = json.loads((model / "tokenizer_config.json").read_text())
    config[key] = value
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    body = refused(submit(server, "output/v1"), 422, "bad_file_reference")
    assert f"tokenizer_config.json's {key}" in body["error"] and "save_pretrained" in body["error"]
    assert evaluations_run(server) == 0
    assert_consistent(server)


def test_tokenizer_config_naming_its_own_files_is_scored(workspace, start_grader, tiny_model):
    """The check refuses escapes only: tokenizer_file naming the checkpoint's own tokenizer.json, and
    a null vocab_file, load as before."""
    server = start_grader(workspace)
    model = copy_model(tiny_model, workspace / "output" / "v1")
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.update(tokenizer_file="tokenizer.json", vocab_file=None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    response = submit(server, "output/v1")
    assert response.status_code == 200 and response.json()["status"] in ("scored", "cached"), response.text
    assert_consistent(server)


@pytest.mark.parametrize(
    "file, change",
    [
        ("tokenizer_config.json", {"auto_map": {"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}}),
        ("tokenizer_config.json", {"auto_map": ["tokenization_evil.EvilTokenizer", None]}),
        ("tokenizer_config.json", {"trust_remote_code": True}),
        ("processor_config.json", {"auto_map": {"AutoProcessor": "processing_evil.EvilProcessor"}}),
        ("preprocessor_config.json", {"auto_map": {"AutoImageProcessor": "image_evil.EvilProcessor"}}),
    ],
)
def test_remote_code_in_tokenizer_and_processor_configs_is_refused(workspace, start_grader, tiny_model, file, change):
    """auto_map names classes in the checkpoint's own Python files: refused as config.json's is,
    whichever loader config asks for it."""
    server = start_grader(workspace)
    model = copy_model(tiny_model, workspace / "output" / "v1")
    path = model / file
    data = json.loads(path.read_text()) if path.exists() else {}
    data.update(change)
    path.write_text(json.dumps(data))
    (model / "tokenization_evil.py").write_text("raise SystemExit('remote code ran')\n")
    body = refused(submit(server, "output/v1"), 422, "remote_code")
    assert file in body["error"]
    assert evaluations_run(server) == 0
    assert_consistent(server)
