"""The agent's environment is built from an allow-list: no host secret reaches it (issue 26, item 1).

Before, only a deny-list of provider keys was removed: GITHUB_TOKEN, AWS_SECRET_ACCESS_KEY, WANDB_API_KEY and
the project's own SERPAPI_KEY reached the agent, which wrote them into code/ (and so into grader/code.git and
the snapshots). Through the real runner, in the real sandbox and without one.
"""

from __future__ import annotations

import pytest

from rlbench.agent_run.environment import HOST_ENV_KEPT, agent_env, key_variables
from rlbench.agent_run.runner import run_agent
from rlbench.config import task_settings
from support.runs import BACKENDS, spec_for

# Host secrets of every kind: a forge token, cloud credentials, a tracker key, the Hugging Face token, the
# DeepSearchQA search key, a judge's key under a custom name, and a variable no list knows.
CANARIES = {
    "GITHUB_TOKEN": "canary-github-7c1",
    "AWS_SECRET_ACCESS_KEY": "canary-aws-3f9",
    "WANDB_API_KEY": "canary-wandb-5e2",
    "HF_TOKEN": "canary-hf-8a4",
    "SERPAPI_KEY": "canary-serp-1d6",
    "MY_JUDGE_KEY": "canary-judge-9b0",
    "SOME_INTERNAL_SETTING": "canary-other-2c8",
}


@pytest.fixture
def canaries(monkeypatch):
    for name, value in CANARIES.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("LANG", "C.UTF-8")
    return CANARIES


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_host_secret_reaches_the_agent(workspace, tiny_model, gsm8k_data, canaries, backend):
    script = "env > code/env.txt; cat /proc/self/environ | tr '\\0' '\\n' > code/proc_env.txt"
    record = run_agent(spec_for(workspace, tiny_model, gsm8k_data, ["bash", "-c", script], sandbox_backend=backend))
    assert record.status == "completed", (workspace / "agent.log").read_text()
    seen = (workspace / "code" / "env.txt").read_text() + (workspace / "code" / "proc_env.txt").read_text()
    leaked = [name for name, value in canaries.items() if value in seen]
    assert leaked == [], leaked
    # The contract's variables and the allow-listed host ones are there.
    for needed in ("GRADING_SERVER_URL=", "MODEL_PATH=", "OUTPUT_DIR=", "LANG=C.UTF-8", "PATH="):
        assert needed in seen, needed


def test_an_agent_entry_passes_what_it_names_but_never_a_key_the_config_names(workspace, tiny_model, gsm8k_data, canaries, registries):
    settings = task_settings({"tasks": {"deepsearchqa": {"search": {"provider": "serpapi", "api_key_var": "SERPAPI_KEY"}}}}, registries, "deepsearchqa")
    settings["judge"] = {**(settings.get("judge") or {}), "api_key_var": "MY_JUDGE_KEY"}
    agent = {"name": "test", "command": ["true"], "pass_env": ["WANDB_API_KEY", "SERPAPI_KEY", "MY_JUDGE_KEY"], "requires": {"env": ["HF_TOKEN"]}}
    spec = spec_for(workspace, tiny_model, gsm8k_data, agent=agent, task_settings=settings)
    assert {"SERPAPI_KEY", "MY_JUDGE_KEY"} <= key_variables(spec)
    env = agent_env(spec, "http://127.0.0.1:1", "marker")
    assert env["WANDB_API_KEY"] == canaries["WANDB_API_KEY"] and env["HF_TOKEN"] == canaries["HF_TOKEN"]
    assert "SERPAPI_KEY" not in env and "MY_JUDGE_KEY" not in env and "GITHUB_TOKEN" not in env


def test_a_driver_key_never_passes(workspace, tiny_model, gsm8k_data, canaries, monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "canary-openai-4e4")
    agent = {"name": "test", "command": ["true"], "pass_env": ["OPENAI_API_KEY"], "driver": {"key_env": "OPENAI_API_KEY"}}
    env = agent_env(spec_for(workspace, tiny_model, gsm8k_data, agent=agent), "http://127.0.0.1:1", "marker")
    assert "OPENAI_API_KEY" not in env


def test_the_allow_list_holds_no_secret_shaped_name():
    for name in HOST_ENV_KEPT:
        assert not any(word in name for word in ("KEY", "TOKEN", "SECRET", "PASSWORD", "CREDENTIAL")), name


# -- item 5: an unsandboxed run never writes through to the results tree ---------------------------------------


def test_an_unsandboxed_agent_writing_in_place_leaves_the_recorded_base_model_and_split_intact(tmp_path, tiny_model, gsm8k_data):
    """With sandbox.backend none the workspace's models/ and data/ were hard links into results/: an agent
    (root, or one that chmods) saving in place corrupted every run's base model and the baseline's."""
    import shutil

    from rlbench.agent_run.workspace import prepare_workspace
    from rlbench.tasks.gsm8k import GSM8K
    from support.settings import GSM8K_SETTINGS, TINY_SPEC

    model, train = tmp_path / "results-model", tmp_path / "results-train"
    shutil.copytree(tiny_model, model)
    shutil.copytree(gsm8k_data[0], train)
    recorded = {p: p.read_bytes() for p in [*model.rglob("*"), *train.rglob("*")] if p.is_file()}
    workspace = tmp_path / "run" / "workspace"
    prepare_workspace(workspace, GSM8K(), GSM8K_SETTINGS, model, TINY_SPEC["hf_id"], train)
    script = (
        "for f in $(find models data -type f); do chmod u+w $f && printf 'overwritten' > $f; done; "
        "find models data -type f | head -3 > code/written.txt"
    )
    record = run_agent(spec_for(workspace, model, gsm8k_data, ["bash", "-c", script], sandbox_backend="none"))
    assert record.sandbox == "none" and record.status == "completed"
    assert (workspace / "code" / "written.txt").read_text().strip(), "the agent wrote nothing: the test proves nothing"
    changed = [str(p) for p, data in recorded.items() if p.read_bytes() != data]
    assert changed == [], changed
