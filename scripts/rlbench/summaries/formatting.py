"""How summaries write values as text: numbers, one-line excerpts, lists of names, a run's title."""

from __future__ import annotations


def fmt(value, signed: bool = False) -> str:
    """A value as summaries show it: "-" for None, floats to 4 significant digits (signed: with a sign)."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:+.4g}" if signed else f"{value:.4g}"
    return str(value)


def first_line(text: str, limit: int = 300) -> str:
    """The text on one line (whitespace runs made one space), cut to limit characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def name_list(names: list[str], limit: int = 6) -> str:
    """The first `limit` names, comma-separated, and "and N more" for the rest."""
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def run_title(labels: dict) -> str:
    """A run's title from its labels: "task / model / agent / seed N" (a multi-task run: its tasks as recorded,
    the wildcards' joined string, or a list joined by +; "?" when the labels name no task)."""
    tasks = labels.get("tasks")
    task = labels.get("task") or (tasks if isinstance(tasks, str) else "+".join(map(str, tasks or []))) or "?"
    return f"{task} / {labels.get('model')} / {labels.get('agent')} / seed {labels.get('seed')}"
