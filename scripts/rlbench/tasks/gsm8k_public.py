"""GSM8K: the public half of the task, copied into every workspace as ``task.py``.

The grader imports the same functions, so the prompt an agent trains on, the answer
extraction and the reward are exactly what the held-out evaluation uses. The file has no
imports outside the standard library so that any agent can load it.

Functions every exposed ``task.py`` provides:
    format_prompt(example) -> list of chat messages sent to the model
    format_target(example) -> the reference completion (for supervised fine-tuning)
    extract_answer(text)   -> the final answer a completion commits to, or None
    reward(completion, example) -> 1.0 when the answer is right, else 0.0
"""

from __future__ import annotations

import re

INSTRUCTION = (
    "Solve the math problem. Reason step by step, then give the final answer "
    "on its own line as '#### <number>'."
)

_NUMBER = re.compile(r"-?[\d,]*\.?\d+")
_FINAL = re.compile(r"####\s*(-?[\d,]*\.?\d+)")


def format_prompt(example: dict) -> list[dict]:
    """The chat messages the grader sends for one problem."""
    return [{"role": "user", "content": f"{example['question']}\n\n{INSTRUCTION}"}]


def format_target(example: dict) -> str:
    """The worked solution, ending in '#### N', as a training completion."""
    return example["answer"]


def normalize_number(text: str) -> str | None:
    """'1,234.50' -> '1234.5'; None when the text is not a number."""
    cleaned = text.replace(",", "").strip().rstrip(".")
    try:
        value = float(cleaned)
    except ValueError:
        return None
    if value != value or value in (float("inf"), float("-inf")):
        return None
    if value == int(value):
        return str(int(value))
    return repr(value)


def extract_answer(text: str) -> str | None:
    """The number after the last '#### ', falling back to the last number in the text."""
    finals = _FINAL.findall(text)
    candidates = finals or _NUMBER.findall(text)
    for candidate in reversed(candidates):
        number = normalize_number(candidate)
        if number is not None:
            return number
    return None


def reference_answer(example: dict) -> str | None:
    """The gold number of an example (its answer ends with '#### N')."""
    return extract_answer(example["answer"])


def is_correct(completion: str, example: dict) -> bool:
    predicted = extract_answer(completion)
    return predicted is not None and predicted == reference_answer(example)


def reward(completion: str, example: dict) -> float:
    """The task's rule reward: exact match of the final number."""
    return 1.0 if is_correct(completion, example) else 0.0
