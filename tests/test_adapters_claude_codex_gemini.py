"""The Claude Code, Codex CLI and Gemini CLI adapters: the launch each plans, what collect() reads from logs
the real tools wrote, and one end-to-end run of each real tool through the runner, the gateway and the sandbox.

The logs under tests/fixtures/agent_logs/<tool>/<case>/ were captured by running each pinned tool with its
adapter's plan behind the real LLM gateway (rlbench.coding_agents.gateway) in front of tests/fixtures/scripted_llm.py, with
the script "echo hi > hello.txt; cat hello.txt; finish" (100 prompt / 20 completion tokens a call):
success (3 calls), dead (the gateway's upstream on a port nobody listens on) and max_turns (turn limit 1).
Each case holds stdout.jsonl (the tool's structured stdout) and home/ (the transcripts the tool wrote under
its private HOME).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomllib

from rlbench.coding_agents.adapters import get_adapter
from rlbench.coding_agents.adapters.base import GatewayEndpoint
from rlbench.coding_agents.tools import install_prefix
from rlbench.recording.ledger import is_scored
from support.cli_agents import (  # noqa: F401
    GATEWAY_KEY,
    GATEWAY_URL,
    LOGS,
    PROVIDER_KEY,
    STDOUT,
    context,
    dead_endpoint_params,
    option,
    tool_trainings,
    with_logs,
)
from support.settings import REPO

sys.path.insert(0, str(REPO / "tests" / "fixtures"))  # scripted_llm

TOOLS = ("claude-code", "codex", "gemini-cli")


# --------------------------------------------------------------------------------------------------------------
# plan()


@pytest.mark.parametrize("tool", TOOLS)
def test_plan_never_carries_the_provider_key_and_shows_the_tool_install(tmp_path, monkeypatch, tool):
    ctx = context(tmp_path, tool)
    monkeypatch.setenv(ctx.agent["driver"]["key_env"], PROVIDER_KEY)
    launch = get_adapter(tool).plan(ctx)
    everything = [*launch.argv, *launch.env.values(), *launch.files.values(), *map(str, launch.files)]
    assert not any(PROVIDER_KEY in text for text in everything)
    # The runner scrubs the driver's key variable; a plan may reuse the name only for the gateway's key (Gemini).
    assert launch.env.get(ctx.agent["driver"]["key_env"], GATEWAY_KEY) == GATEWAY_KEY
    assert launch.visible == [install_prefix(ctx.agent["tool"])]
    assert Path(launch.argv[0]).name == get_adapter(tool).binary
    assert launch.argv[-1] == ctx.prompt
    for path in launch.files:  # all inside the workspace (the home is in it)
        assert Path(path).is_relative_to(ctx.workspace)


def test_claude_code_plan(tmp_path):
    ctx = context(tmp_path, "claude-code", turns=40, time_limit_s=7200)
    launch = get_adapter("claude-code").plan(ctx)
    argv, env = launch.argv, launch.env
    assert {"-p", "--dangerously-skip-permissions", "--verbose"} <= set(argv)
    assert option(argv, "--output-format") == "stream-json"
    assert option(argv, "--model") == "claude-sonnet-4-5"
    assert option(argv, "--max-turns") == "40"
    assert argv[-2:] == ["--", ctx.prompt]
    assert env["IS_SANDBOX"] == "1"  # root refuses --dangerously-skip-permissions without it
    assert env["ANTHROPIC_BASE_URL"] == GATEWAY_URL  # no /v1: Claude appends /v1/messages
    assert env["ANTHROPIC_AUTH_TOKEN"] == GATEWAY_KEY  # Bearer, what the gateway takes
    assert "ANTHROPIC_API_KEY" not in env
    for name in ("ANTHROPIC_MODEL", "ANTHROPIC_SMALL_FAST_MODEL", "ANTHROPIC_DEFAULT_HAIKU_MODEL",
                 "CLAUDE_CODE_SUBAGENT_MODEL"):
        assert env[name] == "claude-sonnet-4-5"
    assert int(env["CLAUDE_CODE_MAX_RETRIES"]) == 10  # the tool's default; tool.options.max_retries sets it
    assert env["BASH_MAX_TIMEOUT_MS"] == "7200000"  # a training command may run for the whole budget
    for name in ("DISABLE_TELEMETRY", "DISABLE_AUTOUPDATER", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC"):
        assert env[name] == "1"
    assert env["CLAUDE_CONFIG_DIR"] == str(ctx.home / ".claude")
    assert launch.files[ctx.workspace / "CLAUDE.md"] == ctx.prompt
    settings = json.loads(launch.files[ctx.home / ".claude" / "settings.json"])
    assert settings["permissions"]["defaultMode"] == "bypassPermissions"


def test_claude_code_plan_without_a_turn_limit_passes_no_max_turns(tmp_path):
    launch = get_adapter("claude-code").plan(context(tmp_path, "claude-code", turns=None))
    assert "--max-turns" not in launch.argv


def test_codex_plan(tmp_path):
    ctx = context(tmp_path, "codex")
    launch = get_adapter("codex").plan(ctx)
    argv, env = launch.argv, launch.env
    assert argv[1] == "exec"
    assert {"--json", "--skip-git-repo-check", "--dangerously-bypass-approvals-and-sandbox"} <= set(argv)
    assert "--search" not in argv and "--ephemeral" not in argv  # offline; the rollout file is kept
    assert option(argv, "--disable") == "unbounded_connection_retries"  # else a dead endpoint hangs forever
    assert option(argv, "-C") == str(ctx.workspace)
    assert option(argv, "-m") == "gpt-5"
    overrides = tomllib.loads("\n".join(argv[i + 1] for i, a in enumerate(argv) if a == "-c"))
    provider = overrides["model_providers"][overrides["model_provider"]]
    assert provider["base_url"] == GATEWAY_URL + "/v1"
    assert provider["wire_api"] == "responses"
    assert env[provider["env_key"]] == GATEWAY_KEY
    assert provider["request_max_retries"] == provider["stream_max_retries"] == 4  # bounded: not unbounded
    assert env["CODEX_HOME"] == str(ctx.home / ".codex")
    config = tomllib.loads(launch.files[ctx.home / ".codex" / "config.toml"])
    # The agent's shells keep the contract (GRADING_SERVER_URL...) but not *KEY* variables (the gateway key).
    assert config["shell_environment_policy"] == {"inherit": "all", "ignore_default_excludes": False}
    assert launch.files[ctx.workspace / "AGENTS.md"] == ctx.prompt


def test_gemini_cli_plan(tmp_path):
    ctx = context(tmp_path, "gemini-cli", turns=40, time_limit_s=7200)
    launch = get_adapter("gemini-cli").plan(ctx)
    argv, env = launch.argv, launch.env
    assert {"--yolo", "--skip-trust"} <= set(argv)
    assert option(argv, "--output-format") == "stream-json"
    assert option(argv, "--model") == "gemini-2.5-pro"
    assert option(argv, "--prompt") == ctx.prompt
    assert env["GOOGLE_GEMINI_BASE_URL"] == GATEWAY_URL
    assert env["GEMINI_API_KEY"] == GATEWAY_KEY
    assert env["GEMINI_CLI_HOME"] == str(ctx.home)
    assert env["GEMINI_SANDBOX"] == "false" and env["GEMINI_CLI_TRUST_WORKSPACE"] == "true"
    settings = json.loads(launch.files[ctx.home / ".gemini" / "settings.json"])
    assert settings["security"]["auth"]["selectedType"] == "gemini-api-key"  # else "Invalid auth method", exit 41
    assert settings["model"]["maxSessionTurns"] == 40
    assert settings["general"]["maxAttempts"] == 10
    assert settings["tools"]["shell"]["inactivityTimeout"] == 7200
    assert settings["privacy"]["usageStatisticsEnabled"] is False
    assert launch.files[ctx.workspace / "GEMINI.md"] == ctx.prompt


# --------------------------------------------------------------------------------------------------------------
# collect() on captured logs


def test_claude_code_collect_reads_the_result_event_and_keeps_the_transcript(tmp_path):
    ctx = with_logs(tmp_path, "claude-code", "success")
    got = get_adapter("claude-code").collect(ctx)
    assert (got.status, got.error, got.turns) == ("success", None, 3)
    assert (got.input_tokens, got.output_tokens, got.cache_read_tokens, got.cache_write_tokens) == (300, 60, 0, 0)
    assert got.cost_usd == pytest.approx(0.0018)  # Claude's own price table applied to a non-Claude model
    assert got.logs[0] == "stdout.jsonl"
    transcripts = [p for p in got.logs if p.startswith("transcripts/")]
    assert len(transcripts) == 1 and (ctx.log_dir / transcripts[0]).read_bytes() == next(
        (LOGS / "claude-code" / "success" / "home" / ".claude" / "projects").rglob("*.jsonl")
    ).read_bytes()


def test_claude_code_collect_says_error_on_a_dead_endpoint_though_subtype_says_success(tmp_path):
    ctx = with_logs(tmp_path, "claude-code", "dead")
    result = json.loads((ctx.log_dir / "stdout.jsonl").read_text().splitlines()[-1])
    assert result["subtype"] == "success" and result["is_error"] is True
    got = get_adapter("claude-code").collect(ctx)
    assert got.status == "error" and "500" in got.error
    assert (got.input_tokens, got.output_tokens) == (0, 0)


def test_claude_code_collect_max_turns(tmp_path):
    got = get_adapter("claude-code").collect(with_logs(tmp_path, "claude-code", "max_turns", turns=1))
    assert got.status == "max_turns" and "maximum number of turns" in got.error
    assert (got.input_tokens, got.output_tokens) == (100, 20)


def test_claude_code_collect_counts_model_usage_of_all_models_not_the_main_loop_usage(tmp_path):
    ctx = with_logs(tmp_path, "claude-code", "success")
    lines = (ctx.log_dir / "stdout.jsonl").read_text().splitlines()
    result = json.loads(lines[-1])
    # A side call under another model name, as Claude Code makes for titles: in modelUsage, not in usage.
    result["modelUsage"]["side-model"] = {"inputTokens": 7, "outputTokens": 3, "cacheReadInputTokens": 0,
                                          "cacheCreationInputTokens": 0, "costUSD": 0}
    (ctx.log_dir / "stdout.jsonl").write_text("\n".join([*lines[:-1], json.dumps(result)]) + "\n")
    got = get_adapter("claude-code").collect(ctx)
    assert (got.input_tokens, got.output_tokens) == (307, 63)


def test_codex_collect_sums_turn_completed_and_counts_calls_in_the_rollout(tmp_path):
    ctx = with_logs(tmp_path, "codex", "success")
    got = get_adapter("codex").collect(ctx)
    assert (got.status, got.error, got.turns) == ("success", None, 3)
    assert (got.input_tokens, got.output_tokens, got.cache_read_tokens) == (300, 60, 0)
    assert got.cost_usd is None  # Codex reports no cost
    assert [p.split("/")[0] for p in got.logs] == ["stdout.jsonl", "sessions"]
    assert (ctx.log_dir / got.logs[1]).name.startswith("rollout-")


def test_codex_collect_dead_endpoint(tmp_path):
    got = get_adapter("codex").collect(with_logs(tmp_path, "codex", "dead"))
    assert got.status == "error" and got.error
    assert got.input_tokens is None and got.turns is None  # no turn completed, no rollout kept in this case


def test_gemini_cli_collect_reads_result_stats_and_keeps_the_chat(tmp_path):
    ctx = with_logs(tmp_path, "gemini-cli", "success")
    got = get_adapter("gemini-cli").collect(ctx)
    assert (got.status, got.error, got.turns) == ("success", None, 3)
    assert (got.input_tokens, got.output_tokens, got.cache_read_tokens) == (300, 60, 0)
    assert got.cost_usd is None
    assert got.logs[0] == "stdout.jsonl" and got.logs[1].startswith("chats/") and len(got.logs) == 2


def test_gemini_cli_collect_dead_endpoint_and_turn_limit(tmp_path):
    dead = get_adapter("gemini-cli").collect(with_logs(tmp_path / "a", "gemini-cli", "dead"))
    assert dead.status == "error" and "Connection error" in dead.error and dead.turns == 0
    limited = get_adapter("gemini-cli").collect(with_logs(tmp_path / "b", "gemini-cli", "max_turns", turns=1))
    assert limited.status == "max_turns"
    assert (limited.turns, limited.input_tokens, limited.output_tokens) == (1, 100, 20)


@pytest.mark.parametrize("tool", TOOLS)
def test_collect_never_raises_on_missing_logs(tmp_path, tool):
    got = get_adapter(tool).collect(context(tmp_path, tool))
    assert (got.status, got.turns, got.input_tokens, got.output_tokens, got.cost_usd) == (None, None, None, None, None)
    assert got.logs == [] and "missing" in got.error


@pytest.mark.parametrize("tool", TOOLS)
def test_collect_on_a_log_cut_short_by_a_kill_reports_no_verdict(tmp_path, tool):
    ctx = with_logs(tmp_path, tool, "success")
    lines = (ctx.log_dir / "stdout.jsonl").read_text().splitlines()
    # Killed mid-run: the final event never came, and the last line was cut in the middle.
    (ctx.log_dir / "stdout.jsonl").write_text("\n".join(lines[: len(lines) // 2]) + "\n" + lines[-1][:25])
    got = get_adapter(tool).collect(ctx)
    assert got.status is None and "did not finish" in got.error
    assert got.cost_usd is None
    if tool == "claude-code":  # the per-block usage is a snapshot, not a count: unknown
        assert got.input_tokens is None and got.turns >= 1
    else:  # the transcripts still hold the calls that finished
        assert got.turns == 3 and (got.input_tokens, got.output_tokens) == (300, 60)


# --------------------------------------------------------------------------------------------------------------
# End to end: the real tool, the runner, the sandbox, the gateway, the scripted LLM
#
# Measured here (2 shared CPU cores): a training run 25-70 s (most of it the SFT step and the grader's
# evaluation; the gateway takes about 7 s to start), a dead endpoint 13-35 s with the runner, 5-20 s without it.


def scripted_run(tool: str, training: str = "real") -> list[dict]:
    """harness.train_and_submit(training) as these tools can play it. They end on a plain-text reply: the finish step goes
    without mini-swe-agent's marker command (the scripted endpoint would play it again on every later call, and the
    tool would loop until its turn limit)."""
    import support.cli_agents as harness

    train, submit, finish = harness.train_and_submit(training)
    steps = [train, submit, {"finish": finish["finish"]}]
    if tool == "codex":
        # Codex's exec_command returns after yield_time_ms (10 s by default, 30 s at most) with the command still
        # running, and a scripted model moves on: wait for the training in two calls of 30 s each.
        script = harness.TRAINING_SCRIPT[training]
        wait = f"while pgrep -f '{script[:-1]}[{script[-1]}]' >/dev/null; do sleep 1; done; ls output/v1"
        steps[:1] = [{"tool": "exec_command", "args": {"cmd": train["command"], "yield_time_ms": 30000}},
                     {"tool": "exec_command", "args": {"cmd": wait, "yield_time_ms": 30000}}]
    return steps


def files_containing(root: Path, secret: str) -> list[str]:
    """The files under root that contain secret."""
    return [
        str(path.relative_to(root))
        for path in root.rglob("*")
        if path.is_file() and not path.is_symlink() and secret.encode() in path.read_bytes()
    ]


@pytest.mark.tools
@pytest.mark.parametrize("tool, training", tool_trainings(TOOLS))
def test_real_tool_trains_submits_and_is_accounted_for(tool, training, tmp_path, workspace, tiny_model, gsm8k_data,
                                                       monkeypatch):
    import support.cli_agents as harness
    from scripted_llm import ScriptedLLM

    harness.require_tool(tool)
    upstream_log = tmp_path / "upstream.jsonl"  # outside the run directory: it sees the provider key
    with ScriptedLLM(scripted_run(tool, training), upstream_log) as llm:
        run = harness.run_cli(workspace, tiny_model, gsm8k_data, harness.cli_entry(tool, llm.url), upstream_log,
                              monkeypatch=monkeypatch)
    print(f"{tool} ({training} training): end-to-end run took {run.seconds:.1f} s")
    assert run.run["status"] == "completed", (run.run.get("error"), run.run.get("llm"))

    scored = [e for e in run.ledger if e.get("model_path") == "output/v1" and is_scored(e)]
    assert scored, run.ledger
    revision = scored[0]["code_revision"]  # the code snapshot of that submission
    code_git = run.run_dir / "grader" / "code.git"
    subprocess.run(["git", "--git-dir", str(code_git), "cat-file", "-e", f"{revision}^{{commit}}"], check=True)

    expected = harness.scripted_usage(run.upstream_log)
    assert expected["calls"] == len(scripted_run(tool, training))  # no side calls from these tools in such a short run
    gateway = run.run["llm"]["usage"]["gateway"]
    assert {k: gateway[k] for k in expected} == expected
    tool_usage = run.run["llm"]["usage"]["tool"]  # every call counts for these three tools (see the adapters)
    assert tool_usage["status"] == "success", tool_usage
    assert tool_usage["input_tokens"] == expected["input_tokens"]
    assert tool_usage["output_tokens"] == expected["output_tokens"]
    assert tool_usage["turns"] >= 1 and tool_usage["logs"][0] == "stdout.jsonl"
    assert all((run.run_dir / "agent" / log).is_file() for log in tool_usage["logs"])

    transcript = (run.run_dir / "gateway" / "transcript.jsonl").read_text().splitlines()
    assert len([line for line in transcript if json.loads(line)["ok"]]) == expected["calls"]
    assert files_containing(run.run_dir, os.environ[harness.SCRIPTED_KEY_ENV]) == []


@pytest.mark.tools
@pytest.mark.parametrize("tool", dead_endpoint_params(TOOLS))
def test_real_tool_on_a_dead_endpoint_ends_in_bounded_time(tool, tmp_path, workspace, tiny_model, gsm8k_data,
                                                           monkeypatch):
    import support.cli_agents as harness
    from scripted_llm import dead_port

    harness.require_tool(tool)
    entry = harness.cli_entry(tool, f"http://127.0.0.1:{dead_port()}/v1")
    run = harness.run_cli(workspace, tiny_model, gsm8k_data, entry, tmp_path / "upstream.jsonl",
                          monkeypatch=monkeypatch)
    print(f"{tool}: dead endpoint run took {run.seconds:.1f} s, status {run.run['status']}")
    assert run.seconds < 120
    # Stopped by the runner (the gateway saw the calls fail), or ended by the tool giving up first.
    assert run.run["status"] in ("stopped", "failed"), run.run
    assert run.ledger == [] and run.run["llm"]["usage"]["gateway"]["input_tokens"] == 0
    assert run.run["llm"]["usage"]["tool"]["status"] in ("error", None)


@pytest.mark.tools
@pytest.mark.slow  # the runner bounds every run (test above); this checks the adapters' own retry settings
@pytest.mark.parametrize("tool", TOOLS)
def test_tool_alone_gives_up_on_a_dead_endpoint_within_seconds(tool, tmp_path, monkeypatch):
    """Without the runner watching the gateway, the adapter's own retry bounds end the tool (Codex would otherwise
    retry forever, Claude Code for about 190 s, Gemini CLI for about 200 s)."""
    import support.cli_agents as harness
    from rlbench.coding_agents.gateway.gateway import LLMGateway
    from scripted_llm import dead_port

    harness.require_tool(tool)
    monkeypatch.setenv(harness.SCRIPTED_KEY_ENV, PROVIDER_KEY)
    ctx = context(tmp_path, tool)
    # The tools' own retry defaults take minutes on a dead endpoint (the runner cuts that short); a small
    # tool.options.max_retries must bound the tool by itself.
    ctx.agent["tool"] = {**ctx.agent["tool"], "options": {"max_retries": 2}}
    adapter = get_adapter(tool)
    driver = {"model": ctx.gateway.model, "provider": "openai-compatible", "upstream_model": "scripted",
              "base_url": f"http://127.0.0.1:{dead_port()}/v1", "key_env": harness.SCRIPTED_KEY_ENV}
    with LLMGateway(driver, tmp_path / "gateway") as gateway:
        ctx.gateway = GatewayEndpoint(url=gateway.url, key=gateway.key, model=gateway.model)
        launch = adapter.plan(ctx)
        for path, text in launch.files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        env = {"PATH": os.environ["PATH"], "LANG": "C.UTF-8", "HOME": str(ctx.home), "TMPDIR": str(tmp_path),
               **launch.env}
        started = time.monotonic()
        with open(ctx.log_dir / launch.stdout, "wb") as out, open(ctx.log_dir / "stderr.log", "wb") as err:
            proc = subprocess.Popen(launch.argv, cwd=ctx.workspace, env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=err, start_new_session=True)
            try:
                code = proc.wait(timeout=120)
            finally:
                if proc.poll() is None:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        seconds = time.monotonic() - started
    print(f"{tool}: gave up on the dead endpoint after {seconds:.1f} s, exit code {code}")
    assert seconds < 60 and code != 0
    got = adapter.collect(ctx)
    assert got.status == "error" and got.error
