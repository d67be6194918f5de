"""OpenCode (`opencode run`, npm opencode-ai, a native Bun binary), headless against the run's LLM gateway.

Launch: `opencode run --format json -m gateway/<model> --dir <workspace> <prompt>`, its config passed inline in
OPENCODE_CONFIG_CONTENT (merged last, over any opencode.json the agent may write in its workspace): a provider
"gateway" (npm @ai-sdk/openai-compatible, bundled in the binary: chat completions with stream and
include_usage) whose baseURL is the gateway's /v1 and whose apiKey is `{env:RLBENCH_GATEWAY_KEY}` (the
gateway's per-run key; the provider's key never reaches the sandbox). The prompt is also the workspace's
AGENTS.md (OpenCode reads it).

Traps handled (AGENT_TOOLS.md §6, checked on 1.18.33):
- permission auto-reject: without `"permission": "allow"` (or --auto), `--format json` mode silently rejects
  every permission request (anomalyco/opencode#39459): the config says "allow";
- network at startup: OPENCODE_DISABLE_MODELS_FETCH (the models.dev catalogue), OPENCODE_DISABLE_AUTOUPDATE,
  OPENCODE_DISABLE_DEFAULT_PLUGINS, OPENCODE_DISABLE_LSP_DOWNLOAD, "share": "disabled"; and the background
  `npm install @opencode-ai/plugin` OpenCode starts in every config directory (~/.config/opencode here; 64 MB
  from the registry, a silent failure offline): it is skipped when that directory already has a
  node_modules/ and a package-lock.json listing the package (Npm.install's dirty check in the binary), so
  plan() writes those two;
- config and state stay in the private home: XDG_CONFIG_HOME, XDG_DATA_HOME (sessions db, logs) and
  XDG_STATE_HOME point inside it (the runner drops the host's XDG_DATA_HOME; XDG_CONFIG_HOME would pass);
- the bash tool kills a command after 2 min unless the model passes a timeout: the default
  (OPENCODE_EXPERIMENTAL_BASH_DEFAULT_TIMEOUT_MS) is the run's budget, so a training command is not cut;
- the step limit `agent.build.steps` (limits.turns) is soft: once reached, OpenCode tells the model to answer
  in text but still offers tools. Runaway loops (a model that keeps calling tools never ends `opencode run`):
  the gateway refuses every call beyond limits.turns (and the token/cost limits), the runner sees the limit
  reached (CliSession.stop_reason) and ends the run, status "stopped"; else the budget's deadline ends it;
- a dead endpoint: OpenCode retries about 70 s, then prints an `error` event and exits 1; behind the gateway
  the runner stops the run as soon as the gateway reports the upstream dead.

collect(): usage is per step: sums of `step_finish.part.tokens` {input, output, reasoning, cache {read,
write}} and `part.cost` (0 for a model without a price). The title-generation call (a request without tools)
appears in no event, so these sums count every call but that one; the gateway's totals count all. turns = the
number of step_finish events. The tool's own log (~/.local/share/opencode/log/*.log) is kept beside stdout.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rlbench.coding_agents.adapters.base import (
    Adapter, Collected, Launch, LaunchContext, as_int, context_file_text, read_jsonl_events,
)

PROVIDER = "gateway"  # the provider id in OpenCode's config: models are "gateway/<model>"
KEY_ENV = "RLBENCH_GATEWAY_KEY"  # the gateway's per-run key, read by the config's {env:...}
STDOUT = "opencode.jsonl"
TOOL_LOGS = "opencode-logs"  # under log_dir: copies of ~/.local/share/opencode/log/*.log
PLUGIN_PACKAGE = "@opencode-ai/plugin"


def config_home(ctx: LaunchContext) -> Path:
    return ctx.home / ".config"


def data_home(ctx: LaunchContext) -> Path:
    return ctx.home / ".local" / "share"


def opencode_config(ctx: LaunchContext) -> dict:
    model = ctx.gateway.model
    config: dict = {
        "$schema": "https://opencode.ai/config.json",
        "permission": "allow",  # else --format json auto-rejects every permission request
        "autoupdate": False,
        "share": "disabled",
        "provider": {
            PROVIDER: {
                "npm": "@ai-sdk/openai-compatible",
                "name": "RL-Bench LLM gateway",
                "options": {"baseURL": ctx.gateway.url.rstrip("/") + "/v1", "apiKey": "{env:%s}" % KEY_ENV},
                "models": {model: {"name": model}},
            }
        },
        "model": f"{PROVIDER}/{model}",
        "small_model": f"{PROVIDER}/{model}",  # title generation: the same model, through the gateway
    }
    turns = ctx.limits.get("turns")
    if turns:
        config["agent"] = {"build": {"steps": int(turns)}}
    return config


class OpenCode(Adapter):
    tool = "opencode"
    binary = "opencode"

    def plan(self, ctx: LaunchContext) -> Launch:
        model = ctx.gateway.model
        argv = [
            str(self.binary_path(ctx.agent)),
            "run",
            "--format", "json",
            "-m", f"{PROVIDER}/{model}",
            "--dir", str(ctx.workspace),
            ctx.prompt,
        ]
        budget_ms = max(int(ctx.time_limit_s * 1000), 120_000)
        env = {
            "OPENCODE_CONFIG_CONTENT": json.dumps(opencode_config(ctx)),
            KEY_ENV: ctx.gateway.key,
            "XDG_CONFIG_HOME": str(config_home(ctx)),
            "XDG_DATA_HOME": str(data_home(ctx)),
            "XDG_STATE_HOME": str(ctx.home / ".local" / "state"),
            "OPENCODE_DISABLE_MODELS_FETCH": "1",
            "OPENCODE_DISABLE_AUTOUPDATE": "1",
            "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1",
            "OPENCODE_DISABLE_LSP_DOWNLOAD": "1",
            "OPENCODE_DISABLE_SHARE": "1",
            "OPENCODE_EXPERIMENTAL_BASH_DEFAULT_TIMEOUT_MS": str(budget_ms),
        }
        # Skip the background `npm install @opencode-ai/plugin` in the config directory (see the module docstring).
        plugin_dir = config_home(ctx) / "opencode"
        version = str(ctx.agent["tool"]["version"])
        files = {
            ctx.workspace / "AGENTS.md": context_file_text(ctx),
            plugin_dir / "package.json": json.dumps({"dependencies": {PLUGIN_PACKAGE: version}}, indent=2) + "\n",
            plugin_dir / "package-lock.json": json.dumps(
                {"lockfileVersion": 3, "packages": {"": {"dependencies": {PLUGIN_PACKAGE: version}}}}, indent=2
            ) + "\n",
            plugin_dir / "node_modules" / ".rlbench": "OpenCode's plugin install is skipped: no network in the sandbox\n",
        }
        return Launch(argv=argv, env=env, files=files, stdout=STDOUT, visible=self.visible_paths(ctx.agent))

    def collect(self, ctx: LaunchContext) -> Collected:
        out = Collected()
        stdout = ctx.log_dir / STDOUT
        if stdout.exists():
            out.logs.append(STDOUT)
        out.logs += keep_logs(data_home(ctx) / "opencode" / "log", ctx.log_dir / TOOL_LOGS, TOOL_LOGS)
        parse_events(read_jsonl_events(stdout), out)
        if not stdout.exists() or stdout.stat().st_size == 0:
            out.error = out.error or f"{STDOUT} is empty or missing"
        return out


def parse_events(events: list[dict], out: Collected) -> Collected:
    """Fill `out` from OpenCode's --format json events (see the module docstring)."""
    steps = [e.get("part") for e in events if e.get("type") == "step_finish" and isinstance(e.get("part"), dict)]
    errors = [e for e in events if e.get("type") == "error"]
    if not events:
        return out
    out.turns = len(steps)
    sums = {"input": 0, "output": 0, "read": 0, "write": 0}
    cost, priced = 0.0, False
    for part in steps:
        tokens = part.get("tokens") if isinstance(part.get("tokens"), dict) else {}
        cache = tokens.get("cache") if isinstance(tokens.get("cache"), dict) else {}
        sums["input"] += as_int(tokens.get("input")) or 0
        sums["output"] += as_int(tokens.get("output")) or 0
        sums["read"] += as_int(cache.get("read")) or 0
        sums["write"] += as_int(cache.get("write")) or 0
        if isinstance(part.get("cost"), (int, float)):
            cost += float(part["cost"])
            priced = True
    out.input_tokens, out.output_tokens = sums["input"], sums["output"]
    out.cache_read_tokens, out.cache_write_tokens = sums["read"], sums["write"]
    out.cost_usd = round(cost, 8) if priced else None
    last_error = max((i for i, e in enumerate(events) if e.get("type") == "error"), default=-1)
    last_step = max((i for i, e in enumerate(events) if e.get("type") == "step_finish"), default=-1)
    if last_error > last_step:  # an error ended the run (a retried error followed by more steps did not)
        out.status = "error"
        out.error = error_text(errors[-1])
    elif steps and steps[-1].get("reason") == "stop":
        out.status = "success"
    else:
        out.status = "incomplete"  # stopped mid-step: killed at the deadline, or by the runner
        out.error = "the last step did not finish with a stop: the run was cut short"
    return out


def error_text(event: dict) -> str:
    error = event.get("error")
    if isinstance(error, dict):
        data = error.get("data") if isinstance(error.get("data"), dict) else {}
        message = data.get("message") or error.get("message")
        name = error.get("name")
        if message:
            return f"{name}: {message}" if name else str(message)
        return str(name or json.dumps(error))
    return str(error or json.dumps(event)[:500])


def keep_logs(source: Path, dest: Path, rel: str, pattern: str = "*.log") -> list[str]:
    """Copy `source`/`pattern` to `dest`; their paths relative to log_dir. Missing or unreadable files are skipped."""
    kept: list[str] = []
    if not source.is_dir():
        return kept
    for path in sorted(source.glob(pattern)):
        if not path.is_file() or path.is_symlink():
            continue
        try:
            dest.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, dest / path.name)
        except OSError:
            continue
        kept.append(f"{rel}/{path.name}")
    return kept
