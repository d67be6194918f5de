"""A RunSpec for the runner: the tiny model on the small GSM8K split, no sandbox unless asked."""

from __future__ import annotations

from pathlib import Path

from rlbench.grader.checks import fingerprint
from rlbench.runner import RunSpec

from support.settings import EVALUATION, GSM8K_SETTINGS


def spec_for(workspace: Path, tiny_model: Path, gsm8k_data, command: list[str], **kwargs) -> RunSpec:
    options = dict(time_limit_s=60, kill_grace_s=1, sandbox_backend="none")
    options.update(kwargs)
    return RunSpec(
        run_dir=workspace.parent,
        workspace=workspace,
        task_settings=GSM8K_SETTINGS,
        agent={"name": "test", "command": command},
        hf_id="rlbench/tiny-qwen2",
        eval_dir=gsm8k_data[1],
        baseline={"score": 0.0, "fingerprint": fingerprint(tiny_model)},
        evaluation=EVALUATION,
        hidden_paths=[gsm8k_data[1].parent],
        labels={"task": "gsm8k", "model": "tiny", "agent": "test", "seed": "0"},
        **options,
    )

