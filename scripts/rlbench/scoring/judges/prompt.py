"""The pairwise judge prompt: AlpacaEval 2.0's default annotator template, read from the installed
alpaca_eval package (never copied into this repository) and turned into chat messages.

The annotator is `weighted_alpaca_eval_gpt4_turbo`: its template is ChatML text with a system turn
and a user turn holding `{instruction}`, `{output_1}` (shown as model "m") and `{output_2}` (shown
as model "M"); the judge answers with one token, m or M.

Rendering differs from alpaca_eval in one way that only matters for hostile text: alpaca_eval fills
the placeholders in the whole ChatML string (first occurrence of each, one after the other) and only
then splits it into messages, so an output containing `<|im_start|>` or `{output_2}` could add
messages or move the other output. Here the template is split into messages first and filled in one
pass, so the texts land verbatim in their slots. For any text without those markers both give the
same messages (tests/test_judges.py checks it against alpaca_eval's own helpers).
"""

from __future__ import annotations

import hashlib
import importlib.util
import re
from functools import lru_cache
from pathlib import Path

ANNOTATOR = "weighted_alpaca_eval_gpt4_turbo"
TEMPLATE = "alpaca_eval_clf_gpt4_turbo/alpaca_eval_clf.txt"  # relative to alpaca_eval/evaluators_configs
PLACEHOLDERS = ("instruction", "output_1", "output_2")
FIRST_TOKEN, SECOND_TOKEN = "m", "M"  # the identifiers of output_1 and output_2 in the template
_PLACEHOLDER = re.compile(r"\{(instruction|output_1|output_2)\}")
_START, _END = "<|im_start|>", "<|im_end|>"


class PromptTemplateError(RuntimeError):
    """The judge prompt template cannot be found or has an unexpected shape."""


def alpaca_eval_package_dir() -> Path:
    """Where alpaca_eval is installed, found without importing it (its import is slow and needs pandas)."""
    spec = importlib.util.find_spec("alpaca_eval")
    if spec is None or not spec.submodule_search_locations:
        raise PromptTemplateError(
            "the judge prompt is read from the alpaca-eval package, which is not installed: "
            "pip install alpaca-eval==0.6.6"
        )
    return Path(next(iter(spec.submodule_search_locations)))


@lru_cache(maxsize=None)
def template_text() -> str:
    """The raw ChatML template of the default AlpacaEval 2.0 annotator."""
    path = alpaca_eval_package_dir() / "evaluators_configs" / TEMPLATE
    try:
        return path.read_text()
    except OSError as exc:
        raise PromptTemplateError(
            f"cannot read the AlpacaEval judge template {path} ({exc}); reinstall alpaca-eval==0.6.6"
        ) from exc


def template_sha256() -> str:
    """Hash of the template text: part of the judge's identity (a changed prompt is a different judge)."""
    return hashlib.sha256(template_text().encode()).hexdigest()


def split_chatml_template(text: str, name: str) -> tuple[tuple[str, str], ...]:
    """(role, content-with-placeholders) per ChatML turn of a pairwise template, split as alpaca_eval's
    prompt_to_chatml does; `name` says which template it is in errors."""
    text = text.strip()
    if not (text.startswith(_START) and text.endswith(_END)):
        raise PromptTemplateError(f"the judge template {name} is not ChatML text")
    messages = []
    for turn in text.split(_START)[1:]:
        role, _, rest = turn.partition("\n")
        messages.append((role.strip(), rest.split(_END, 1)[0].strip()))
    found = [m.group(1) for _, content in messages for m in _PLACEHOLDER.finditer(content)]
    if sorted(found) != sorted(PLACEHOLDERS):
        raise PromptTemplateError(f"the judge template {name} should hold each of {PLACEHOLDERS} once; found {found}")
    return tuple(messages)


@lru_cache(maxsize=None)
def template_messages() -> tuple[tuple[str, str], ...]:
    """(role, content-with-placeholders) per ChatML turn, split as alpaca_eval's prompt_to_chatml does."""
    return split_chatml_template(template_text(), TEMPLATE)


def fill_messages(
    messages: tuple[tuple[str, str], ...], instruction: str, output_1: str, output_2: str
) -> list[dict]:
    """A split template's messages with the texts in their slots, in one pass (texts land verbatim)."""
    values = {"instruction": instruction, "output_1": output_1, "output_2": output_2}
    return [
        {"role": role, "content": _PLACEHOLDER.sub(lambda m: str(values[m.group(1)]), content)}
        for role, content in messages
    ]


def render_messages(instruction: str, output_1: str, output_2: str) -> list[dict]:
    """The chat messages asking which of output_1 ("m") and output_2 ("M") answers the instruction better."""
    return fill_messages(template_messages(), instruction, output_1, output_2)
