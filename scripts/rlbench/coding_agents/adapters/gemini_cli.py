"""Google Gemini CLI (`gemini -p`, npm @google/gemini-cli), headless against the run's LLM gateway.

Traps handled (AGENT_TOOLS.md §5):
- the gateway is reached with GOOGLE_GEMINI_BASE_URL and GEMINI_API_KEY (the gateway's key); with that
  env alone headless fails "Invalid auth method selected." (exit 41): the user settings.json selects
  `security.auth.selectedType = "gemini-api-key"`;
- the user settings live under GEMINI_CLI_HOME/.gemini (GEMINI_CLI_HOME = the private home); the turn limit
  `model.maxSessionTurns` only works there, not in the project's .gemini/ (exit 53 when hit);
- in an untrusted folder `--yolo` is silently downgraded to "default" approval: `--skip-trust` and
  GEMINI_CLI_TRUST_WORKSPACE=true; GEMINI_SANDBOX=false (the run's sandbox is the boundary);
- a dead endpoint is retried 10 times (about 200 s): `general.maxAttempts` (tool.options.max_retries) sets it;
- a shell command silent for 5 min is killed: `tools.shell.inactivityTimeout` is the budget, so a quiet
  training command can run;
- no update checks, telemetry or usage statistics;
- usage: the final `result.stats` of `--output-format stream-json` (input_tokens, output_tokens, cached); no
  cost; turns = model calls, from the chat log under ~/.gemini/tmp/<project>/chats/ (kept whole).
"""

from __future__ import annotations

import json
from pathlib import Path

from rlbench.coding_agents.adapters.base import Adapter, Collected, Launch, LaunchContext, context_file_text, read_jsonl_events
from rlbench.coding_agents.adapters.claude_code import keep_transcripts

# Per call (tool.options.max_retries; the tool's default, 10, takes about 200 s on a dead endpoint, which the runner
# cuts short: it ends a run whose endpoint stops answering after a few calls).
MAX_ATTEMPTS = 10
STDOUT = "stdout.jsonl"
CHATS = "chats"  # under log_dir: copies of ~/.gemini/tmp/**/chats/*


def gemini_dir(ctx: LaunchContext) -> Path:
    return ctx.home / ".gemini"


class GeminiCli(Adapter):
    tool = "gemini-cli"
    binary = "gemini"

    def plan(self, ctx: LaunchContext) -> Launch:
        argv = [
            str(self.binary_path(ctx.agent)),
            "--model", ctx.gateway.model,
            "--yolo",
            "--skip-trust",
            "--output-format", "stream-json",
            "--prompt", ctx.prompt,
        ]
        env = {
            "GEMINI_CLI_HOME": str(ctx.home),
            "GOOGLE_GEMINI_BASE_URL": ctx.gateway.url,
            "GEMINI_API_KEY": ctx.gateway.key,
            "GOOGLE_GENAI_USE_VERTEXAI": "false",
            "GEMINI_SANDBOX": "false",
            "GEMINI_CLI_TRUST_WORKSPACE": "true",
            "GEMINI_TELEMETRY_ENABLED": "false",
        }
        settings: dict = {
            "security": {"auth": {"selectedType": "gemini-api-key"}},
            "general": {"enableAutoUpdate": False, "enableAutoUpdateNotification": False,
                        "maxAttempts": int(self.option(ctx.agent, "max_retries", MAX_ATTEMPTS))},
            "privacy": {"usageStatisticsEnabled": False},
            "telemetry": {"enabled": False},
            "tools": {"shell": {"inactivityTimeout": max(int(ctx.time_limit_s), 300)}},
        }
        turns = ctx.limits.get("turns")
        if turns:
            settings["model"] = {"maxSessionTurns": int(turns)}
        files = {
            ctx.workspace / "GEMINI.md": context_file_text(ctx),
            gemini_dir(ctx) / "settings.json": json.dumps(settings, indent=2) + "\n",
        }
        return Launch(argv=argv, env=env, files=files, stdout=STDOUT, visible=self.visible_paths(ctx.agent))

    def collect(self, ctx: LaunchContext) -> Collected:
        out = Collected()
        stdout = ctx.log_dir / STDOUT
        if stdout.exists():
            out.logs.append(STDOUT)
        out.logs += keep_transcripts(gemini_dir(ctx) / "tmp", ctx.log_dir / CHATS, CHATS, "session-*")
        chats = [ctx.log_dir / rel for rel in out.logs if rel.startswith(CHATS + "/")]
        replies = chat_replies(chats)
        out.turns = len(replies) if chats else None  # main-loop model calls (side calls are not in the chat)
        events = read_jsonl_events(stdout)
        results = [e for e in events if e.get("type") == "result"]
        stats = results[-1].get("stats") if results else None
        if isinstance(stats, dict):
            out.input_tokens = _int(stats.get("input_tokens"))
            out.output_tokens = _int(stats.get("output_tokens"))
            out.cache_read_tokens = _int(stats.get("cached"))
        elif replies:  # stopped before the end: the chat log has each reply's tokens
            tokens = [r["tokens"] for r in replies.values() if isinstance(r.get("tokens"), dict)]
            out.input_tokens = _sum(t.get("input") for t in tokens)
            out.output_tokens = _sum(t.get("output") for t in tokens)
            out.cache_read_tokens = _sum(t.get("cached") for t in tokens)
        if results:
            result = results[-1]
            error = result.get("error")
            message = (error.get("message") or error.get("type")) if isinstance(error, dict) else error
            if result.get("status") == "success":
                out.status = "success"
            else:
                turn_limit = isinstance(error, dict) and error.get("type") == "FatalTurnLimitedError"
                out.status = "max_turns" if turn_limit else "error"
                out.error = str(message) if message else f"result status {result.get('status')!r}"
        elif not events:
            out.error = f"{STDOUT} is empty or missing"
        else:
            errors = [e.get("message") or json.dumps(e) for e in events if e.get("type") == "error"]
            out.error = f"no result event in {STDOUT}: the tool did not finish" + (
                f" (last error: {errors[-1]})" if errors else "")
        return out


def chat_replies(paths: list[Path]) -> dict[str, dict]:
    """{message id: the last record of it} of the model's replies (type "gemini") in the chat logs."""
    replies: dict[str, dict] = {}
    for path in paths:
        for record in read_jsonl_events(path):
            if record.get("type") == "gemini" and record.get("id"):
                replies[str(record["id"])] = record
    return replies


def _int(value) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def _sum(values) -> int | None:
    known = [v for v in (_int(x) for x in values) if v is not None]
    return sum(known) if known else None
