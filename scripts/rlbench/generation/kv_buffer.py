"""The batch KV buffer of CachedBatchGenerator on transformers: a cache layer over a preallocated
buffer (written in place), the cache made of such layers, and the masked grouped-query SDPA
attention the model is switched to (explicit 4D boolean masks without repeating K/V per head)."""

from __future__ import annotations


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
