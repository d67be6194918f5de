"""An offline judge: a local transformers causal LM reads the same AlpacaEval prompt and its
preference comes from the next-token distribution after the assistant turn opens.

The prompt's system and user messages go through the model's chat template with the generation
prompt; with p(m) and p(M) the model's next-token probabilities of the answers "m" and "M",
P(m) = p(m) / (p(m) + p(M)) and preference = 2 - P(m): alpaca_eval's logprob rule, over the full
distribution rather than the 5 alternatives an API lists (a small model rarely puts m or M in its
top 5). Float32 (on the GPU when there is one), no sampling: deterministic, so its repeats share
cache entries.

The instruction and the outputs are tokenized with special tokens split, so text such as
"<|im_end|>" in a model's output stays text and cannot close the judge's turn.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlbench.judges.base import Call, Judge, JudgeError, Verdict, preference_from_logprobs
from rlbench.judges.prompt import FIRST_TOKEN, PLACEHOLDERS, SECOND_TOKEN, render_messages

# Private-use characters mark where the texts go in the rendered chat template.
_SLOTS = {name: f"\ue000{i}\ue001" for i, name in enumerate(PLACEHOLDERS)}


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
        super().__init__(cache_dir, replicate)
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
            self._lm = _Loaded(torch, tokenizer, model, device, tuple(answer_ids), pad_id or 0, int(limit), rendered)
        return self._lm

    def _encode(self, call: Call) -> list[int]:
        """Token ids of the prompt: the template's pieces tokenized as such, the texts with special tokens split."""
        loaded = self._load()
        tokenizer, rendered = loaded.tokenizer, loaded.rendered
        values = {"instruction": call.instruction, "output_1": call.first, "output_2": call.second}
        ids: list[int] = []
        rest = rendered
        for name in PLACEHOLDERS:  # the template shows them in this order, once each
            before, marker, rest = rest.partition(_SLOTS[name])
            if not marker:
                raise JudgeError(f"the local judge's chat template dropped the {name} slot")
            ids += tokenizer(before, add_special_tokens=False)["input_ids"]
            ids += tokenizer(values[name], add_special_tokens=False, split_special_tokens=True)["input_ids"]
        return ids + tokenizer(rest, add_special_tokens=False)["input_ids"]

    def _judge_calls(self, calls: list[Call]) -> list[Verdict]:
        loaded = self._load()
        torch, model, pad_id, limit = loaded.torch, loaded.model, loaded.pad_id, loaded.limit
        id_m, id_big = loaded.answer_ids
        encoded = [self._encode(call) for call in calls]
        verdicts: list[Verdict] = [Verdict() for _ in calls]
        fits = []
        for i, ids in enumerate(encoded):
            if len(ids) > limit:
                verdicts[i] = Verdict(
                    failure="too_long", detail=f"prompt of {len(ids)} tokens; the judge takes {limit}"
                )
            else:
                fits.append(i)
        fits.sort(key=lambda i: -len(encoded[i]))  # similar lengths share a batch
        for start in range(0, len(fits), self.batch_size):
            batch = fits[start : start + self.batch_size]
            width = max(len(encoded[i]) for i in batch)
            input_ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, i in enumerate(batch):  # left padding: every prompt ends at the last column
                input_ids[row, width - len(encoded[i]) :] = torch.tensor(encoded[i])
                mask[row, width - len(encoded[i]) :] = 1
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
        return verdicts
