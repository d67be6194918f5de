"""GSM8K: the public half of the task, copied into every workspace as ``task.py``.

The grader imports these same functions, so the prompt an agent trains on, the answer
extraction and the reward are exactly what the held-out evaluation uses. The protocol is the
paper's: OpenCompass's ``gsm8k_gen_1d7fe4`` (four worked examples as a multi-turn chat, then
"Question: ...\\nLet's think step by step\\nAnswer:"; greedy decoding, at most 512 new tokens;
the answer is the last number before any "Question:" the model goes on to write). The
exemplars and settings live in ``task_protocol.json`` beside this file, read from the pinned
OpenCompass wheel when the workspace was built. Standard library only, so any agent can load it.

Functions every exposed ``task.py`` provides:
    format_prompt(example) -> list of chat messages sent to the model
    format_target(example) -> the reference completion (for supervised fine-tuning)
    extract_answer(text)   -> the final answer a completion commits to, or None
    reward(completion, example) -> 1.0 when the answer is right, else 0.0
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from pathlib import Path

PROTOCOL_FILE = Path(__file__).with_name("task_protocol.json")
_ROLES = {"HUMAN": "user", "BOT": "assistant", "SYSTEM": "system"}
_NUMBER = re.compile(r"\-?\d+\.\d+|\-?\d+")  # OpenCompass gsm8k_postprocess
_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)


@lru_cache(maxsize=4)
def load_protocol(path: str | None = None) -> dict:
    """The evaluation protocol (rounds, max_out_len, post-processing) from task_protocol.json."""
    return json.loads(Path(path or PROTOCOL_FILE).read_text(encoding="utf-8"))


def format_prompt(example: dict, protocol: dict | None = None) -> list[dict]:
    """The chat messages the grader sends for one problem: the few-shot rounds, then the question.

    As OpenCompass's chat models render them: each round's {field} placeholders are replaced
    with the row's input fields (the answer field with ''); the default chat meta-template
    (HUMAN, SYSTEM, BOT) maps SYSTEM to the user role, so every user turn is followed by an empty
    user turn, and consecutive turns of one role are joined with a newline: every user message
    ends with '\\n'.
    """
    protocol = protocol or load_protocol()
    fields = {name: example.get(name, "") for name in protocol["input_columns"]}
    fields[protocol["output_column"]] = ""
    turns: list[tuple[str, str]] = []
    for turn in protocol["rounds"]:
        content = turn["prompt"]
        for name, value in fields.items():
            content = content.replace("{" + name + "}", str(value))
        turns.append((_ROLES[turn["role"]], content))
        if turn["role"] == "HUMAN":
            turns.append(("user", ""))  # the meta-template's empty SYSTEM slot
    messages: list[dict] = []
    for role, content in turns:
        if messages and messages[-1]["role"] == role:
            messages[-1]["content"] += "\n" + content
        else:
            messages.append({"role": role, "content": content})
    return [m for m in messages if m["content"]]


def format_target(example: dict) -> str:
    """The worked solution as a training completion, ending 'The answer is N' as the exemplars do."""
    solution = example["answer"].split("####")[0].rstrip()
    return f"{solution}\nThe answer is {reference_answer(example)}\n"


def strip_reasoning(text: str) -> str:
    """OpenCompass 'extract-non-reasoning-content': drop <think>...</think> sections."""
    if "<think>" not in text and "</think>" in text:
        return text.split("</think>")[-1].strip()
    return _THINK.sub("", text).strip()


def extract_answer(text: str) -> str | None:
    """The last number before the model starts a new 'Question:' (OpenCompass gsm8k_postprocess)."""
    text = strip_reasoning(text).split("Question:")[0]
    numbers = _NUMBER.findall(text)
    return numbers[-1] if numbers else None


def reference_answer(example: dict) -> str:
    """The gold number: what follows '#### ', commas removed (OpenCompass gsm8k_dataset_postprocess)."""
    return example["answer"].split("#### ")[1].replace(",", "")


def answers_match(predicted: str | None, reference: str) -> bool:
    """OpenCompass Gsm8kEvaluator.is_equal: equal strings, or |float(pred) - int(gold)| < 1e-6."""
    if predicted is None:
        return False
    try:
        return predicted == reference or abs(float(predicted) - int(reference)) < 1e-6
    except ValueError:
        return False


def is_correct(completion: str, example: dict) -> bool:
    return answers_match(extract_answer(completion), reference_answer(example))


def reward(completion: str, example: dict) -> float:
    """The task's rule reward: 1.0 when the final number matches the gold answer."""
    return 1.0 if is_correct(completion, example) else 0.0
