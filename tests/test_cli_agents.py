"""LLM agent registry entries: schema and `extends`, readiness before launch, keys kept out of the sandbox."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from rlbench.coding_agents.adapters import ADAPTERS, build_prompt, get_adapter
from rlbench.coding_agents.session import PROVIDER_KEY_VARS, scrub_provider_keys
from rlbench.config import ConfigError, Registries, load_registry
from rlbench.fileio.jsonio import read_json
from rlbench.agent_run.environment import refuse_provider_key
from rlbench.agent_run.runner import run_agent
from rlbench.coding_agents.tools import SetupError, find_python
from support.runs import spec_for

CLI_AGENTS = ("claude-code", "codex", "gemini-cli", "opencode", "openhands", "mini-swe-agent")


def test_every_tool_has_a_registry_entry_with_pinned_version_driver_and_install_recipe():
    agents = Registries.load().agents
    tools = {a["tool"]["name"] for a in agents.values() if a["kind"] == "cli"}
    assert tools == set(ADAPTERS) == set(CLI_AGENTS)
    for name in CLI_AGENTS:
        entry = agents[name]
        assert entry["tool"]["version"][0].isdigit()
        assert entry["tool"]["install"]
        assert entry["driver"]["model"] and entry["driver"]["provider"]
        assert entry["mode"] in ("free", "sft-only", "rl-only")
        assert get_adapter(entry["tool"]["name"]).tool == entry["tool"]["name"]


def _registry(tmp_path: Path, files: dict[str, str]) -> Path:
    (tmp_path / "agents").mkdir()
    for name, text in files.items():
        (tmp_path / "agents" / f"{name}.yaml").write_text(textwrap.dedent(text))
    return tmp_path


BASE = """\
    name: base
    kind: cli
    tool: {name: codex, version: 0.171.0, install: {npm: "@openai/codex@0.171.0"}}
    driver: {model: gpt-5, provider: openai, key_env: OPENAI_API_KEY}
    limits: {turns: 10}
"""


def test_one_yaml_file_extends_another_entry_and_overrides_nested_keys(tmp_path):
    root = _registry(
        tmp_path,
        {
            "base": BASE,
            "local": """\
                name: local
                extends: base
                mode: rl-only
                driver: {provider: openai-compatible, base_url: "http://127.0.0.1:8000/v1", key_env: null}
            """,
        },
    )
    agents = load_registry("agents", root)
    local = agents["local"]
    assert local["mode"] == "rl-only" and local["kind"] == "cli"
    assert local["driver"] == {
        "model": "gpt-5",
        "provider": "openai-compatible",
        "base_url": "http://127.0.0.1:8000/v1",
        "key_env": None,
    }
    assert local["tool"]["name"] == "codex" and local["limits"] == {"turns": 10}
    assert agents["base"]["mode"] == "free"


@pytest.mark.parametrize(
    "files, message",
    [
        ({"a": "name: a\nextends: nowhere\ncommand: [x]\n"}, "extends 'nowhere', which is not in"),
        ({"a": "name: a\nextends: b\n", "b": "name: b\nextends: a\n"}, "cycle"),
        ({"a": "name: a\nkind: cli\ndriver: {model: m, provider: openai}\n"}, "tool"),
        ({"a": BASE.replace("name: base", "name: a").replace("codex", "cursor", 1)}, "allowed values"),
        ({"a": "name: a\nkind: script\n"}, "command"),
        ({"a": BASE.replace("name: base", "name: a").replace("provider: openai", "provider: azure")}, "provider"),
    ],
)
def test_bad_agent_entries_are_refused_with_the_key_and_what_is_allowed(tmp_path, files, message):
    with pytest.raises(ConfigError, match=message):
        load_registry("agents", _registry(tmp_path, files))


def test_no_provider_key_reaches_the_agent_environment(monkeypatch):
    env = {var: "secret-value" for var in PROVIDER_KEY_VARS}
    env.update(MY_DRIVER_KEY="driver-secret", PATH="/usr/bin")
    scrubbed = scrub_provider_keys(env, {"key_env": "MY_DRIVER_KEY"})
    assert scrubbed == {"PATH": "/usr/bin"}
    monkeypatch.setenv("MY_DRIVER_KEY", "sk-the-real-provider-key")
    with pytest.raises(RuntimeError, match="provider key"):
        refuse_provider_key({"X": "Bearer sk-the-real-provider-key"}, ["tool"], {"key_env": "MY_DRIVER_KEY"})
    with pytest.raises(RuntimeError, match="provider key"):
        refuse_provider_key({}, ["tool", "--key=sk-the-real-provider-key"], {"key_env": "MY_DRIVER_KEY"})
    refuse_provider_key({"X": "the gateway's key"}, ["tool"], {"key_env": "MY_DRIVER_KEY"})


def test_prompt_holds_instructions_description_mode_and_budget(workspace):
    prompt = build_prompt(workspace, 3 * 3600 + 600, {"turns": 50, "tokens": None})
    assert (workspace / "instructions.md").read_text().strip() in prompt
    assert (workspace / "description.md").read_text().strip() in prompt
    assert "3 h 10 min" in prompt and "turns 50" in prompt and "tokens" not in prompt.split("limited")[1][:40]


def test_a_multi_task_workspace_prompt_asks_for_every_task(tmp_path):
    (tmp_path / "tasks" / "gsm8k").mkdir(parents=True)
    (tmp_path / "instructions.md").write_text('# Instructions\n\n"task": "all"\n')
    (tmp_path / "description.md").write_text("# Multi-task run\n\n- gsm8k\n- humaneval\n")
    prompt = build_prompt(tmp_path, 3600)
    assert "score higher on every task below" in prompt and '"task": "all"' in prompt and "- humaneval" in prompt


@pytest.mark.parametrize("key", [None, "sk-ant-a-real-looking-key-123456"])
def test_readiness_failure_stops_that_run_with_what_to_do_and_never_the_key(
    workspace, tiny_model, gsm8k_data, monkeypatch, tmp_path, key
):
    monkeypatch.setenv("RLBENCH_TOOLS_DIR", str(tmp_path / "no-tools"))
    if key is None:
        monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    else:
        monkeypatch.setenv("ANTHROPIC_API_KEY", key)
    agent = Registries.load().agents["claude-code"]
    spec = spec_for(workspace, tiny_model, gsm8k_data, agent=agent, time_limit_s=30, kill_grace_s=10.0)
    record = run_agent(spec)
    run = read_json(workspace.parent / "run.json")
    assert record.status == run["status"] == "error" and run["exit_code"] is None
    assert "make setup-agents" in run["error"] and "gateway" in run["error"]
    assert ("ANTHROPIC_API_KEY" in run["error"]) == (key is None)  # named when missing
    assert run["agent_kind"] == "cli" and run["llm"]["agent_tool"]["pinned"] == "2.1.197"
    if key:
        assert all(key not in p.read_text(errors="replace") for p in workspace.parent.rglob("*") if p.is_file())


def test_find_python_says_what_to_install_when_none_is_new_enough(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "pyenv"))
    with pytest.raises(SetupError, match=r"no Python >= 3\.99 found.*install one"):
        find_python("3.99")
    assert find_python(None)


def test_an_npm_tool_sees_a_node_installed_under_the_masked_home(tmp_path, monkeypatch):
    """nvm puts node under the home, which the sandbox masks: the adapter shows that installation read-only."""
    node = tmp_path / "home" / ".nvm" / "versions" / "node" / "v22.1.0" / "bin" / "node"
    node.parent.mkdir(parents=True)
    node.write_text("#!/bin/sh\n")
    node.chmod(0o755)
    monkeypatch.setenv("PATH", str(node.parent))
    agent = Registries.load().agents["codex"]
    assert node.parent.parent in get_adapter("codex").visible_paths(agent)
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # the system's node (or none): nothing more to show
    assert get_adapter("codex").visible_paths(agent) == get_adapter("codex").visible_paths(agent)[:1]


def test_relative_run_paths_as_snakemake_passes_them_become_absolute(tmp_path, monkeypatch):
    """Snakemake hands the runner relative paths; the gateway runs in its records directory and the tool in the
    workspace, so every path a session or gateway hands on must be absolute (a relative config path once kept
    the gateway from starting under Snakemake)."""
    from rlbench.coding_agents.session import CliSession
    from rlbench.coding_agents.gateway.gateway import LLMGateway

    monkeypatch.chdir(tmp_path)
    run_dir = Path("results/runs/gsm8k/tiny/claude-code/0")
    session = CliSession(Registries.load().agents["claude-code"], run_dir / "workspace", run_dir, 60, run_dir / "workspace" / ".home")
    assert session.run_dir.is_absolute() and session.home.is_absolute() and session.log_dir.is_absolute()
    assert session.home == tmp_path / run_dir / "workspace" / ".home"
    gateway = LLMGateway({"model": "m", "provider": "openai-compatible", "base_url": "http://127.0.0.1:9/v1"}, run_dir / "gateway")
    assert gateway.records_dir == tmp_path / run_dir / "gateway" and gateway.config_path.is_absolute()
