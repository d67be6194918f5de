"""A text generator for prompts rebuilt at every step (RowCachedGenerator): each prompt computed on
its own (batch 1, no padding), from the longest cached token prefix of any episode, with greedy
decoding sped up by prompt-lookup drafts.

WebShop rebuilds its chat prompt at every step (the page's actions, then a sliding window of the
last steps), and its turns are short actions, often copied from the prompt itself. What pays there:
- the KV of the longest common token prefix with any cached prompt (the episode's own previous
  prompt, else another episode's: the shared system message and instructions) is reused, and only
  the rest is computed, with no padding to the longest row of a batch;
- prompt-lookup decoding: the tokens that followed the latest earlier occurrence of the text's last
  n-gram (n <= 3) are proposed as a draft and checked in the same forward as the prompt's uncached
  part (then as the next forward's input): every draft token that equals the greedy choice is kept,
  so a turn copied from the prompt (an action of the list, a repeated one) costs one or two forwards
  instead of one per token. The output is the greedy decoding's own (a draft only saves forwards).

Per-row prefill pays when turns are one token (nothing to decode in a batch); with longer turns
the lockstep batch decode (prefix_cache) costs less. The contract is textgen_base's (full-prompt
tokenization, EOS / max_new_tokens / stop strings, None beyond the context). `for_rebuilt_prompts`
gives the generator a rollout of rebuilt prompts plays with: over a CachedBatchGenerator, a
TurnLengthSwitch (its batch path, or this one once the first call's turns were one token long);
any other generator as is.
"""

from __future__ import annotations

import time
from pathlib import Path

from rlbench.generation.backends import cut_at_stop
from rlbench.generation.kv_buffer import causal_after_cache, use_masked_gqa_sdpa
from rlbench.generation.prompt_lookup import lookup_draft
from rlbench.generation.textgen_base import HFModel, TextGenerator, common_prefix, contains_stop, new_stats

#: draft tokens proposed per forward (fed with the prompt's uncached part, or after the last token)
DRAFT_TOKENS = 10


class _Entry:
    """A key's cached tokens and their per-layer KV ([1, kv_heads, len(tokens), head_dim] each)."""

    __slots__ = ("tokens", "kv")

    def __init__(self, tokens: tuple, kv: list):
        self.tokens, self.kv = tokens, kv


class RowCachedGenerator(TextGenerator):
    """Each prompt alone (batch 1), from the longest cached prefix of any key, decoded greedily with
    prompt-lookup drafts (module docstring). At rest: each live key's tokens and KV, and the last
    released key's (new keys seed the shared prompt prefix from it when no key is live).

    stats: textgen_base's (draft_tokens: proposed, draft_tokens_accepted)."""

    name = "hf"

    def __init__(self, model_dir: Path | None = None, device: str | None = None, dtype=None, *, hf: HFModel | None = None,
                 draft_tokens: int = DRAFT_TOKENS):  # fmt: skip
        if (model_dir is None) == (hf is None):
            raise ValueError("RowCachedGenerator takes a model directory or a loaded HFModel (hf=), not both")
        self.hf = hf if hf is not None else HFModel(model_dir, device=device, dtype=dtype)
        use_masked_gqa_sdpa(self.hf.model)  # the 4D boolean masks below, and causal_after_cache
        self.torch = self.hf.torch
        self.draft_tokens = draft_tokens
        self.entries: dict = {}
        self._spare: _Entry | None = None
        self.stats = new_stats()

    def release(self, key) -> None:
        entry = self.entries.pop(key, None)
        if entry is not None:
            self._spare = entry

    def generate(self, prompts: dict, max_new_tokens: int, stop: list[str] | None) -> dict:
        started = time.perf_counter()
        stats, hf = self.stats, self.hf
        stats["calls"] += 1
        results: dict = {}
        for key, prompt in prompts.items():
            tokens = tuple(hf.encode(prompt))
            stats["prompts"] += 1
            stats["prompt_tokens"] += len(tokens)
            if not tokens or not hf.fits(len(tokens), max_new_tokens):
                stats["over_context"] += int(bool(tokens))
                results[key] = None
                continue
            try:
                with self.torch.inference_mode():
                    results[key] = self._complete(key, tokens, max_new_tokens, stop)
            except BaseException:
                self.entries.pop(key, None)  # a half-updated cache must not be trusted
                raise
        stats["generate_seconds"] += time.perf_counter() - started
        return results

    # -- one prompt -----------------------------------------------------------------------------
    def _source(self, key, tokens: tuple) -> tuple[_Entry | None, int]:
        """The cached entry sharing the longest token prefix with `tokens` (the key's own first),
        and how many of its tokens to reuse (the last prompt token is always fed)."""
        best, reused = None, 0
        own = self.entries.get(key)
        candidates = ([own] if own is not None else []) + [e for k, e in self.entries.items() if k != key]
        if self._spare is not None:
            candidates.append(self._spare)
        for entry in candidates:
            n = common_prefix(entry.tokens, tokens)
            if n > reused:
                best, reused = entry, n
        return best, min(reused, len(tokens) - 1)

    def _forward(self, cache, start: int, fed: list[int], keep: int):
        """Feed `fed` at positions start.. after `cache` (which holds `start` tokens); the logits
        of the last `keep` positions, [keep, vocab]."""
        torch, device = self.torch, self.hf.device
        q = len(fed)
        cols = torch.arange(start + q, device=device)
        rows = torch.arange(start, start + q, device=device)
        mask = (cols[None, :] <= rows[:, None])[None, None]  # causal, the cached part visible to all
        with causal_after_cache():  # that structure computed as such (on CPU) instead of the mask read
            out = self.hf.model(
                input_ids=torch.tensor([fed], dtype=torch.long, device=device),
                attention_mask=mask,
                position_ids=rows[None],
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=keep,
            )
        self.stats["forward_calls"] += 1
        return out.logits[0]

    def _complete(self, key, tokens: tuple, max_new_tokens: int, stop) -> str:
        from transformers.cache_utils import DynamicCache

        hf, stats = self.hf, self.stats
        source, reused = self._source(key, tokens)
        cache = DynamicCache()
        if reused:
            cache = DynamicCache(ddp_cache_data=[(k[:, :, :reused], v[:, :, :reused]) for k, v in source.kv])
        stats["prompt_tokens_reused"] += reused
        stats["prompt_tokens_computed"] += len(tokens) - reused
        generated: list[int] = []
        fed = list(tokens[reused:])
        start = reused
        finished = False
        while not finished:
            # the last fed token's logits give the next token; each draft token's the one after it
            draft = lookup_draft(tokens + tuple(generated), min(self.draft_tokens, max_new_tokens - len(generated) - 1))
            logits = self._forward(cache, start, fed + draft, 1 + len(draft))
            chosen = self.torch.argmax(logits, dim=-1).tolist()
            stats["draft_tokens"] += len(draft)
            accepted = 0
            for position, token in enumerate(chosen):
                generated.append(token)
                if token in hf.eos or len(generated) >= max_new_tokens or contains_stop(hf.decode(generated), stop):
                    finished = True
                    break
                if position >= len(draft) or draft[position] != token:
                    break
                accepted += 1
            stats["draft_tokens_accepted"] += accepted
            start += len(fed) + accepted
            _drop_after(cache, start)  # the rejected draft tokens
            fed = [generated[-1]]
        stats["generated_tokens"] += len(generated)
        kept = len(tokens) + len(generated) - 1  # the last generated token was never fed
        _drop_after(cache, kept)
        self.entries[key] = _Entry(tokens + tuple(generated[:-1]), [(layer.keys, layer.values) for layer in cache.layers])
        return cut_at_stop(hf.decode(generated), stop)


def _drop_after(cache, length: int) -> None:
    """Keep the first `length` tokens of a DynamicCache (crop's negative form: tokens to remove)."""
    extra = cache.get_seq_length() - length
    if extra > 0:
        cache.crop(-extra)


class TurnLengthSwitch(TextGenerator):
    """Prompts rebuilt at every step, on the cheaper of two paths over one model: the first call
    goes to the lockstep batch decode (CachedBatchGenerator: one forward per token for all rows,
    which pays when turns are several tokens long); when its turns averaged at most
    `short_turn_tokens` tokens (nothing to decode in a batch: a padded, masked prefill of the
    whole batch is all it would do), every later call goes to a RowCachedGenerator instead (each
    prompt alone from its longest cached prefix, no padding). Both answer exactly alike; the
    choice follows the turns' length, never a timing. stats: both generators' added up."""

    def __init__(self, batch, short_turn_tokens: float = 1.5):
        self.batch = batch
        self.rows = RowCachedGenerator(hf=batch.hf)
        self.name = batch.name
        self.hf = batch.hf
        self.chat_format = batch.chat_format
        self.short_turn_tokens = short_turn_tokens
        self.active = None  # decided after the first call

    @property
    def stats(self) -> dict:
        both = dict(self.rows.stats)
        for key, value in self.batch.stats.items():
            both[key] = both.get(key, 0) + value
        both["path"] = "rows" if self.active is self.rows else "batch"
        return both

    def reset_stats(self) -> None:
        self.batch.reset_stats()
        self.rows.reset_stats()

    def release(self, key) -> None:
        self.batch.release(key)
        self.rows.release(key)

    def generate(self, prompts: dict, max_new_tokens: int, stop: list[str] | None) -> dict:
        if self.active is not None:
            return self.active.generate(prompts, max_new_tokens, stop)
        before = dict(self.batch.stats)
        results = self.batch.generate(prompts, max_new_tokens, stop)
        answered = self.batch.stats["prompts"] - before["prompts"] - (self.batch.stats["over_context"] - before["over_context"])
        if answered:
            turn = (self.batch.stats["generated_tokens"] - before["generated_tokens"]) / answered
            self.active = self.rows if turn <= self.short_turn_tokens else self.batch
        return results


def for_rebuilt_prompts(generator: TextGenerator) -> TextGenerator:
    """The generator a rollout whose prompts are rebuilt at every step plays with: over a
    CachedBatchGenerator, a TurnLengthSwitch between it and a RowCachedGenerator on the same model
    (no second copy); any other generator (vLLM's prefix caching, the reference loop) as it is."""
    from rlbench.generation.prefix_cache import CachedBatchGenerator

    if not isinstance(generator, CachedBatchGenerator):
        return generator
    return TurnLengthSwitch(generator)
