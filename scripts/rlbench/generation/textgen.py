"""Text generators for multi-step rollouts (ALFWorld ReAct episodes): greedy text completion of
many growing prompts at once, with the already computed prompt state reused between steps.

A rollout asks, at every step, for the greedy continuation of each live episode's full prompt text
(up to a stop string, at most `max_new_tokens` tokens); the next step's prompt is the previous one
plus the completion's action and the new observation. Three generators answer that question:

- FullPromptGenerator: the reference harness's way, one prompt at a time, the whole prompt
  computed at every call (transformers ``generate``, batch 1);
- CachedBatchGenerator: all prompts in one batched greedy decode (one forward per decoded token
  for all live rows); the KV cache of each episode is kept between calls and reused up to the
  longest common *token* prefix of the new full-prompt tokenization, and prompt prefixes shared
  by several episodes (the few-shot examples) are computed and stored once, in a radix tree;
- VLLMTextGenerator: vLLM with automatic prefix caching, one ``llm.generate`` per call (GPU).

All three tokenize each prompt in full, as vLLM does for text completion (default special
tokens), stop a row at EOS, at `max_new_tokens`, or as soon as the decoded new text contains a
stop string, and return the text cut before the first stop string. A prompt whose token count
plus `max_new_tokens` exceeds the model's ``max_position_embeddings`` is not generated for: its
key maps to None (the caller ends that episode as lost).
"""

from __future__ import annotations

import importlib.util
import time
from abc import ABC, abstractmethod
from pathlib import Path

from rlbench.generation.backends import DEFAULT_GPU_MEMORY_UTILIZATION, eos_ids, cut_at_stop, resolve_backend_name

TEXT_GENERATORS = ("auto", "hf", "vllm", "reference")


def _new_stats() -> dict:
    return {
        "calls": 0,
        "prompts": 0,
        "prompt_tokens": 0,  # tokens of all prompts asked for
        "prompt_tokens_computed": 0,  # ... of which went through the model in this call
        "prompt_tokens_reused": 0,  # ... of which came from a cache
        "generated_tokens": 0,
        "forward_calls": 0,
        "over_context": 0,  # prompts answered None (context limit)
        "rows_retired_early": 0,  # CachedBatchGenerator: rows dropped from the batch mid-decode
        "generate_seconds": 0.0,
    }


class TextGenerator(ABC):
    """Greedy text completion of many keyed prompts at once (keys: episode ids, any hashable)."""

    name: str
    stats: dict

    @abstractmethod
    def generate(self, prompts: dict, max_new_tokens: int, stop: list[str] | None) -> dict:
        """key -> greedy completion of prompts[key], cut before the first stop string (excluded);
        None where the prompt plus `max_new_tokens` does not fit the model's context."""

    def release(self, key) -> None:
        """The episode `key` ended: free whatever is cached for it."""

    def chat_prompt(self, messages: list[dict]) -> str:
        """The text prompt of a chat conversation, as the model's chat template renders it with the
        generation prompt (what vLLM's ``llm.chat`` feeds the model); a tokenizer without a chat
        template gets backends.render_prompt's plain-text fallback."""
        from rlbench.generation.backends import render_prompt

        return render_prompt(self.tokenizer, messages)

    @property
    def tokenizer(self):
        return self.hf.tokenizer

    def reset_stats(self) -> None:
        self.stats = _new_stats()


def _lcp(a, b) -> int:
    """Length of the longest common prefix of two token sequences (lists/tuples of ints)."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    if a[:n] == b[:n]:  # C-speed fast path (the usual case: a prompt extends the cached tokens)
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[lo:mid] == b[lo:mid]:
            lo = mid
        else:
            hi = mid
    return lo


def _contains_stop(text: str, stop: list[str] | None) -> bool:
    return bool(stop) and any(s and s in text for s in stop)


def _max_positions(config) -> int | None:
    text_config = config.get_text_config() if hasattr(config, "get_text_config") else config
    value = getattr(text_config, "max_position_embeddings", None)
    return int(value) if value else None


class _HFModel:
    """Model and tokenizer loaded like generation.HFBackend (float32 on CPU, eval mode)."""

    def __init__(self, model_dir: Path, device: str | None = None, dtype=None):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        if dtype is None:
            dtype = torch.bfloat16 if self.device == "cuda" else torch.float32
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
        self.model = AutoModelForCausalLM.from_pretrained(
            model_dir, trust_remote_code=False, use_safetensors=True, dtype=dtype
        ).to(self.device)
        self.model.eval()
        self.eos = set(eos_ids(self.tokenizer.eos_token_id, self.model.generation_config.eos_token_id))
        self.pad_id = self.tokenizer.pad_token_id
        if self.pad_id is None:
            self.pad_id = min(self.eos) if self.eos else 0
        self.max_positions = _max_positions(self.model.config)

    def encode(self, prompt: str) -> list[int]:
        # vLLM text completion: the tokenizer's default special tokens (BOS where the model has one).
        return list(self.tokenizer(prompt)["input_ids"])

    def decode(self, tokens) -> str:
        return self.tokenizer.decode(tokens, skip_special_tokens=True)

    def fits(self, n_prompt_tokens: int, max_new_tokens: int) -> bool:
        return self.max_positions is None or n_prompt_tokens + max_new_tokens <= self.max_positions


# -- the reference: one prompt at a time, whole prompt every call --------------------------------
class FullPromptGenerator(TextGenerator):
    """The reference harness's way: each prompt alone (batch 1), the whole prompt computed at every
    call, transformers ``generate`` with greedy decoding."""

    name = "reference"

    def __init__(self, model_dir: Path, device: str | None = None, dtype=None):
        self.hf = _HFModel(model_dir, device=device, dtype=dtype)
        self.stats = _new_stats()

    def generate(self, prompts: dict, max_new_tokens: int, stop: list[str] | None) -> dict:
        from transformers import GenerationConfig, StoppingCriteria, StoppingCriteriaList

        torch, hf = self.hf.torch, self.hf
        started = time.perf_counter()
        stats = self.stats
        stats["calls"] += 1
        results = {}
        for key, prompt in prompts.items():
            ids = hf.encode(prompt)
            stats["prompts"] += 1
            stats["prompt_tokens"] += len(ids)
            if not hf.fits(len(ids), max_new_tokens):
                stats["over_context"] += 1
                results[key] = None
                continue

            class _StopText(StoppingCriteria):  # the same rule as CachedBatchGenerator (and vLLM)
                def __call__(self, input_ids, scores, **kwargs):
                    done = _contains_stop(hf.decode(input_ids[0, len(ids) :].tolist()), stop)
                    return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)

            config = GenerationConfig(  # a clean greedy config: nothing from the model's defaults
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=sorted(hf.eos) or None,
                pad_token_id=hf.pad_id,
            )
            inputs = torch.tensor([ids], device=hf.device)
            with torch.inference_mode():
                output = hf.model.generate(
                    input_ids=inputs,
                    attention_mask=torch.ones_like(inputs),
                    generation_config=config,
                    stopping_criteria=StoppingCriteriaList([_StopText()]) if stop else None,
                )
            new = output[0, len(ids) :].tolist()
            stats["prompt_tokens_computed"] += len(ids)
            stats["generated_tokens"] += len(new)
            stats["forward_calls"] += len(new)
            results[key] = cut_at_stop(hf.decode(new), stop)
        stats["generate_seconds"] += time.perf_counter() - started
        return results


# -- ours: batched, cached ---------------------------------------------------------------------
class _Node:
    """A radix-tree node of shared prompt prefixes: `tokens` follow the parent's tokens; `kv` holds
    one (keys, values) pair per layer for exactly these tokens, shaped [1, kv_heads, n, head_dim]."""

    __slots__ = ("parent", "tokens", "kv", "children", "full", "last_used")

    def __init__(self, parent, tokens: tuple, kv):
        self.parent = parent
        self.tokens = tokens
        self.kv = kv
        self.children: dict = {}  # first token -> child
        self.full: tuple = (parent.full if parent is not None else ()) + tokens
        self.last_used = 0

    @property
    def end(self) -> int:
        return len(self.full)

    @property
    def start(self) -> int:
        return len(self.full) - len(self.tokens)

    def chain(self) -> list:
        nodes, node = [], self
        while node is not None and node.parent is not None:  # the root holds nothing
            nodes.append(node)
            node = node.parent
        return nodes[::-1]


def _anchor(node: _Node, length: int) -> _Node:
    """The deepest node on `node`'s chain whose segment starts before `length` (root if 0)."""
    while node.parent is not None and node.start >= length:
        node = node.parent
    return node


class _Entry:
    """What is cached for one key: the first `base` tokens of the shared chain ending at `node`,
    then private tokens `own` with their per-layer KV `own_kv` ([1, kv_heads, len(own), head_dim])."""

    __slots__ = ("node", "base", "own", "own_kv")

    def __init__(self, node: _Node, base: int, own: list | None = None, own_kv=None):
        self.node, self.base, self.own, self.own_kv = node, base, tuple(own or ()), own_kv

    def tokens(self) -> tuple:
        return self.node.full[: self.base] + self.own

    def __len__(self) -> int:
        return self.base + len(self.own)


class _BufferLayer:
    """A KV-cache layer over a preallocated [batch, heads, capacity, dim] buffer: update() writes
    the new states in place (no per-token concatenation of the whole cache) and returns views."""

    is_sliding = False
    is_compileable = False
    is_croppable = False

    def __init__(self, keys_buffer, values_buffer, length: int):
        self.k_buf, self.v_buf, self.length = keys_buffer, values_buffer, length
        self.is_initialized = True
        self.dtype, self.device = keys_buffer.dtype, keys_buffer.device

    @property
    def keys(self):
        return self.k_buf[:, :, : self.length]

    @property
    def values(self):
        return self.v_buf[:, :, : self.length]

    def update(self, key_states, value_states, *args, **kwargs):
        n = key_states.shape[-2]
        self.k_buf[:, :, self.length : self.length + n] = key_states
        self.v_buf[:, :, self.length : self.length + n] = value_states
        self.length += n
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.length + query_length, 0

    def get_max_length(self) -> int:
        return -1


_ATTENTION = "rlbench_masked_gqa_sdpa"


def _masked_gqa_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """SDPA with an explicit (4D boolean) mask and grouped-query attention done by the kernel:
    transformers' own SDPA path repeats K/V per query head whenever a mask is given, copying the
    whole cache three times per layer and decoded token (SmolLM2); this reads it in place."""
    import torch

    output = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=0.0,
        scale=scaling,
        is_causal=False,
        enable_gqa=query.shape[1] != key.shape[1],
    )
    return output.transpose(1, 2).contiguous(), None


def _use_masked_gqa_sdpa(model) -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(_ATTENTION, _masked_gqa_sdpa)
    model.set_attn_implementation(_ATTENTION)


def _make_cache(layers):
    from transformers.cache_utils import Cache, CacheLayerMixin

    # Register the buffer layer as a cache layer type (structural subclass) once.
    if not issubclass(_BufferLayer, CacheLayerMixin):
        CacheLayerMixin.register(_BufferLayer)
    cache = Cache(layers=layers)
    return cache


class CachedBatchGenerator(TextGenerator):
    """All prompts of a call in one batched greedy decode, with KV reuse between calls.

    Per key, the longest common token prefix of the new full-prompt tokenization and the tokens
    cached for that key is reused (generated tokens included); prefixes shared by several keys
    (>= `min_shared` tokens) live once in a radix tree of KV segments, which new keys are seeded
    from. A call assembles a batch cache in one preallocated buffer per layer: each row's cached
    tokens (left-padded), then a window in which every row's uncached suffix is prefilled
    (right-aligned, pads masked), then the decoded tokens; a per-row 4D mask and explicit position
    ids make every row see exactly its own tokens at their unpadded positions. Decoding is one
    forward per token for all live rows; once `retire_fraction` of them have finished, those rows'
    caches are copied out and the buffer is compacted to the others. At the end each row's private
    part is copied out (pad slots dropped) and the buffers are freed.

    Memory: at rest, the tree (each shared prefix once) plus each key's private tokens; during a
    call, the batch buffer (rows x (longest cached + suffix window + max_new_tokens) tokens, the
    shared prefix repeated per row there, as batched SDPA needs it).

    stats["prompt_tokens_computed"] counts every prompt token run through the model, the shared
    prefixes' (tree) computation included; "prompt_tokens_reused" those taken from a cache.
    """

    name = "hf"

    def __init__(
        self,
        model_dir: Path,
        device: str | None = None,
        dtype=None,
        min_shared: int = 32,
        idle_prefix_tokens: int = 16384,
        retire_fraction: float = 0.5,
    ):
        self.hf = _HFModel(model_dir, device=device, dtype=dtype)
        self.torch = self.hf.torch
        self.min_shared = min_shared
        self.idle_prefix_tokens = idle_prefix_tokens
        self.retire_fraction = retire_fraction
        self.root = _Node(None, (), None)
        self.entries: dict = {}
        self.stats = _new_stats()
        self._clock = 0
        config = self.hf.model.config.get_text_config()
        self.n_layers = config.num_hidden_layers
        self.kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        _use_masked_gqa_sdpa(self.hf.model)  # (the masks below are 4D booleans: True = attend)

    # -- public ---------------------------------------------------------------------------------
    def release(self, key) -> None:
        self.entries.pop(key, None)
        self._prune()

    def cached_tokens(self) -> dict:
        """Tokens held in KV form: shared (tree) and private (per key), for memory accounting."""
        shared = sum(len(n.tokens) for n in self._nodes())
        private = sum(len(e.own) for e in self.entries.values())
        return {"shared": shared, "private": private, "keys": len(self.entries)}

    def generate(self, prompts: dict, max_new_tokens: int, stop: list[str] | None) -> dict:
        started = time.perf_counter()
        self._clock += 1
        stats, hf = self.stats, self.hf
        stats["calls"] += 1
        results: dict = {}
        ids: dict = {}
        for key, prompt in prompts.items():
            tokens = tuple(hf.encode(prompt))  # tuples throughout: _lcp compares slices
            stats["prompts"] += 1
            stats["prompt_tokens"] += len(tokens)
            if not hf.fits(len(tokens), max_new_tokens) or not tokens:
                stats["over_context"] += int(bool(tokens))
                results[key] = None
                continue
            ids[key] = tokens
        if ids:
            try:
                with self.torch.inference_mode():
                    self._seed_new_keys(ids)
                    results.update(self._run(ids, max_new_tokens, stop))
            except BaseException:
                for key in ids:  # a half-updated cache must not be trusted
                    self.entries.pop(key, None)
                raise
        self._prune()
        stats["generate_seconds"] += time.perf_counter() - started
        return {key: results[key] for key in prompts}

    # -- the prefix tree ------------------------------------------------------------------------
    def _nodes(self):
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _match(self, tokens) -> tuple[_Node, int]:
        """The deepest tree position along `tokens`: (node, matched length), the match possibly
        ending inside the node's segment (its KV prefix is valid on its own)."""
        node, pos = self.root, 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            n = _lcp(child.tokens, tokens[pos : pos + len(child.tokens)])
            node, pos = child, pos + n
            if n < len(child.tokens):
                break
        return node, pos

    def _split(self, node: _Node, at: int) -> _Node:
        """Split `node` so that a node ends at absolute position `at` (inside its segment); the
        original object keeps the tail (entries pointing at it stay valid); returns the head."""
        cut = at - node.start
        parent = node.parent
        head = _Node(parent, node.tokens[:cut], [(k[:, :, :cut], v[:, :, :cut]) for k, v in node.kv])
        head.last_used = node.last_used
        parent.children[head.tokens[0]] = head
        node.parent = head
        node.tokens = node.tokens[cut:]
        node.kv = [(k[:, :, cut:], v[:, :, cut:]) for k, v in node.kv]
        head.children[node.tokens[0]] = node
        return head

    def _ensure_node(self, tokens) -> _Node:
        """A tree node ending exactly at len(tokens), computing the missing segment (batch 1)."""
        node, pos = self._match(tokens)
        if pos < node.end:
            node = self._split(node, pos)
        if pos == len(tokens):
            return node
        segment = tuple(tokens[pos:])
        kv = self._compute_segment(node, segment)
        child = _Node(node, segment, kv)
        node.children[segment[0]] = child
        return child

    def _compute_segment(self, parent: _Node, segment: tuple):
        torch = self.torch
        start, n = parent.end, len(segment)
        layers = self._alloc(1, start + n)
        for nd in parent.chain():
            for (kb, vb), (k, v) in zip(layers, nd.kv):
                kb[:, :, nd.start : nd.end] = k
                vb[:, :, nd.start : nd.end] = v
        valid = torch.ones(1, start + n, dtype=torch.bool, device=self.hf.device)
        self._forward(layers, start, torch.tensor([segment], device=self.hf.device), valid,
                      torch.arange(start, start + n, device=self.hf.device)[None], keep=False)
        self.stats["prompt_tokens_computed"] += n
        return [(kb[:, :, start:].clone(), vb[:, :, start:].clone()) for kb, vb in layers]

    def _seed_new_keys(self, ids: dict) -> None:
        """Keys without a cache: when their prompt shares >= min_shared tokens with another prompt
        (of this call, or cached), put that common prefix into the tree (computed once)."""
        new = [k for k in ids if k not in self.entries]
        if not new:
            return
        sequences = [(ids[k], k) for k in ids] + [(e.tokens(), None) for k, e in self.entries.items() if k not in ids]
        sequences.sort(key=lambda item: item[0])
        position = {key: i for i, (_seq, key) in enumerate(sequences) if key is not None}
        wanted = []
        for key in new:
            i = position[key]
            seq = sequences[i][0]
            best = max(
                (_lcp(seq, sequences[j][0]) for j in (i - 1, i + 1) if 0 <= j < len(sequences)), default=0
            )
            best = min(best, len(seq) - 1)
            if best >= self.min_shared:
                wanted.append(seq[:best])
        for prefix in sorted(set(wanted), key=len):
            self._ensure_node(prefix)

    # -- one call -------------------------------------------------------------------------------
    def _alloc(self, batch: int, capacity: int):
        torch = self.torch
        shape = (batch, self.kv_heads, capacity, self.head_dim)
        dtype, device = self.hf.model.dtype, self.hf.device
        return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                for _ in range(self.n_layers)]

    def _forward(self, layers, length: int, input_ids, valid, position_ids, keep: bool = True):
        """One forward of `input_ids` [B, q] written at buffer columns [length, length + q); `valid`
        [B, length + q] says which columns each row may attend to (besides causality)."""
        torch = self.torch
        q = input_ids.shape[1]
        total = length + q
        cols = torch.arange(total, device=valid.device)
        rows = torch.arange(length, total, device=valid.device)
        allowed = valid[:, None, None, :] & (cols[None, None, None, :] <= rows[None, None, :, None])
        # A padding query sees at least itself (no all-masked row, no NaN anywhere in the buffer).
        allowed |= cols[None, None, None, :] == rows[None, None, :, None]
        cache = _make_cache([_BufferLayer(k, v, length) for k, v in layers])
        out = self.hf.model(
            input_ids=input_ids,
            attention_mask=allowed,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        self.stats["forward_calls"] += 1
        return out.logits[:, -1, :] if keep else None

    def _plan_row(self, key, tokens: list):
        """(entry, reused): the cache to start from for `tokens` and how many tokens of it to use."""
        limit = len(tokens) - 1  # the last prompt token is always fed (its logits start decoding)
        node, matched = self._match(tokens)
        tree_len = min(matched, limit)
        entry = self.entries.get(key)
        own_len = min(_lcp(entry.tokens(), tokens), limit) if entry is not None else -1
        if own_len > tree_len:
            return entry, own_len
        return _Entry(_anchor(node, tree_len), tree_len), tree_len

    def _run(self, ids: dict, max_new_tokens: int, stop) -> dict:
        torch, hf, stats = self.torch, self.hf, self.stats
        device = hf.device
        keys = list(ids)
        plans = []
        for key in keys:
            entry, reused = self._plan_row(key, ids[key])
            plans.append((key, entry, reused))
        batch = len(keys)
        cached_max = max(reused for _k, _e, reused in plans)
        window = max(len(ids[k]) - reused for k, _e, reused in plans)
        capacity = cached_max + window + max(max_new_tokens - 1, 0)
        layers = self._alloc(batch, capacity)
        valid = torch.zeros(batch, capacity, dtype=torch.bool, device=device)
        input_ids = torch.full((batch, window), hf.pad_id, dtype=torch.long, device=device)
        position_ids = torch.zeros(batch, window, dtype=torch.long, device=device)
        for row, (key, entry, reused) in enumerate(plans):
            tokens = ids[key]
            offset = cached_max - reused  # left padding of the cached part
            self._copy_cached(layers, row, offset, entry, reused)
            valid[row, offset:cached_max] = True
            suffix = tokens[reused:]
            lead = window - len(suffix)
            input_ids[row, lead:] = torch.tensor(suffix, dtype=torch.long)
            position_ids[row, lead:] = torch.arange(reused, len(tokens))
            position_ids[row, :lead] = reused
            valid[row, cached_max + lead : cached_max + window] = True
            self.entries[key] = entry  # (re-pointed below, after the call)
            entry.own_kv = None  # the buffer holds it now; the copy out rebuilds it
            stats["prompt_tokens_reused"] += reused
            stats["prompt_tokens_computed"] += len(suffix)

        length = cached_max
        logits = self._forward(layers, length, input_ids, valid[:, : length + window], position_ids)
        length += window
        generated = [[] for _ in range(batch)]
        finished = [False] * batch
        next_pos = torch.tensor([len(ids[k]) for k in keys], dtype=torch.long, device=device)
        active = list(range(batch))  # plan index of each buffer row
        results = {}

        def finish(index: int, buffer_row: int) -> None:
            key, entry, reused = plans[index]
            gen = generated[index]
            stats["generated_tokens"] += len(gen)
            results[key] = cut_at_stop(hf.decode(gen), stop)
            fed = gen[: len(gen) - 1]  # the last generated token was never fed (no KV)
            tokens = ids[key] + tuple(fed)
            self.entries[key] = self._copy_out(
                layers, buffer_row, cached_max, window, len(ids[key]) - reused, entry, reused, tokens
            )
            entry.node.last_used = self._clock

        while True:
            chosen = torch.argmax(logits, dim=-1).tolist()
            for row, index in enumerate(active):
                if finished[index]:
                    continue
                token = chosen[row]
                generated[index].append(token)
                if (
                    token in hf.eos
                    or len(generated[index]) >= max_new_tokens
                    or _contains_stop(hf.decode(generated[index]), stop)
                ):
                    finished[index] = True
            done = [row for row, index in enumerate(active) if finished[index]]
            if len(done) == len(active):
                break
            if done and len(done) >= self.retire_fraction * len(active):
                # Retire the finished rows: their caches out, the buffer compacted to the rest, so
                # the remaining decode steps no longer compute (and attend over) them.
                for row in done:
                    finish(active[row], row)
                stats["rows_retired_early"] += len(done)
                keep = [row for row, index in enumerate(active) if not finished[index]]
                select = torch.tensor(keep, dtype=torch.long, device=device)
                layers = [(k.index_select(0, select), v.index_select(0, select)) for k, v in layers]
                valid, next_pos = valid.index_select(0, select), next_pos.index_select(0, select)
                chosen = [chosen[row] for row in keep]
                active = [active[row] for row in keep]
            feed = torch.tensor(
                [[chosen[row] if not finished[index] else hf.pad_id] for row, index in enumerate(active)],
                device=device,
            )
            valid[:, length] = True
            logits = self._forward(layers, length, feed, valid[:, : length + 1], next_pos[:, None])
            next_pos += 1
            length += 1
        for row, index in enumerate(active):
            finish(index, row)
        return {key: results[key] for key in keys}

    def _copy_cached(self, layers, row: int, offset: int, entry: _Entry, reused: int) -> None:
        """Write the first `reused` cached tokens of `entry` into buffer row `row` from `offset`."""
        if reused == 0:
            return
        col = offset
        for nd in entry.node.chain():
            if nd.start >= reused:
                break
            n = min(nd.end, reused) - nd.start
            for (kb, vb), (k, v) in zip(layers, nd.kv):
                kb[row, :, col : col + n] = k[0, :, :n]
                vb[row, :, col : col + n] = v[0, :, :n]
            col += n
        rest = reused - min(entry.base, reused)
        if rest > 0:
            for (kb, vb), (k, v) in zip(layers, entry.own_kv):
                kb[row, :, col : col + rest] = k[0, :, :rest]
                vb[row, :, col : col + rest] = v[0, :, :rest]
            col += rest
        assert col == offset + reused

    def _copy_out(self, layers, row, cached_max, window, suffix_len, entry: _Entry, reused, tokens) -> _Entry:
        """The row's new private cache: everything after its shared base, pad slots dropped."""
        torch = self.torch
        base = min(entry.base, reused)
        offset = cached_max - reused  # the row's cached part: columns [offset, cached_max)
        pieces = []
        if reused > base:
            pieces.append((offset + base, cached_max))
        pieces.append((cached_max + window - suffix_len, cached_max + window))  # right-aligned suffix
        n_fed = len(tokens) - reused - suffix_len  # generated tokens fed back, after the window
        if n_fed:
            pieces.append((cached_max + window, cached_max + window + n_fed))
        own_kv = []
        for kb, vb in layers:
            own_kv.append((
                torch.cat([kb[row : row + 1, :, a:b] for a, b in pieces], dim=2).clone(),
                torch.cat([vb[row : row + 1, :, a:b] for a, b in pieces], dim=2).clone(),
            ))
        return _Entry(_anchor(entry.node, base), base, tokens[base:], own_kv)

    def _prune(self) -> None:
        """Drop tree leaves no entry uses, least recently used first, beyond the idle budget."""
        used = set()
        for entry in self.entries.values():
            node = entry.node
            while node is not None and id(node) not in used:
                used.add(id(node))
                node = node.parent
        while True:
            idle = [n for n in self._nodes() if id(n) not in used and not n.children]
            idle_tokens = sum(len(n.tokens) for n in self._nodes() if id(n) not in used)
            if idle_tokens <= self.idle_prefix_tokens or not idle:
                return
            victim = min(idle, key=lambda n: n.last_used)
            victim.parent.children.pop(victim.tokens[0], None)


# -- vLLM (GPU) ----------------------------------------------------------------------------------
class VLLMTextGenerator(TextGenerator):
    """vLLM offline inference with automatic prefix caching: one ``llm.generate`` per call; the
    shared few-shot prefix and each episode's history stay in vLLM's block cache between calls."""

    name = "vllm"
    tokenizer = None  # set in __init__ (vLLM's own tokenizer)

    def __init__(self, model_dir: Path, seed: int = 0, **llm_kwargs):
        if importlib.util.find_spec("vllm") is None:
            raise RuntimeError(
                "the vllm text generator needs the gpu extra: pip install -e '.[gpu]' (or use the hf generator)"
            )
        from transformers import AutoConfig
        from vllm import LLM, SamplingParams

        self.llm = LLM(model=str(model_dir), trust_remote_code=False, seed=seed, enable_prefix_caching=True, **llm_kwargs)
        self.sampling = SamplingParams
        self.tokenizer = self.llm.get_tokenizer()
        self.max_positions = _max_positions(AutoConfig.from_pretrained(model_dir, trust_remote_code=False))
        self.stats = _new_stats()

    def generate(self, prompts: dict, max_new_tokens: int, stop: list[str] | None) -> dict:
        started = time.perf_counter()
        stats = self.stats
        stats["calls"] += 1
        results, keys, texts = {}, [], []
        for key, prompt in prompts.items():
            n = len(self.tokenizer(prompt)["input_ids"])
            stats["prompts"] += 1
            stats["prompt_tokens"] += n
            if self.max_positions is not None and n + max_new_tokens > self.max_positions:
                stats["over_context"] += 1
                results[key] = None
            else:
                keys.append(key)
                texts.append(prompt)
        if texts:
            params = self.sampling(temperature=0.0, max_tokens=max_new_tokens, stop=list(stop) if stop else None)
            outputs = self.llm.generate(texts, params, use_tqdm=False)
            stats["forward_calls"] += 1  # engine steps are not visible here; one call per batch
            for key, output in zip(keys, outputs):
                completion = output.outputs[0]
                results[key] = cut_at_stop(completion.text, stop)
                stats["generated_tokens"] += len(completion.token_ids)
                cached = getattr(output, "num_cached_tokens", None) or 0
                stats["prompt_tokens_reused"] += cached
                stats["prompt_tokens_computed"] += len(output.prompt_token_ids or []) - cached
        stats["generate_seconds"] += time.perf_counter() - started
        return {key: results[key] for key in prompts}


def load_text_generator(name: str, model_dir: Path, device: str | None = None, **kwargs) -> TextGenerator:
    """'hf' -> CachedBatchGenerator, 'vllm' -> VLLMTextGenerator, 'auto' -> vllm when CUDA and vllm
    are both present, else hf (generation.resolve_backend_name); 'reference' -> FullPromptGenerator
    (the reference harness's one-prompt-at-a-time loop, for comparisons)."""
    memory = kwargs.pop("gpu_memory_utilization", None)  # vLLM's only
    if name == "reference":
        return FullPromptGenerator(model_dir, device=device, **kwargs)
    if name not in TEXT_GENERATORS:
        raise ValueError(f"unknown text generator {name!r}; allowed: {', '.join(TEXT_GENERATORS)}")
    if resolve_backend_name(name) == "vllm":
        return VLLMTextGenerator(model_dir, gpu_memory_utilization=memory or DEFAULT_GPU_MEMORY_UTILIZATION, **kwargs)
    return CachedBatchGenerator(model_dir, device=device, **kwargs)
