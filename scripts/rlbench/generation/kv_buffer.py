"""The batch KV buffer of CachedBatchGenerator on transformers: a cache layer over a preallocated
buffer (written in place), the cache made of such layers, and the masked grouped-query attention
the model is switched to (explicit 4D boolean masks without repeating K/V per head), which can
also attend to prefixes shared by groups of rows (SharedPrefix), read once per group, or, for one
row fed after its cache (causal_after_cache), skip the masked half instead of reading a mask."""

from __future__ import annotations

import contextlib
import contextvars


class BufferLayer:
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


class SharedPrefix:
    """Prefixes shared by groups of consecutive batch rows, kept out of the batch buffer: `spans`
    [(first row, end row), ...] cover the batch in order; `kv[layer][i]` is the (keys, values) of
    span i's prefix, shaped [kv_heads, prefix length, head_dim], or None (no shared prefix). Each
    row attends to its span's prefix and to its own buffer columns (its mask's), as one softmax."""

    def __init__(self, spans: list, kv: list):
        self.spans, self.kv = spans, kv
        self._mask = self._bias = None

    def bias(self, mask, rep: int, dtype):
        """The additive form (0 / -inf) of the boolean `mask` [B, 1, q, L], each query row repeated
        for the `rep` query heads of a KV head: [B, 1, rep * q, L]. Made once per forward (every
        layer of a forward gets the same mask object)."""
        import torch

        if mask is not self._mask:
            batch, _one, q, length = mask.shape
            additive = torch.where(mask, torch.zeros((), dtype=dtype), torch.full((), float("-inf"), dtype=dtype))
            if q == 1:
                self._bias = additive.expand(batch, 1, rep, length)  # a view: the kernel reads it in place
            else:
                self._bias = additive[:, :, None].expand(batch, 1, rep, q, length).reshape(batch, 1, rep * q, length)
            self._mask = mask
        return self._bias


_PREFIX: contextvars.ContextVar = contextvars.ContextVar("rlbench_shared_prefix", default=None)


@contextlib.contextmanager
def attending_to(prefix: SharedPrefix | None):
    """Forwards run inside attend to `prefix` besides the cache (None: the cache alone)."""
    token = _PREFIX.set(prefix)
    try:
        yield
    finally:
        _PREFIX.reset(token)


_CAUSAL_AFTER_CACHE: contextvars.ContextVar = contextvars.ContextVar("rlbench_causal_after_cache", default=False)


@contextlib.contextmanager
def causal_after_cache():
    """Forwards run inside feed one row of q new tokens after its cache, with the mask that says
    exactly that (every cached token visible to all, the new ones causal among themselves): on
    CPU the attention is computed as that structure (_attend_causal_after_cache), the mask unread."""
    token = _CAUSAL_AFTER_CACHE.set(True)
    try:
        yield
    finally:
        _CAUSAL_AFTER_CACHE.reset(token)


def _masked_gqa_sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, is_causal=None, **kwargs):
    """SDPA with an explicit (4D boolean) mask and grouped-query attention done by the kernel:
    transformers' own SDPA path repeats K/V per query head whenever a mask is given, copying the
    whole cache three times per layer and decoded token (SmolLM2); this reads it in place. Inside
    attending_to(prefix), each row also attends to its group's shared prefix (_attend_with_prefix);
    inside causal_after_cache(), one row's new tokens skip the causal mask's empty half."""
    import torch

    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    prefix = _PREFIX.get()
    if prefix is not None:
        return _attend_with_prefix(query, key, value, attention_mask, scale, prefix, module.layer_idx), None
    if _CAUSAL_AFTER_CACHE.get() and query.shape[0] == 1 and query.shape[2] > 1 and _cpu_flash(query):
        return _attend_causal_after_cache(query, key, value, scale), None
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


def _cpu_flash(query) -> bool:
    import torch

    return query.device.type == "cpu" and hasattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu")


def _attend_causal_after_cache(query, key, value, scale: float):
    """One row's q new tokens (query [1, H, q, d]) over its key/value [1, kv_heads, L, d], the last
    q of which are those tokens': the L - q cached columns, visible to every new token, in one
    unmasked call (query heads grouped by their KV head, no K/V repeated), and the new tokens among
    themselves in one causal call (the kernel skips the blocks above the diagonal, where a masked
    call computes the whole rectangle and reads the mask), merged by their log-sum-exps: one
    softmax over both, the masked call's result up to rounding. Returns [1, q, H, d]."""
    import torch

    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    batch, heads, q, dim = query.shape
    kv_heads, length = key.shape[1], key.shape[2]
    rep, cached = heads // kv_heads, length - q
    new_keys = key[:, :, cached:].repeat_interleave(rep, dim=1)
    new_values = value[:, :, cached:].repeat_interleave(rep, dim=1)
    out, lse = flash(query, new_keys, new_values, 0.0, True, scale=scale)
    if cached:
        grouped = query.reshape(batch, kv_heads, rep * q, dim)
        old, old_lse = flash(grouped, key[:, :, :cached], value[:, :, :cached], 0.0, False, scale=scale)
        old, old_lse = old.reshape(batch, heads, q, dim), old_lse.reshape(batch, heads, q)
        total = torch.logaddexp(old_lse, lse)
        out = old * torch.exp(old_lse - total)[..., None] + out * torch.exp(lse - total)[..., None]
    return out.transpose(1, 2).contiguous()


def _attention_with_lse(query, key, value, bias, scale: float):
    """Softmax attention of query [N, h, m, d] over key/value [N, h, L, d] with an additive bias
    [N, 1, m, L] (-inf: masked) or None: (output [N, h, m, d], log-sum-exp of the scores [N, h, m]
    in float32). On CPU, the fused flash kernel SDPA itself runs (it also returns the log-sum-exp;
    the output in the query's dtype); elsewhere (CUDA) the scores, their softmax, its log-sum-exp
    and the output are computed and returned in float32 whatever the model's dtype, as the fused
    kernels accumulate: in bfloat16 the parts that _attend_with_prefix merges would each carry
    bfloat16's rounding before the merge."""
    import torch

    if _cpu_flash(query):
        output, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, key, value, 0.0, False, attn_mask=bias, scale=scale
        )
        return output, lse
    scores = torch.matmul(query.float(), key.float().transpose(-1, -2)) * scale
    if bias is not None:
        scores = scores + bias.float()
    lse = torch.logsumexp(scores, dim=-1)
    return torch.matmul(torch.exp(scores - lse[..., None]), value.float()), lse


def _attend_with_prefix(query, key, value, mask, scale: float, prefix: SharedPrefix, layer: int):
    """Attention of query [B, H, q, d] over each row's group prefix and its own cache key/value
    [B, kv_heads, L, d] (mask [B, 1, q, L], True = attend): each row attends to its own columns;
    each group's queries attend to the group's prefix together (the prefix read once, not once
    per row); the two are merged by their log-sum-exps (one softmax over both). The query heads
    served by one KV head attend as that head's queries (no K/V repeated). Returns [B, q, H, d]."""
    import torch

    batch, heads, q, dim = query.shape
    kv_heads = key.shape[1]
    rep = heads // kv_heads  # query heads per KV head (kv head i serves heads i*rep .. i*rep+rep-1)
    grouped = query.reshape(batch, kv_heads, rep * q, dim)
    bias = prefix.bias(mask, rep, query.dtype)
    out, own_lse = _attention_with_lse(grouped, key, value, bias, scale)  # [B, kv_heads, rep*q, d]
    for (first, end), shared in zip(prefix.spans, prefix.kv[layer]):
        if shared is None:
            continue
        keys, values = shared
        n = end - first
        rows = grouped[first:end].transpose(0, 1).reshape(1, kv_heads, n * rep * q, dim)
        from_prefix, prefix_lse = _attention_with_lse(rows, keys[None], values[None], None, scale)
        from_prefix = from_prefix[0].reshape(kv_heads, n, rep * q, dim).transpose(0, 1)
        prefix_lse = prefix_lse[0].reshape(kv_heads, n, rep * q).transpose(0, 1)
        lse = torch.logaddexp(prefix_lse, own_lse[first:end])
        out[first:end] = (
            from_prefix * torch.exp(prefix_lse - lse)[..., None] + out[first:end] * torch.exp(own_lse[first:end] - lse)[..., None]
        )
    return out.reshape(batch, heads, q, dim).transpose(1, 2).to(query.dtype).contiguous()


def use_masked_gqa_sdpa(model) -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(_ATTENTION, _masked_gqa_sdpa)
    model.set_attn_implementation(_ATTENTION)


def make_cache(layers):
    from transformers.cache_utils import Cache, CacheLayerMixin

    # Register the buffer layer as a cache layer type (structural subclass) once.
    if not issubclass(BufferLayer, CacheLayerMixin):
        CacheLayerMixin.register(BufferLayer)
    cache = Cache(layers=layers)
    return cache
