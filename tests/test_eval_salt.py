"""The offline held-out splits cannot be rebuilt from what an agent can know.

An agent may know the generator code, the config (data_seed, eval_size) and its training split;
the one thing it never sees is the installation's salt (results/secrets/eval_salt, under the
hidden results tree). These tests play that agent: the unsalted recipe the harness used before,
or any other salt, must not reproduce eval.jsonl, while the same salt must, byte for byte.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import stat
from pathlib import Path

import pytest

from rlbench.fileio.jsonio import read_json, read_jsonl, write_jsonl
from rlbench.tasks import addition_control, gsm8k
from rlbench.tasks.addition_control import AdditionControl
from rlbench.tasks.gsm8k import GSM8K
from support.workflow import make_workdir, snakemake

SALT = "a3" * 32  # the installation's secret in these tests
OTHER_SALT = "5c" * 32
SETTINGS = {
    "gsm8k": {"name": "gsm8k", "module": "gsm8k", "source": "offline", "train_size": 16, "eval_size": 12,
              "data_seed": 0},
    "addition-control": {"name": "addition-control", "module": "addition_control", "source": "offline",
                         "train_size": 300, "eval_size": 40, "data_seed": 0},
}
TASKS = {"gsm8k": GSM8K, "addition-control": AdditionControl}


def unsalted_rows(task: str, train_dir: Path) -> list[dict]:
    """The held-out split as the harness drew it before the salt, from public facts only."""
    settings = SETTINGS[task]
    if task == "gsm8k":
        train_questions = {row["question"] for row in read_jsonl(train_dir / "train.jsonl")}
        return gsm8k._offline_rows(settings["data_seed"] + 1_000_003, settings["eval_size"], "eval", train_questions)
    pool = addition_control._pool(settings["data_seed"])
    return [addition_control._row("eval", i, a, b) for i, (a, b) in enumerate(reversed(pool[-settings["eval_size"]:]))]


def questions(path: Path) -> set[str]:
    return {row["question"] for row in read_jsonl(path)}


@pytest.fixture(scope="module", params=sorted(TASKS))
def split(request, tmp_path_factory):
    """(task name, train dir, eval dir, manifest): the training split and the salted held-out split."""
    root = tmp_path_factory.mktemp(request.param)
    manifest = TASKS[request.param]().prepare(SETTINGS[request.param], root / "train", root / "eval", salt=SALT)
    return request.param, root / "train", root / "eval", manifest


def test_the_same_salt_reproduces_the_split_byte_for_byte(split, tmp_path):
    task, train_dir, eval_dir, _ = split
    TASKS[task]().prepare_eval(SETTINGS[task], train_dir, tmp_path, salt=SALT)
    assert (tmp_path / "eval.jsonl").read_bytes() == (eval_dir / "eval.jsonl").read_bytes()


def test_public_facts_without_the_salt_do_not_rebuild_the_split(split, tmp_path):
    task, train_dir, eval_dir, _ = split
    held_out = eval_dir / "eval.jsonl"
    write_jsonl(tmp_path / "unsalted.jsonl", unsalted_rows(task, train_dir))
    assert (tmp_path / "unsalted.jsonl").read_bytes() != held_out.read_bytes()
    TASKS[task]().prepare_eval(SETTINGS[task], train_dir, tmp_path / "other", salt=OTHER_SALT)
    assert (tmp_path / "other" / "eval.jsonl").read_bytes() != held_out.read_bytes()
    # Not even a useful part of it: a guess shares at most a chance question or two.
    size = SETTINGS[task]["eval_size"]
    for guess in (tmp_path / "unsalted.jsonl", tmp_path / "other" / "eval.jsonl"):
        assert len(questions(guess) & questions(held_out)) <= max(1, size // 10), guess.name


def test_splits_stay_disjoint_and_the_manifest_names_the_salt_without_holding_it(split):
    task, train_dir, eval_dir, manifest = split
    assert not questions(train_dir / "train.jsonl") & questions(eval_dir / "eval.jsonl")
    assert len(list(read_jsonl(eval_dir / "eval.jsonl"))) == SETTINGS[task]["eval_size"]
    assert manifest["salt_sha256"] == hashlib.sha256(SALT.encode()).hexdigest()
    assert SALT not in json.dumps(manifest)


@pytest.mark.parametrize("salt", [None, ""])
@pytest.mark.parametrize("task", sorted(TASKS))
def test_an_offline_split_without_a_salt_is_refused(task, salt, tmp_path):
    instance = TASKS[task]()
    instance.prepare_train(SETTINGS[task], tmp_path / "train")
    with pytest.raises(ValueError, match="needs a secret salt"):
        instance.prepare_eval(SETTINGS[task], tmp_path / "train", tmp_path / "eval", salt=salt)
    assert not (tmp_path / "eval" / "eval.jsonl").exists()


def test_a_hub_split_is_public_and_ignores_the_salt(tmp_path, monkeypatch):
    rows = {which: [{"id": f"{which}-{i}", "question": f"{which} {i}?", "answer": "#### 1"} for i in range(3)]
            for which in ("train", "eval")}
    monkeypatch.setattr(gsm8k, "_hub_rows", lambda settings, which: rows[which])
    settings = {**SETTINGS["gsm8k"], "source": "hub", "eval_size": None}
    manifests = [GSM8K().prepare(settings, tmp_path / str(salt), tmp_path / str(salt), salt=salt)
                 for salt in (None, SALT)]
    assert manifests[0] == manifests[1] and "salt_sha256" not in manifests[0]


# --- the workflow: rule eval_salt and the salt's way into prepare_eval_data --------------------------

SWEEP = {
    "sweep": {"tasks": ["addition-control"], "models": ["tiny"], "agents": ["copy"], "seeds": [0]},
    "budget": {"time_limit_s": 30},
    "tasks": {"addition-control": {"train_size": 50, "eval_size": 10}},
}
EVAL = "results/data/addition-control/eval/eval.jsonl"
SALT_FILE = "results/secrets/eval_salt"


def test_the_salt_is_drawn_once_kept_secret_and_copied_to_reproduce(tmp_path):
    first = make_workdir(tmp_path / "first", SWEEP)
    snakemake(first, "--cores", "1", EVAL)
    salt_file = first / SALT_FILE
    salt = salt_file.read_text().strip()
    assert len(bytes.fromhex(salt)) == 32
    assert stat.S_IMODE(salt_file.stat().st_mode) == 0o600
    assert stat.S_IMODE(salt_file.parent.stat().st_mode) == 0o700
    manifest = read_json(first / "results/data/addition-control/eval/manifest.json")
    assert manifest["salt_sha256"] == hashlib.sha256(salt.encode()).hexdigest()

    # Never redrawn: a second run has nothing to do, and even forcing the rule keeps the salt.
    again = snakemake(first, "-n", "--cores", "1", EVAL)
    assert "Nothing to be done" in again.stdout + again.stderr
    held_out = (first / EVAL).read_bytes()
    snakemake(first, "--cores", "1", EVAL, "--forcerun", "eval_salt")
    assert salt_file.read_text().strip() == salt and (first / EVAL).read_bytes() == held_out
    for path in [*(first / ".snakemake").rglob("*"), *(first / "results" / "data").rglob("*")]:
        if path.is_file():
            assert salt.encode() not in path.read_bytes(), f"the salt leaked into {path}"

    # Another installation reproduces the split exactly by copying the salt file in.
    second = make_workdir(tmp_path / "second", SWEEP)
    (second / SALT_FILE).parent.mkdir(parents=True)
    shutil.copy(salt_file, second / SALT_FILE)
    snakemake(second, "--cores", "1", EVAL)
    assert (second / EVAL).read_bytes() == (first / EVAL).read_bytes()
    assert (second / SALT_FILE).read_text().strip() == salt


def test_a_hub_split_does_not_wait_for_the_salt(tmp_path):
    config = {**SWEEP, "sweep": {**SWEEP["sweep"], "tasks": ["gsm8k"]}, "tasks": {"gsm8k": {"source": "hub"}}}
    plan = snakemake(make_workdir(tmp_path, config), "-n", "results/data/gsm8k/eval/eval.jsonl")
    assert "prepare_eval_data" in plan.stdout and "eval_salt" not in plan.stdout
