"""OpenAI Codex CLI (`codex exec`, npm @openai/codex), headless against the run's LLM gateway.

Traps handled (AGENT_TOOLS.md §4):
- Codex speaks only the Responses API: a custom provider (`wire_api="responses"`, base_url = gateway/v1,
  `env_key` naming a variable that holds the gateway key) set with `-c`; the built-in `openai` provider
  would ignore OPENAI_BASE_URL and try WebSockets first;
- a dead endpoint makes it retry forever: `--disable unbounded_connection_retries`, and small provider
  request/stream retry counts;
- outside a git repository it refuses without `--skip-git-repo-check`; approvals and its own sandbox are
  off (`--dangerously-bypass-approvals-and-sandbox`: the run's sandbox is the boundary); no `--search`
  (the hosted web_search tool); stdin is /dev/null (the runner's), else exec waits for more prompt;
- no `--ephemeral`: the rollout file under $CODEX_HOME/sessions has per-call token counts, kept beside
  the `--json` stdout;
- the agent's shells inherit the whole environment (GRADING_SERVER_URL and the rest of the contract) but
  names matching *KEY*/*SECRET*/*TOKEN*, the gateway key's variable among them: Codex 0.171 does NOT apply
  those default excludes unless `ignore_default_excludes = false` (checked), which config.toml sets;
- commands run in `bash -lc` (a login shell) by default, whose /etc/profile resets PATH: the run's
  interpreter is lost (`python: command not found`, checked); `allow_login_shell = false` keeps PATH;
- no turn limit flag: the gateway refuses calls beyond the registry's limit;
- usage: the sum of `turn.completed.usage` (input_tokens includes cached ones), else (stopped mid-turn) the
  rollout's per-call `token_usage_record`s; turns = model calls (those records); no cost anywhere.
"""

from __future__ import annotations

import json
from pathlib import Path

from rlbench.coding_agents.adapters.base import Adapter, Collected, Launch, LaunchContext, context_file_text, read_jsonl_events
from rlbench.coding_agents.adapters.claude_code import keep_transcripts

PROVIDER = "rlbench"
KEY_ENV = "RLBENCH_GATEWAY_KEY"  # holds the gateway key; kept out of the shells (*KEY* is excluded)
# Per request and per stream (tool.options.max_retries; Codex's own defaults are 4 and 5). Bounded either way:
# unbounded_connection_retries is disabled, and the runner ends a run whose endpoint is dead.
MAX_RETRIES = 4
STDOUT = "stdout.jsonl"
SESSIONS = "sessions"  # under log_dir: copies of $CODEX_HOME/sessions/**/rollout-*.jsonl


# The user config: no update check or analytics; shells are not login shells (a login shell's /etc/profile resets
# PATH, and `python` is then not the run's interpreter) and get the environment less *KEY*/*SECRET*/*TOKEN*.
CONFIG_TOML = """\
check_for_update_on_startup = false
allow_login_shell = false

[analytics]
enabled = false

[shell_environment_policy]
inherit = "all"
ignore_default_excludes = false
"""


def codex_home(ctx: LaunchContext) -> Path:
    return ctx.home / ".codex"


def toml_string(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid TOML basic string


class Codex(Adapter):
    tool = "codex"
    binary = "codex"

    def plan(self, ctx: LaunchContext) -> Launch:
        retries = int(self.option(ctx.agent, "max_retries", MAX_RETRIES))
        provider = (
            f"{{name={toml_string('rlbench gateway')}, base_url={toml_string(ctx.gateway.url.rstrip('/') + '/v1')}, "
            f'wire_api="responses", env_key="{KEY_ENV}", '
            f"request_max_retries={retries}, stream_max_retries={retries}}}"
        )
        overrides = [f"model_providers.{PROVIDER}={provider}", f"model_provider={toml_string(PROVIDER)}"]
        argv = [str(self.binary_path(ctx.agent)), "exec", "--json", "--skip-git-repo-check",
                "--dangerously-bypass-approvals-and-sandbox", "-C", str(ctx.workspace), "-m", ctx.gateway.model,
                "--disable", "unbounded_connection_retries"]
        for override in overrides:
            argv += ["-c", override]
        argv += ["--", ctx.prompt]
        env = {"CODEX_HOME": str(codex_home(ctx)), KEY_ENV: ctx.gateway.key}
        files = {
            ctx.workspace / "AGENTS.md": context_file_text(ctx),
            codex_home(ctx) / "config.toml": CONFIG_TOML,  # also creates CODEX_HOME, which Codex requires
        }
        return Launch(argv=argv, env=env, files=files, stdout=STDOUT, visible=self.visible_paths(ctx.agent))

    def collect(self, ctx: LaunchContext) -> Collected:
        out = Collected()
        stdout = ctx.log_dir / STDOUT
        if stdout.exists():
            out.logs.append(STDOUT)
        out.logs += keep_transcripts(codex_home(ctx) / "sessions", ctx.log_dir / SESSIONS, SESSIONS, "rollout-*.jsonl")
        events = read_jsonl_events(stdout)
        rollouts = [ctx.log_dir / rel for rel in out.logs if rel.startswith(SESSIONS + "/")]
        calls = rollout_calls(rollouts)
        out.turns = len(calls) if calls or rollouts else None  # model calls: one usage record each
        completed = [e for e in events if e.get("type") == "turn.completed"]
        usages = [e["usage"] for e in completed if isinstance(e.get("usage"), dict)]
        if not usages and calls:  # stopped mid-turn: the rollout still has each finished call
            usages = list(calls.values())
        if usages:
            out.input_tokens = _sum(u.get("input_tokens") for u in usages)
            out.output_tokens = _sum(u.get("output_tokens") for u in usages)
            out.cache_read_tokens = _sum(u.get("cached_input_tokens") for u in usages)
            out.cache_write_tokens = _sum(u.get("cache_write_input_tokens") for u in usages)
        failed = [e for e in events if e.get("type") == "turn.failed"]
        if failed:
            out.status = "error"
            error = failed[-1].get("error")
            out.error = error.get("message") if isinstance(error, dict) else str(error)
        elif completed:
            out.status = "success"
        elif not events:
            out.error = f"{STDOUT} is empty or missing"
        else:
            errors = [e.get("message") for e in events if e.get("type") == "error" and e.get("message")]
            out.error = f"no turn.completed in {STDOUT}: the tool did not finish" + (
                f" (last error: {errors[-1]})" if errors else "")
        return out


def rollout_calls(paths: list[Path]) -> dict[str, dict]:
    """{response id: usage} of the model calls recorded in the rollout files (`token_usage_record` lines)."""
    calls: dict[str, dict] = {}
    for path in paths:
        for event in read_jsonl_events(path):
            payload = event.get("payload")
            if event.get("type") != "token_usage_record" or not isinstance(payload, dict):
                continue
            if isinstance(payload.get("usage"), dict):
                calls[str(payload.get("response_id") or len(calls))] = payload["usage"]
    return calls


def _int(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _sum(values) -> int | None:
    known = [v for v in (_int(x) for x in values) if v is not None]
    return sum(known) if known else None
