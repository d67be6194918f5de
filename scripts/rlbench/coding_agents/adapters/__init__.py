"""CLI coding-agent adapters (registry entries of kind `cli`), one module per tool."""

from __future__ import annotations

import importlib
from pathlib import Path

from rlbench.coding_agents.adapters.base import Adapter

# tool name (registry `tool.name`) -> module:class; imported on use.
ADAPTERS = {
    "claude-code": "rlbench.coding_agents.adapters.claude_code:ClaudeCode",
    "codex": "rlbench.coding_agents.adapters.codex:Codex",
    "gemini-cli": "rlbench.coding_agents.adapters.gemini_cli:GeminiCli",
    "opencode": "rlbench.coding_agents.adapters.opencode:OpenCode",
    "openhands": "rlbench.coding_agents.adapters.openhands:OpenHands",
    "mini-swe-agent": "rlbench.coding_agents.adapters.mini_swe_agent:MiniSweAgent",
}


def get_adapter(tool: str) -> Adapter:
    if tool not in ADAPTERS:
        raise ValueError(f"unknown agent tool {tool!r}; known tools: {', '.join(sorted(ADAPTERS))}")
    module, cls = ADAPTERS[tool].split(":")
    return getattr(importlib.import_module(module), cls)()


def build_prompt(workspace: Path, time_limit_s: float, limits: dict | None = None) -> str:
    """The task prompt every tool gets: the workspace's instructions (with the mode's rules) and description,
    the budget, and how to work headless. The same text is written as the tool's context file."""
    instructions = (workspace / "instructions.md").read_text()
    description = (workspace / "description.md").read_text()
    hours, rest = divmod(int(time_limit_s), 3600)
    budget = f"{hours} h {rest // 60} min" if hours else f"{rest // 60} min {rest % 60} s"
    lines = [
        "You are an autonomous machine-learning engineer working alone, without a human to answer questions.",
        f"Your working directory is the workspace ({workspace}). You have {budget} of wall-clock time in all "
        "(`bash timer.sh` prints what is left); when it is over, every process you started is stopped.",
        # a multi-task workspace (its tasks under tasks/): one model for all of them, as its description says
        f"Train the base model to score higher on {'every task' if (workspace / 'tasks').is_dir() else 'the task'} "
        "below and submit checkpoints to the grading server "
        "as the instructions say; your result is your best submission. The network is closed except the "
        "grading server: use what is in the workspace and the installed Python packages.",
    ]
    if limits:
        shown = ", ".join(f"{k} {v}" for k, v in limits.items() if v is not None)
        if shown:
            lines.append(f"Your LLM use is limited ({shown}); calls beyond it are refused.")
    return "\n\n".join([*lines, instructions.strip(), description.strip()]) + "\n"
