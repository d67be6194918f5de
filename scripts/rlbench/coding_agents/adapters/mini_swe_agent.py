"""mini-swe-agent (`mini`, pip mini-swe-agent), headless against the run's LLM gateway.

Launch: `mini -y --exit-immediately -m openai/<model> -t <prompt> -c <builtin mini.yaml> -c
model.model_kwargs.api_base=<gateway>/v1 -c model.model_kwargs.api_key=<gateway key> -c environment.cwd=<ws>
-c environment.timeout=<budget> -c agent.step_limit=<turns> -c agent.wall_time_limit_seconds=<budget>
-c agent.cost_limit=<cost or 0> -o <home>/.mini-swe-agent/trajectory.json`. The model class is mini's default
(LiteLLM, tool calling: one `bash` tool, chat completions, non-streaming). The run ends when a command's
output starts with COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT (exit_status Submitted).

Traps handled (AGENT_TOOLS.md §8, checked with 2.4.6):
- the first-run setup wizard prompts unless MSWEA_CONFIGURED=true; its global config (.env, loaded with
  dotenv) lives in MSWEA_GLOBAL_CONFIG_DIR, inside the private home;
- any `-c` replaces the default config: the builtin mini.yaml comes first, by its absolute path (a bare
  `mini.yaml` is looked up in the cwd first, i.e. the agent's workspace);
- an unknown model's cost raises unless MSWEA_COST_TRACKING=ignore_errors; the default agent.cost_limit
  ($3) would stop a priced model early: it is limits.cost_usd, else 0 (none; the gateway enforces limits);
- each command is killed after environment.timeout (30 s by default), far too short for training: it is
  the run's budget;
- LITELLM_LOCAL_MODEL_COST_MAP=True (no remote price map fetch at import);
- a dead endpoint: 10 attempts with waits of 4-60 s (minutes); MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT bounds it
  (2 attempts: about 20 s, rc 1, exit_status InternalServerError); the gateway's refusal of a call beyond the
  limits ends it the same way;
- `mini` has no --version: version() reads the installed distribution's metadata.

Its stdout is a rich-text log, not JSON (kept as mini.log). collect() copies the trajectory (rewritten after
every step) to <log_dir>/trajectory.json and reads it: tokens are not aggregated by mini, so
messages[].extra.response.usage is summed; turns = info.model_stats.api_calls; cost =
info.model_stats.instance_cost; status from info.exit_status.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rlbench.coding_agents.adapters.base import Adapter, Collected, Launch, LaunchContext, as_int
from rlbench.coding_agents.tools import install_prefix
from rlbench.coding_agents.adapters.openhands import installed_version, venv_base_prefix

STDOUT = "mini.log"  # rich text, not JSON
TRAJECTORY = "trajectory.json"  # under log_dir
RETRY_ATTEMPTS = 2  # per model call (MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT)
# info.exit_status -> status
STATUSES = {
    "Submitted": "success",
    "LimitsExceeded": "max_turns",
    "TimeExceeded": "timeout",
    "RepeatedFormatError": "format_errors",
}


def trajectory_path(ctx: LaunchContext) -> Path:
    return ctx.home / ".mini-swe-agent" / TRAJECTORY


def builtin_config(prefix: Path, name: str = "mini.yaml") -> str:
    """The absolute path of one of mini's builtin configs in its venv (the bare name when not found)."""
    for path in sorted(prefix.glob(f"lib/python3*/site-packages/minisweagent/config/{name}")):
        return str(path)
    return name


class MiniSweAgent(Adapter):
    tool = "mini-swe-agent"
    binary = "mini"

    def version(self, agent: dict) -> str | None:
        return installed_version(install_prefix(agent["tool"]), "mini-swe-agent")

    def visible_paths(self, agent: dict) -> list[Path]:
        prefix = install_prefix(agent["tool"])
        base = venv_base_prefix(prefix)
        return [prefix, *([base] if base is not None else [])]

    def plan(self, ctx: LaunchContext) -> Launch:
        prefix = install_prefix(ctx.agent["tool"])
        budget_s = max(int(ctx.time_limit_s), 30)
        turns = ctx.limits.get("turns")
        cost = ctx.limits.get("cost_usd")
        argv = [
            str(self.binary_path(ctx.agent)),
            "-y",
            "--exit-immediately",
            "-m", f"openai/{ctx.gateway.model}",
            "-t", ctx.prompt,
            "-c", builtin_config(prefix),
            "-c", f"model.model_kwargs.api_base={ctx.gateway.url.rstrip('/')}/v1",
            "-c", f"model.model_kwargs.api_key={ctx.gateway.key}",
            "-c", f"environment.cwd={ctx.workspace}",
            "-c", f"environment.timeout={budget_s}",
            "-c", f"agent.step_limit={int(turns) if turns else 0}",
            "-c", f"agent.wall_time_limit_seconds={budget_s}",
            "-c", f"agent.cost_limit={float(cost) if cost is not None else 0}",
            "-o", str(trajectory_path(ctx)),
        ]
        env = {
            "MSWEA_CONFIGURED": "true",
            "MSWEA_COST_TRACKING": "ignore_errors",
            "MSWEA_MODEL_RETRY_STOP_AFTER_ATTEMPT": str(RETRY_ATTEMPTS),
            "MSWEA_GLOBAL_CONFIG_DIR": str(ctx.home / ".config" / "mini-swe-agent"),
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }
        return Launch(argv=argv, env=env, files={}, stdout=STDOUT, visible=self.visible_paths(ctx.agent))

    def collect(self, ctx: LaunchContext) -> Collected:
        out = Collected()
        if (ctx.log_dir / STDOUT).exists():
            out.logs.append(STDOUT)
        source = trajectory_path(ctx)
        if source.is_file():
            try:
                shutil.copyfile(source, ctx.log_dir / TRAJECTORY)
                out.logs.append(TRAJECTORY)
            except OSError:
                pass
        try:
            trajectory = json.loads(source.read_text())
        except (OSError, ValueError) as error:
            out.error = f"no readable trajectory ({source.name}): {type(error).__name__}"
            return out
        return parse_trajectory(trajectory, out)


def parse_trajectory(trajectory, out: Collected) -> Collected:
    """Fill `out` from a mini-swe-agent trajectory (trajectory_format mini-swe-agent-1.1)."""
    if not isinstance(trajectory, dict):
        out.error = "the trajectory is not a JSON object"
        return out
    info = trajectory.get("info") if isinstance(trajectory.get("info"), dict) else {}
    stats = info.get("model_stats") if isinstance(info.get("model_stats"), dict) else {}
    messages = trajectory.get("messages") if isinstance(trajectory.get("messages"), list) else []
    sums = {"prompt": 0, "completion": 0, "cached": 0}
    responses = 0
    for message in messages:
        extra = message.get("extra") if isinstance(message, dict) and isinstance(message.get("extra"), dict) else {}
        response = extra.get("response") if isinstance(extra.get("response"), dict) else None
        if response is None:
            continue
        usage = response.get("usage") if isinstance(response.get("usage"), dict) else {}
        responses += 1
        sums["prompt"] += as_int(usage.get("prompt_tokens")) or 0
        sums["completion"] += as_int(usage.get("completion_tokens")) or 0
        details = usage.get("prompt_tokens_details") if isinstance(usage.get("prompt_tokens_details"), dict) else {}
        sums["cached"] += as_int(details.get("cached_tokens")) or 0
    out.input_tokens, out.output_tokens, out.cache_read_tokens = sums["prompt"], sums["completion"], sums["cached"]
    calls = as_int(stats.get("api_calls"))
    out.turns = calls if calls is not None else responses
    cost = stats.get("instance_cost")
    out.cost_usd = float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else None
    exit_status = info.get("exit_status")
    if isinstance(exit_status, str) and exit_status:
        out.status = STATUSES.get(exit_status, "error")
        if out.status != "success":
            last = messages[-1] if messages and isinstance(messages[-1], dict) else {}
            detail = last.get("content") if last.get("role") == "exit" else None
            out.error = f"{exit_status}: {detail}" if detail and detail != exit_status else exit_status
    else:
        out.status = "incomplete"  # the trajectory is saved after every step: the run was cut short
        out.error = "no exit_status in the trajectory: the run was cut short"
    return out
