"""Text generators for rollouts (rlbench.generation.textgen): the cached, batched generator must answer
exactly like the reference's one-prompt-at-a-time loop, while reusing cached prompt state."""

from __future__ import annotations

import random

import pytest

from rlbench.generation.backends import cut_at_stop
from rlbench.models.materialise import prepare_model
from rlbench.generation.full_prompt import FullPromptGenerator
from rlbench.generation.prefix_cache import CachedBatchGenerator, choose_prefix_lengths
from rlbench.generation.textgen import load_text_generator
from rlbench.tasks.alfworld.public import clean_action, history_entry

PREFIXES = [
    "Interact with a household to solve a task. Here are two examples.\n"
    "You are in the middle of a room. Looking quickly around you, you see a cabinet 1, a drawer 2.\n"
    "Your task is to: put a clean mug in coffeemachine.\n> think: First I need to find a mug.\nOK.\n"
    "> go to cabinet 1\nOn the cabinet 1, you see a mug 1.\n> take mug 1 from cabinet 1\n"
    "You pick up the mug 1 from the cabinet 1.\n\nHere is the task.\n",
    "Interact with a household to solve a task. Here are two examples.\n"
    "You are in the middle of a room. Looking quickly around you, you see a fridge 1, a shelf 3.\n"
    "Your task is to: cool some apple and put it in shelf.\n> go to fridge 1\nThe fridge 1 is closed.\n"
    "> open fridge 1\nYou open the fridge 1. In it, you see a apple 2.\n> think: Now I cool it.\nOK.\n"
    "\nHere is the task.\n",
]
OBSERVATIONS = [
    "Nothing happens.",
    "On the desk 1, you see a pen 2, a apple",
    "OK.",
    "You arrive at the countertop 1. On it you see 1 2 3 4 5",
    "The drawer 1 is closed and the cat sat on the mat",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("rollouts") / "tiny"
    prepare_model({"name": "tiny", "source": "tiny", "hf_id": "rlbench/tiny-qwen2", "seed": 0}, out)
    return out


@pytest.fixture(scope="module")
def reference(model_dir):
    return FullPromptGenerator(model_dir, device="cpu")


def _start(episode: int) -> str:
    return PREFIXES[episode % 2] + f"You see a cabinet {episode}, a desk {episode + 3}.\nYour task is to: put pen {episode} on desk.\n>"


def _next_prompt(prompt: str, completion: str, episode: int, step: int, rng: random.Random) -> str:
    observation = rng.choice(OBSERVATIONS)
    if (episode + step) % 3 == 0:
        # Raw continuation: the appended text's first characters may merge with the completion's
        # last token on re-tokenization (e.g. " apple" + "s" -> " apples"), invalidating cached KV.
        return prompt + completion + rng.choice(["s", "ing", "", "1", "\n"]) + observation + "\n>"
    return prompt + history_entry(clean_action(completion), observation)


@pytest.fixture(params=["cpu kernel", "off-cpu attention"])
def attention(request, monkeypatch):
    """The attention the cached generator's shared-prefix path uses: the CPU's fused flash kernel,
    or the plain float32 computation it uses on other devices (CUDA), here run on the CPU."""
    if request.param == "off-cpu attention":
        from rlbench.generation import kv_buffer

        monkeypatch.setattr(kv_buffer, "_cpu_flash", lambda query: False)
    return request.param


def test_cached_batch_equals_reference_over_react_like_episodes(model_dir, reference, attention):
    ours = CachedBatchGenerator(model_dir, device="cpu", min_shared=16, retire_fraction=0.2)
    reference.reset_stats()
    rng = random.Random(0)
    episodes = 7
    live = {e: _start(e) for e in range(episodes - 1)}
    ends = {e: 3 + e % 4 for e in range(episodes)}  # episodes end at steps 3..6
    late = episodes - 1  # joins at step 2, while the others are cached and longer
    stops = [None, [" and"], ["\n"], ["to to", "ii"], [">>>"], None]
    seen_cut = False
    for step in range(6):
        if step == 2:
            live[late] = _start(late)
        stop = stops[step]
        expected = reference.generate(live, 10, stop)
        got = ours.generate(live, 10, stop)
        assert got == expected, f"step {step}"
        if step in (3, 4):  # the stop string cuts like generation.cut_at_stop on the uncut text
            uncut = reference.generate(live, 10, None)
            for key in live:
                assert expected[key] == cut_at_stop(uncut[key], stop) or len(uncut[key]) > len(expected[key])
                seen_cut |= expected[key] != uncut[key]
        following = {}
        for key, prompt in live.items():
            if step + 1 >= ends[key]:
                ours.release(key)
            else:
                following[key] = _next_prompt(prompt, expected[key], key, step, rng)
        live = following
    assert seen_cut, "no stop string ever cut a completion: the test lost its stop-string check"
    assert not ours.entries

    # Reuse: the shared prefixes are computed once, each episode's history stays cached.
    computed = ours.stats["prompt_tokens_computed"]
    assert computed < 0.25 * ours.stats["prompt_tokens"], ours.stats
    assert ours.stats["prompt_tokens_reused"] > 0.75 * ours.stats["prompt_tokens"], ours.stats
    assert ours.stats["forward_calls"] <= 6 * 10 + 2 * 2, ours.stats  # one per decoded token (+ prefix nodes)
    assert ours.stats["generated_tokens"] > 0


def test_shared_prefix_computed_once(model_dir, reference):
    ours = CachedBatchGenerator(model_dir, device="cpu", min_shared=16, idle_prefix_tokens=0)
    prompts = {e: _start(e) for e in range(6)}
    assert ours.generate(prompts, 4, None) == reference.generate(prompts, 4, None)
    tokens = {e: len(ours.hf.encode(p)) for e, p in prompts.items()}
    prefix = [len(ours.hf.encode(p)) for p in PREFIXES]
    # Each of the two prefixes went through the model once, not once per episode.
    assert ours.stats["prompt_tokens_computed"] <= sum(tokens.values()) - 4 * min(prefix)
    held = ours.cached_tokens()
    # Both prefixes are in the tree once (their common beginning once for both).
    assert held["keys"] == 6 and max(prefix) <= held["shared"] <= sum(prefix) + 2 * 20
    for key in prompts:
        ours.release(key)
    assert ours.cached_tokens() == {"shared": 0, "private": 0, "keys": 0}


def test_a_short_extension_of_the_tree_is_computed_in_the_rows_not_alone(model_dir, reference):
    """Prompts sharing a long prefix, then pairs sharing a few tokens more (WebShop's first call: the
    instructions' first words): the long prefix is one tree segment; the few tokens are not a
    batch-1 forward of their own but part of each row's suffix in the batched prefill."""
    ours = CachedBatchGenerator(model_dir, device="cpu", min_shared=16, idle_prefix_tokens=0)
    prompts = {
        f"{word}{n}": PREFIXES[0] + f"Instruction: i {word} a lamp number {n} >"
        for word in ("need", "want", "seek")
        for n in range(2)
    }
    assert ours.generate(prompts, 6, None) == reference.generate(prompts, 6, None)
    tokens = {key: ours.hf.encode(prompt) for key, prompt in prompts.items()}
    pairs = sorted(len(tokens[f"{word}0"]) - 3 for word in ("need", "want", "seek"))  # (the last 3: "0", " ", ">")
    assert all(tokens[f"{word}0"][:pairs[0] - 8] == tokens["need0"][:pairs[0] - 8] for word in ("want", "seek"))
    assert pairs[-1] - pairs[0] < 16  # the pairs' prefixes differ from the first's by a few tokens: the case
    # The first pair's prefix is the tree's one segment; the others, a few tokens longer, got no node
    # of their own (the old rule computed a batch-1 segment for each, 216 shared tokens here).
    held = ours.cached_tokens()
    assert held["shared"] == pairs[0], (held, pairs)
    # And every row reused what the tree holds of its prompt, the rest computed in the batched prefill.
    assert ours.stats["prompt_tokens_reused"] >= 6 * (pairs[0] - 8), ours.stats


def test_rows_finishing_early_are_retired(model_dir, reference):
    """Rows that stop early leave the batch mid-decode (their caches copied out, the buffer
    compacted); the rest decode on, and later calls still reuse everybody's cache."""
    ours = CachedBatchGenerator(model_dir, device="cpu", retire_fraction=0.3)
    prompts = {
        "gt": "Hello world. The cat sat on the mat.\n>",
        "to": "Looking quickly around you, you see a cabinet 4, a desk 2.\n> go to",
        "apple": "On the desk 1, you see a pen 2, a apple",
        "digits": "1 2 3 4 5 6 7",
        "need": "Your task is to: put some pen on desk 1.\n> think: I need",
    }
    stop = [">>>", " apple apple", "77777"]
    for step in range(3):
        expected = reference.generate(prompts, 14, stop)
        assert ours.generate(prompts, 14, stop) == expected, f"step {step}"
        prompts = {key: prompt + expected[key] + f" x{step}\n>" for key, prompt in prompts.items()}
    assert ours.stats.get("rows_retired_early", 0) > 0, "no row was retired mid-decode: that path went untested"
    assert ours.stats["prompt_tokens_reused"] > ours.stats["prompt_tokens_computed"]


def test_drafts_in_the_batch_save_forwards_and_change_nothing(model_dir, reference):
    """Prompt-lookup drafts while decoding a batch (rows accepting different numbers of draft tokens,
    the rejected ones' columns left as holes) and a lone row (longer drafts): the reference's
    completions, also cut at stop strings, fewer forwards than undrafted, and the caches kept
    across calls (holes left out) answer the next calls like the reference."""
    drafted = CachedBatchGenerator(model_dir, device="cpu")
    undrafted = CachedBatchGenerator(model_dir, device="cpu", draft_tokens=0)
    prompts = {
        "mat": "Question: the cat sat on the mat. The cat sat on the mat. The cat sat on the",
        "digits": "1 2 3 4 5 6 7 1 2 3 4 5 6 7 1 2 3",
        "room": "You are in the middle of a room. Looking quickly around you, you see a cabinet 4, a desk 2.\n> go to",
        "alone": "On the desk 1, you see a pen 2, a apple",
    }
    stop = [" apple apple", "77777"]
    for step in range(3):
        expected = reference.generate(prompts, 24, stop)
        assert drafted.generate(prompts, 24, stop) == expected, f"step {step}"
        assert undrafted.generate(prompts, 24, stop) == expected, f"step {step}"
        prompts = {key: prompt + expected[key] + f" {step}" for key, prompt in prompts.items()}
    lone = {"alone": prompts["alone"]}  # one row: its drafts run to draft_tokens
    assert drafted.generate(lone, 40, None) == reference.generate(lone, 40, None)
    stats = drafted.stats
    assert stats["draft_tokens_accepted"] > 0, stats
    assert stats["forward_calls"] < undrafted.stats["forward_calls"], (stats, undrafted.stats)
    assert undrafted.stats["draft_tokens"] == 0


def test_edited_and_repeated_prompts(model_dir, reference):
    """Cached state is only reused up to the longest common token prefix: shortened, edited and
    identical prompts all answer like the reference."""
    ours = CachedBatchGenerator(model_dir, device="cpu")
    base = _start(1) + " go to desk 4\nOn the desk 4, you see a apple"
    sequence = [
        base,
        base,  # identical: everything cached but the last token
        base + "s and a pen 1.\n>",  # merges with " apple"
        base[:-40] + "Nothing happens.\n>",  # edited inside the cached part
        base[:50],  # much shorter than what is cached
    ]
    for prompt in sequence:
        assert ours.generate({"a": prompt, "b": prompt[: len(prompt) // 2]}, 8, [" and"]) == reference.generate(
            {"a": prompt, "b": prompt[: len(prompt) // 2]}, 8, [" and"]
        )


def test_context_limit_returns_none(model_dir, reference):
    ours = CachedBatchGenerator(model_dir, device="cpu")
    limit = ours.hf.max_positions
    unit = "1 2 3 4 5 6 7 8 9 "
    per_unit = len(ours.hf.encode(unit * 100)) / 100
    long_prompt = unit * int(limit / per_unit + 20)
    assert len(ours.hf.encode(long_prompt)) + 10 > limit
    repeats = int((limit - 10) / per_unit)
    while len(ours.hf.encode(unit * repeats)) + 10 > limit:
        repeats -= 1
    fitting = unit * repeats  # the longest such prompt that still fits
    prompts = {"long": long_prompt, "short": _start(0), "edge": fitting}
    expected = reference.generate(prompts, 10, None)
    assert expected["long"] is None and expected["short"] is not None and expected["edge"] is not None
    assert ours.generate(prompts, 10, None) == expected
    assert ours.stats["over_context"] == 1


def test_load_text_generator_names(model_dir):
    assert isinstance(load_text_generator("hf", model_dir, device="cpu"), CachedBatchGenerator)
    assert isinstance(load_text_generator("reference", model_dir, device="cpu"), FullPromptGenerator)
    with pytest.raises(ValueError):
        load_text_generator("nope", model_dir)


def test_shared_prefix_attention_equals_attention_over_the_whole_cache(attention):
    """kv_buffer's shared-prefix attention (each group's prefix read once, one softmax over prefix
    and own columns) gives what attention over each row's prefix + own columns gives."""
    import torch

    from rlbench.generation.kv_buffer import SharedPrefix, _attend_with_prefix

    torch.manual_seed(0)
    heads, kv_heads, dim, q, own = 4, 2, 8, 3, 7
    prefixes = [torch.randn(2, kv_heads, 11, dim), None, torch.randn(2, kv_heads, 5, dim)]
    spans = [(0, 2), (2, 3), (3, 6)]  # rows 0-1 share prefix 0, row 2 has none, rows 3-5 prefix 2
    batch = 6
    query = torch.randn(batch, heads, q, dim)
    key, value = torch.randn(batch, kv_heads, own, dim), torch.randn(batch, kv_heads, own, dim)
    mask = torch.rand(batch, 1, q, own) > 0.4
    mask[..., -1] = True  # every query sees at least one own column
    got = _attend_with_prefix(
        query, key, value, mask, dim**-0.5,
        SharedPrefix(spans, [[None if p is None else (p[0], p[1]) for p in prefixes]]), 0,
    )
    for (first, end), prefix in zip(spans, prefixes):
        for row in range(first, end):
            k, v, m = key[row], value[row], mask[row]
            if prefix is not None:
                k, v = torch.cat([prefix[0], k], dim=1), torch.cat([prefix[1], v], dim=1)
                m = torch.cat([torch.ones(1, q, prefix.shape[2], dtype=torch.bool), m], dim=-1)
            expected = torch.nn.functional.scaled_dot_product_attention(
                query[row : row + 1], k[None], v[None], attn_mask=m[None], enable_gqa=True
            ).transpose(1, 2)[0]
            assert torch.allclose(got[row], expected, atol=1e-6), row


def test_attention_off_the_cpu_keeps_bfloat16_to_its_inputs_rounding(monkeypatch):
    """Off the CPU (CUDA), a bfloat16 model's shared-prefix attention computes scores, softmax,
    log-sum-exp and output in float32, as the fused kernels do: only the inputs' rounding remains.
    (Computed in bfloat16, both parts merged by the log-sum-exp carried 0.1 of error here.)"""
    import torch

    from rlbench.generation import kv_buffer

    monkeypatch.setattr(kv_buffer, "_cpu_flash", lambda query: False)
    torch.manual_seed(0)
    query, key = torch.randn(4, 3, 24, 64) * 2, torch.randn(4, 3, 300, 64) * 2
    value = torch.randn(4, 3, 300, 64)
    bias = torch.where(torch.rand(4, 1, 24, 300) > 0.3, 0.0, float("-inf"))
    query, key, value, bias = (t.bfloat16() for t in (query, key, value, bias))
    output, lse = kv_buffer._attention_with_lse(query, key, value, bias, 0.125)
    scores = torch.matmul(query.double(), key.double().transpose(-1, -2)) * 0.125 + bias.double()
    exact_lse = torch.logsumexp(scores, dim=-1)
    exact = torch.matmul(torch.exp(scores - exact_lse[..., None]), value.double())
    assert lse.dtype == torch.float32
    assert (lse.double() - exact_lse).abs().max() < 1e-4
    assert (output.double() - exact).abs().max() < 1e-4


@pytest.mark.parametrize("group_cost", [0, 10**9])
def test_shared_prefix_groups_are_chosen_by_cost(model_dir, reference, group_cost):
    """Rows whose prompts share a few-shot prefix attend to one copy of it where a group is worth its
    cost: free groups (0) keep every shared prefix out of the batch buffer (its capacity stays below
    the prefix's length, its room for drafts aside); priceless ones (10**9) put it into every row's
    columns. Same answers."""
    ours = CachedBatchGenerator(model_dir, device="cpu", min_shared=16, group_cost=group_cost)
    capacities = []
    allocate = ours._alloc

    def recording(batch, capacity):
        capacities.append((batch, capacity))
        return allocate(batch, capacity)

    ours._alloc = recording
    prompts = {e: _start(e) for e in range(6)}
    prefix = min(len(ours.hf.encode(p)) for p in PREFIXES)
    for step in range(2):
        expected = reference.generate(prompts, 6, ["\n"])
        assert ours.generate(prompts, 6, ["\n"]) == expected, f"step {step}"
        prompts = {key: prompt + history_entry(clean_action(expected[key]), "Nothing happens.") for key, prompt in prompts.items()}
    batch_calls = [capacity - ours.draft_slack for batch, capacity in capacities if batch == 6]
    assert len(batch_calls) == 2, capacities
    assert all((capacity < prefix) == (group_cost == 0) for capacity in batch_calls), (capacities, prefix)


def test_prefix_lengths_minimise_groups_plus_tokens_read_per_row():
    """choose_prefix_lengths: a group costs group_cost, each tree token after a row's group prefix
    costs 1. Two task prefixes of 1,000 tokens (points a, b), each branching into scenes of 50 more
    (a1, a2, b1) that single rows end in."""
    a, b = ("a", 1000), ("b", 1000)
    paths = [[a, ("a1", 1050)], [a, ("a1", 1050)], [a, ("a2", 1050)], [b, ("b1", 1050)], []]
    # Free groups: each row at its deepest point; the row without a shared prefix has none.
    assert choose_prefix_lengths(paths, 0) == [1050, 1050, 1050, 1050, 0]
    # A group costs 500: a's three rows share one (3,000 tokens saved), a1's pair beside it would
    # save 100 only; b's single row saves 1,000 with a group of its own.
    assert choose_prefix_lengths(paths, 500) == [1000, 1000, 1000, 1050, 0]
    # At 2,000, b's row reads its 1,050 tokens itself; a's group still saves 3,000 - 150.
    assert choose_prefix_lengths(paths, 2000) == [1000, 1000, 1000, 0, 0]
    # Groups dearer than anything they save: none.
    assert choose_prefix_lengths(paths, 10**6) == [0, 0, 0, 0, 0]
