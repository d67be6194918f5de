"""Our batched, prefix-cached text generator (CachedBatchGenerator) and its cache structures: the
radix tree of shared prompt prefixes (_Node) and each episode's cached tokens (_Entry).

All prompts of a call go in one batched greedy decode (one forward per decoded token for all live
rows); the KV cache of each episode is kept between calls and reused up to the longest common
*token* prefix of the new full-prompt tokenization, and prompt prefixes shared by several episodes
(the few-shot examples) are computed and stored once, in a radix tree, and attended to once per
group of rows sharing them. Decoding checks prompt-lookup drafts (generation.prompt_lookup) in the
same forwards: the greedy output, in fewer forwards where a completion copies its prompt or repeats
itself.
"""

from __future__ import annotations

import time
from pathlib import Path

from rlbench.generation.backends import cut_at_stop
from rlbench.generation.kv_buffer import BufferLayer, SharedPrefix, attending_to, make_cache, use_masked_gqa_sdpa
from rlbench.generation.prompt_lookup import lookup_draft
from rlbench.generation.textgen_base import HFModel, TextGenerator, common_prefix, contains_stop, new_stats


#: choose_prefix_lengths' cost of a group, in prefix tokens read per row times query heads x head_dim
GROUP_COST_HEAD_DIMS = 64 * 4000
#: prompt-lookup drafts while decoding: a row drafts at most DRAFT_TOKENS tokens, and a forward feeds
#: at most DRAFT_FORWARD_TOKENS tokens in all (rows x (1 + draft)); on CPU a forward's cost grows
#: with the tokens fed beyond a floor (SmolLM2-135M, 2 cores: batch 1 x 33 tokens ~ 10 x 5 ~ 2x one
#: batch-1 token)
DRAFT_TOKENS = 32
DRAFT_FORWARD_TOKENS = 50


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


def _points(entry: "_Entry", shared: int) -> list:
    """The places a row reusing `shared` tokens of `entry`'s tree chain can take its group's prefix
    up to: (node id, length) at the end of each node of the chain within `shared`, then `shared`."""
    points = []
    for node in entry.node.chain():
        if node.start >= shared:
            break
        points.append((id(node), min(node.end, shared)))
    return points


def choose_prefix_lengths(paths: list, group_cost: float) -> list:
    """Per row, how many tokens of its tree chain it attends to as a shared group prefix (0: none).

    `paths[r]`: the row's points (_points): (id, length) pairs, lengths increasing; rows whose paths
    share a point can share a group there. A group costs `group_cost` (in row x token units: one
    attention call per group and layer, and the merge of its log-sum-exp), and every tree token a
    row holds after its group's prefix costs 1 (it is read per row). Exact minimum of the total
    over every choice of groups (a dynamic program over the tree of points); with `group_cost` 0
    each row takes the deepest point (the longest shared prefix)."""
    children: dict = {}
    ending: dict = {}
    for row, path in enumerate(paths):
        parent = None
        for point in path:
            children.setdefault(parent, {})[point] = None
            parent = point
        ending.setdefault(parent, []).append(row)
    memo: dict = {}

    def cost(point, above: int) -> tuple:
        """(cost of the rows below `point` given the nearest group prefix above ends at `above`,
        whether to put a group at `point`)."""
        cached = memo.get((point, above))
        if cached is None:
            length = point[1]
            below = children.get(point, ())
            no_group = sum(cost(child, above)[0] for child in below) + len(ending.get(point, ())) * (length - above)
            group = group_cost + sum(cost(child, length)[0] for child in below)
            cached = memo[(point, above)] = (group, True) if group < no_group else (no_group, False)
        return cached

    lengths = [0] * len(paths)
    for row in ending.get(None, ()):
        lengths[row] = 0
    stack = [(point, 0) for point in children.get(None, ())]
    while stack:
        point, above = stack.pop()
        here = point[1] if cost(point, above)[1] else above
        for row in ending.get(point, ()):
            lengths[row] = here
        stack.extend((child, here) for child in children.get(point, ()))
    return lengths


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


class CachedBatchGenerator(TextGenerator):
    """All prompts of a call in one batched greedy decode, with KV reuse between calls.

    Per key, the longest common token prefix of the new full-prompt tokenization and the tokens
    cached for that key is reused (generated tokens included); prefixes shared by several keys
    (>= `min_shared` tokens) live once in a radix tree of KV segments, which new keys are seeded
    from. A call groups the rows by the shared (tree) prefix they reuse, neighbours in the batch,
    and assembles a batch cache of the rest in one preallocated buffer per layer: each row's
    private cached tokens (left-padded), then a window in which every row's uncached suffix is
    prefilled (right-aligned, pads masked), then the decoded tokens; a per-row 4D mask and
    explicit position ids make every row see exactly its own tokens at their unpadded positions.
    Each group's prefix stays out of the buffer: attention reads it once per group and joins it
    to each row's own columns in one softmax (kv_buffer.SharedPrefix). Which tree prefixes become
    groups is chosen per call (choose_prefix_lengths): a group costs an attention call per layer,
    so rows share one only where that saves more than it costs (ALFWorld: the task type's few-shot
    prefix, not the few tokens games of one room share after it); the tree tokens after a row's
    group prefix are copied into its columns. Decoding is one forward per
    step for all live rows, each feeding its last token and a prompt-lookup draft of what follows
    (generation.prompt_lookup: at most `draft_tokens`, and `draft_forward_tokens` fed per forward
    in all, so a lone row drafts long and a full batch little or nothing); a row keeps the draft
    tokens that equal its greedy choices and the greedy token after them, so the output is the
    greedy decoding's own. The columns every row rejected are written over by the next forward;
    those only some rows rejected stay as masked holes, left out when a cache is copied out.
    Once `retire_fraction` of the rows have finished, their caches are copied out and the buffer
    is compacted to the others. At the end each row's private part is copied out (pad slots and
    holes dropped) and the buffers are freed.

    Memory: at rest, the tree (each shared prefix once) plus each key's private tokens; during a
    call, the batch buffer (rows x (longest private cached part + suffix window + max_new_tokens
    + draft_slack) tokens) and one copy of each group's prefix.

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
        group_cost: float | None = None,
        draft_tokens: int = DRAFT_TOKENS,
        draft_forward_tokens: int = DRAFT_FORWARD_TOKENS,
    ):
        self.hf = HFModel(model_dir, device=device, dtype=dtype)
        self.torch = self.hf.torch
        self.min_shared = min_shared
        self.idle_prefix_tokens = idle_prefix_tokens
        self.retire_fraction = retire_fraction
        self.draft_tokens = draft_tokens
        self.draft_forward_tokens = draft_forward_tokens
        # buffer columns beyond the decoded tokens: the drafts, and the rejected drafts' columns
        self.draft_slack = 4 * draft_tokens
        self.root = _Node(None, (), None)
        self.entries: dict = {}
        self.stats = new_stats()
        self._clock = 0
        config = self.hf.model.config.get_text_config()
        self.n_layers = config.num_hidden_layers
        self.kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        heads = config.num_attention_heads
        # A group's attention call and merge against reading its prefix per row (choose_prefix_lengths):
        # measured on CPU, a group costs about as much as 4,000 prefix tokens read per row on the 64 query-head dimensions
        # of the tiny model (2,000 to 8,000 were best on ALFWorld; each row reads them once per head).
        self.group_cost = group_cost if group_cost is not None else GROUP_COST_HEAD_DIMS / (heads * self.head_dim)
        use_masked_gqa_sdpa(self.hf.model)  # (the masks below are 4D booleans: True = attend)

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
        for key, encoded in zip(prompts, hf.encode_all(list(prompts.values()))):
            tokens = tuple(encoded)  # tuples throughout: common_prefix compares slices
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
            n = common_prefix(child.tokens, tokens[pos : pos + len(child.tokens)])
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
                      torch.arange(start, start + n, device=self.hf.device)[None], keep=0)
        self.stats["prompt_tokens_computed"] += n
        return [(kb[:, :, start:].clone(), vb[:, :, start:].clone()) for kb, vb in layers]

    def _seed_new_keys(self, ids: dict) -> None:
        """Keys without a cache: when their prompt shares >= min_shared tokens with another prompt
        (of this call, or cached), put that common prefix into the tree (computed once) where it
        extends the tree by >= min_shared tokens."""
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
                (common_prefix(seq, sequences[j][0]) for j in (i - 1, i + 1) if 0 <= j < len(sequences)), default=0
            )
            best = min(best, len(seq) - 1)
            if best >= self.min_shared:
                wanted.append(seq[:best])
        for prefix in sorted(set(wanted), key=len):
            # A segment is computed alone (a batch-1 forward: the whole model's weights read for it),
            # so only one of min_shared tokens or more; the rows sharing a shorter extension of the
            # tree compute it in their own suffixes, in the call's batched prefill.
            if len(prefix) - self._match(prefix)[1] >= self.min_shared:
                self._ensure_node(prefix)

    # -- one call -------------------------------------------------------------------------------
    def _alloc(self, batch: int, capacity: int):
        torch = self.torch
        shape = (batch, self.kv_heads, capacity, self.head_dim)
        dtype, device = self.hf.model.dtype, self.hf.device
        return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
                for _ in range(self.n_layers)]

    def _forward(self, layers, length: int, input_ids, valid, position_ids, keep: int = 1, prefix=None):
        """One forward of `input_ids` [B, q] written at buffer columns [length, length + q); `valid`
        [B, length + q] says which columns each row may attend to (besides causality); `prefix`
        (a kv_buffer.SharedPrefix) the shared prefixes the rows attend to before their columns.
        The logits of the last `keep` positions, [B, keep, vocab] (None for 0)."""
        torch = self.torch
        q = input_ids.shape[1]
        total = length + q
        cols = torch.arange(total, device=valid.device)
        rows = torch.arange(length, total, device=valid.device)
        allowed = valid[:, None, None, :] & (cols[None, None, None, :] <= rows[None, None, :, None])
        # A padding query sees at least itself (no all-masked row, no NaN anywhere in the buffer).
        allowed |= cols[None, None, None, :] == rows[None, None, :, None]
        cache = make_cache([BufferLayer(k, v, length) for k, v in layers])
        with attending_to(prefix):
            out = self.hf.model(
                input_ids=input_ids,
                attention_mask=allowed,
                position_ids=position_ids,
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=max(keep, 1),
            )
        self.stats["forward_calls"] += 1
        return out.logits[:, -keep:, :] if keep else None

    def _plan_row(self, key, tokens: list):
        """(entry, reused): the cache to start from for `tokens` and how many tokens of it to use."""
        limit = len(tokens) - 1  # the last prompt token is always fed (its logits start decoding)
        node, matched = self._match(tokens)
        tree_len = min(matched, limit)
        entry = self.entries.get(key)
        own_len = min(common_prefix(entry.tokens(), tokens), limit) if entry is not None else -1
        if own_len > tree_len:
            return entry, own_len
        return _Entry(_anchor(node, tree_len), tree_len), tree_len

    def _run(self, ids: dict, max_new_tokens: int, stop) -> dict:
        torch, hf, stats = self.torch, self.hf, self.stats
        device = hf.device
        rows = []
        for key in ids:
            entry, reused = self._plan_row(key, ids[key])
            rows.append((key, entry, reused, min(entry.base, reused)))  # (shared: the reused part in the tree)
        # Each row attends to the first `prefix` tokens of its tree chain as a group's shared prefix;
        # the tree tokens after it go into the row's buffer columns (a group per few rows costs more
        # than it saves).
        lengths = choose_prefix_lengths([_points(entry, shared) for _k, entry, _r, shared in rows], self.group_cost)
        plans = []
        for (key, entry, reused, shared), prefix in zip(rows, lengths):
            group = (id(_anchor(entry.node, prefix)), prefix) if prefix else None
            plans.append((key, entry, reused, shared, group, prefix))
        # Rows sharing a prefix are neighbours: the prefix is attended to once per group.
        order = {group: i for i, group in enumerate(dict.fromkeys(plan[4] for plan in plans))}
        plans.sort(key=lambda plan: order[plan[4]])
        keys = [plan[0] for plan in plans]
        batch = len(keys)
        cached_max = max(reused - prefix for _k, _e, reused, _s, _g, prefix in plans)
        window = max(len(ids[k]) - reused for k, _e, reused, _s, _g, _p in plans)
        # (decoded tokens, and room for the drafts and for the columns of rejected ones)
        capacity = cached_max + window + max(max_new_tokens - 1, 0) + self.draft_slack
        layers = self._alloc(batch, capacity)
        valid = torch.zeros(batch, capacity, dtype=torch.bool, device=device)
        input_ids = torch.full((batch, window), hf.pad_id, dtype=torch.long, device=device)
        position_ids = torch.zeros(batch, window, dtype=torch.long, device=device)
        for row, (key, entry, reused, shared, _group, prefix) in enumerate(plans):
            tokens = ids[key]
            offset = cached_max - (reused - prefix)  # left padding of the row's cached columns
            self._copy_cached(layers, row, offset, entry, reused, prefix)
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
        prefixes = {plan[4]: self._prefix_kv(plan[1], plan[5]) for plan in plans if plan[4] is not None}
        groups = [plan[4] for plan in plans]  # of each plan index

        def shared_prefix(rows: list):
            """The SharedPrefix of the buffer rows (plan indices `rows`, in buffer order)."""
            spans, kv = [], [[] for _ in range(self.n_layers)]
            for first, index in enumerate(rows):
                if first and groups[index] == groups[rows[first - 1]]:
                    spans[-1][1] = first + 1
                    continue
                spans.append([first, first + 1])
                for layer in range(self.n_layers):
                    kv[layer].append(prefixes[groups[index]][layer] if groups[index] is not None else None)
            return SharedPrefix([tuple(span) for span in spans], kv)

        length = cached_max
        active = list(range(batch))  # plan index of each buffer row
        prefix = shared_prefix(active)
        logits = self._forward(layers, length, input_ids, valid[:, : length + window], position_ids, prefix=prefix)
        length += window
        generated = [[] for _ in range(batch)]
        finished = [False] * batch
        next_pos = [len(ids[k]) for k in keys]  # of each buffer row: the position its next fed token takes
        drafts: list = [[] for _ in range(batch)]  # of each plan index: fed after its last generated token
        width = 0  # columns of the last decode forward, from `length` (0: the prefill's window)
        results = {}

        def finish(index: int, buffer_row: int) -> None:
            key, entry, reused, shared, _group, _prefix = plans[index]
            gen = generated[index]
            stats["generated_tokens"] += len(gen)
            results[key] = cut_at_stop(hf.decode(gen), stop)
            fed = gen[: len(gen) - 1]  # the last generated token was never fed (no KV)
            tokens = ids[key] + tuple(fed)
            kept = valid[buffer_row, cached_max + window : length].nonzero().flatten() + cached_max + window
            assert len(kept) == len(fed), (len(kept), len(fed))
            self.entries[key] = self._copy_out(
                layers, buffer_row, cached_max, window, len(ids[key]) - reused, entry, reused, shared, tokens, kept
            )
            entry.node.last_used = self._clock

        while True:
            picks = torch.argmax(logits, dim=-1).tolist()  # [row][position]
            kept_width = 1
            for row, index in enumerate(active):
                if finished[index]:
                    continue
                draft, accepted = drafts[index], 0
                for position, token in enumerate(picks[row]):
                    generated[index].append(token)
                    if (
                        token in hf.eos
                        or len(generated[index]) >= max_new_tokens
                        or contains_stop(hf.decode(generated[index]), stop)
                    ):
                        finished[index] = True
                        break
                    if position >= len(draft) or draft[position] != token:
                        break
                    accepted += 1
                stats["draft_tokens_accepted"] += accepted
                if width:  # the row keeps its fed token and accepted drafts, not the rest
                    if 1 + accepted < width:
                        valid[row, length + 1 + accepted : length + width] = False
                    next_pos[row] += 1 + accepted
                    kept_width = max(kept_width, 1 + accepted)
            if width:  # the columns after every row's kept ones are written over next
                length += kept_width
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
                valid = valid.index_select(0, select)
                next_pos = [next_pos[row] for row in keep]
                active = [active[row] for row in keep]
                prefix = shared_prefix(active)
            # Prompt-lookup drafts from each row's own text: a drafted column costs every row of the
            # batch, so the fewer rows, the longer the drafts (a lone row's tokens are sequential
            # otherwise); the buffer keeps room for the longest possible rest at one column a forward.
            longest = max(max_new_tokens - len(generated[index]) for index in active if not finished[index])
            limit = min(self.draft_tokens, self.draft_forward_tokens // len(active) - 1, capacity - length - longest)
            for index in active:
                room = min(limit, max_new_tokens - len(generated[index]) - 1)
                drafts[index] = []
                if room > 0 and not finished[index]:
                    drafts[index] = lookup_draft(ids[keys[index]] + tuple(generated[index]), room)
                    stats["draft_tokens"] += len(drafts[index])
            width = 1 + max(len(drafts[index]) for index in active)
            # per row: its tokens then pads, which of them it keeps, their positions (a pad repeats
            # the row's last one, so no position passes what the row itself may reach)
            feed, fed, positions = [], [], []
            for row, index in enumerate(active):
                tokens = [] if finished[index] else [generated[index][-1]] + drafts[index]
                feed.append(tokens + [hf.pad_id] * (width - len(tokens)))
                fed.append([True] * len(tokens) + [False] * (width - len(tokens)))
                positions.append([next_pos[row] + min(j, max(len(tokens) - 1, 0)) for j in range(width)])
            feed = torch.tensor(feed, dtype=torch.long, device=device)
            valid[:, length : length + width] = torch.tensor(fed, dtype=torch.bool, device=device)
            positions = torch.tensor(positions, dtype=torch.long, device=device)
            logits = self._forward(layers, length, feed, valid[:, : length + width], positions, keep=width, prefix=prefix)
        for row, index in enumerate(active):
            finish(index, row)
        return {key: results[key] for key in ids}

    def _prefix_kv(self, entry: _Entry, shared: int) -> list:
        """Per layer, the (keys, values) [kv_heads, shared, head_dim] of the first `shared` tokens
        of `entry`'s tree chain (a group's shared prefix, attended to outside the batch buffer)."""
        pieces = [(nd, min(nd.end, shared) - nd.start) for nd in entry.node.chain() if nd.start < shared]
        out = []
        for layer in range(self.n_layers):
            keys = [nd.kv[layer][0][0, :, :n] for nd, n in pieces]
            values = [nd.kv[layer][1][0, :, :n] for nd, n in pieces]
            out.append((self.torch.cat(keys, dim=1), self.torch.cat(values, dim=1)))
        return out

    def _copy_cached(self, layers, row: int, offset: int, entry: _Entry, reused: int, prefix: int) -> None:
        """Write the row's cached tokens after its group's prefix into buffer row `row` from
        `offset`: the tree tokens [prefix, shared) of its chain, then its private ones up to `reused`."""
        shared = min(entry.base, reused)
        for nd in entry.node.chain():
            a, b = max(nd.start, prefix), min(nd.end, shared)
            if a < b:
                at = offset + a - prefix
                for (kb, vb), (k, v) in zip(layers, nd.kv):
                    kb[row, :, at : at + b - a] = k[0, :, a - nd.start : b - nd.start]
                    vb[row, :, at : at + b - a] = v[0, :, a - nd.start : b - nd.start]
        rest = reused - shared
        if rest > 0:
            at = offset + shared - prefix
            for (kb, vb), (k, v) in zip(layers, entry.own_kv):
                kb[row, :, at : at + rest] = k[0, :, :rest]
                vb[row, :, at : at + rest] = v[0, :, :rest]

    def _copy_out(self, layers, row, cached_max, window, suffix_len, entry: _Entry, reused, shared, tokens, fed_columns) -> _Entry:
        """The row's new private cache: everything after its shared base, pad slots dropped;
        `fed_columns` (a tensor) the columns after the window that hold its generated tokens fed
        back (columns of rejected drafts and of pads in between left out)."""
        torch = self.torch
        offset = cached_max - (reused - shared)  # the row's private cached part: [offset, cached_max)
        pieces = []
        if reused > shared:
            pieces.append(slice(offset, cached_max))
        pieces.append(slice(cached_max + window - suffix_len, cached_max + window))  # right-aligned suffix
        if len(fed_columns):
            pieces.append(fed_columns)
        own_kv = []
        for kb, vb in layers:
            own_kv.append((
                torch.cat([kb[row : row + 1, :, piece] for piece in pieces], dim=2).clone(),
                torch.cat([vb[row : row + 1, :, piece] for piece in pieces], dim=2).clone(),
            ))
        return _Entry(_anchor(entry.node, shared), shared, tokens[shared:], own_kv)

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
