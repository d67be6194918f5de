"""Task registry: task name -> implementation. Adding a task is one folder here plus one YAML.

A task's folder `rlbench/tasks/<module>/` holds its Task subclass (`__init__.py`, exported as
TASK_CLASS), the public module every workspace gets as task.py, and any data it ships; its registry
entry `config/tasks/<name>.yaml` names the folder in `module:`. See rlbench.tasks.base.

Builds on: paths, fileio, config, generation, scoring.
"""

from __future__ import annotations

import importlib

from rlbench.tasks.base import EVAL_FILE, TRAIN_FILE, EvalContext, EvalResult, Task
from rlbench.tasks.capacity import size_problems

__all__ = ["EVAL_FILE", "TRAIN_FILE", "EvalContext", "EvalResult", "Task", "get_task", "split_size_problems"]


def get_task(settings: dict) -> Task:
    """Instantiate the task a registry entry names (its `module`: a folder under rlbench.tasks)."""
    name = settings["module"]
    try:
        module = importlib.import_module(f"rlbench.tasks.{name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"rlbench.tasks.{name}":
            raise
        raise ValueError(
            f"task {settings.get('name')!r}: module {name!r} is not a task folder under scripts/rlbench/tasks/"
        ) from None
    task_class = getattr(module, "TASK_CLASS", None)
    if task_class is None or not issubclass(task_class, Task):
        raise ValueError(f"rlbench.tasks.{name} defines no TASK_CLASS (a Task subclass)")
    return task_class()


def split_size_problems(settings: dict) -> list[str]:
    """What is wrong with the split sizes a task's settings ask for, given what its data source can give
    (Task.split_capacity); empty when nothing is. What the workflow checks for every task of the sweep
    before any rule runs (rlbench.config.validate_config's task_problems)."""
    try:
        task = get_task(settings)
    except ValueError as error:
        return [str(error)]
    return size_problems(settings["name"], settings.get("source"), task.split_sizes(settings), task.split_capacity(settings))
