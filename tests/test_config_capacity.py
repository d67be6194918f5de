"""Split sizes a task's data source cannot give are refused when the config is validated, before any rule
runs (issue 25, item 7: addition-control with train_size 4000 + eval_size 500 over its 4,095 operand pairs
passed validation, rewrote the training split, archived a finished run and lost the held-out split before it
failed). Each task says what its source can give (Task.split_capacity); the config code repeats none of it."""

from __future__ import annotations

import copy

import pytest

from rlbench.config import ConfigError, Registries, task_settings, validate_config
from rlbench.tasks import get_task, split_size_problems
from support.workflow import make_workdir, snakemake


def one_task(task: str, **overrides) -> dict:
    """A sweep of one task with these task settings."""
    return {
        "sweep": {"tasks": [task], "models": ["tiny"], "agents": ["copy"], "seeds": [0]},
        "budget": {"time_limit_s": 60, "kill_grace_s": 2},
        "tasks": {task: overrides},
    }


def validated(config: dict, registries: Registries) -> dict:
    return validate_config(config, registries, task_problems=split_size_problems)


ISSUE_CONFIG = one_task("addition-control", train_size=4000, eval_size=500)


def test_the_issue_config_is_refused_before_any_rule_runs(tmp_path):
    workdir = make_workdir(tmp_path, ISSUE_CONFIG)
    proc = snakemake(workdir, "-n", check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, out[-2000:]
    for fragment in ("addition-control", "train_size 4000", "eval_size 500", "4,095", "tasks.addition-control"):
        assert fragment in out, out[-2000:]
    assert not (workdir / "results").exists()


OVERFLOWS = [
    # (task, settings, what the message must say)
    ("addition-control", {"train_size": 4000, "eval_size": 500}, ["train_size 4000 + eval_size 500 = 4500", "4,095"]),
    ("addition-control", {"train_size": 4095}, ["train_size 4095 + eval_size 100 = 4195", "4,095"]),
    ("humaneval", {"train_size": 100}, ["train_size 100", "82"]),
    ("humaneval", {"source": "hub", "eval_size": 83}, ["eval_size 83", "82"]),
    ("gsm8k", {"source": "hub", "train_size": 8000}, ["train_size 8000", "7,473"]),
    ("gsm8k", {"source": "hub", "eval_size": 2000}, ["eval_size 2000", "1,319"]),
    ("alpaca-eval", {"source": "offline", "eval_size": 62}, ["eval_size 62", "61"]),
    ("alpaca-eval", {"source": "offline", "train_size": 301}, ["train_size 301", "300"]),
    ("alpaca-eval", {"source": "hub", "eval_size": 806}, ["eval_size 806", "805"]),
    ("alpaca-eval", {"source": "hub", "train_size": 60000}, ["train_size 60000", "52,002"]),
    ("deepsearchqa", {"source": "hub", "train_size": 101}, ["train_size 101", "100"]),
    ("deepsearchqa", {"source": "hub", "eval_size": 201}, ["eval_size 201", "200"]),
    ("deepsearchqa", {"source": "offline", "kb_size": 20, "train_size": 100, "eval_size": 10}, ["= 110", "106", "kb_size"]),
    ("webshop", {"source": "offline", "catalogue_size": 10, "eval_size": 5000}, ["eval_size 5000", "3,060", "catalogue_size"]),
    ("alfworld", {"source": "hub", "eval_size": 135}, ["eval_size 135", "134"]),
    ("alfworld", {"source": "hub", "train_size": 4000}, ["train_size 4000", "3,553"]),
]


@pytest.mark.parametrize("task,settings,fragments", OVERFLOWS, ids=[f"{t}-{'-'.join(map(str, s.values()))}" for t, s, _ in OVERFLOWS])
def test_sizes_beyond_the_source_are_refused_with_what_to_change(registries, task, settings, fragments):
    with pytest.raises(ConfigError) as error:
        validated(one_task(task, **settings), registries)
    message = str(error.value)
    assert f"task {task!r}" in message and f"tasks.{task}." in message, message
    for fragment in fragments:
        assert fragment in message, message


FITS = [
    ("addition-control", {"train_size": 4000, "eval_size": 95}),  # exactly the 4,095 pairs
    ("humaneval", {"train_size": 82, "eval_size": 82}),
    ("gsm8k", {"source": "hub", "train_size": 7473, "eval_size": 1319}),
    ("gsm8k", {"source": "offline", "train_size": 100000, "eval_size": 5000}),  # a generator without a fixed pool
    ("gsm8k", {"source": "hub", "hub": {"path": "my/gsm8k-copy"}, "train_size": 100000}),  # another dataset: unknown here
    ("alpaca-eval", {"source": "offline", "train_size": 300, "eval_size": 61}),
    ("alpaca-eval", {"source": "hub", "train_size": 52002, "eval_size": 805}),
    ("deepsearchqa", {"source": "hub", "train_size": 100, "eval_size": 200}),
    ("deepsearchqa", {"source": "offline", "kb_size": 20, "train_size": 96, "eval_size": 10}),
    ("webshop", {"source": "offline", "catalogue_size": 10, "eval_size": 3060}),
    ("webshop", {"source": "hub", "hub": {"url": "http://localhost:3000"}, "train_size": 50000}),  # the site decides
    ("alfworld", {"source": "offline", "train_size": 5000, "eval_size": 1000}),  # generated games: no fixed pool
    ("alfworld", {"source": "hub", "train_size": 3553, "eval_size": 134}),
]


@pytest.mark.parametrize("task,settings", FITS, ids=[f"{t}-{'-'.join(map(str, s.values()))}" for t, s in FITS])
def test_sizes_the_source_can_give_pass(registries, task, settings):
    validated(one_task(task, **settings), registries)


def test_the_default_config_and_every_registry_entry_fit_their_sources(registries, default_config):
    validated(default_config, registries)
    for name in registries.tasks:
        assert split_size_problems(task_settings({}, registries, name)) == [], name


def test_every_problem_is_reported_at_once(registries):
    config = {
        **one_task("humaneval"),
        "sweep": {"tasks": ["addition-control", "humaneval"], "models": ["tiny"], "agents": ["copy"], "seeds": [0]},
        "tasks": {"addition-control": {"train_size": 4000, "eval_size": 500}, "humaneval": {"eval_size": 90}},
    }
    with pytest.raises(ConfigError) as error:
        validated(config, registries)
    assert "'addition-control'" in str(error.value) and "'humaneval'" in str(error.value)


def test_tasks_outside_the_sweep_are_not_checked(registries):
    config = copy.deepcopy(ISSUE_CONFIG)
    config["sweep"]["tasks"] = ["humaneval"]
    validated(config, registries)


# -- the capacities are what the sources really give ----------------------------------------------------


def settings_of(registries, task: str, **overrides) -> dict:
    return task_settings({"tasks": {task: overrides}}, registries, task)


def test_addition_control_prepares_exactly_its_capacity(registries, tmp_path):
    settings = settings_of(registries, "addition-control", train_size=4000, eval_size=95)
    task = get_task(settings)
    assert task.split_capacity(settings).total == 4095
    task.prepare(settings, tmp_path / "train", tmp_path / "eval", salt="capacity-test")
    with pytest.raises(RuntimeError, match="exceeds"):
        task.prepare_eval({**settings, "eval_size": 96}, tmp_path / "train", tmp_path / "eval2", salt="capacity-test")


def test_deepsearchqa_offline_capacity_is_the_knowledge_base_s_questions(registries):
    from rlbench.tasks.deepsearchqa.kb import build_kb, questions

    settings = settings_of(registries, "deepsearchqa", source="offline", kb_size=20, train_size=96, eval_size=10)
    total = get_task(settings).split_capacity(settings).total
    kb = build_kb(0, 20)
    train = questions(kb, 0, 96)
    assert len(questions(kb, 1, total - 96, exclude=train)) == total - 96
    with pytest.raises(ValueError, match="raise kb_size"):
        questions(kb, 1, total - 95, exclude=train)


def test_webshop_offline_capacity_bounds_what_the_generator_gives(registries):
    from rlbench.tasks.webshop import generate

    settings = settings_of(registries, "webshop", source="offline", catalogue_size=10)
    capacity = get_task(settings).split_capacity(settings)
    catalogue = generate.generate_catalogue(0, 10)
    with pytest.raises(ValueError, match="ask for fewer"):
        generate.heldout_goals(catalogue, 1, capacity.eval + 1)


def test_humaneval_and_alpaca_eval_offline_capacities_are_their_shipped_data(registries):
    from rlbench.fileio.jsonio import read_jsonl
    from rlbench.tasks.alpaca_eval import OFFLINE_EVAL, OFFLINE_TRAIN
    from rlbench.tasks.humaneval import TRAIN_PROBLEMS, problems

    settings = settings_of(registries, "humaneval", source="offline")
    capacity = get_task(settings).split_capacity(settings)
    assert capacity.train + capacity.eval == len(problems(settings)) and capacity.train == TRAIN_PROBLEMS
    settings = settings_of(registries, "alpaca-eval", source="offline")
    capacity = get_task(settings).split_capacity(settings)
    assert (capacity.train, capacity.eval) == (len(list(read_jsonl(OFFLINE_TRAIN))), len(list(read_jsonl(OFFLINE_EVAL))))
