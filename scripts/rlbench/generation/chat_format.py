"""How a conversation becomes the prompt text the model reads: the protocol's chat template, never
code a submission ships that computes on the held-out inputs.

A chat template is a program (Jinja): one that parses "What is A + B?" and renders the sum into the
prompt makes untouched weights look perfect. So a submission's own template is used only in a form
that cannot see the content of a message: it is rendered with a sentinel in place of each message's
content, and the real contents are substituted for the sentinels afterwards. Such a template still
decides everything around the contents (role markers, a system prompt of its own), which is what a
trained model may legitimately need; it is used only when it shows every message's content exactly
once and in order (probed at load, checked again on each conversation), so that it cannot drop or
reorder the protocol's few-shot prompt either. Otherwise, and whenever the submission ships no
template, the base model's template is used. The base model itself (the baseline evaluation, or a
submission whose template is byte-identical to the base model's) is rendered directly.

`ChatFormat.record()` says which template was used and why; the grader keeps it in the ledger entry
(`chat_template`), and the baseline's result carries the base template's text, which the grader
and the final evaluation pass back as the protocol's (resources' `base_chat_template`).
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass

# A sentinel per message: text no protocol prompt holds, which a template has no reason to alter.
SENTINEL = "\u27e6rlbench-message-{index}\u27e7"
_SENTINEL_RE = re.compile("\u27e6rlbench-message-(\\d+)\u27e7")
# Conversation shapes the submitted template is tried on before it is used (the protocols' shapes:
# a single question, a system prompt, few-shot turns).
PROBE_SHAPES = (
    ("user",),
    ("system", "user"),
    ("user", "assistant", "user"),
    ("system", "user", "assistant", "user", "assistant", "user"),
)

USED_OWN = "own"  # the model is the base model: its own template (the baseline evaluation)
USED_BASE = "base"  # the base model's template, rendered directly
USED_SUBMITTED = "submitted"  # the submission's template, blind to the contents (sentinels substituted)
USED_PLAIN = "plain"  # no template anywhere: "Role: content" turns (render_plain)


def render_plain(conversation: list[dict]) -> str:
    """The prompt of a model without any chat template: one "Role: content" paragraph per turn."""
    turns = [f"{m['role'].capitalize()}: {m['content']}" for m in conversation]
    return "\n\n".join(turns) + "\n\nAssistant:"


def template_text(template: object) -> str | None:
    """A tokenizer's chat_template as one template text: a dict of named templates gives its
    "default" one (what apply_chat_template uses)."""
    if isinstance(template, dict):
        template = template.get("default")
    return template if isinstance(template, str) and template else None


def template_sha256(template: object) -> str | None:
    if not template:
        return None
    return hashlib.sha256(template.encode("utf-8")).hexdigest()


def _render(tokenizer, template, conversation: list[dict], extra: dict | None = None) -> str:
    return tokenizer.apply_chat_template(
        conversation, chat_template=template, tokenize=False, add_generation_prompt=True, **(extra or {})
    )


def _blind(conversation: list[dict]) -> list[dict]:
    """The conversation with each message's content replaced by its sentinel."""
    return [{**message, "content": SENTINEL.format(index=i)} for i, message in enumerate(conversation)]


def _shows_each_content_once(rendered: str, n_messages: int) -> bool:
    """Every sentinel 0..n-1 appears exactly once, in order, and no other."""
    found = [int(m.group(1)) for m in _SENTINEL_RE.finditer(rendered)]
    return found == list(range(n_messages))


def _substitute(rendered: str, conversation: list[dict]) -> str:
    """The sentinels replaced by the real contents, in one pass (a content that happens to hold a
    sentinel's text is not substituted again)."""
    return _SENTINEL_RE.sub(lambda m: conversation[int(m.group(1))]["content"], rendered)


@dataclass
class ChatFormat:
    """The chat template a model's prompts are rendered with, and how (see the module's docstring)."""

    tokenizer: object
    used: str
    reason: str
    base_template: object = None
    submitted_template: object = None
    fallbacks: int = 0  # conversations the submitted template failed the check on (rendered with the base's)
    # Template variables of the decoding (generation.decoding.template_kwargs: Qwen3's enable_thinking).
    extra: dict | None = None

    @classmethod
    def for_model(cls, tokenizer, base_template: object = None, protocol: bool = False) -> "ChatFormat":
        """The format of a loaded tokenizer. protocol False: the model is the base model (its own
        template is trusted); True: a submission, judged against base_template (the base model's
        template text, None when it has none)."""
        own = template_text(getattr(tokenizer, "chat_template", None))
        base_template = template_text(base_template)
        if not protocol:
            if own:
                return cls(tokenizer, USED_OWN, "the base model's own template", base_template=own)
            return cls(tokenizer, USED_PLAIN, "the base model has no chat template")
        if not own:
            if base_template:
                return cls(tokenizer, USED_BASE, "the submission has no chat template", base_template=base_template)
            return cls(tokenizer, USED_PLAIN, "neither the submission nor the base model has a chat template")
        if own == base_template:
            return cls(tokenizer, USED_BASE, "the submission's template is the base model's", base_template=base_template)
        problem = cls.probe(tokenizer, own)
        if problem is None:
            return cls(
                tokenizer,
                USED_SUBMITTED,
                "the submission's own template, rendered blind to the message contents",
                base_template=base_template,
                submitted_template=own,
            )
        if base_template:
            return cls(
                tokenizer,
                USED_BASE,
                f"the submission's template was ignored: {problem}",
                base_template=base_template,
                submitted_template=own,
            )
        return cls(
            tokenizer, USED_PLAIN, f"the submission's template was ignored: {problem}", submitted_template=own
        )

    @staticmethod
    def probe(tokenizer, template) -> str | None:
        """Why `template` cannot be used blind (None: it can): it fails to render a protocol shape,
        or does not show each message's content exactly once, in order."""
        for shape in PROBE_SHAPES:
            conversation = _blind([{"role": role, "content": ""} for role in shape])
            try:
                rendered = _render(tokenizer, template, conversation)
            except Exception as exc:  # noqa: BLE001 - any template error: the template is not used
                return f"it fails on a {'/'.join(shape)} conversation ({type(exc).__name__}: {str(exc)[:200]})"
            if not isinstance(rendered, str) or not _shows_each_content_once(rendered, len(shape)):
                return (
                    f"it does not show each message's content exactly once and in order "
                    f"(a {'/'.join(shape)} conversation)"
                )
        return None

    def render(self, conversation: list[dict]) -> str:
        """The prompt text of one conversation, with the generation prompt."""
        if self.used == USED_PLAIN:
            return render_plain(conversation)
        if self.used == USED_OWN:
            return _render(self.tokenizer, self.base_template, conversation, self.extra)
        if self.used == USED_SUBMITTED and all(isinstance(m.get("content"), str) for m in conversation):
            try:
                rendered = _render(self.tokenizer, self.submitted_template, _blind(conversation), self.extra)
            except Exception:  # noqa: BLE001 - the check below fails it the same way
                rendered = None
            if isinstance(rendered, str) and _shows_each_content_once(rendered, len(conversation)):
                return _substitute(rendered, conversation)
            self.fallbacks += 1
        if not self.base_template:
            return render_plain(conversation)
        return _render(self.tokenizer, self.base_template, conversation, self.extra)

    def record(self) -> dict:
        """What the ledger and the results say about the template (no template text)."""
        record = {"used": self.used, "reason": self.reason}
        if self.submitted_template:
            record["submitted_sha256"] = template_sha256(self.submitted_template)
        if self.base_template and self.used in (USED_BASE, USED_OWN):
            record["base_sha256"] = template_sha256(self.base_template)
        if self.used == USED_OWN:  # the base model's: the protocol's template for its submissions
            record["template"] = self.base_template
        if self.fallbacks:
            record["fallbacks"] = self.fallbacks
        if self.extra:
            record["template_kwargs"] = dict(self.extra)
        return record
