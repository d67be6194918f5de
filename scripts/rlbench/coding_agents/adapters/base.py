"""What every CLI coding-agent adapter does: plan the launch, check readiness, collect afterwards.

An adapter turns a registry entry of kind `cli` (config/agents/<name>.yaml: the tool and its pinned version,
the driver LLM, the mode, the limits) into a launch: argv, environment, and the files the tool expects (its
context file such as CLAUDE.md / AGENTS.md / GEMINI.md, its config under the run's private HOME). The tool
always talks to the run's LLM gateway (never to the provider directly: the provider key stays outside the
sandbox). After the run, `collect` keeps the tool's own structured log whole under <run_dir>/agent/ and
parses turns, tokens and cost from it; the token totals the harness reports come from the gateway, the tool's
own counts are kept beside them.

Facts on each tool (flags, wire formats, traps): ../shared/AGENT_TOOLS.md in the project notes; each adapter
module names the ones it handles.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from rlbench.coding_agents.tools import install_prefix


@dataclass
class GatewayEndpoint:
    """How the tool reaches its LLM: the run's gateway (see rlbench.coding_agents.gateway)."""

    url: str  # http://127.0.0.1:PORT, no /v1
    key: str  # the per-run key the tool sends; never the provider's key
    model: str  # the model name the tool asks for


@dataclass
class LaunchContext:
    agent: dict  # the validated registry entry (kind cli)
    workspace: Path  # the agent's cwd
    home: Path  # the agent's private HOME (inside the workspace)
    log_dir: Path  # <run_dir>/agent: outside the workspace, hidden from the agent; collect() writes here
    prompt: str  # the full task prompt (prompt.md in log_dir)
    gateway: GatewayEndpoint
    time_limit_s: float

    @property
    def limits(self) -> dict:
        return self.agent.get("limits") or {}


@dataclass
class Launch:
    """What the runner starts (inside the sandbox, cwd = workspace, stdin = /dev/null)."""

    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)  # on top of the runner's agent environment
    files: dict[Path, str] = field(default_factory=dict)  # absolute path (workspace or home) -> text, written first
    stdout: str = "stdout.jsonl"  # the tool's stdout, kept in log_dir under this name
    # Shown read-only in the sandbox: at least Adapter.visible_paths (the tool's install), plus what the tool needs.
    visible: list[Path] = field(default_factory=list)


@dataclass
class Collected:
    """What collect() parsed from the tool's own log; None where the tool does not report it."""

    turns: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cache_read_tokens: int | None = None
    cache_write_tokens: int | None = None
    cost_usd: float | None = None
    status: str | None = None  # the tool's own verdict: success, error, max_turns, ...
    error: str | None = None
    logs: list[str] = field(default_factory=list)  # files kept under log_dir, relative to it


class Adapter:
    """One coding-agent tool. Subclasses set `tool` and `binary` and implement plan() and collect()."""

    tool: str = ""  # registry `tool.name`
    binary: str = ""  # the command's name in the install prefix (bin/ or node_modules/.bin/)

    def binary_path(self, agent: dict) -> Path:
        tool = agent["tool"]
        prefix = install_prefix(tool)
        candidates = [prefix / "node_modules" / ".bin" / self.binary, prefix / "bin" / self.binary]
        for candidate in candidates:
            if candidate.exists():
                return candidate
        found = shutil.which(self.binary) if tool.get("allow_path", False) else None
        return Path(found) if found else candidates[0 if "npm" in tool["install"] else 1]

    @staticmethod
    def option(agent: dict, name: str, default):
        """A tool-specific setting from the entry's tool.options (e.g. max_retries), else the adapter's default."""
        return (agent["tool"].get("options") or {}).get(name, default)

    def visible_paths(self, agent: dict) -> list[Path]:
        """What the sandbox must show for the tool to run: its install prefix, and for an npm tool the Node.js
        installation when it is not the system's (nvm and the like put it under the home, which is masked)."""
        paths = [install_prefix(agent["tool"])]
        node = shutil.which("node") if "npm" in agent["tool"]["install"] else None
        if node:
            prefix = Path(node).resolve().parent.parent  # <prefix>/bin/node
            if not any(prefix == Path(d) for d in ("/", "/usr", "/usr/local")):
                paths.append(prefix)
        return paths

    def version(self, agent: dict) -> str | None:
        """The installed version as the tool reports it (`--version`), or None when it cannot say."""
        try:
            out = subprocess.run(
                [str(self.binary_path(agent)), "--version"],
                capture_output=True,
                text=True,
                timeout=60,
                stdin=subprocess.DEVNULL,
                env={**os.environ, "HOME": os.environ.get("TMPDIR", "/tmp")},
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        match = re.search(r"\d+\.\d+\.\d+[\w.+-]*", out.stdout + out.stderr)
        return match.group(0) if match else None

    def readiness(self, agent: dict) -> list[str]:
        """Why this tool cannot run here (each with what to do), empty when ready. Never logs a key's value."""
        problems = []
        path = self.binary_path(agent)
        if not path.exists():
            problems.append(
                f"{self.tool} {agent['tool']['version']} is not installed ({path} missing): "
                f"run `make setup-agents` (or `rlbench setup-agents {agent['name']}`)"
            )
        else:
            installed = self.version(agent)
            if installed is not None and installed != str(agent["tool"]["version"]):
                problems.append(
                    f"{self.tool} reports version {installed}, the registry pins {agent['tool']['version']}: "
                    f"run `rlbench setup-agents {agent['name']}` again"
                )
        driver = agent.get("driver") or {}
        key_env = driver.get("key_env")
        if key_env and not os.environ.get(key_env):
            problems.append(f"environment variable {key_env} (the driver's API key) is not set: export it first")
        return problems

    def plan(self, ctx: LaunchContext) -> Launch:
        raise NotImplementedError

    def collect(self, ctx: LaunchContext) -> Collected:
        raise NotImplementedError


def context_file_text(ctx: LaunchContext) -> str:
    """The text of the tool's context file (CLAUDE.md, AGENTS.md, GEMINI.md): the prompt itself."""
    return ctx.prompt


def read_jsonl_events(path: Path) -> list[dict]:
    """The JSON objects of a JSONL log, skipping lines that are not JSON objects (banners, warnings)."""
    import json

    events = []
    if not path.exists():
        return events
    with open(path, errors="replace") as handle:
        for line in handle:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict):
                events.append(event)
    return events


def as_int(value) -> int | None:
    """A count from a tool's log: ints and floats as int; anything else (bool, str, None) as None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return int(value)
    return None
