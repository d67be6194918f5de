"""A RunSpec for the runner: the tiny model on the small GSM8K split, no sandbox unless asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlbench.agent_run.spec import RunSpec
from rlbench.sandbox.bubblewrap import bubblewrap_available

from support.models import baseline_record
from support.settings import EVALUATION, GSM8K_SETTINGS

BWRAP_OK, BWRAP_WHY = bubblewrap_available()
needs_bwrap = pytest.mark.skipif(not BWRAP_OK, reason=f"bubblewrap cannot run here: {BWRAP_WHY}")
# A run test's sandbox backends: none, and bubblewrap where it can run (marked `sandbox`).
BACKENDS = ["none", pytest.param("bubblewrap", marks=[needs_bwrap, pytest.mark.sandbox])]


def spec_for(workspace: Path, tiny_model: Path, gsm8k_data, command: list[str] | None = None, *,
             agent: dict | None = None, **kwargs) -> RunSpec:
    """A RunSpec on the test workspace: the agent `command` (named "test"), or a registry `agent` entry;
    keyword arguments override the defaults (60 s, 1 s grace, no sandbox) and any other RunSpec field."""
    agent = agent if agent is not None else {"name": "test", "command": command}
    options = dict(
        run_dir=workspace.parent,
        workspace=workspace,
        task_settings=GSM8K_SETTINGS,
        agent=agent,
        hf_id="rlbench/tiny-qwen2",
        eval_dir=gsm8k_data[1],
        baseline=baseline_record(tiny_model),
        evaluation=EVALUATION,
        hidden_paths=[gsm8k_data[1].parent],
        labels={"task": "gsm8k", "model": "tiny", "agent": agent["name"], "seed": "0"},
        time_limit_s=60,
        kill_grace_s=1,
        sandbox_backend="none",
    )
    options.update(kwargs)
    return RunSpec(**options)
