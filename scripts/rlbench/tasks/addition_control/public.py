"""Addition control: the public half of the task, copied into every workspace as ``task.py``.

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

INSTRUCTION = "Answer with the number only."

_INTEGER = re.compile(r"-?\d+")


def format_prompt(example: dict) -> list[dict]:
    """The chat messages the grader sends for one problem: 'What is A + B? Answer with the number only.'"""
    return [{"role": "user", "content": f"{example['question']} {INSTRUCTION}"}]


def format_target(example: dict) -> str:
    """The bare sum, e.g. '85', as a training completion."""
    return str(example["answer"])


def extract_answer(text: str) -> str | None:
    """The first integer in the text ('85', '-3'), without leading zeros; None when there is none.

    Only the first number counts: a reply that restates the question ('47 + 38 = 85') answers 47.
    """
    match = _INTEGER.search(text)
    return str(int(match.group())) if match else None


def reference_answer(example: dict) -> str | None:
    """The gold sum of an example."""
    return extract_answer(str(example["answer"]))


def is_correct(completion: str, example: dict) -> bool:
    predicted = extract_answer(completion)
    return predicted is not None and predicted == reference_answer(example)


def reward(completion: str, example: dict) -> float:
    """The task's rule reward: exact match of the first number in the reply."""
    return 1.0 if is_correct(completion, example) else 0.0
