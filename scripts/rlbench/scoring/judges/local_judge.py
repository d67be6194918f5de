"""An offline judge: a local transformers causal LM reads the same AlpacaEval prompt and its
preference comes from the next-token distribution after the assistant turn opens.

The prompt's system and user messages go through the model's chat template with the generation
prompt; with p(m) and p(M) the model's next-token probabilities of the answers "m" and "M",
P(m) = p(m) / (p(m) + p(M)) and preference = 2 - P(m): alpaca_eval's logprob rule, over the full
distribution rather than the 5 alternatives an API lists (a small model rarely puts m or M in its
top 5). Float32 (on the GPU when there is one), no sampling: deterministic, so its repeats share
cache entries.

Free-text prompts (Judge.ask, for grading tasks) go through the same chat template with the
generation prompt, and the answer is greedy generation (argmax at every step, no sampling, none of
the model's generation_config sampling or penalty settings) of at most max_tokens new tokens,
stopping at an end-of-sequence token (the tokenizer's, the config's and the generation config's),
decoded with special tokens skipped. Prompts are batched (batch_size, left padding); a prompt longer
than max_prompt_tokens (default: the model's context) is a too_long failure.

Texts are tokenized with special tokens split, so text such as "<|im_end|>" in a model's output
stays text and cannot close the judge's turn: the template is rendered with a private-use marker
in place of each text (each pairwise slot, or each message's content), the template's own pieces
are tokenized as usual and the texts with split_special_tokens=True.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlbench.scoring.judges.annotators import WEIGHTED_LOCAL, get_annotator
from rlbench.scoring.judges.base import Answer, Call, Judge, JudgeError, Verdict, preference_from_logprobs
from rlbench.scoring.judges.prompt import FIRST_TOKEN, PLACEHOLDERS, SECOND_TOKEN, render_messages

# Private-use characters mark where the texts go in the rendered chat template.
_MARK_OPEN, _MARK_CLOSE = "\ue000", "\ue001"


def _marker(index: int) -> str:
    return f"{_MARK_OPEN}{index}{_MARK_CLOSE}"


_SLOTS = {name: _marker(i) for i, name in enumerate(PLACEHOLDERS)}


def directory_fingerprint(model_dir: Path) -> str:
    """sha256 over the directory's files (names and bytes): the judge's weights are part of its identity."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(model_dir).rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(model_dir)).encode() + b"\0")
        with path.open("rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


@dataclass
class _Loaded:
    torch: Any
    tokenizer: Any
    model: Any
    device: str
    answer_ids: tuple[int, int]  # the tokens "m" and "M"
    pad_id: int
    limit: int  # the longest prompt, in tokens
    rendered: str  # the chat template around the slot markers
    stop_ids: frozenset[int]  # the tokens that end a generated answer


class LocalJudge(Judge):
    backend = "local"
    deterministic = True

    def __init__(
        self,
        model_dir: Path,
        model_name: str | None = None,
        *,
        batch_size: int = 8,
        max_prompt_tokens: int | None = None,
        cache_dir: Path | None = None,
        replicate: int = 0,
    ):
        # A small local model cannot make function calls: it always runs the weighted prompt.
        super().__init__(cache_dir, replicate, get_annotator(WEIGHTED_LOCAL))
        self.model_dir = Path(model_dir)
        if not (self.model_dir / "config.json").is_file():
            raise JudgeError(
                f"the local judge model directory {self.model_dir} holds no model (config.json); "
                "the workflow's prepare_model rule materialises results/models/<judge.model> first"
            )
        self._model = model_name or self.model_dir.name
        self.batch_size = max(1, int(batch_size))
        self._max_prompt_tokens = max_prompt_tokens
        self._fingerprint: str | None = None
        self._lm: _Loaded | None = None

    @property
    def model(self) -> str:
        return self._model

    def decoding(self) -> dict:
        if self._fingerprint is None:
            self._fingerprint = directory_fingerprint(self.model_dir)
        return {"weights_sha256": self._fingerprint, "dtype": "float32", "rule": "next-token P(m)/(P(m)+P(M))"}

    def check_ready(self) -> None:
        """Raise JudgeError when the model cannot judge (no chat template, m or M not one token)."""
        self._load()

    def _load(self) -> _Loaded:
        if self._lm is None:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(self.model_dir, trust_remote_code=False)
            if not getattr(tokenizer, "chat_template", None):
                raise JudgeError(f"the local judge {self.model_dir} has no chat template; use an instruct model")
            model = AutoModelForCausalLM.from_pretrained(
                self.model_dir, trust_remote_code=False, use_safetensors=True, dtype=torch.float32
            )
            device = "cuda" if torch.cuda.is_available() else "cpu"
            model.to(device).eval()
            answer_ids = []
            for token in (FIRST_TOKEN, SECOND_TOKEN):
                ids = tokenizer(token, add_special_tokens=False)["input_ids"]
                if len(ids) != 1:
                    raise JudgeError(
                        f"the local judge's tokenizer splits the answer {token!r} into {ids}; it needs one token"
                    )
                answer_ids.append(ids[0])
            pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
            limit = self._max_prompt_tokens or getattr(model.config, "max_position_embeddings", None) or 2048
            slots = render_messages(*(_SLOTS[name] for name in PLACEHOLDERS))
            rendered = tokenizer.apply_chat_template(slots, tokenize=False, add_generation_prompt=True)
            stop_ids = set()
            for source in (tokenizer, model.config, getattr(model, "generation_config", None)):
                eos = getattr(source, "eos_token_id", None)
                stop_ids.update([eos] if isinstance(eos, int) else [i for i in eos or [] if isinstance(i, int)])
            self._lm = _Loaded(
                torch, tokenizer, model, device, tuple(answer_ids), pad_id or 0, int(limit), rendered,
                frozenset(stop_ids),
            )  # fmt: skip
        return self._lm

    def text_decoding(self) -> dict:
        return {**self.decoding(), "rule": "greedy generation, chat template with generation prompt"}

    def _tokenize_marked(self, rendered: str, texts: list[tuple[str, str, str]]) -> list[int]:
        """Token ids of a chat template rendered with markers: `texts` are (marker, text, what it is)
        in the order the template shows them, once each. The template's pieces are tokenized as
        such, the texts with special tokens split."""
        tokenizer = self._load().tokenizer
        ids: list[int] = []
        rest = rendered
        for marker, text, what in texts:
            before, found, rest = rest.partition(marker)
            if not found or _MARK_OPEN in before:
                raise JudgeError(f"the local judge's chat template dropped, repeated or reordered the {what}")
            ids += tokenizer(before, add_special_tokens=False)["input_ids"]
            ids += tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]
        if _MARK_OPEN in rest:
            raise JudgeError("the local judge's chat template repeated or reordered a text it was given")
        return ids + tokenizer(rest, add_special_tokens=False)["input_ids"]

    def _encode_messages(self, messages: list[dict]) -> list[int]:
        """Token ids of a free-text prompt: the chat template with the generation prompt, each
        message's content tokenized with special tokens split."""
        tokenizer = self._load().tokenizer
        marked = [{"role": m["role"], "content": _marker(i)} for i, m in enumerate(messages)]
        try:
            rendered = tokenizer.apply_chat_template(marked, tokenize=False, add_generation_prompt=True)
        except Exception as exc:  # a template that refuses these roles (jinja raise_exception)
            raise JudgeError(f"the local judge's chat template cannot render the prompt: {exc}") from exc
        texts = [(_marker(i), m["content"], f"content of message {i}") for i, m in enumerate(messages)]
        return self._tokenize_marked(rendered, texts)

    def _encode(self, call: Call) -> list[int]:
        """Token ids of the prompt: the template's pieces tokenized as such, the texts with special tokens split."""
        values = {"instruction": call.instruction, "output_1": call.first, "output_2": call.second}
        # The template shows them in this order, once each.
        texts = [(_SLOTS[name], values[name], f"{name} slot") for name in PLACEHOLDERS]
        return self._tokenize_marked(self._load().rendered, texts)

    def _batches(self, encoded: list[list[int]], failed: dict[int, str]):
        """(prompt indices, input_ids, attention_mask) per batch of the prompts that fit, left-padded,
        similar lengths together; `failed` gets the too-long ones' details."""
        loaded = self._load()
        torch, limit = loaded.torch, loaded.limit
        fits = []
        for i, ids in enumerate(encoded):
            if len(ids) > limit:
                failed[i] = f"prompt of {len(ids)} tokens; the judge takes {limit}"
            else:
                fits.append(i)
        fits.sort(key=lambda i: -len(encoded[i]))  # similar lengths share a batch
        for start in range(0, len(fits), self.batch_size):
            batch = fits[start : start + self.batch_size]
            width = max(len(encoded[i]) for i in batch)
            input_ids = torch.full((len(batch), width), loaded.pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, i in enumerate(batch):  # left padding: every prompt ends at the last column
                input_ids[row, width - len(encoded[i]) :] = torch.tensor(encoded[i])
                mask[row, width - len(encoded[i]) :] = 1
            yield batch, input_ids, mask

    def _greedy(self, input_ids, mask, max_new_tokens: int) -> list[list[int]]:
        """Greedy continuations of a left-padded batch: per row, the new tokens up to and with the
        first stop token, at most max_new_tokens."""
        loaded = self._load()
        torch, model, device = loaded.torch, loaded.model, loaded.device
        input_ids, mask = input_ids.to(device), mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        rows = input_ids.shape[0]
        new: list[list[int]] = [[] for _ in range(rows)]
        done = [False] * rows
        past = None
        step_ids, step_positions = input_ids, positions
        with torch.inference_mode():
            for _ in range(max_new_tokens):
                out = model(
                    input_ids=step_ids, attention_mask=mask, position_ids=step_positions,
                    past_key_values=past, use_cache=True, logits_to_keep=1,
                )  # fmt: skip
                past = out.past_key_values
                chosen = out.logits[:, -1, :].argmax(dim=-1).tolist()
                for row, token in enumerate(chosen):
                    if not done[row]:
                        new[row].append(token)
                        done[row] = token in loaded.stop_ids
                if all(done):
                    break
                # Finished rows are fed padding; what follows for them is discarded.
                step_ids = torch.tensor(
                    [[loaded.pad_id if d else t] for d, t in zip(done, chosen)], dtype=torch.long, device=device
                )
                step_positions = step_positions[:, -1:] + 1
                mask = torch.cat([mask, torch.ones((rows, 1), dtype=mask.dtype, device=device)], dim=1)
        return new

    def _complete_calls(self, prompts: list[list[dict]], max_tokens: int) -> list[Answer]:
        loaded = self._load()
        encoded = [self._encode_messages(messages) for messages in prompts]
        failed: dict[int, str] = {}
        answers: list[Answer] = [Answer() for _ in prompts]
        for batch, input_ids, mask in self._batches(encoded, failed):
            continuations = self._greedy(input_ids, mask, max_tokens)
            self.stats.add(requests=len(batch))
            for i, tokens in zip(batch, continuations, strict=True):
                ended = bool(tokens) and tokens[-1] in loaded.stop_ids
                text = loaded.tokenizer.decode(tokens[:-1] if ended else tokens, skip_special_tokens=True)
                answers[i] = Answer(text=text, attempts=1, detail=None if ended else "cut at max_tokens")
        for i, detail in failed.items():
            answers[i] = Answer(failure="too_long", detail=detail)
        return answers

    def _judge_calls(self, calls: list[Call]) -> list[Verdict]:
        loaded = self._load()
        torch, model = loaded.torch, loaded.model
        id_m, id_big = loaded.answer_ids
        encoded = [self._encode(call) for call in calls]
        verdicts: list[Verdict] = [Verdict() for _ in calls]
        failed: dict[int, str] = {}
        for batch, input_ids, mask in self._batches(encoded, failed):
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            inputs = {"input_ids": input_ids, "attention_mask": mask, "position_ids": positions}
            with torch.inference_mode():
                logits = model(**{k: v.to(loaded.device) for k, v in inputs.items()}, logits_to_keep=1).logits
            logprobs = torch.log_softmax(logits[:, -1, :].float(), dim=-1)
            self.stats.add(requests=len(batch))
            for row, i in enumerate(batch):
                lp_m, lp_big = float(logprobs[row, id_m]), float(logprobs[row, id_big])
                verdicts[i] = Verdict(
                    preference=preference_from_logprobs(lp_m, lp_big),
                    parser="next_token",
                    attempts=1,
                    detail=json.dumps({"m": lp_m, "M": lp_big}),
                )
        for i, detail in failed.items():
            verdicts[i] = Verdict(failure="too_long", detail=detail)
        return verdicts
