"""Config and registry validation: mistakes stop early with the key and the allowed values."""

from __future__ import annotations

import copy

import pytest

from rlbench.config import (
    ConfigError,
    Registries,
    evaluation_settings,
    multi_run_budget,
    multi_runs,
    sweep_runs,
    task_settings,
    validate_config,
)


def test_default_config_is_valid_and_gets_defaults(registries, default_config):
    config = validate_config(default_config, registries)
    runs = sweep_runs(config)
    assert {(r["task"], r["agent"]) for r in runs if r["model"] == "tiny"} == {
        ("gsm8k", "copy"), ("gsm8k", "sft"), ("gsm8k", "grpo"),
        ("humaneval", "copy"), ("humaneval", "sft"), ("humaneval", "grpo"),
        ("alpaca-eval", "copy"), ("alpaca-eval", "sft"),
        ("alfworld", "copy"), ("alfworld", "sft-grpo"),
        ("webshop", "copy"), ("deepsearchqa", "copy"),
    }  # fmt: skip
    # Every task of the default sweep runs offline; the judges need no key and no network.
    offline = ("gsm8k", "humaneval", "alpaca-eval", "alfworld", "webshop", "deepsearchqa")
    assert {config["tasks"][t]["source"] for t in offline} == {"offline"}
    assert config["tasks"]["alpaca-eval"]["judge"]["backend"] == "local"
    assert config["tasks"]["deepsearchqa"]["judge"]["backend"] == "match"
    assert config["evaluation"]["backend"] == "auto"


GRID = {"tasks": ["gsm8k"], "models": ["tiny"], "agents": ["copy", "sft"], "seeds": [0]}


def test_a_sweep_can_be_a_list_of_grids_and_shared_runs_run_once(registries, default_config):
    default_config["sweep"] = [GRID, {**GRID, "agents": ["sft", "grpo"], "seeds": [0, 1]}]
    runs = sweep_runs(validate_config(default_config, registries))
    assert [(r["agent"], r["seed"]) for r in runs] == [("copy", 0), ("sft", 0), ("sft", 1), ("grpo", 0), ("grpo", 1)]


def test_a_mistake_in_the_second_grid_names_that_grid(registries, default_config):
    default_config["sweep"] = [GRID, {**GRID, "models": ["tinny"]}]
    with pytest.raises(ConfigError, match=r"'sweep\[1\]\.models\[0\]' is 'tinny'.*allowed values"):
        validate_config(default_config, registries)
    default_config["sweep"] = {**GRID, "agent": ["copy"]}
    with pytest.raises(ConfigError, match="unknown key 'agent' under 'sweep'; allowed keys: agents"):
        validate_config(default_config, registries)


def test_a_multi_grid_is_one_run_per_model_agent_seed_over_its_tasks(registries, default_config):
    multi = {**GRID, "tasks": ["humaneval", "gsm8k"], "mode": "multi", "time_limit_s": 60}
    # the same run named twice (another task order) is one run; the single-task grid's runs stay apart
    default_config["sweep"] = [GRID, multi, {**multi, "tasks": ["gsm8k", "humaneval"], "agents": ["copy"]}]
    config = validate_config(default_config, registries)
    assert [(r["task"], r["agent"]) for r in sweep_runs(config)] == [("gsm8k", "copy"), ("gsm8k", "sft")]
    runs = multi_runs(config)
    assert [(r["tasks"], r["task_list"], r["agent"], r["time_limit_s"]) for r in runs] == [
        ("gsm8k+humaneval", ["gsm8k", "humaneval"], "copy", 60),
        ("gsm8k+humaneval", ["gsm8k", "humaneval"], "sft", 60),
    ]
    assert multi_run_budget(config, "gsm8k+humaneval", "tiny", "sft", 0) == 60
    default_config["sweep"] = [{**multi, "time_limit_s": None}]
    with pytest.raises(ConfigError, match="time_limit_s"):
        validate_config(default_config, registries)
    del multi["time_limit_s"]
    default_config["sweep"] = [multi]
    assert multi_runs(validate_config(default_config, registries))[0]["time_limit_s"] == default_config["budget"]["time_limit_s"]


@pytest.mark.parametrize(
    "grids, message",
    [
        ([{**GRID, "mode": "multi"}], r"'sweep\[0\]' is a multi-task grid \(mode: multi\) with one task"),
        ([{**GRID, "time_limit_s": 5}], r"'sweep\[0\]\.time_limit_s' is for multi-task grids only"),
        ([{**GRID, "mode": "joint"}], r"allowed values: single, multi"),
        (
            [
                {**GRID, "tasks": ["gsm8k", "humaneval"], "mode": "multi", "time_limit_s": 5},
                {**GRID, "tasks": ["humaneval", "gsm8k"], "mode": "multi", "time_limit_s": 6},
            ],
            r"gives the multi-task run gsm8k\+humaneval/tiny/copy/0 the budget 6 s, another grid 5 s",
        ),
    ],
)
def test_multi_grid_mistakes_are_named(registries, default_config, grids, message):
    default_config["sweep"] = grids
    with pytest.raises(ConfigError, match=message):
        validate_config(default_config, registries)


def test_unknown_key_names_the_key_and_the_allowed_keys(registries, default_config):
    default_config["budget"]["time_limt_s"] = 5
    with pytest.raises(ConfigError) as error:
        validate_config(default_config, registries)
    assert "'time_limt_s'" in str(error.value) and "time_limit_s" in str(error.value)


def test_wrong_enum_value_lists_allowed_values(registries, default_config):
    default_config["evaluation"]["backend"] = "tgi"
    with pytest.raises(ConfigError, match=r"evaluation.backend.*allowed values: auto, hf, vllm"):
        validate_config(default_config, registries)


@pytest.mark.parametrize("kind,name", [("tasks", "gsm9k"), ("models", "gpt-5"), ("agents", "claud")])
def test_unknown_registry_name_is_refused(registries, default_config, kind, name):
    config = copy.deepcopy(default_config)
    config["sweep"] = {**GRID, kind: [name]}
    with pytest.raises(ConfigError, match=rf"sweep.{kind}\[0\].*{name}.*allowed values"):
        validate_config(config, registries)


def test_task_overrides_apply_over_the_registry(registries, default_config):
    config = validate_config(default_config, registries)
    settings = task_settings(config, registries, "gsm8k")
    assert registries.tasks["gsm8k"]["source"] == "hub"
    assert settings["source"] == "offline" and settings["module"] == "gsm8k"


def test_registry_entry_with_wrong_name_is_refused(tmp_path):
    for kind in ("tasks", "models", "agents"):
        (tmp_path / kind).mkdir()
    (tmp_path / "agents" / "mine.yaml").write_text("name: other\ncommand: [echo]\n")
    with pytest.raises(ConfigError, match="must equal the file name"):
        Registries.load(tmp_path)


def test_optional_sections_get_their_defaults(registries, default_config):
    for section in ("tasks", "evaluation", "sandbox"):
        default_config.pop(section)
    config = validate_config(default_config, registries)
    assert config["sandbox"]["backend"] == "auto" and config["evaluation"]["batch_size"] == 32
    assert config["tasks"] == {}


@pytest.mark.parametrize(
    "settings,message",
    [
        ({"enabled": True}, r"report.narrative.judge.backend.*set report.narrative.enabled: false"),
        ({"enabled": True, "judge": {"backend": "openai"}}, r"report.narrative.judge.model' is missing"),
        ({"enabled": True, "judge": {"backend": "local", "model": "gpt-5"}}, r"'gpt-5', which is not in config/models/"),
        ({"enabled": False, "judge": None}, None),
    ],
)
def test_report_narrative_needs_a_judge_that_writes_text(registries, default_config, settings, message):
    config = copy.deepcopy(default_config)
    config.setdefault("report", {})["narrative"] = settings
    if message is None:
        assert validate_config(config, registries)["report"]["narrative"]["enabled"] is False
        return
    with pytest.raises(ConfigError, match=message):
        validate_config(config, registries)


def test_report_budget_cuts_and_pass_at_k_are_checked(registries, default_config):
    for key, value in (("budget_cuts", [0.5, 1.5]), ("pass_at_k", [0])):
        config = copy.deepcopy(default_config)
        config.setdefault("report", {})[key] = value
        with pytest.raises(ConfigError, match=rf"report.{key}"):
            validate_config(config, registries)


def test_evaluation_worker_settings_are_checked_and_kept_out_of_the_evaluations_params(registries, default_config):
    validated = validate_config(default_config, registries)
    # The worker settings get the schema's defaults; gpu_memory_utilization, a scoring setting, gets none, so
    # a key left out never changes the params of recorded baselines and final evaluations.
    assert validated["evaluation"]["worker"] == "warm" and validated["evaluation"]["worker_idle_s"] == 300
    assert "gpu_memory_utilization" not in validated["evaluation"]
    # What an evaluation reads outside the workflow: the same defaults, from the schema alone.
    filled = evaluation_settings({"batch_size": 4})
    assert filled["batch_size"] == 4 and set(filled) == {"backend", "batch_size", "eval_timeout_s", "worker", "worker_idle_s"}
    with pytest.raises(ConfigError, match="'worker' is 'hot'; allowed values: warm, fresh"):
        evaluation_settings({"worker": "hot"})
    default_config["evaluation"].update(worker="fresh", worker_idle_s=0, gpu_memory_utilization=0.3)
    assert validate_config(default_config, registries)["evaluation"]["worker"] == "fresh"
    for key, value, message in (
        ("worker", "hot", r"evaluation.worker.*allowed values: warm, fresh"),
        ("worker_idle_s", -1, r"evaluation.worker_idle_s"),
        ("gpu_memory_utilization", 1.5, r"evaluation.gpu_memory_utilization"),
    ):
        bad = {**default_config, "evaluation": {**default_config["evaluation"], key: value}}
        with pytest.raises(ConfigError, match=message):
            validate_config(bad, registries)


# -- the bare Snakemake path: a --configfile Snakemake itself cannot read (issue 26, item 6) -----------------------
def bare_snakemake(tmp_path, *args) -> str:
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    command = [str(Path(sys.executable).parent / "snakemake"), "-n", "-s", str(repo / "Snakefile"), "-d", str(tmp_path), *args]
    proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0
    return proc.stdout + proc.stderr


def test_a_missing_configfile_is_named_without_a_traceback(tmp_path):
    out = bare_snakemake(tmp_path, "--configfile", "missing.yaml")
    assert "Traceback" not in out and "FileNotFoundError" not in out, out
    assert "'missing.yaml' not found" in out and "config/config.yaml" in out, out
    assert len(out.strip().splitlines()) <= 4, out


def test_a_yaml_syntax_error_names_the_file_and_the_line(tmp_path):
    bad = tmp_path / "my.yaml"
    bad.write_text("sweep:\n  tasks: [gsm8k\n  models: : tiny\n")
    out = bare_snakemake(tmp_path, "--configfile", str(bad))
    assert "Traceback" not in out, out
    assert str(bad) in out and "line 3" in out, out
