"""The OpenCode, OpenHands and mini-swe-agent adapters: the launch each plans, what collect() reads from logs
the real tools wrote, and one end-to-end run of each real tool through the runner, the gateway and the sandbox.

The logs under tests/fixtures/agent_logs/<tool>/<case>/ were captured by running each pinned tool (OpenCode
1.18.33, openhands-sdk 1.58.2, mini-swe-agent 2.4.6) with its adapter's plan behind the real LLM gateway
(rlbench.coding_agents.gateway) in front of tests/fixtures/scripted_llm.py, with the script "echo hi > hello.txt; cat
hello.txt; finish" (100 prompt / 20 completion tokens a call), each tool left to end by itself:

- success: 3 tool calls (OpenCode makes a 4th, title generation, which its events do not report);
- dead: the gateway's upstream on a port nobody listens on (OpenCode gave up after 82 s, OpenHands 28 s,
  mini-swe-agent 16 s);
- max_turns (OpenHands, mini-swe-agent: turn limit 1 = max_iteration_per_run / agent.step_limit 1, and a
  gateway call limit of 1); limit (OpenCode, whose step limit is soft: gateway call limit 1, the title call
  took it, the first step was refused with HTTP 429).

Each case holds the tool's stdout under the adapter's name for it and home/ (what the tool wrote under its
private HOME that collect() reads). The OpenHands SystemPromptEvent's 22 KB of prompt and tool schemas were
trimmed; the gateway key in mini-swe-agent's logs was replaced by a fixed fake.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlbench.coding_agents.adapters import get_adapter
from rlbench.coding_agents.tools import install_prefix
from rlbench.config import Registries
from support.cli_agents import (  # noqa: F401
    GATEWAY_KEY,
    GATEWAY_URL,
    LOGS,
    PROVIDER_KEY,
    STDOUT,
    context,
    dead_endpoint_params,
    option,
    training_params,
    with_logs,
)
from support.settings import REPO

sys.path.insert(0, str(REPO / "tests" / "fixtures"))
sys.path.insert(0, str(REPO / "tests"))

TOOLS = ("opencode", "openhands", "mini-swe-agent")


def configs(argv: list[str]) -> list[str]:
    """mini's -c values, in order."""
    return [argv[i + 1] for i, a in enumerate(argv) if a == "-c"]


# --------------------------------------------------------------------------------------------------------------
# plan()


@pytest.mark.parametrize("tool", TOOLS)
def test_plan_never_carries_the_provider_key_and_shows_the_tool_install(tmp_path, monkeypatch, tool):
    ctx = context(tmp_path, tool)
    if ctx.agent["driver"].get("key_env"):
        monkeypatch.setenv(ctx.agent["driver"]["key_env"], PROVIDER_KEY)
    for var in ("OPENAI_API_KEY", "ANTHROPIC_API_KEY"):
        monkeypatch.setenv(var, PROVIDER_KEY)
    launch = get_adapter(tool).plan(ctx)
    everything = [*launch.argv, *launch.env.values(), *launch.files.values(), *map(str, launch.files)]
    assert not any(PROVIDER_KEY in text for text in everything)
    assert not {"OPENAI_API_KEY", "ANTHROPIC_API_KEY"} & set(launch.env)
    assert any(GATEWAY_KEY in text for text in everything)  # the gateway's key is what the tool sends
    assert install_prefix(ctx.agent["tool"]) in launch.visible
    assert Path(launch.argv[0]).name == get_adapter(tool).binary
    assert launch.stdout == STDOUT[tool]
    for path in launch.files:  # all inside the workspace (the home is in it)
        assert Path(path).is_relative_to(ctx.workspace)


def test_opencode_plan(tmp_path):
    ctx = context(tmp_path, "opencode", turns=40, time_limit_s=7200)
    launch = get_adapter("opencode").plan(ctx)
    argv = launch.argv
    assert argv[1:4] == ["run", "--format", "json"]
    assert option(argv, "-m") == "gateway/gpt-5" and option(argv, "--dir") == str(ctx.workspace)
    assert argv[-1] == ctx.prompt
    config = json.loads(launch.env["OPENCODE_CONFIG_CONTENT"])
    assert config["permission"] == "allow"  # else --format json silently auto-rejects
    provider = config["provider"]["gateway"]
    assert provider["npm"] == "@ai-sdk/openai-compatible"
    assert provider["options"] == {"baseURL": GATEWAY_URL + "/v1", "apiKey": "{env:RLBENCH_GATEWAY_KEY}"}
    assert launch.env["RLBENCH_GATEWAY_KEY"] == GATEWAY_KEY
    assert list(provider["models"]) == ["gpt-5"] and config["small_model"] == "gateway/gpt-5"
    assert config["agent"] == {"build": {"steps": 40}}
    for flag in ("OPENCODE_DISABLE_MODELS_FETCH", "OPENCODE_DISABLE_AUTOUPDATE", "OPENCODE_DISABLE_DEFAULT_PLUGINS"):
        assert launch.env[flag] == "1"
    assert launch.env["OPENCODE_EXPERIMENTAL_BASH_DEFAULT_TIMEOUT_MS"] == str(7200 * 1000)  # not the 2 min default
    assert launch.env["XDG_CONFIG_HOME"] == str(ctx.home / ".config")
    assert launch.env["XDG_DATA_HOME"].startswith(str(ctx.home))
    assert launch.files[ctx.workspace / "AGENTS.md"] == ctx.prompt
    # The plugin install is skipped: node_modules/ exists and the lock lists the package.
    plugin_dir = ctx.home / ".config" / "opencode"
    lock = json.loads(launch.files[plugin_dir / "package-lock.json"])
    assert "@opencode-ai/plugin" in lock["packages"][""]["dependencies"]
    assert any(Path(p).parent == plugin_dir / "node_modules" for p in launch.files)


def test_opencode_plan_without_a_turn_limit_sets_no_steps(tmp_path):
    launch = get_adapter("opencode").plan(context(tmp_path, "opencode", turns=None))
    assert "agent" not in json.loads(launch.env["OPENCODE_CONFIG_CONTENT"])


def test_openhands_plan(tmp_path):
    ctx = context(tmp_path, "openhands", turns=40, time_limit_s=7200)
    adapter = get_adapter("openhands")
    launch = adapter.plan(ctx)
    from rlbench.coding_agents.adapters.openhands import LAUNCHER

    prefix = install_prefix(ctx.agent["tool"])
    assert launch.argv[:3] == [str(prefix / "bin" / "python"), "-I", str(LAUNCHER)]
    config_path = Path(launch.argv[3])
    config = json.loads(launch.files[config_path])
    assert config_path.is_relative_to(ctx.home)
    assert config["model"] == "openai/claude-sonnet-4-5"
    assert config["base_url"] == GATEWAY_URL + "/v1" and config["api_key"] == GATEWAY_KEY
    assert config["workspace"] == str(ctx.workspace) and config["prompt"] == ctx.prompt
    assert config["max_iterations"] == 40 and 0 <= config["num_retries"] <= 3
    assert Path(config["persistence_dir"]).is_relative_to(ctx.home)
    assert launch.env["OPENHANDS_SUPPRESS_BANNER"] == "1" and launch.env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert launch.env["TMUX_TMPDIR"] in (str(ctx.home / ".tmux"), "/tmp")
    # The launcher and the venv's base interpreter (under the host's home, hidden by the sandbox) are shown.
    assert LAUNCHER in launch.visible and prefix in launch.visible
    if (prefix / "pyvenv.cfg").exists():
        from rlbench.coding_agents.adapters.openhands import venv_base_prefix

        assert venv_base_prefix(prefix) in launch.visible


def test_openhands_tmux_socket_falls_back_to_the_private_tmp_when_the_home_path_is_too_long(tmp_path):
    ctx = context(tmp_path / ("x" * 90), "openhands")
    assert get_adapter("openhands").plan(ctx).env["TMUX_TMPDIR"] == "/tmp"


def test_openhands_launcher_imports_nothing_from_rlbench():
    from rlbench.coding_agents.adapters.openhands import LAUNCHER

    tree = ast.parse(LAUNCHER.read_text())
    modules = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    modules |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not any(m.split(".")[0] == "rlbench" for m in modules), modules
    assert {m.split(".")[0] for m in modules} <= {"__future__", "json", "os", "shutil", "sys", "time", "traceback",
                                                  "importlib", "openhands"}


def test_openhands_readiness_says_no_python_312_was_found_and_what_to_install(tmp_path, monkeypatch):
    import types

    from rlbench.coding_agents import setup as setup_agents

    monkeypatch.setenv("RLBENCH_TOOLS_DIR", str(tmp_path / "no-tools"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path / "no-pyenv"))
    monkeypatch.setattr(setup_agents, "sys", types.SimpleNamespace(version_info=(3, 11, 7), executable=sys.executable))
    agent = Registries.load().agents["openhands"]
    problems = get_adapter("openhands").readiness(agent)
    assert len(problems) == 1, problems
    assert problems[0].startswith("OpenHands 1.58.2 needs Python >= 3.12: no Python >= 3.12 found")
    assert "python3.13 + python3.13-venv" in problems[0] and "pyenv install 3.12" in problems[0]
    assert problems[0].endswith("`rlbench setup-agents openhands`")


def test_mini_swe_agent_plan(tmp_path):
    ctx = context(tmp_path, "mini-swe-agent", turns=40, time_limit_s=7200)
    launch = get_adapter("mini-swe-agent").plan(ctx)
    argv = launch.argv
    assert "-y" in argv and "--exit-immediately" in argv
    assert option(argv, "-m") == "openai/qwen3-8b" and option(argv, "-t") == ctx.prompt
    specs = configs(argv)
    # The builtin mini.yaml first, by its absolute path: any -c replaces the default, and a bare name is
    # looked up in the cwd (the agent's workspace) first.
    assert specs[0].endswith("minisweagent/config/mini.yaml") or specs[0] == "mini.yaml"
    if install_prefix(ctx.agent["tool"]).exists():
        assert Path(specs[0]).is_absolute() and Path(specs[0]).exists()
    assert f"model.model_kwargs.api_base={GATEWAY_URL}/v1" in specs
    assert f"model.model_kwargs.api_key={GATEWAY_KEY}" in specs
    assert f"environment.cwd={ctx.workspace}" in specs
    assert "environment.timeout=7200" in specs  # not the 30 s default: training commands run long
    assert "agent.step_limit=40" in specs and "agent.wall_time_limit_seconds=7200" in specs
    assert "agent.cost_limit=0" in specs  # not the $3 default; the gateway enforces cost limits
    assert Path(option(argv, "-o")).is_relative_to(ctx.home)
    env = launch.env
    assert env["MSWEA_CONFIGURED"] == "true" and env["MSWEA_COST_TRACKING"] == "ignore_errors"
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"
    assert 1 <= int(env["MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT"]) <= 3
    assert Path(env["MSWEA_GLOBAL_CONFIG_DIR"]).is_relative_to(ctx.home)


def test_mini_swe_agent_plan_passes_the_cost_limit_and_no_step_limit(tmp_path):
    launch = get_adapter("mini-swe-agent").plan(context(tmp_path, "mini-swe-agent", turns=None, cost_usd=2.5))
    assert "agent.step_limit=0" in configs(launch.argv) and "agent.cost_limit=2.5" in configs(launch.argv)


@pytest.mark.parametrize("tool", ["openhands", "mini-swe-agent"])
def test_version_is_read_from_the_installed_distribution(tool, tmp_path, monkeypatch):
    agent = Registries.load().agents[tool]
    adapter = get_adapter(tool)
    if install_prefix(agent["tool"]).exists():
        assert adapter.version(agent) == agent["tool"]["version"]
    monkeypatch.setenv("RLBENCH_TOOLS_DIR", str(tmp_path))
    assert adapter.version(agent) is None


# --------------------------------------------------------------------------------------------------------------
# collect() on the captured logs


def test_opencode_collect_sums_step_finish_and_keeps_its_log(tmp_path):
    ctx = with_logs(tmp_path, "opencode", "success")
    got = get_adapter("opencode").collect(ctx)
    assert got.status == "success" and got.error is None
    # 3 steps; the title call (the 4th the gateway saw) is in no event.
    assert (got.turns, got.input_tokens, got.output_tokens) == (3, 300, 60)
    assert (got.cache_read_tokens, got.cache_write_tokens, got.cost_usd) == (0, 0, 0.0)
    assert got.logs == ["opencode.jsonl", "opencode-logs/opencode.log"]
    assert (ctx.log_dir / "opencode-logs" / "opencode.log").stat().st_size > 0


def test_opencode_collect_dead_endpoint_and_gateway_limit(tmp_path):
    dead = get_adapter("opencode").collect(with_logs(tmp_path / "a", "opencode", "dead"))
    assert dead.status == "error" and "Connection error" in dead.error
    assert (dead.turns, dead.input_tokens, dead.output_tokens) == (0, 0, 0)
    limited = get_adapter("opencode").collect(with_logs(tmp_path / "b", "opencode", "limit", turns=1))
    assert limited.status == "error" and "call limit 1 reached" in limited.error


def test_openhands_collect_reads_the_end_event_and_keeps_the_conversation(tmp_path):
    ctx = with_logs(tmp_path, "openhands", "success")
    got = get_adapter("openhands").collect(ctx)
    assert got.status == "success" and got.error is None
    assert (got.turns, got.input_tokens, got.output_tokens, got.cost_usd) == (3, 300, 60, 0.0)
    assert got.logs[0] == "openhands.jsonl"
    kept = [p for p in got.logs if p.startswith("openhands/")]
    assert any(p.endswith("base_state.json") for p in kept) and len([p for p in kept if "/events/" in p]) == 8
    assert all((ctx.log_dir / p).is_file() for p in got.logs)


def test_openhands_collect_dead_endpoint_and_max_iterations(tmp_path):
    dead = get_adapter("openhands").collect(with_logs(tmp_path / "a", "openhands", "dead"))
    assert dead.status == "error" and "Connection error" in dead.error
    assert (dead.turns, dead.input_tokens, dead.output_tokens) == (0, 0, 0)
    limited = get_adapter("openhands").collect(with_logs(tmp_path / "b", "openhands", "max_turns", turns=1))
    assert limited.status == "max_turns" and "MaxIterationsReached" in limited.error
    assert (limited.turns, limited.input_tokens, limited.output_tokens) == (1, 100, 20)


def test_openhands_collect_falls_back_to_the_persisted_state_when_the_launcher_was_killed(tmp_path):
    ctx = with_logs(tmp_path, "openhands", "success")
    stdout = ctx.log_dir / "openhands.jsonl"
    stdout.write_text(stdout.read_text().splitlines()[0] + "\n")  # only the start event: killed mid-run
    got = get_adapter("openhands").collect(ctx)
    assert got.status == "incomplete" and "did not finish" in got.error
    assert (got.turns, got.input_tokens, got.output_tokens) == (3, 300, 60)  # from base_state.json


def test_mini_swe_agent_collect_sums_message_usage_and_keeps_the_trajectory(tmp_path):
    ctx = with_logs(tmp_path, "mini-swe-agent", "success")
    got = get_adapter("mini-swe-agent").collect(ctx)
    assert got.status == "success" and got.error is None
    assert (got.turns, got.input_tokens, got.output_tokens, got.cache_read_tokens, got.cost_usd) == (3, 300, 60, 0, 0.0)
    assert got.logs == ["mini.log", "trajectory.json"]
    assert json.loads((ctx.log_dir / "trajectory.json").read_text())["info"]["exit_status"] == "Submitted"


def test_mini_swe_agent_collect_dead_endpoint_and_step_limit(tmp_path):
    dead = get_adapter("mini-swe-agent").collect(with_logs(tmp_path / "a", "mini-swe-agent", "dead"))
    assert dead.status == "error" and dead.error.startswith("InternalServerError") and "Connection error" in dead.error
    assert (dead.input_tokens, dead.output_tokens) == (0, 0)
    limited = get_adapter("mini-swe-agent").collect(with_logs(tmp_path / "b", "mini-swe-agent", "max_turns", turns=1))
    assert limited.status == "max_turns" and limited.error == "LimitsExceeded"
    assert (limited.turns, limited.input_tokens, limited.output_tokens) == (1, 100, 20)


@pytest.mark.parametrize("tool", TOOLS)
def test_collect_never_raises_on_missing_logs(tmp_path, tool):
    got = get_adapter(tool).collect(context(tmp_path, tool))
    assert (got.status, got.turns, got.input_tokens, got.output_tokens, got.cost_usd) == (None, None, None, None, None)
    assert got.logs == [] and got.error


@pytest.mark.parametrize("tool", TOOLS)
def test_collect_on_logs_cut_short_by_a_kill_never_raises(tmp_path, tool):
    ctx = with_logs(tmp_path, tool, "success")
    stdout = ctx.log_dir / STDOUT[tool]
    lines = stdout.read_text().splitlines()
    stdout.write_text("\n".join(lines[: len(lines) // 2]) + "\n" + lines[-1][:25])  # the last line cut mid-way
    trajectory = ctx.home / ".mini-swe-agent" / "trajectory.json"
    if trajectory.exists():  # rewritten after every step: a kill may cut it mid-write
        trajectory.write_text(trajectory.read_text()[:1000])
    got = get_adapter(tool).collect(ctx)
    assert got.status != "success" and got.error
    if tool == "opencode":  # the steps that finished are counted
        assert got.status == "incomplete" and got.turns >= 1 and got.input_tokens == 100 * got.turns
    if tool == "mini-swe-agent":
        assert got.status is None and got.input_tokens is None and "trajectory" in got.error


# --------------------------------------------------------------------------------------------------------------
# End to end: the real tool, the runner, the sandbox, the gateway, the scripted LLM


def _files_holding(root: Path, secret: str) -> list[str]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink() and path.stat().st_size < 50_000_000:
            if secret.encode() in path.read_bytes():
                found.append(str(path.relative_to(root)))
    return found


def _script(name: str, training: str) -> list[dict]:
    import support.cli_agents as harness

    # OpenCode offers no finish tool: it runs the last step's marker command, then gets the plain-text finish
    # that scripted_llm plays past the end of the script, and stops.
    return harness.train_and_submit(training)


def _run_real_tool(name, tmp_path, workspace, tiny_model, gsm8k_data, monkeypatch, training="real"):
    import support.cli_agents as harness
    from scripted_llm import ScriptedLLM

    harness.require_tool(name)
    upstream_log = tmp_path / "upstream.jsonl"  # outside the run directory: it sees the provider key
    with ScriptedLLM(_script(name, training), upstream_log) as llm:
        run = harness.run_cli(workspace, tiny_model, gsm8k_data, harness.cli_entry(name, llm.url), upstream_log,
                              monkeypatch=monkeypatch)
    print(f"{name} ({training} training): end-to-end run took {run.seconds:.1f} s")
    return harness, run


def _check_run(harness, run) -> dict:
    """What every tool's end-to-end run must show; returns the tool's own usage."""
    assert run.run["status"] == "completed", (run.run.get("error"), run.run.get("llm"))
    scored = [e for e in run.ledger if e.get("model_path") == "output/v1" and e.get("score") is not None]
    assert scored, run.ledger
    if "code_revision" in scored[0]:
        revision = scored[0]["code_revision"]
        assert revision, scored[0]
        git_dir = run.run_dir / "grader" / "code.git"
        subprocess.run(["git", "--git-dir", str(git_dir), "cat-file", "-e", f"{revision}^{{commit}}"], check=True)
    expected = harness.scripted_usage(run.upstream_log)
    assert expected["calls"] >= 3
    gateway = run.run["llm"]["usage"]["gateway"]
    assert {k: gateway[k] for k in expected} == expected
    assert {k: run.run["llm"]["tokens"][k] for k in expected} == expected
    transcript = [json.loads(line) for line in (run.run_dir / "gateway" / "transcript.jsonl").read_text().splitlines()]
    assert len([t for t in transcript if t.get("ok")]) == expected["calls"]
    assert not _files_holding(run.run_dir, os.environ[harness.SCRIPTED_KEY_ENV])
    tool = run.run["llm"]["usage"]["tool"]
    assert tool["status"] == "success", tool
    return tool


def _tool_calls_usage(upstream_log: list[dict]) -> tuple[int, int, int]:
    """(calls, prompt, completion) of the upstream calls that offered tools: the agent loop's, not side calls."""
    loop = [r for r in upstream_log if r.get("has_tools")]
    return (len(loop), sum(r["usage"]["prompt_tokens"] for r in loop), sum(r["usage"]["completion_tokens"] for r in loop))


def _run_dead(name, tmp_path, workspace, tiny_model, gsm8k_data, monkeypatch):
    import support.cli_agents as harness
    from scripted_llm import dead_port

    harness.require_tool(name)
    entry = harness.cli_entry(name, f"http://127.0.0.1:{dead_port()}/v1")
    run = harness.run_cli(workspace, tiny_model, gsm8k_data, entry, tmp_path / "upstream.jsonl", monkeypatch=monkeypatch)
    print(f"{name}: dead endpoint run took {run.seconds:.1f} s, status {run.run['status']}")
    assert run.seconds < 120
    assert run.run["status"] in ("stopped", "failed"), run.run
    if run.run["status"] == "stopped":
        assert run.run["stopped_by"]["kind"] == "llm_endpoint_dead"
    assert not run.ledger
    assert run.run["llm"]["usage"]["gateway"]["input_tokens"] == 0
    return run


@pytest.mark.tools
@pytest.mark.parametrize("training", training_params("opencode"))
def test_opencode_trains_submits_and_is_accounted_for(training, tmp_path, workspace, tiny_model, gsm8k_data, monkeypatch):
    harness, run = _run_real_tool("opencode", tmp_path, workspace, tiny_model, gsm8k_data, monkeypatch, training)
    tool = _check_run(harness, run)
    calls, prompt, completion = _tool_calls_usage(run.upstream_log)
    # OpenCode's step_finish events count the agent loop's calls, not its title-generation call.
    assert (tool["turns"], tool["input_tokens"], tool["output_tokens"]) == (calls, prompt, completion)
    assert len(run.upstream_log) == calls + 1
    assert (run.run_dir / "agent" / "opencode.jsonl").exists()


@pytest.mark.tools
@pytest.mark.parametrize("training", training_params("openhands"))
def test_openhands_trains_submits_and_is_accounted_for(training, tmp_path, workspace, tiny_model, gsm8k_data, monkeypatch):
    harness, run = _run_real_tool("openhands", tmp_path, workspace, tiny_model, gsm8k_data, monkeypatch, training)
    tool = _check_run(harness, run)
    expected = harness.scripted_usage(run.upstream_log)
    assert (tool["turns"], tool["input_tokens"], tool["output_tokens"]) == (
        expected["calls"], expected["input_tokens"], expected["output_tokens"])
    assert any(p.endswith("base_state.json") for p in tool["logs"])


@pytest.mark.tools
@pytest.mark.parametrize("training", training_params("mini-swe-agent"))
def test_mini_swe_agent_trains_submits_and_is_accounted_for(training, tmp_path, workspace, tiny_model, gsm8k_data, monkeypatch):
    harness, run = _run_real_tool("mini-swe-agent", tmp_path, workspace, tiny_model, gsm8k_data, monkeypatch, training)
    tool = _check_run(harness, run)
    expected = harness.scripted_usage(run.upstream_log)
    assert (tool["turns"], tool["input_tokens"], tool["output_tokens"]) == (
        expected["calls"], expected["input_tokens"], expected["output_tokens"])
    assert (run.run_dir / "agent" / "trajectory.json").exists()
    # The run's directory alone tells the run: the prompt, the transcript, the code at each submission, scores.
    from rlbench.recording.reconstruct import reconstruct

    story = reconstruct(run.run_dir)
    assert story["missing"] == [] and (run.run_dir / "agent" / "prompt.md").read_text().startswith(story["prompt"]["text"])
    assert story["transcript"]["records"] == len(run.upstream_log)
    scored = [s for s in story["submissions"] if s["status"] in ("scored", "cached")]
    assert scored and all("sft_agent.py" in " ".join(s["code_files"]) and s["checkpoint"]["files"] for s in scored)


@pytest.mark.tools
@pytest.mark.parametrize("tool", dead_endpoint_params(TOOLS))
def test_real_tool_on_a_dead_endpoint_ends_in_bounded_time(tool, tmp_path, workspace, tiny_model, gsm8k_data, monkeypatch):
    _run_dead(tool, tmp_path, workspace, tiny_model, gsm8k_data, monkeypatch)
