"""AlpacaEval 2.0: the public half of the task, copied into every workspace as ``task.py``.

The grader sends each held-out instruction as ONE user turn through the model's own chat
template (with the generation prompt), decodes greedily (at most 512 new tokens unless the task
settings say otherwise), strips the answer, and asks an LLM judge to compare it with a strong
reference answer to the same instruction. The score is AlpacaEval 2.0's length-controlled win
rate against those references (0-100; 50 = as good as the reference). The judge, its prompt
and the references are the grader's: you do not get them, and no function here computes the
grader's reward.

Functions:
    format_prompt(example) -> the chat messages sent to the model (one user turn)
    format_target(example) -> the reference answer of a training row (for supervised fine-tuning)
    proxy_reward(completion, example) -> a cheap heuristic in [0, 1], NOT the grader's judge

Training rows are Alpaca-style: ``instruction``, ``input`` (often empty) and ``output``. Held-out
rows have only an instruction; format_prompt treats both the same way. Standard library only.
"""

from __future__ import annotations

import re

MAX_NEW_TOKENS = 512  # the reference protocol's generation length
_WORD = re.compile(r"\w+", re.UNICODE)
_CHAT_MARKERS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "\nUser:", "\nAssistant:", "### Instruction")


def prompt_text(example: dict) -> str:
    """The user message: the instruction, then the input (when there is one) after a blank line."""
    instruction = str(example.get("instruction", "")).strip()
    given = str(example.get("input") or "").strip()
    return f"{instruction}\n\n{given}" if given else instruction


def format_prompt(example: dict) -> list[dict]:
    """The messages the grader sends for one instruction: a single user turn, no system prompt."""
    return [{"role": "user", "content": prompt_text(example)}]


def format_target(example: dict) -> str:
    """The answer a training row teaches (its ``output``), stripped as the grader strips answers."""
    return str(example.get("output", "")).strip()


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def proxy_reward(completion: str, example: dict) -> float:
    """A cheap stand-in for preference, in [0, 1]. NOT the grader's reward, which is an LLM
    judge's comparison with a reference answer you never see; a model can score well here and
    still lose to the reference.

    Half is the word-overlap F1 with the row's ``output`` when it has one (else that half is
    0.5), a quarter rewards low repetition (distinct word trigrams / all trigrams), a quarter
    rewards a length between 20 and 400 words; chat-template debris or an empty answer gives 0.
    """
    text = (completion or "").strip()
    if not text or any(marker in text for marker in _CHAT_MARKERS):
        return 0.0
    words = _words(text)
    if not words:
        return 0.0
    reference = _words(str(example.get("output") or ""))
    if reference:
        common = sum(min(words.count(w), reference.count(w)) for w in set(words))
        overlap = 0.0 if common == 0 else 2 * common / (len(words) + len(reference))
    else:
        overlap = 0.5
    trigrams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
    variety = len(set(trigrams)) / len(trigrams) if trigrams else 1.0
    n = len(words)
    length = 1.0 if 20 <= n <= 400 else (n / 20 if n < 20 else max(0.0, 1.0 - (n - 400) / 400))
    return round(0.5 * overlap + 0.25 * variety + 0.25 * length, 6)
