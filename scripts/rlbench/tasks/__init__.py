"""Task registry: task name -> implementation. Adding a task is a YAML entry plus one module."""

from __future__ import annotations

import importlib

from rlbench.tasks.base import EVAL_FILE, TRAIN_FILE, EvalResult, Task

__all__ = ["EVAL_FILE", "TRAIN_FILE", "EvalResult", "Task", "get_task"]


def get_task(settings: dict) -> Task:
    """Instantiate the task a registry entry names (its `module` under rlbench.tasks)."""
    module = importlib.import_module(f"rlbench.tasks.{settings['module']}")
    return module.TASK_CLASS()
