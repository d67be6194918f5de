"""RowCachedGenerator (generation.row_cache): prompts rebuilt at every step, each computed from the
longest cached prefix of any episode with prompt-lookup drafts, answer exactly like the reference
loop (FullPromptGenerator: the whole prompt, one at a time)."""

from __future__ import annotations

import pytest

from rlbench.generation import kv_buffer
from rlbench.generation.full_prompt import FullPromptGenerator
from rlbench.generation.prefix_cache import CachedBatchGenerator
from rlbench.generation.row_cache import (
    RowCachedGenerator,
    TurnLengthSwitch,
    for_rebuilt_prompts,
)
from rlbench.generation.prompt_lookup import lookup_draft
from rlbench.generation.textgen_base import common_prefix
from rlbench.models.materialise import prepare_model

HEAD = (
    "You are shopping on an e-commerce website. Find and purchase a product matching the instruction.\n\n"
    "Instruction: "
)
ACTIONS = [["search[<your query>]", "click[search]"], ["click[back to search]", "click[next >]", "click[b0a]"]]
PAGES = ["WebShop [SEP] Search", "Page 1 (Total results: 3) [SEP] B0A [SEP] red mug [SEP] $3.5", "Nothing happens."]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("row-cache") / "tiny"
    prepare_model({"name": "tiny", "source": "tiny", "hf_id": "rlbench/tiny-qwen2", "seed": 0}, out)
    return out


@pytest.fixture(scope="module")
def reference(model_dir):
    return FullPromptGenerator(model_dir, device="cpu")


def rebuilt_prompt(key: int, history: list) -> str:
    """WebShop's shape: a shared head, the key's instruction, the page's actions, then a sliding
    window of the last two (action, page) entries and the current page."""
    actions = "\n".join(f"  {a}" for a in ACTIONS[len(history) % 2])
    text = HEAD + f"buy mug {key} under {key + 3} dollars\n\nAvailable actions:\n{actions}\n\nNow it's your turn:\n"
    first = max(0, len(history) - 2)
    for number, (action, page) in enumerate(history[first:], start=first + 1):
        text += f"\nObservation {number}: {page}\nAction {number}: {action}\n"
    return text + f"\nObservation {len(history) + 1}: {PAGES[len(history) % 3]}\nAction {len(history) + 1}:"


def test_lookup_draft_continues_the_latest_earlier_ngram():
    assert lookup_draft((1, 2, 3, 4, 5, 9, 2, 3), 3) == [4, 5, 9]  # the 2-gram (2, 3)
    assert lookup_draft((1, 2, 3, 7, 2, 3, 8, 5, 3), 2) == [8, 5]  # the latest 1-gram (3) wins
    assert lookup_draft((1, 2, 3, 4, 5, 9, 7), 3) == []  # nothing occurs earlier
    assert lookup_draft((1, 2, 1), 0) == []
    assert lookup_draft((1, 256, 0, 1), 3) == [256, 0, 1]  # byte matches across tokens do not count
    # A continuation reaching the end goes on copying itself: a repetition of period 3 drafted on.
    assert lookup_draft((9, 1, 2, 3, 1, 2, 3), 8) == [1, 2, 3, 1, 2, 3, 1, 2]
    assert lookup_draft((1, 256, 0, 1), 5) == [256, 0, 1, 256, 0]
    assert common_prefix((1, 2, 3, 4), (1, 2, 5)) == 2 and common_prefix((1, 2), (1, 2, 3)) == 2


@pytest.mark.parametrize("cached", [0, 1, 37])
def test_causal_after_cache_attention_is_the_masked_one(cached):
    """One row's new tokens after its cache: the cached columns unmasked plus the new ones causal,
    merged by log-sum-exp, give the masked SDPA's result (grouped-query heads, 3 per KV head)."""
    import torch

    torch.manual_seed(0)
    q, heads, kv_heads, dim = 23, 6, 2, 16
    query = torch.randn(1, heads, q, dim)
    key, value = torch.randn(1, kv_heads, cached + q, dim), torch.randn(1, kv_heads, cached + q, dim)
    rows, cols = torch.arange(cached, cached + q), torch.arange(cached + q)
    mask = (cols[None, :] <= rows[:, None])[None, None]
    expected = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)
    got = kv_buffer._attend_causal_after_cache(query, key, value, dim**-0.5)  # [1, q, heads, dim]
    assert torch.allclose(got.transpose(1, 2), expected, atol=1e-5), (got.transpose(1, 2) - expected).abs().max()


def test_rebuilt_prompts_answer_like_the_reference(model_dir, reference, monkeypatch):
    split = []
    real = kv_buffer._attend_causal_after_cache
    monkeypatch.setattr(kv_buffer, "_attend_causal_after_cache", lambda *a: split.append(a[0].shape[2]) or real(*a))
    ours = RowCachedGenerator(model_dir, device="cpu")
    histories = {key: [] for key in range(3)}
    stops = [["\n"], None, [" the", "\n"], ["\n"], None, ["\n"]]
    for step, stop in enumerate(stops):
        if step == 2:
            ours.release(0)  # ended: the next key seeds the shared head from the others
            histories.pop(0)
            histories[7] = []
        prompts = {key: rebuilt_prompt(key, history) for key, history in histories.items()}
        reused = ours.stats["prompt_tokens_reused"]
        got = ours.generate(prompts, 12, stop)
        assert got == reference.generate(prompts, 12, stop), f"step {step}"
        assert ours.stats["prompt_tokens_reused"] > reused  # the shared head at least
        for key, history in histories.items():
            history.append((got[key].strip() or "click[nothing]", PAGES[(step + key) % 3]))
    stats = ours.stats
    assert stats["prompt_tokens_computed"] + stats["prompt_tokens_reused"] == stats["prompt_tokens"]
    assert stats["prompt_tokens_reused"] > 0.25 * stats["prompt_tokens"], stats  # the sliding window: 31%
    assert set(ours.entries) == {1, 2, 7}
    assert split and max(split) > 1, "the prompts' new tokens were not computed as causal-after-cache"


def test_drafts_save_forwards_and_change_nothing(model_dir, reference):
    """The tiny model repeats itself: drafts looked up in the text are accepted, fewer forwards
    than tokens, the same completions (also cut at stop strings)."""
    ours = RowCachedGenerator(model_dir, device="cpu")
    prompts = {i: f"Question {i}: the cat sat on the mat {i} times. Answer:" for i in range(3)}
    for stop in (None, ["::::::"]):
        assert ours.generate(prompts, 30, stop) == reference.generate(prompts, 30, stop)
    stats = ours.stats
    assert stats["draft_tokens_accepted"] > 0 and stats["forward_calls"] < stats["generated_tokens"], stats
    undrafted = RowCachedGenerator(model_dir, device="cpu", draft_tokens=0)
    assert undrafted.generate(prompts, 30, None) == reference.generate(prompts, 30, None)
    assert undrafted.stats["forward_calls"] == undrafted.stats["generated_tokens"]


def test_context_limit_returns_none(model_dir, reference):
    ours = RowCachedGenerator(model_dir, device="cpu")
    limit = ours.hf.max_positions
    long_prompt = "1 2 3 4 5 6 7 8 9 " * limit
    prompts = {"long": long_prompt, "short": rebuilt_prompt(0, [])}
    expected = reference.generate(prompts, 10, None)
    assert expected["long"] is None and expected["short"] is not None
    assert ours.generate(prompts, 10, None) == expected
    assert ours.stats["over_context"] == 1 and "long" not in ours.entries


def test_for_rebuilt_prompts_shares_the_batch_generators_model(model_dir, reference):
    batch = CachedBatchGenerator(model_dir, device="cpu")
    switch = for_rebuilt_prompts(batch)
    assert isinstance(switch, TurnLengthSwitch) and switch.rows.hf is batch.hf and switch.batch is batch
    assert switch.chat_prompt([{"role": "user", "content": "hi"}]) == batch.chat_prompt([{"role": "user", "content": "hi"}])
    assert for_rebuilt_prompts(reference) is reference
    with pytest.raises(ValueError, match="not both"):
        RowCachedGenerator(model_dir, hf=batch.hf)


@pytest.mark.parametrize("tokens, path", [(1, "rows"), (8, "batch")])
def test_switch_takes_rows_only_after_one_token_turns(model_dir, reference, tokens, path):
    """One-token turns: the rows path from the second call on; the tiny model's 8-token turns: the
    batch path stays; every answer the reference's."""
    switch = for_rebuilt_prompts(CachedBatchGenerator(model_dir, device="cpu"))
    histories = {key: [] for key in range(3)}
    for _step in range(3):
        prompts = {key: rebuilt_prompt(key, history) for key, history in histories.items()}
        got = switch.generate(prompts, tokens, None)
        assert got == reference.generate(prompts, tokens, None)
        for key, history in histories.items():
            history.append((got[key].strip() or "click[nothing]", PAGES[key % 3]))
    assert switch.stats["path"] == path and switch.stats["prompts"] == 9
    assert (switch.rows.stats["calls"], switch.batch.stats["calls"]) == ((2, 1) if path == "rows" else (0, 3))
