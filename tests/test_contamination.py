"""The contamination scan of a run (rlbench.integrity.contamination): held-out items planted in an agent's
file, a code revision or its driver's output are found there, and nothing else is: not a clean run, not
the same template with other numbers, not short items, not a disjoint training split."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from rlbench.fileio.jsonio import read_jsonl, sha256_file, write_jsonl
from rlbench.integrity import contamination
from rlbench.integrity.contamination import Index, item_texts, scan_run, scan_training_split, words
from rlbench.recording.repository import CodeRepository
from rlbench.tasks import get_task
from support.settings import GSM8K_SETTINGS, REPO, TEST_SALT


@pytest.fixture(scope="module")
def gsm8k_rows(tmp_path_factory) -> tuple[list[dict], list[dict]]:
    """A realistic offline GSM8K split (reasoning_gym's gsm_symbolic: templates shared between the
    splits with other numbers and names)."""
    root = tmp_path_factory.mktemp("gsm8k-contamination")
    settings = {**GSM8K_SETTINGS, "train_size": 300, "eval_size": 60}
    get_task(settings).prepare(settings, root / "train", root / "eval", salt=TEST_SALT)
    return list(read_jsonl(root / "eval" / "eval.jsonl")), list(read_jsonl(root / "train" / "train.jsonl"))


@pytest.fixture(scope="module")
def gsm8k_split_twins(gsm8k_rows) -> list[dict]:
    """What the training split check finds in the offline split: held-out items whose training twin
    differs only by a name (gsm_symbolic draws the same numbers now and then)."""
    held_out, train = gsm8k_rows
    return scan_training_split(Index(held_out), train, 0.8)["flagged"]


@pytest.fixture(scope="module")
def disjoint_rows(gsm8k_rows, gsm8k_split_twins) -> tuple[list[dict], list[dict]]:
    held_out, train = gsm8k_rows
    twins = {m["item"] for m in gsm8k_split_twins}
    return [r for r in held_out if r["id"] not in twins], train


@pytest.fixture(scope="module")
def addition_rows(tmp_path_factory) -> tuple[list[dict], list[dict]]:
    root = tmp_path_factory.mktemp("addition-contamination")
    settings = yaml.safe_load((REPO / "config" / "tasks" / "addition-control.yaml").read_text())
    settings.update(train_size=500, eval_size=100)
    get_task(settings).prepare(settings, root / "train", root / "eval", salt=TEST_SALT)
    return list(read_jsonl(root / "eval" / "eval.jsonl")), list(read_jsonl(root / "train" / "train.jsonl"))


def make_run(tmp_path: Path, train: list[dict]) -> Path:
    """A run directory as the benchmark leaves it: the workspace with its given files recorded in
    workspace.json."""
    run = tmp_path / "run"
    ws = run / "workspace"
    (ws / "data").mkdir(parents=True)
    (ws / "code").mkdir()
    (ws / "output").mkdir()
    write_jsonl(ws / "data" / "train.jsonl", train)
    (ws / "task.py").write_text("def reward(completion, answer):\n    return float(completion == answer)\n")
    (ws / "description.md").write_text("Solve grade school maths problems.\n")
    files = {p.relative_to(ws).as_posix(): sha256_file(p) for p in ws.rglob("*") if p.is_file()}
    (run / "workspace.json").write_text(json.dumps({"workspace": str(ws), "files": files}))
    return run


def sft_rows(train: list[dict]) -> list[dict]:
    return [{"prompt": r["question"], "completion": r["answer"]} for r in train]


def commit_code(run: Path, files: dict[str, str], n: int) -> str:
    tree = run.parent / f"snapshot-{n}"
    for rel, text in files.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text)
    return CodeRepository(run / "grader" / "code.git").commit(tree, f"submission {n}", 1_700_000_000 + n)


def transcript_record(call_id: str, content: str | None = None, arguments: dict | None = None) -> dict:
    message = {"role": "assistant", "content": content}
    tool_calls = None
    if arguments is not None:
        tool_calls = [{"id": "t1", "type": "function", "function": {"name": "write", "arguments": json.dumps(arguments)}}]
    return {
        "ts": 1.0,
        "call_id": call_id,
        "ok": True,
        "route": "/v1/chat/completions",
        "call_type": "acompletion",
        "model_group": "driver",
        "request": {"messages": [{"role": "user", "content": "go on"}]},
        "response": {"content": message["content"], "tool_calls": tool_calls, "finish_reason": "stop"},
    }


def other_numbers(text: str) -> str:
    """The same template with other numbers."""
    return re.sub(r"\d+", lambda m: str(int(m.group()) + 7), text)


def test_five_planted_items_are_found_in_the_file_and_the_code_revision(tmp_path, disjoint_rows):
    held_out, train = disjoint_rows
    run = make_run(tmp_path, train)
    planted = [held_out[i] for i in (3, 11, 17, 29, 41)]
    rows = sft_rows(train[:100]) + sft_rows(planted) + sft_rows(train[100:150])
    leaked = "\n".join(json.dumps(r) for r in rows) + "\n"
    clean_code = "import json\nrows = [json.loads(l) for l in open('data/train.jsonl')]\n"
    first = commit_code(run, {"train.py": clean_code}, 1)
    second = commit_code(run, {"train.py": clean_code, "data/sft.jsonl": leaked}, 2)
    (run / "workspace" / "code" / "train.py").write_text(clean_code)
    (run / "workspace" / "code" / "data").mkdir()
    (run / "workspace" / "code" / "data" / "sft.jsonl").write_text(leaked)

    started = time.monotonic()
    report = scan_run(run, held_out, train)
    assert time.monotonic() - started < 5
    assert json.loads(json.dumps(report)) == report
    assert report["method"] == contamination.METHOD and report["threshold"] == 0.8
    assert [m["item"] for m in report["flagged"]] == sorted(r["id"] for r in planted)
    for match in report["flagged"]:
        assert match["score"] >= 0.8 and match["long_match"] and match["signals"] == ["idf", "long"]
        assert match["where"] == {"kind": "code_revision", "revision": second, "submission": 2, "path": "data/sft.jsonl"}
        assert {"kind": "workspace_file", "path": "code/data/sft.jsonl"} in match["places"]
        assert not match["in_training_split"]
    assert all(p.get("revision") != first for m in report["flagged"] for p in m["places"])
    assert report["sources"]["code_revisions"] == 2
    assert report["sources"]["workspace_given"] == 3  # data/train.jsonl, task.py, description.md: the benchmark's
    assert report["training_split"]["flagged"] == []
    assert report["strongest"][0]["score"] == 1.0


def test_a_transcript_reciting_an_item_is_flagged_with_its_turn(tmp_path, disjoint_rows):
    held_out, train = disjoint_rows
    run = make_run(tmp_path, train)
    item = held_out[7]
    records = [
        transcript_record("c0", content="Let me look at the data first."),
        transcript_record("c1", arguments={"command": "head -3 data/train.jsonl"}),
        transcript_record("c2", content="I will add this example:", arguments={"path": "code/x.py", "content": f"Q = {item['question']!r}\nA = {item['answer']!r}\n"}),
        transcript_record("c3", content=other_numbers(held_out[8]["question"])),
    ]
    (run / "gateway").mkdir()
    write_jsonl(run / "gateway" / "transcript.jsonl", records)
    report = scan_run(run, held_out, train)
    assert [m["item"] for m in report["flagged"]] == [item["id"]]
    assert report["flagged"][0]["where"] == {"kind": "transcript", "path": "gateway/transcript.jsonl", "turn": 2, "call_id": "c2"}
    assert report["sources"]["transcripts"] == 1 and report["sources"]["transcript_turns"] == 4


def test_a_clean_run_and_near_misses_flag_nothing(tmp_path, disjoint_rows):
    held_out, train = disjoint_rows
    run = make_run(tmp_path, train)
    # The agent's own data: the training split reformatted, and every held-out item's template with
    # other numbers, and text sharing common words with every item.
    twins = [{"prompt": other_numbers(r["question"]), "completion": other_numbers(r["answer"])} for r in held_out]
    chatter = "\n".join(" ".join(words(r["question"])[:4]) + " and then how many does she have left" for r in held_out)
    files = {
        "sft.jsonl": "\n".join(json.dumps(r) for r in sft_rows(train) + twins) + "\n",
        "notes.md": chatter,
        "train.py": "PROMPT = 'Give the result as your final answer. Do not include units.'\n",
    }
    commit_code(run, files, 1)
    for rel, text in files.items():
        (run / "workspace" / "code" / rel).write_text(text)
    (run / "workspace" / "output" / "v1").mkdir()
    (run / "workspace" / "output" / "v1" / "model.safetensors").write_bytes(b"\0" * 1024)
    report = scan_run(run, held_out, train)
    assert report["flagged"] == []
    assert report["training_split"]["flagged"] == []
    assert all(m["score"] < 0.8 for m in report["strongest"])
    assert report["items_scanned"] == len(held_out)


def test_the_training_split_check_flags_a_planted_overlap(tmp_path, disjoint_rows):
    held_out, train = disjoint_rows
    run = make_run(tmp_path, train)
    leaked = [{**held_out[5], "id": "train-x"}, {**held_out[6], "id": "train-y"}]
    report = scan_run(run, held_out, train[:200] + leaked + train[200:])
    split = report["training_split"]
    assert split["rows"] == len(train) + 2
    assert [m["item"] for m in split["flagged"]] == sorted([held_out[5]["id"], held_out[6]["id"]])
    assert {m["where"]["row"] for m in split["flagged"]} == {"train-x", "train-y"}
    # The workspace's data/train.jsonl is the benchmark's (unchanged): the agent is not blamed.
    assert report["flagged"] == []


def test_the_offline_splits_name_twins_are_real_duplicates(gsm8k_rows, gsm8k_split_twins):
    """The split check's findings on the offline GSM8K twin are items whose training twin has the same
    numbers and the same answer (another name): the same problem, rightly reported."""
    held_out, train = gsm8k_rows
    by_id = {r["id"]: r for r in held_out + train}
    assert len(gsm8k_split_twins) <= len(held_out) // 10
    for match in gsm8k_split_twins:
        item, twin = by_id[match["item"]], by_id[match["where"]["row"]]
        assert item["answer"].split("####")[-1] == twin["answer"].split("####")[-1]
        assert re.findall(r"\d+", item["question"]) == re.findall(r"\d+", twin["question"])


def test_short_items_are_counted_never_flagged(tmp_path, addition_rows):
    held_out, train = addition_rows
    assert held_out[0]["question"].startswith("What is ")
    run = make_run(tmp_path, train)
    # An agent that writes every two-digit sum holds every held-out item: chance, not a leak.
    every_sum = "\n".join(f"What is {a} + {b}? {a + b}" for a in range(10, 100) for b in range(10, 100))
    (run / "workspace" / "code" / "all_sums.txt").write_text(every_sum)
    report = scan_run(run, held_out, train)
    assert report["items_too_short"] == len(held_out) and report["items_scanned"] == 0
    assert report["flagged"] == [] and report["training_split"]["flagged"] == []


def test_item_texts_per_task_shape():
    assert item_texts({"id": "e1", "question": "Q?", "answer": "42"}) == ("Q?", "42")
    assert item_texts({"task_id": "HumanEval/90", "prompt": "def f():", "canonical_solution": "  return 1", "test": "x"}) == (
        "def f():",
        "  return 1",
    )
    assert item_texts({"id": "a", "instruction": "Say hi.", "reference": "Hi!"}) == ("Say hi.", "Hi!")
    assert item_texts({"id": "d", "problem": "Which rivers ...?", "answer": "Nile"}) == ("Which rivers ...?", "Nile")
    # No known key: every string of a few words, ids and paths left out.
    prompt, gold = item_texts({"id": "x-1", "game": "games/a/b/c.json", "meta": {"text": "put a clean mug in the coffee machine"}})
    assert prompt == "put a clean mug in the coffee machine" and gold == ""


def test_oversized_files_and_binaries_are_bounded_not_read(tmp_path, disjoint_rows, monkeypatch):
    held_out, train = disjoint_rows
    run = make_run(tmp_path, train)
    monkeypatch.setattr(contamination, "MAX_FILE_BYTES", 10_000)
    big = "\n".join(json.dumps(r) for r in held_out)
    assert len(big) > 10_000
    (run / "workspace" / "code" / "big.jsonl").write_text(big)
    (run / "workspace" / "code" / "blob.bin").write_text(big)  # not a text suffix
    (run / "workspace" / "code" / "link.jsonl").symlink_to(run / "workspace" / "code" / "big.jsonl")
    report = scan_run(run, held_out, train)
    assert report["flagged"] == []
    assert report["bounded_count"] == 1
    assert report["bounded"][0]["path"] == "code/big.jsonl" and report["bounded"][0]["kind"] == "workspace_file"
