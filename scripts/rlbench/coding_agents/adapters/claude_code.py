"""Claude Code (`claude -p`, npm @anthropic-ai/claude-code), headless against the run's LLM gateway.

Traps handled (AGENT_TOOLS.md §3):
- as root `--dangerously-skip-permissions` refuses to start unless IS_SANDBOX=1;
- `--output-format stream-json` needs `--verbose`;
- the gateway is reached with ANTHROPIC_BASE_URL (no /v1) and ANTHROPIC_AUTH_TOKEN (sent as Bearer, what
  LiteLLM expects); provider keys are kept out of the agent's environment by the runner;
- every model name Claude may ask for (main, small/fast, haiku/sonnet/opus defaults, subagents) is the
  gateway's model, so side calls go to the driver under its own name (the gateway's wildcard entry would
  serve other names too, but the records would then name models nobody chose);
- a dead endpoint is retried 10 times (about 190 s): CLAUDE_CODE_MAX_RETRIES (tool.options.max_retries) sets
  it; the tool's default is kept, since a real provider's passing 529s must not end a long run, and the runner
  ends a run whose endpoint stops answering after a few calls anyway;
- the Bash tool stops a command after 10 min at most: BASH_MAX_TIMEOUT_MS lets a training command run as
  long as the budget;
- the `result` event is the only place with final counts (the per-block `assistant` events carry a
  snapshot taken at message start); `modelUsage` counts every call, `usage` the main loop only; failure is
  `is_error`, not `subtype` (a connection failure says subtype "success"); `total_cost_usd` is priced from
  Anthropic's table, whatever the model; turns are the tool's own `num_turns` (it counted 2 for a run stopped
  by `--max-turns 1` after one call).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rlbench.coding_agents.adapters.base import Adapter, Collected, Launch, LaunchContext, context_file_text, read_jsonl_events

MAX_RETRIES = 10  # per call, the tool's default (tool.options.max_retries); the runner ends a run whose endpoint is dead
STDOUT = "stdout.jsonl"
TRANSCRIPTS = "transcripts"  # under log_dir: copies of ~/.claude/projects/**/*.jsonl
# result.subtype -> status, when is_error is true
ERROR_SUBTYPES = {
    "error_max_turns": "max_turns",
    "error_max_budget_usd": "max_budget",
    "error_during_execution": "error",
}


def config_dir(ctx: LaunchContext) -> Path:
    return ctx.home / ".claude"


class ClaudeCode(Adapter):
    tool = "claude-code"
    binary = "claude"

    def plan(self, ctx: LaunchContext) -> Launch:
        model = ctx.gateway.model
        argv = [
            str(self.binary_path(ctx.agent)),
            "-p",
            "--model", model,
            "--output-format", "stream-json",
            "--verbose",
            "--dangerously-skip-permissions",
        ]
        turns = ctx.limits.get("turns")
        if turns:
            argv += ["--max-turns", str(int(turns))]
        argv += ["--", ctx.prompt]
        budget_ms = str(max(int(ctx.time_limit_s * 1000), 120_000))
        env = {
            "IS_SANDBOX": "1",  # root may skip permissions: the run's sandbox is the boundary
            "CLAUDE_CONFIG_DIR": str(config_dir(ctx)),
            "ANTHROPIC_BASE_URL": ctx.gateway.url,
            "ANTHROPIC_AUTH_TOKEN": ctx.gateway.key,
            "ANTHROPIC_MODEL": model,
            "ANTHROPIC_SMALL_FAST_MODEL": model,
            "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
            "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
            "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
            "CLAUDE_CODE_SUBAGENT_MODEL": model,
            "CLAUDE_CODE_MAX_RETRIES": str(int(self.option(ctx.agent, "max_retries", MAX_RETRIES))),
            "BASH_MAX_TIMEOUT_MS": budget_ms,
            "DISABLE_TELEMETRY": "1",
            "DISABLE_AUTOUPDATER": "1",
            "DISABLE_ERROR_REPORTING": "1",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        }
        settings = {"permissions": {"defaultMode": "bypassPermissions"}}
        files = {
            ctx.workspace / "CLAUDE.md": context_file_text(ctx),
            config_dir(ctx) / "settings.json": json.dumps(settings, indent=2) + "\n",
        }
        return Launch(argv=argv, env=env, files=files, stdout=STDOUT, visible=self.visible_paths(ctx.agent))

    def collect(self, ctx: LaunchContext) -> Collected:
        out = Collected()
        stdout = ctx.log_dir / STDOUT
        if stdout.exists():
            out.logs.append(STDOUT)
        out.logs += keep_transcripts(config_dir(ctx) / "projects", ctx.log_dir / TRANSCRIPTS, TRANSCRIPTS)
        events = read_jsonl_events(stdout)
        results = [e for e in events if e.get("type") == "result"]
        if not results:
            # Stopped before the end: no final counts anywhere (the per-block usage is a start-of-message snapshot).
            messages = {(e.get("message") or {}).get("id") for e in events if e.get("type") == "assistant"}
            messages.discard(None)
            out.turns = len(messages) if events else None
            out.error = (f"no result event in {STDOUT}: the tool did not finish" if events
                         else f"{STDOUT} is empty or missing")
            return out
        result = results[-1]
        out.turns = _int(result.get("num_turns"))
        totals = model_usage_totals(result.get("modelUsage"))
        if totals is None:  # empty when no call succeeded: the main loop's usage (zeros)
            usage = result.get("usage") if isinstance(result.get("usage"), dict) else {}
            totals = {
                "input": _int(usage.get("input_tokens")),
                "output": _int(usage.get("output_tokens")),
                "cache_read": _int(usage.get("cache_read_input_tokens")),
                "cache_write": _int(usage.get("cache_creation_input_tokens")),
            }
        out.input_tokens, out.output_tokens = totals["input"], totals["output"]
        out.cache_read_tokens, out.cache_write_tokens = totals["cache_read"], totals["cache_write"]
        cost = result.get("total_cost_usd")
        out.cost_usd = float(cost) if isinstance(cost, (int, float)) else None  # Claude's price table, any model
        if result.get("is_error"):
            out.status = ERROR_SUBTYPES.get(result.get("subtype"), "error")
            message = result.get("result") or result.get("errors") or result.get("subtype")
            out.error = "; ".join(map(str, message)) if isinstance(message, list) else str(message)
        else:
            out.status = "success"
        return out


def model_usage_totals(model_usage) -> dict | None:
    """The sums over `result.modelUsage` (every call, side calls included), or None when it is absent."""
    if not isinstance(model_usage, dict) or not model_usage:
        return None
    keys = {"input": "inputTokens", "output": "outputTokens", "cache_read": "cacheReadInputTokens",
            "cache_write": "cacheCreationInputTokens"}
    totals: dict[str, int | None] = {}
    for name, key in keys.items():
        values = [_int(m.get(key)) for m in model_usage.values() if isinstance(m, dict)]
        known = [v for v in values if v is not None]
        totals[name] = sum(known) if known else None
    return totals


def keep_transcripts(source: Path, dest: Path, rel: str, pattern: str = "*.jsonl") -> list[str]:
    """Copy the files matching `pattern` under `source` to `dest` (same relative paths); their paths under
    log_dir (`rel` = dest's name there). Missing source or unreadable files are skipped."""
    kept: list[str] = []
    if not source.is_dir():
        return kept
    for path in sorted(source.rglob(pattern)):
        if not path.is_file() or path.is_symlink():
            continue
        target = dest / path.relative_to(source)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        except OSError:
            continue
        kept.append(str(Path(rel) / path.relative_to(source)))
    return kept


def _int(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None
