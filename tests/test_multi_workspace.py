"""A multi-task run's workspace (rlbench.agent_run.workspace.replace_multi_workspace): one folder per task with its
training split and task files, never a held-out row; its description and instructions; rebuilt the same from its
manifest; the agent's variables; and the reference agent of the mode (multi_sft_agent.py): its client's "task" and
the training rows it builds from every single-turn task."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from rlbench.agent_run.attempts import begin_attempt
from rlbench.agent_run.environment import agent_env
from rlbench.agent_run.workspace import (
    FEEDBACK_SPLIT_NOTE,
    MODE_RULES,
    readonly_parts,
    rebuild_workspace,
    replace_multi_workspace,
    unshare_readonly_files,
)
from rlbench.fileio.jsonio import read_jsonl, sha256_file
from rlbench.tasks import get_task
from support.runs import spec_for
from support.settings import ADDITION, GSM8K_SETTINGS, TEST_SALT, TINY_SPEC

REPO = Path(__file__).resolve().parents[1]
AGENTS = REPO / "scripts" / "agents"
HF_ID = TINY_SPEC["hf_id"]
DEEPSEARCHQA = {
    "name": "deepsearchqa",
    "level": "L3",
    "module": "deepsearchqa",
    "source": "offline",
    "metric": "accuracy",
    "train_size": 6,
    "eval_size": 6,
    "data_seed": 0,
    "kb_size": 40,
    "environment": {"max_steps": 6},
    "judge": {"backend": "match", "model": "string-match"},
    "search": {"provider": "auto", "max_results": 3, "timeout_s": 10},
}
SETTINGS = [GSM8K_SETTINGS, ADDITION, DEEPSEARCHQA]  # the run's order
NAMES = [s["name"] for s in SETTINGS]
SINGLE_TURN = ["gsm8k", "addition-control"]  # deepsearchqa plays ReAct episodes: no format_target
# sha256 of a single-task instructions.md for HF_ID in mode free, full feedback: the reference's text, which the
# multi-task mode must leave byte for byte as it was. Change it only with a deliberate change of that text.
SINGLE_INSTRUCTIONS_SHA256 = "41ed9bf9634133b8bf20955a898128f8016ac443a5b0ab83d832b4d3d47409ca"


@pytest.fixture(scope="module")
def splits(tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """Each task's training and held-out split, built from the repository's own data (offline)."""
    root = tmp_path_factory.mktemp("splits")
    out = {}
    for settings in SETTINGS:
        task, train, held_out = get_task(settings), root / settings["name"] / "train", root / settings["name"] / "eval"
        if settings["name"] == "deepsearchqa":  # its splits come from the generate_games rule's output
            built = {split: root / "games" / split for split in ("train", "heldout")}
            for split, folder in built.items():
                task.build_games(settings, split, folder, salt=TEST_SALT)
            task.prepare_train(settings, train, sources={"train_games": built["train"]})
            task.prepare_eval(settings, train, held_out, salt=TEST_SALT, sources={"heldout_games": built["heldout"]})
        else:
            task.prepare(settings, train, held_out, salt=TEST_SALT)
        out[settings["name"]] = (train, held_out)
    return out


def members(splits, settings_list=SETTINGS):
    return [(get_task(s), s, splits[s["name"]][0]) for s in settings_list]


@pytest.fixture(scope="module")
def multi(tmp_path_factory, splits, tiny_model) -> tuple[Path, dict]:
    run_dir = tmp_path_factory.mktemp("multi") / "run"
    manifest, archived = replace_multi_workspace(run_dir, members(splits), tiny_model, HF_ID)
    assert archived is None
    return run_dir / "workspace", manifest


def hashes(workspace: Path) -> dict[str, str]:
    return {str(p.relative_to(workspace)): sha256_file(p) for p in sorted(workspace.rglob("*")) if p.is_file()}


def test_layout_one_folder_per_task_one_model_one_output(multi, splits, tiny_model):
    workspace, manifest = multi
    assert sorted(p.name for p in workspace.iterdir()) == ["code", "description.md", "instructions.md", "models",
                                                            "output", "tasks"]  # fmt: skip
    assert sorted(p.name for p in (workspace / "tasks").iterdir()) == sorted(NAMES)
    model = workspace / "models" / HF_ID
    assert sorted(p.name for p in model.rglob("*")) == sorted(p.name for p in tiny_model.rglob("*"))
    for settings in SETTINGS:
        folder, task = workspace / "tasks" / settings["name"], get_task(settings)
        train = splits[settings["name"]][0]
        assert {p.relative_to(folder / "data") for p in (folder / "data").rglob("*")} == {
            p.relative_to(train) for p in train.rglob("*")
        }
        for path in (folder / "data").rglob("*"):
            assert path.read_bytes() == (train / path.relative_to(folder / "data")).read_bytes()
            assert not path.stat().st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
        assert (folder / "description.md").read_text() == task.description(settings)
        exposed = task.exposed_files(settings)
        assert "task.py" in exposed
        for name, source in exposed.items():
            expected = source if isinstance(source, bytes) else Path(source).read_bytes()
            assert (folder / name).read_bytes() == expected
    assert (workspace / "tasks" / "gsm8k" / "task_protocol.json").is_file()  # what gsm8k's task.py reads beside it
    assert manifest["tasks"] == NAMES
    assert manifest["model"] == f"models/{HF_ID}" and manifest["mode"] == "free"
    assert manifest["workspace"] == str(workspace)
    assert manifest["files"] == hashes(workspace)
    assert [m["task_settings"]["name"] for m in manifest["build"]["members"]] == NAMES
    assert [m["train_dir"] for m in manifest["build"]["members"]] == [str(splits[n][0]) for n in NAMES]
    assert json.loads(json.dumps(manifest)) == manifest  # written as workspace.json
    assert readonly_parts(workspace) == [workspace / "models", *(workspace / "tasks" / n / "data" for n in sorted(NAMES))]


def test_no_held_out_row_anywhere_in_the_workspace(multi, splits):
    workspace, manifest = multi
    texts = [p.read_bytes().decode("utf-8", "replace") for p in workspace.rglob("*")
             if p.is_file() and "models" not in p.relative_to(workspace).parts]  # fmt: skip
    held_out_files = {sha256_file(p) for _, held_out in splits.values() for p in held_out.rglob("*.jsonl")}
    shared_kb = sha256_file(splits["deepsearchqa"][0] / "kb.jsonl")  # the search corpus both splits search
    assert not (held_out_files - {shared_kb}) & set(manifest["files"].values())
    for name, (_, held_out) in splits.items():
        rows = read_jsonl(held_out / "eval.jsonl")
        assert rows
        for row in rows:
            longest = max((v for v in row.values() if isinstance(v, str)), key=len)
            assert len(longest) >= 10, row
            assert not any(longest in text for text in texts), f"{name}: a held-out row is in the workspace"


def test_description_lists_every_task_and_the_one_model_goal(multi):
    workspace, _ = multi
    text = (workspace / "description.md").read_text()
    for settings in SETTINGS:
        assert f"| {settings['name']} | {settings['level']} | `tasks/{settings['name']}/`" in text
    assert "ONE model" in text and "mean" in text and "held-out" in text
    assert "`task_protocol.json`" in text  # gsm8k's own files are listed


def test_instructions_say_how_to_submit_to_every_task(multi):
    workspace, _ = multi
    text = (workspace / "instructions.md").read_text()
    assert '"task": "all"' in text and "unknown_task" in text and "TASKS" in text and "`tasks/<task>/`" in text
    assert "`summary`" in text and '"statistic": "mean"' in text
    assert f"`models/{HF_ID}/`" in text
    assert "- `data/` — the training split" not in text  # the single-task layout's line
    assert FEEDBACK_SPLIT_NOTE not in text


def test_single_task_instructions_are_the_references_byte_for_byte(workspace):
    text = (workspace / "instructions.md").read_bytes()
    assert hashlib.sha256(text).hexdigest() == SINGLE_INSTRUCTIONS_SHA256
    assert not (workspace / "tasks").exists() and (workspace / "task.py").is_file()


def test_split_scoring_mode_rules_and_a_private_copy_of_the_splits(tmp_path, splits, tiny_model):
    split = {**ADDITION, "scoring": {"feedback": "split", "final_share": 0.5}}
    run_dir = tmp_path / "run"
    manifest, _ = replace_multi_workspace(run_dir, members(splits, [GSM8K_SETTINGS, split]), tiny_model, HF_ID,
                                          mode="sft-only")  # fmt: skip
    workspace = run_dir / "workspace"
    text = (workspace / "instructions.md").read_text()
    assert FEEDBACK_SPLIT_NOTE in text and text.endswith(MODE_RULES["sft-only"])
    assert manifest["tasks"] == ["gsm8k", "addition-control"] and manifest["mode"] == "sft-only"
    data = [p for n in manifest["tasks"] for p in (workspace / "tasks" / n / "data").rglob("*") if p.is_file()]
    assert data and all(p.stat().st_nlink >= 2 for p in data)  # hard links to the results' splits
    assert unshare_readonly_files(workspace) >= len(data)
    assert all(p.stat().st_nlink == 1 for p in data)
    assert hashes(workspace) == manifest["files"]


def test_a_task_named_twice_or_no_task_is_refused(tmp_path, splits, tiny_model):
    with pytest.raises(ValueError, match="named twice"):
        replace_multi_workspace(tmp_path / "a", members(splits, [ADDITION, ADDITION]), tiny_model, HF_ID)
    with pytest.raises(ValueError, match="at least one task"):
        replace_multi_workspace(tmp_path / "b", [], tiny_model, HF_ID)
    assert not (tmp_path / "a" / "workspace").exists()


def test_rebuild_from_the_manifest_gives_the_same_workspace(tmp_path, splits, tiny_model):
    run_dir = tmp_path / "run"
    manifest, _ = replace_multi_workspace(run_dir, members(splits), tiny_model, HF_ID)
    workspace = run_dir / "workspace"
    (workspace / "code" / "mine.py").write_text("print('attempt 1')\n")
    begin_attempt(run_dir, f"test-{uuid.uuid4().hex}")  # an interrupted first attempt, archived by the rebuild
    archived = rebuild_workspace(json.loads(json.dumps(manifest)))
    assert archived is not None and (archived / "workspace" / "code" / "mine.py").is_file()
    assert hashes(workspace) == manifest["files"]


def test_agent_env_of_a_multi_task_run(multi, tiny_model, splits, workspace, gsm8k_data):
    multi_ws, _ = multi
    member = {"eval_dir": None, "baseline": {}, "resources": {}, "partition": None}
    spec = spec_for(multi_ws, tiny_model, gsm8k_data, ["true"], task_settings={"name": "multi", "tasks": {}},
                    members={name: {**member, "task_settings": s} for name, s in zip(NAMES, SETTINGS)})  # fmt: skip
    env = agent_env(spec, "http://127.0.0.1:1/secret", "marker")
    assert env["TASK"] == "multi" and env["TASKS"] == ",".join(NAMES)
    assert env["DATA_PATH"] == str(multi_ws.resolve() / "tasks")
    assert env["MODEL_PATH"] == str(multi_ws.resolve() / "models" / HF_ID)
    single = agent_env(spec_for(workspace, tiny_model, gsm8k_data, ["true"]), "http://127.0.0.1:1/secret", "marker")
    assert single["TASK"] == "gsm8k" and "TASKS" not in single
    assert single["DATA_PATH"] == str(workspace.resolve() / "data")


def _agent_script(script: str, workspace: Path, **env) -> subprocess.CompletedProcess:
    root = workspace.resolve()
    full = {
        **os.environ,
        "WORKSPACE": str(root),
        "MODEL_PATH": str(root / "models" / HF_ID),
        "OUTPUT_DIR": str(root / "output"),
        "PYTHONPATH": str(AGENTS),
        **env,
    }
    return subprocess.run([sys.executable, "-c", script], env=full, cwd=root, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_multi_sft_agent_trains_on_every_single_turn_task(multi, tmp_path):
    workspace, _ = multi
    script = (
        "import json\n"
        "from datasets import Dataset\n"
        "from agent_env import TASKS, load_task_at, task_dir\n"
        "from multi_sft_agent import training_rows\n"
        "rows, skipped = training_rows(TASKS, 5, 0)\n"
        "Dataset.from_list([{'prompt': r['prompt'], 'completion': r['completion']} for r in rows])\n"
        "gsm8k = load_task_at(task_dir('gsm8k'))\n"
        "print(json.dumps({'rows': rows, 'skipped': skipped, 'module': gsm8k.__name__,\n"
        "                  'protocol': len(gsm8k.load_protocol()['rounds'])}))\n"
    )
    # The agent's own workspace elsewhere: it copies its code to code/agent/, and the shared one stays as built.
    proc = _agent_script(script, tmp_path, DATA_PATH=str(workspace.resolve() / "tasks"), TASKS=",".join(NAMES))
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    rows, skipped = out["rows"], out["skipped"]
    assert list(skipped) == ["deepsearchqa"] and "format_prompt" in skipped["deepsearchqa"]
    assert [r["task"] for r in rows] == SINGLE_TURN * 5  # round-robin, 5 rows of each
    for row in rows:
        assert row["prompt"] and all(m["content"] for m in row["prompt"])
        assert row["completion"][0]["role"] == "assistant" and row["completion"][0]["content"].strip()
    assert out["module"] == "task_gsm8k" and out["protocol"] > 1  # its protocol, read from beside its task.py
    assert (tmp_path / "code" / "agent" / "agent_env.py").is_file()
