"""OpenHands (the software-agent SDK, pip openhands-sdk + openhands-tools), headless against the run's gateway.

The SDK is a Python library, not a command: the launch is the OpenHands venv's interpreter running
openhands_main.py (next to this module; it imports nothing from rlbench) with a JSON config written under
the agent's private home. It builds LLM(model="openai/<model>", base_url=<gateway>/v1, api_key=<gateway key>,
usage_id="agent"), an Agent with the Terminal and FileEditor tools (finish and think are built in), the
CLI-mode system prompt and OpenHands' default condenser (old events summarized by the same model, through
the gateway, so that a long run fits the context), and a Conversation(workspace,
max_iteration_per_run=limits.turns, persistence_dir under the home, visualizer=None), sends the prompt and
runs; it prints JSON lines (start, error, end with the execution status and metrics) and exits 0 only when
the conversation ended FINISHED.

Traps handled (AGENT_TOOLS.md §7, checked with 1.58.2):
- Python >= 3.12 only (`pip install` under 3.11 finds nothing): the tool's venv is built with a 3.12+
  interpreter (`rlbench setup-agents`); readiness() says when none is installed and what to install. The
  venv's base interpreter usually lives under the host's home (pyenv), which the sandbox hides: it is
  bound back read-only (Launch.visible), with the venv and openhands_main.py. The interpreter runs with -I
  so that a PYTHONPATH meant for the harness's Python (3.11 packages) cannot break it;
- the Terminal tool runs commands in tmux panes: TMUX_TMPDIR is a directory of the agent's own (its home,
  or /tmp, private in the sandbox, when the home's path would make the socket path too long for a Unix
  socket); without tmux the launcher falls back to the subprocess terminal;
- a dead endpoint: the SDK's defaults (5 retries, waits 8-64 s) take minutes; num_retries is small here
  and the runner stops the run as soon as the gateway reports the upstream dead;
- the gateway refuses calls beyond the run's limits (HTTP 429): run() raises, the launcher exits 1;
- OPENHANDS_SUPPRESS_BANNER=1, LITELLM_LOCAL_MODEL_COST_MAP=True (no remote price map fetch);
- tool arguments are validated strictly (an extra key is rejected): nothing to do here, but a scripted
  endpoint must send exactly the declared keys;
- cost is 0 for a model LiteLLM has no price for (a UserWarning "Cost calculation failed" on stderr).

collect(): tokens and cost from the launcher's `end` event (metrics.accumulated_token_usage, accumulated_cost;
prompt_tokens include cache reads); when the run was cut short (no `end` event), from the persisted
base_state.json (stats.usage_to_metrics). The persistence directory (base_state.json, events/*.json) is
copied to <log_dir>/openhands/.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from rlbench.coding_agents.adapters.base import (
    Adapter, Collected, Launch, LaunchContext, as_int, read_jsonl_events,
)
from rlbench.coding_agents.tools import SetupError, find_python, install_prefix

LAUNCHER = Path(__file__).with_name("openhands_main.py")
STDOUT = "openhands.jsonl"
EVENTS = "openhands"  # under log_dir: a copy of the conversation's persistence directory
MIN_PYTHON = (3, 12)
NUM_RETRIES = 2  # per LLM call, waits 1-8 s; the gateway does not retry its upstream
SOCKET_PATH_MAX = 100  # sun_path holds 108 bytes; tmux's socket is <TMUX_TMPDIR>/tmux-<uid>/openhands-<32 hex>
# execution_status -> status
STATUSES = {"finished": "success", "stuck": "stuck", "error": "error", "paused": "interrupted"}


def run_dir_in_home(ctx: LaunchContext) -> Path:
    return ctx.home / ".openhands-run"


def persistence_dir(ctx: LaunchContext) -> Path:
    return ctx.home / ".openhands" / "conversations"


def tmux_tmpdir(ctx: LaunchContext) -> str:
    own = ctx.home / ".tmux"
    socket = own / f"tmux-{os.getuid()}" / ("openhands-" + "0" * 32)
    return str(own) if len(str(socket).encode()) <= SOCKET_PATH_MAX else "/tmp"


def venv_base_prefix(prefix: Path) -> Path | None:
    """The prefix of the interpreter a venv was built from (pyvenv.cfg `home` is its bin/), or None."""
    try:
        text = (prefix / "pyvenv.cfg").read_text()
    except OSError:
        return None
    match = re.search(r"^\s*home\s*=\s*(.+?)\s*$", text, re.MULTILINE)
    if not match:
        return None
    home = Path(match.group(1))
    return (home.parent if home.name == "bin" else home).resolve()


def python_version_of(executable: Path) -> tuple[int, ...] | None:
    """(major, minor) from an interpreter's file name (python3.12), without running it; None for other names."""
    match = re.search(r"python(\d+)\.(\d+)$", executable.name)
    if match:
        return int(match.group(1)), int(match.group(2))
    return None


def installed_version(prefix: Path, distribution: str) -> str | None:
    """A distribution's version from its .dist-info directory name in a venv (no interpreter started)."""
    name = distribution.replace("-", "_")
    for info in sorted(prefix.glob(f"lib/python3*/site-packages/{name}-*.dist-info")):
        version = info.name[len(name) + 1 : -len(".dist-info")]
        if version:
            return version
    return None


class OpenHands(Adapter):
    tool = "openhands"
    binary = "python"  # the venv's interpreter; the command is openhands_main.py

    def version(self, agent: dict) -> str | None:
        return installed_version(install_prefix(agent["tool"]), "openhands-sdk")

    def readiness(self, agent: dict) -> list[str]:
        prefix = install_prefix(agent["tool"])
        minimum = str(agent["tool"]["install"].get("python") or "%d.%d" % MIN_PYTHON)
        if not (prefix / "bin" / "python").exists():
            try:
                find_python(minimum)
            except SetupError as error:
                return [f"OpenHands {agent['tool']['version']} needs Python >= {minimum}: {error} "
                        f"`rlbench setup-agents {agent['name']}`"]
        problems = super().readiness(agent)
        version = python_version_of(Path(os.path.realpath(prefix / "bin" / "python")))
        if version is not None and version < MIN_PYTHON:
            problems.append(
                f"the OpenHands venv {prefix} runs Python {version[0]}.{version[1]}; it needs >= 3.12: remove it "
                f"and run `rlbench setup-agents {agent['name']}` with a Python >= 3.12 installed"
            )
        if not LAUNCHER.exists():
            problems.append(f"the OpenHands launcher {LAUNCHER} is missing from this checkout")
        return problems

    def visible_paths(self, agent: dict) -> list[Path]:
        prefix = install_prefix(agent["tool"])
        paths = [prefix, LAUNCHER]
        base = venv_base_prefix(prefix)
        if base is not None:
            paths.append(base)
        return paths

    def plan(self, ctx: LaunchContext) -> Launch:
        turns = ctx.limits.get("turns")
        config = {
            "model": f"openai/{ctx.gateway.model}",
            "base_url": ctx.gateway.url.rstrip("/") + "/v1",
            "api_key": ctx.gateway.key,  # the gateway's per-run key, never the provider's
            "workspace": str(ctx.workspace),
            "prompt": ctx.prompt,
            "max_iterations": int(turns) if turns else 500,
            "num_retries": NUM_RETRIES,
            "persistence_dir": str(persistence_dir(ctx)),
        }
        config_path = run_dir_in_home(ctx) / "config.json"
        argv = [str(self.binary_path(ctx.agent)), "-I", str(LAUNCHER), str(config_path)]
        env = {
            "OPENHANDS_SUPPRESS_BANNER": "1",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "TMUX_TMPDIR": tmux_tmpdir(ctx),
        }
        files = {config_path: json.dumps(config, indent=2) + "\n"}
        if env["TMUX_TMPDIR"] != "/tmp":
            files[Path(env["TMUX_TMPDIR"]) / ".rlbench"] = "tmux sockets of the OpenHands terminal\n"
        return Launch(argv=argv, env=env, files=files, stdout=STDOUT, visible=self.visible_paths(ctx.agent))

    def collect(self, ctx: LaunchContext) -> Collected:
        out = Collected()
        stdout = ctx.log_dir / STDOUT
        if stdout.exists():
            out.logs.append(STDOUT)
        events = read_jsonl_events(stdout)
        ends = [e for e in events if e.get("event") == "end"]
        errors = [e for e in events if e.get("event") == "error"]
        end = ends[-1] if ends else {}
        conversation_dirs = find_conversations(persistence_dir(ctx), end.get("persistence_dir"))
        out.logs += keep_conversations(conversation_dirs, ctx.log_dir / EVENTS, EVENTS)
        metrics = end.get("metrics") if isinstance(end.get("metrics"), dict) else None
        calls = as_int(end.get("llm_calls"))
        if metrics is None or metrics.get("accumulated_token_usage") is None:
            metrics, calls = persisted_metrics(conversation_dirs)
        if metrics is not None:
            usage = metrics.get("accumulated_token_usage") or {}
            out.input_tokens = as_int(usage.get("prompt_tokens"))
            out.output_tokens = as_int(usage.get("completion_tokens"))
            out.cache_read_tokens = as_int(usage.get("cache_read_tokens"))
            out.cache_write_tokens = as_int(usage.get("cache_write_tokens"))
            cost = metrics.get("accumulated_cost")
            out.cost_usd = float(cost) if isinstance(cost, (int, float)) else None
        out.turns = calls
        status = end.get("execution_status") or persisted_status(conversation_dirs)
        error_event = conversation_error(conversation_dirs)
        if errors:
            out.status = "error"
            out.error = f"{errors[-1].get('type')}: {errors[-1].get('message')}"
        elif status:
            out.status = STATUSES.get(status, status)
            if error_event and error_event.get("code") == "MaxIterationsReached":
                out.status = "max_turns"
            if out.status != "success" and error_event:
                out.error = f"{error_event.get('code')}: {error_event.get('detail')}"
        if not ends:
            out.error = out.error or (
                f"no end event in {STDOUT}: the launcher did not finish" if events else f"{STDOUT} is empty or missing"
            )
            if out.status in (None, "success", "running", "idle") and (events or conversation_dirs):
                out.status = "incomplete"  # cut short: killed at the deadline, or stopped by the runner
        return out


def find_conversations(root: Path, reported: str | None) -> list[Path]:
    """The conversation directories (each with base_state.json): the one the launcher reported, else all."""
    if reported:
        path = Path(reported)
        if (path / "base_state.json").exists() or (path / "events").is_dir():
            return [path]
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and ((p / "base_state.json").exists() or (p / "events").is_dir()))


def keep_conversations(dirs: list[Path], dest: Path, rel: str) -> list[str]:
    """Copy each conversation directory's base_state.json and events/*.json under dest/<id>/; relative paths."""
    kept: list[str] = []
    for conversation in dirs:
        files = [conversation / "base_state.json", *sorted((conversation / "events").glob("*.json"))]
        for path in files:
            if not path.is_file() or path.is_symlink():
                continue
            target = dest / conversation.name / path.relative_to(conversation)
            try:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)
            except OSError:
                continue
            kept.append(str(Path(rel) / conversation.name / path.relative_to(conversation)))
    return kept


def _base_state(conversation: Path) -> dict:
    try:
        state = json.loads((conversation / "base_state.json").read_text())
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def persisted_metrics(dirs: list[Path]) -> tuple[dict | None, int | None]:
    """Metrics summed over every LLM (usage id) of the persisted conversations, and the number of LLM calls."""
    found = False
    usage = {"prompt_tokens": 0, "completion_tokens": 0, "cache_read_tokens": 0, "cache_write_tokens": 0}
    cost, calls = 0.0, 0
    for conversation in dirs:
        stats = _base_state(conversation).get("stats") or {}
        per_llm = stats.get("usage_to_metrics") if isinstance(stats, dict) else None
        if not isinstance(per_llm, dict):
            continue
        for metrics in per_llm.values():
            if not isinstance(metrics, dict):
                continue
            found = True
            accumulated = metrics.get("accumulated_token_usage") or {}
            for key in usage:
                usage[key] += as_int(accumulated.get(key)) or 0
            if isinstance(metrics.get("accumulated_cost"), (int, float)):
                cost += float(metrics["accumulated_cost"])
            if isinstance(metrics.get("token_usages"), list):
                calls += len(metrics["token_usages"])
    if not found:
        return None, None
    return {"accumulated_cost": cost, "accumulated_token_usage": usage}, calls


def persisted_status(dirs: list[Path]) -> str | None:
    for conversation in reversed(dirs):
        status = _base_state(conversation).get("execution_status")
        if isinstance(status, str):
            return status
    return None


def conversation_error(dirs: list[Path]) -> dict | None:
    """The last ConversationErrorEvent persisted (code, detail), e.g. MaxIterationsReached."""
    for conversation in reversed(dirs):
        for path in sorted((conversation / "events").glob("*.json"), reverse=True):
            try:
                event = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if isinstance(event, dict) and event.get("kind") == "ConversationErrorEvent":
                return event
    return None
