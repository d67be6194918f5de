"""WebShop (L3): the reward, the shop's pages and action grammar, the generator, and the real
evaluation path (build_games -> prepare_train / prepare_eval -> Task.evaluate with a scripted
text generator).

An oracle policy (the scripted expert's actions, one per prompt) must score a success rate of
100, a nonsense policy 0; the held-out goals never reach the training split or a workspace."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path
from random import Random

import pytest

from rlbench.fileio.jsonio import read_jsonl, write_jsonl
from rlbench.tasks import get_task
from rlbench.tasks.base import EvalContext, new_salt, public_metrics
from rlbench.tasks.webshop import generate, public

SEP = public.SEP


def settings(**overrides) -> dict:
    base = {
        "name": "webshop",
        "module": "webshop",
        "level": "L3",
        "source": "offline",
        "metric": "success_rate",
        "train_size": 24,
        "eval_size": 10,
        "catalogue_size": 72,
        "data_seed": 0,
        "max_new_tokens": None,
        "environment": {"max_steps": 50},
        "hub": {"url": None},
    }
    return {**base, **overrides}


# -- hand-made products ----------------------------------------------------------------------
def product(asin="B000000001", name="Lumora Eye Shadow Palette with Mirror", **fields) -> dict:
    raw = {
        "asin": asin,
        "name": name,
        "category": "beauty",
        "query": "eye shadow palette",
        "product_category": "Beauty & Personal Care › Makeup › Eyes",
        "full_description": "A palette of twelve shades.",
        "small_description": ["Twelve shades"],
        "pricing": "$19.99",
        "customization_options": {"color": [{"value": "dark brown"}, {"value": "nude"}], "size": [{"value": "mini"}]},
        "attributes": ["long-lasting", "paraben free"],
    }
    raw.update(fields)
    return public.prepare_product(raw)


def goal(**fields) -> dict:
    base = {
        "asin": "B000000001",
        "name": "Lumora Eye Shadow Palette with Mirror",
        "query": "eye shadow palette",
        "product_category": "Beauty & Personal Care › Makeup › Eyes",
        "instruction": "i need a long lasting eye shadow palette with color: dark brown, and size: mini",
        "attributes": ["long lasting", "cruelty free"],
        "goal_options": {"color": "dark brown", "size": "mini"},
        "price_upper": 30.0,
    }
    return {**base, **fields}


# -- the reward ------------------------------------------------------------------------------
def test_attribute_matches_by_fuzzy_score_or_by_substring():
    item = product()
    assert public.get_attribute_reward(item, ["long lasting"]) == (1.0, 1)  # fuzzy: 'long-lasting'
    assert public.get_attribute_reward(item, ["cruelty free"]) == (0.0, 0)
    with_text = product(full_description="Cruelty free and vegan.")
    assert public.get_attribute_reward(with_text, ["cruelty free"]) == (1.0, 1)  # substring of the description
    in_bullets = product(small_description=["Twelve shades", "travel size case"])
    assert public.get_attribute_reward(in_bullets, ["travel size", "cruelty free"]) == (0.5, 1)


def test_options_match_against_name_value_tuples():
    assert public.get_option_reward(["dark brown"], [("color", "dark brown")]) == (1.0, 1)
    assert public.get_option_reward(["18 inch"], [("size", "22 inch")]) == (0.0, 0)
    assert public.get_option_reward(["pack of 12"], ["pack of 6"]) == (1.0, 1)  # string options (human goals): 88 > 85
    assert public.normalize_color(("color", "black")) == "black"  # a colour element of the tuple
    assert public.normalize_color(("color", "dark brown")) == ("color", "dark brown")
    assert public.normalize_color("dark brown") == "brown"
    assert public.get_option_reward(["nude"], [("color", "dark brown")]) == (0.0, 0)
    assert public.get_option_reward([], [("size", "mini")]) == (0.0, 0)


def test_reward_counts_attributes_options_and_price_as_slots():
    item = product()
    reward, info = public.get_reward(item, goal(), 19.99, {"color": "dark brown", "size": "mini"})
    assert reward == pytest.approx(4 / 5)  # 1 of 2 attributes, 2 of 2 options, the price
    assert info["r_type"] == 1.0 and info["r_att"] == 0.5 and info["r_option"] == 1.0 and info["r_price"]
    assert info["w_att"] == pytest.approx(2 / 5) and info["w_option"] == pytest.approx(2 / 5) and info["w_price"] == pytest.approx(1 / 5)
    over, info = public.get_reward(item, goal(), 31.0, {"color": "dark brown", "size": "mini"})
    assert over == pytest.approx(3 / 5) and info["r_price"] is False
    no_options, info = public.get_reward(item, goal(), 19.99, {})
    assert no_options == pytest.approx(2 / 5) and info["r_option"] == 0.0  # buying without options: no = 0
    plain, info = public.get_reward(item, goal(goal_options={}), 19.99, {})
    assert plain == pytest.approx(2 / 3) and "r_option" not in info


def test_product_type_factor():
    other = {"query": "keyboards", "product_category": "Electronics › Computers › Keyboards"}

    def r_type(purchased_name, goal_name="Lumora Eye Shadow Palette with Mirror", **purchased_fields):
        purchased = product(name=purchased_name, **{**other, **purchased_fields})
        return public.get_type_reward(purchased, goal(name=goal_name))

    same = r_type("Brightfield Eye Shadow Palette")  # 3 of the goal's 5 nouns
    assert same["r_type"] == 1.0 and same["title_score"] == pytest.approx(3 / 5) and not same["query_match"]
    weak = r_type("Wireless Keyboard with Mirror")  # 1 of 5 nouns = 0.2, no query or category match
    assert weak["r_type"] == 0.5 and weak["title_score"] == pytest.approx(0.2)
    assert r_type("Wireless Keyboard with Mirror", query="eye shadow palette")["r_type"] == 1.0
    assert r_type("Keyboard with Mirror", product_category="Beauty & Personal Care › Makeup › Lips")["category_match"]
    many = "Leather wallet with coin pocket and strap, gift box, card, key ring, zipper, buckle and tassel"
    rare = r_type("Velvet bag with zipper", goal_name=many)  # 1 of 13 nouns
    assert rare["r_type"] == 0.1 and 0 < rare["title_score"] < 0.1
    assert r_type("Velvet bag with ribbon")["r_type"] == 0.0
    no_nouns = r_type("Velvet bag with ribbon", goal_name="very soft and warm")
    assert no_nouns["title_score"] == 0.2 and no_nouns["r_type"] == 0.5


# -- the shop --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def mugs():
    """12 mugs and a lamp: a search for 'mug' fills a second results page; the mugs' texts
    score alike, so they come in catalogue order."""
    items = [
        product(asin=f"B0MUG{i:05d}", name=f"Ceramic Coffee Mug Number {i}", query="coffee mug",
                product_category="Home & Kitchen › Kitchen & Dining › Mugs", full_description=f"Mug {i} holds coffee.",
                small_description=["Dishwasher safe", "12 ounce"], pricing="$9.99 - $14.99" if i == 0 else f"${10 + i}.99",
                customization_options={"color": [{"value": "red"}, {"value": "blue"}]},
                attributes=["dishwasher safe"])
        for i in range(12)
    ]
    items.append(product(asin="B0LAMP0001", name="Desk Lamp", query="lamp", full_description="A lamp."))
    return public.Catalogue(items)


def test_search_results_item_and_sub_pages(mugs):
    mug_goal = goal(instruction="i need a red coffee mug", asin="B0MUG00000", goal_options={"color": "red"},
                    name="Ceramic Coffee Mug Number 0", query="coffee mug", attributes=["dishwasher safe"])
    env = public.WebShopEnv(mugs)
    assert env.reset(mug_goal) == "WebShop [SEP] Instruction: [SEP] i need a red coffee mug [SEP] Search"
    assert env.get_instruction_text() == "Instruction: i need a red coffee mug"
    assert env.available_actions() == {"has_search_bar": True, "clickables": ["search"]}
    observation, reward, done, _ = env.step("search[Coffee Mug]")
    assert not done and reward == 0.0
    head = "Instruction: [SEP] i need a red coffee mug [SEP] Back to Search [SEP] Page 1 (Total results: 12) [SEP] Next > [SEP] "
    assert observation.startswith(head + "B0MUG00000 [SEP] Ceramic Coffee Mug Number 0 [SEP] $9.99 to $14.99 [SEP] B0MUG00001")
    clickables = env.available_actions()["clickables"]
    assert clickables[:2] == ["back to search", "next >"] and len(clickables) == 12 and "b0mug00000" in clickables
    page_two, *_ = env.step("click[next >]")
    assert "Page 2 (Total results: 12) [SEP] < Prev [SEP] Next > [SEP] B0MUG" in page_two
    assert env.available_actions()["clickables"][:3] == ["back to search", "< prev", "next >"]
    assert page_two.count("B0MUG") == 2
    env.step("click[< prev]")
    item, *_ = env.step("click[b0mug00000]")
    assert item == (
        "Instruction: [SEP] i need a red coffee mug [SEP] Back to Search [SEP] < Prev [SEP] color [SEP] red [SEP] blue "
        "[SEP] Ceramic Coffee Mug Number 0 [SEP] Price: $9.99 to $14.99 [SEP] Rating: N.A. [SEP] Description "
        "[SEP] Features [SEP] Reviews [SEP] Buy Now"
    )
    assert env.available_actions()["clickables"] == [
        "back to search", "< prev", "description", "features", "reviews", "buy now", "red", "blue",
    ]
    features, *_ = env.step("click[features]")
    assert features == "Instruction: [SEP] i need a red coffee mug [SEP] Back to Search [SEP] < Prev [SEP] Dishwasher safe [SEP] 12 ounce"
    assert env.available_actions()["clickables"] == ["back to search", "< prev"]
    assert env.step("click[< prev]")[0] == item
    description, *_ = env.step("click[description]")
    assert description.endswith("< Prev [SEP] Mug 0 holds coffee.")
    assert env.step("click[reviews]")[0] == description  # no such clickable on a sub-page: nothing happens
    env.step("click[< prev]")
    env.step("click[red]")
    done_page, reward, done, info = env.step("click[buy now]")
    assert done and done_page.startswith("Thank you for shopping with us!") and done_page.endswith(f"{SEP}{reward}")
    assert info["options"] == {"color": "red"} and reward == 1.0


def test_invalid_actions_change_nothing(mugs):
    env = public.WebShopEnv(mugs, goals=[goal(instruction="i need a mug")])
    start = env.reset(0)
    for action in ("click[search]", "search[]", "buy now", "click[buy now]", "Search[mug]", "click mug"):
        assert env.step(action) == (start, 0.0, False, {"valid": False})
    env.step("search[mug]")
    item, *_ = env.step("click[b0mug00000]")
    assert env.step("click[b0lamp0001]") == (item, 0.0, False, {"valid": False})  # not on this page
    env.step("click[blue]")
    assert env.options == {"color": "blue"}
    lamp_results, *_ = env.step("search[desk lamp]")  # search works from any page
    assert lamp_results.split(SEP)[5:7] == ["B0LAMP0001", "Desk Lamp"]
    assert env.step("click[back to search]")[0] == start and env.options == {} and env.keywords is None


def test_search_is_deterministic_and_keeps_catalogue_order_on_ties():
    twins = public.Catalogue([product(asin=f"B0TWIN{i:04d}", name="Same Mug", full_description="") for i in range(3)])
    assert twins.search("same mug") == ["B0TWIN0000", "B0TWIN0001", "B0TWIN0002"]
    assert twins.search("nothing matches this") == []


# -- the protocol ----------------------------------------------------------------------------
def test_prompt_shows_the_last_five_steps_with_the_page_after_each_action():
    # history entries are (action, observation after it), as RD-Agent's webshop_run appends them
    history = [(f"click[x{k}]", f"page after {k}") for k in range(1, 8)]
    prompt = public.user_prompt("Instruction: buy a mug", {"has_search_bar": True, "clickables": ["search"]}, history, "page after 7")
    assert "Instruction: Instruction: buy a mug" in prompt
    assert "Available actions:\n  search[<your query>]\n  click[search]\n" in prompt
    rules = prompt.split("Rules:\n")[1].split("\n\n")[0].splitlines()
    assert len(rules) == 4 and all(rule.startswith("- ") for rule in rules)
    tail = prompt.split("Now it's your turn:\n")[1]
    assert tail.startswith("\nObservation 3: page after 3\nAction 3: click[x3]\n") and "Observation 2:" not in tail
    assert tail.endswith("Action 7: click[x7]\n\nObservation 8: page after 7\nAction 8:")
    assert public.user_prompt("i", {}, history, "p", 8) == public.user_prompt("i", {}, history, "p")
    with pytest.raises(ValueError, match="len\\(history\\) \\+ 1"):
        public.user_prompt("i", {}, history, "p", 7)
    chat = public.messages("Instruction: buy a mug", {"has_search_bar": False, "clickables": []}, [], "p")
    assert [m["role"] for m in chat] == ["system", "user"] and "ONLY" in chat[0]["content"]
    assert public.clean_action("  Action: choose[buy now] ") == "click[buy now]"
    assert public.clean_action("search[red mug]") == "search[red mug]"
    assert public.is_success(0.5) and not public.is_success(0.49)


def test_expert_chats_replay_a_trajectory_into_the_graders_prompts(mugs):
    mug_goal = goal(instruction="i need a red coffee mug", asin="B0MUG00000", goal_options={"color": "red"},
                    name="Ceramic Coffee Mug Number 0", query="coffee mug", attributes=["dishwasher safe"])
    actions = ["search[coffee mug]", "click[b0mug00000]", "click[red]", "click[buy now]"]
    pairs = public.expert_chats(public.WebShopEnv(mugs), mug_goal, actions)
    assert [action for _, action in pairs] == actions
    env = public.WebShopEnv(mugs)
    observation = env.reset(mug_goal)
    results, *_ = env.step("search[coffee mug]")
    item, *_ = env.step("click[b0mug00000]")
    second = pairs[1][0][1]["content"]
    assert second.endswith(f"\nObservation 1: {results}\nAction 1: search[coffee mug]\n\nObservation 2: {results}\nAction 2:")
    assert pairs[0][0][1]["content"].endswith(f"Observation 1: {observation}\nAction 1:")
    assert "click[red]" in pairs[2][0][1]["content"] and f"Observation 3: {item}" in pairs[2][0][1]["content"]


# -- the generator ---------------------------------------------------------------------------
def test_generator_is_deterministic_and_partitions_the_targets():
    first, second = generate.generate_catalogue(3, 60), generate.generate_catalogue(3, 60)
    assert json.dumps(first.products) == json.dumps(second.products) and first == second
    assert json.dumps(generate.training_goals(first, 3, 20)) == json.dumps(generate.training_goals(second, 3, 20))
    assert generate.generate_catalogue(4, 60).products != first.products
    assert len(first.heldout_asins) == 15 and not set(first.heldout_asins) & set(first.train_asins)
    asins = [p["asin"] for p in first.products]
    assert len(set(asins)) == 60 and all(len(a) == 10 and a.startswith("B0") and a.isupper() for a in asins)
    goals = generate.training_goals(first, 3, 20)
    assert {g["asin"] for g in goals} <= set(first.train_asins)
    held = generate.heldout_goals(first, 987654321, 10, {g["instruction"] for g in goals})
    assert {g["asin"] for g in held} <= set(first.heldout_asins)
    for g in goals + held:
        assert g["price_upper"] > first.by_asin(g["asin"])["price"] and g["price_upper"] % 10 == 0
        assert g["instruction"].endswith(f", and price lower than {g['price_upper']:.2f} dollars")
        assert set(g["attributes"]) <= set(first.by_asin(g["asin"])["attributes"])
        assert public.title_nouns(g["name"])  # spaCy finds nouns in every title
    assert generate.price_bound(995.0, Random(0)) is None


def test_expert_pages_to_a_target_on_a_later_results_page(mugs):
    later = goal(asin="B0MUG00011", name="Ceramic Coffee Mug Number 11", query="coffee mug",
                 product_category="Home & Kitchen › Kitchen & Dining › Mugs", attributes=["dishwasher safe"],
                 goal_options={}, instruction="i need a mug")
    env = public.WebShopEnv(mugs)
    env.reset(later)
    env.hits = []  # the expert must search itself
    steps, reward = generate.expert_trajectory(env, later)
    assert reward == 1.0 and steps[-1]["action"] == "click[buy now]"


# -- the real evaluation path ----------------------------------------------------------------
@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    root = tmp_path_factory.mktemp("webshop")
    task, salt = get_task(settings()), new_salt()
    games = {split: root / "levels" / split for split in ("train", "heldout")}
    manifests = {split: task.build_games(settings(), split, games[split], salt=salt) for split in games}
    train_dir, eval_dir = root / "data" / "train", root / "data" / "eval"
    train_manifest = task.prepare_train(settings(), train_dir, sources={"train_games": games["train"]})
    eval_manifest = task.prepare_eval(settings(), train_dir, eval_dir, salt=salt, sources={"heldout_games": games["heldout"]})
    return {"root": root, "task": task, "salt": salt, "games": games, "manifests": manifests, "train": train_dir,
            "eval": eval_dir, "train_manifest": train_manifest, "eval_manifest": eval_manifest}


class ScriptedGenerator:
    """A TextGenerator stand-in: the chat prompt is the user message; each episode (key) gets the
    next of its scripted actions."""

    name = "scripted"

    def __init__(self, plans: dict, fallback: str = "click[nothing]"):
        self.plans, self.fallback = plans, fallback
        self.turn = {key: 0 for key in plans}
        self.calls, self.released = 0, []

    def chat_prompt(self, messages):
        return messages[-1]["content"]

    def generate(self, prompts, max_new_tokens, stop):
        assert max_new_tokens == public.MAX_NEW_TOKENS and stop == public.STOP
        self.calls += 1
        out = {}
        for key, prompt in prompts.items():
            assert prompt.rstrip().endswith(":") and "Available actions:" in prompt
            plan, index = self.plans.get(key, []), self.turn.get(key, 0)
            self.turn[key] = index + 1
            out[key] = " Action: " + plan[index] if index < len(plan) else self.fallback
        return out

    def release(self, key):
        self.released.append(key)


def evaluate(splits, backend, **overrides):
    ctx = EvalContext(settings(**overrides), model_dir=None, eval_dir=splits["eval"], backend=backend, evaluation={"batch_size": 4})
    try:
        return splits["task"].evaluate(ctx)
    finally:
        ctx.close()


def oracle_plans(eval_dir: Path) -> dict:
    env = public.WebShopEnv(public.load_products(eval_dir / "products.jsonl"))
    plans = {}
    for row in read_jsonl(eval_dir / "eval.jsonl"):
        steps, reward = generate.expert_trajectory(env, row)
        assert reward == 1.0
        plans[row["id"]] = [step["action"] for step in steps]
    return plans


def test_experts_win_every_training_and_heldout_goal(splits):
    rows = list(read_jsonl(splits["train"] / "train.jsonl"))
    assert len(rows) == 24 and all(row["expert_reward"] == 1.0 for row in rows)
    env = public.WebShopEnv(public.load_products(splits["train"] / "products.jsonl"))
    for row in rows[:5]:  # the recorded trajectories replay to the same pages and reward
        env.reset(row)
        for step in row["expert"]:
            observation, reward, done, _ = env.step(step["action"])
            assert observation == step["observation"]
        assert done and reward == 1.0
    assert len(oracle_plans(splits["eval"])) == 10
    assert splits["manifests"]["train"]["summary"]["goals"] == 24


def test_oracle_policy_succeeds_on_every_heldout_goal(splits):
    generator = ScriptedGenerator(oracle_plans(splits["eval"]))
    result = evaluate(splits, generator)
    assert result.primary == "success_rate" and result.score == 100.0 and result.n == 10
    metrics = result.metrics
    assert metrics["mean_reward"] == 100.0 and metrics["full_success_rate"] == 100.0 and metrics["success_count"] == 10
    assert metrics["context_exhausted"] == 0 and metrics["avg_steps"] >= 3 and "generation_s" in metrics
    assert metrics["avg_reward"] == 1.0 and metrics["goals"] == "generated"
    assert sorted(generator.released) == sorted(item["id"] for item in result.items)
    assert all(item["end"] == "bought" and item["actions"][-1] == "click[buy now]" for item in result.items)
    assert "items" not in public_metrics(result.to_dict())


def test_nonsense_policy_scores_zero(splits):
    result = evaluate(splits, ScriptedGenerator({}, fallback="I would like to buy it"), environment={"max_steps": 4})
    assert result.score == 0.0 and result.metrics["mean_reward"] == 0.0 and result.metrics["avg_steps"] == 4
    assert all(item["end"] == "max_steps" and item["reward"] == 0.0 for item in result.items)


def test_episode_over_the_context_ends_lost(splits):
    class OutOfContext(ScriptedGenerator):
        def generate(self, prompts, max_new_tokens, stop):
            return {key: None for key in prompts}

    result = evaluate(splits, OutOfContext({}))
    assert result.score == 0.0 and result.metrics["context_exhausted"] == 10
    assert all(item["steps"] == 0 and item["end"] == "context" for item in result.items)


def test_hf_backend_plays_every_episode_like_the_reference_loop(splits, tiny_model):
    """The evaluation's hf path (episode_generator over a CachedBatchGenerator: row_cache, every
    live episode in lockstep) ends every episode as the reference's loop does (FullPromptGenerator,
    one episode at a time), past the history window's first slide."""
    from rlbench.generation.full_prompt import FullPromptGenerator
    from rlbench.generation.prefix_cache import CachedBatchGenerator
    from rlbench.generation.row_cache import TurnLengthSwitch
    from rlbench.tasks.webshop.rollout import episode_generator, play_episodes

    catalogue = public.Catalogue(public.load_products(splits["eval"] / "products.jsonl"))
    goals = {row["id"]: row for row in read_jsonl(splits["eval"] / "eval.jsonl")}
    steps = public.HISTORY_WINDOW + 3
    ours = episode_generator(CachedBatchGenerator(tiny_model, device="cpu"))
    assert isinstance(ours, TurnLengthSwitch)
    played = {}
    for name, generator, live in (("ours", ours, 4), ("reference", FullPromptGenerator(tiny_model, device="cpu"), 1)):
        played[name] = play_episodes(goals, lambda: public.WebShopEnv(catalogue), generator, max_steps=steps, max_live=live)
    assert played["ours"] == played["reference"]
    assert all(episode["steps"] for episode in played["ours"].values())
    assert ours.stats["path"] == "rows" and not ours.rows.entries and ours.stats["prompt_tokens_reused"] > 0.2 * ours.stats["prompt_tokens"], ours.stats


def test_heldout_goals_never_reach_the_training_split_or_a_workspace(splits, tmp_path):
    from rlbench.agent_run.workspace import prepare_workspace

    eval_rows = list(read_jsonl(splits["eval"] / "eval.jsonl"))
    train_rows = list(read_jsonl(splits["train"] / "train.jsonl"))
    assert not {r["asin"] for r in eval_rows} & {r["asin"] for r in train_rows}
    assert "salt_sha256" in splits["eval_manifest"]
    heldout_manifest = (splits["games"]["heldout"] / "manifest.json").read_text()
    assert splits["salt"] not in heldout_manifest and "seed" not in heldout_manifest
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    workspace = tmp_path / "ws"
    manifest = prepare_workspace(workspace, splits["task"], settings(), model, "org/base", splits["train"])
    assert not any("eval" in name for name in manifest["files"])
    assert (workspace / "task.py").read_bytes() == Path(public.__file__).read_bytes()
    assert "MIT License" in (workspace / "LICENSE-RD-Agent-prompts").read_text()  # task.py carries RD-Agent's prompt
    assert "WebShop" in (workspace / "description.md").read_text()
    texts = "\n".join(path.read_text() for path in workspace.rglob("*") if path.is_file() and path.suffix in (".py", ".md", ".jsonl"))
    assert not [row["instruction"] for row in eval_rows if row["instruction"] in texts]
    # A training split that shared a held-out instruction would be refused.
    leaky = tmp_path / "leaky"
    leaky.mkdir()
    write_jsonl(leaky / "train.jsonl", train_rows + [{**eval_rows[0], "asin": "B0NOTHERE0"}])
    with pytest.raises(RuntimeError, match="also in the training split"):
        splits["task"].prepare_eval(settings(), leaky, tmp_path / "eval", salt=splits["salt"],
                                    sources={"heldout_games": splits["games"]["heldout"]})


def test_build_games_is_byte_identical_for_the_same_seeds(splits, tmp_path):
    again = tmp_path / "train"
    splits["task"].build_games(settings(), "train", again)
    for name in ("products.jsonl", "goals.jsonl", "manifest.json"):
        assert (again / name).read_bytes() == (splits["games"]["train"] / name).read_bytes()
    with pytest.raises(ValueError, match="salt"):
        splits["task"].build_games(settings(), "heldout", tmp_path / "heldout")


# -- the hub source ----------------------------------------------------------------------------
ITEM_PAGE = """<!DOCTYPE html>
<html><head><title>WebShop</title><style>body { color: red; }</style></head>
<body>
  <div class="container">
    <div id="instruction-text" class="text-center"><h4>Instruction: <br>i need a red mug, and price lower than 20.00 dollars</h4></div>
    <form method="post" action="/fixed_3"><button type="submit" class="btn btn-success">Back to Search</button></form>
    <form method="post" action="/search_results/fixed_3/%5B%27mug%27%5D/1"><button type="submit" class="btn btn-primary">&lt; Prev</button></form>
    <div class="radio-toolbar">
      <h4>color</h4>
      <input type="radio" id="radio_color0" name="color" value="red"><label for="radio_color0">red</label>
      <input type="radio" id="radio_color1" name="color" value="blue"><label for="radio_color1">blue</label>
    </div>
    <h2>Ceramic Mug</h2><h4>Price: $12.99</h4><h4>Rating: N.A.</h4>
    <!-- a comment is not text -->
    <form method="post" action="/item_sub_page/fixed_3/B0MUG00000/%5B%27mug%27%5D/1/Description/%7B%7D">
      <button class="btn btn-primary" type="submit">Description</button></form>
    <div style="display:none">hidden but still text</div>
    <form method="post" action="/done/fixed_3/B0MUG00000/%7B%7D"><button type="submit" class="btn btn-lg purchase">Buy Now</button></form>
    <script>var chosen = {};</script>
  </div>
</body></html>
"""

RESULTS_PAGE = """<html><body>
<div id="instruction-text"><h4>Instruction: <br>i need a red mug</h4></div>
<form method="post" action="/fixed_3"><button class="btn btn-success">Back to Search</button></form>
<h5>Page 1 (Total results: 50)</h5>
<form method="post" action="/search_results/fixed_3/mug/2"><button class="btn btn-primary">Next &gt;</button></form>
<div class="list-group-item"><h4><a class="product-link" href="/item_page/fixed_3/B0MUG00000/mug/1/%7B%7D">B0MUG00000</a></h4>
<h4>Ceramic Mug</h4><h5>$12.99</h5></div>
</body></html>
"""

SEARCH_PAGE = """<html><body><h1>WebShop</h1>
<div id="instruction-text"><h4>Instruction: <br>i need a red mug</h4></div>
<form action="/fixed_3" method="post"><input id="search_input" type="text" name="search_query">
<button type="submit" class="btn btn-primary">Search</button></form></body></html>"""


def test_hub_pages_parse_to_the_text_observation():
    item = public.parse_page(ITEM_PAGE)
    assert item["observation"] == (
        "Instruction: [SEP] i need a red mug, and price lower than 20.00 dollars [SEP] Back to Search [SEP] < Prev "
        "[SEP] color [SEP] red [SEP] blue [SEP] Ceramic Mug [SEP] Price: $12.99 [SEP] Rating: N.A. [SEP] Description "
        "[SEP] hidden but still text [SEP] Buy Now"
    )
    assert item["clickables"] == ["back to search", "< prev", "description", "buy now", "red", "blue"]
    assert item["instruction"] == "Instruction: i need a red mug, and price lower than 20.00 dollars"
    assert not item["has_search_bar"] and item["radios"] == {"red": "color", "blue": "color"}
    assert item["buttons"]["buy now"] == {"method": "post", "url": "/done/fixed_3/B0MUG00000/%7B%7D"}
    results = public.parse_page(RESULTS_PAGE)
    assert results["observation"] == (
        "Instruction: [SEP] i need a red mug [SEP] Back to Search [SEP] Page 1 (Total results: 50) [SEP] Next > "
        "[SEP] B0MUG00000 [SEP] Ceramic Mug [SEP] $12.99"
    )
    assert results["clickables"] == ["back to search", "next >", "b0mug00000"]
    assert results["products"]["b0mug00000"].startswith("/item_page/fixed_3/B0MUG00000")
    search = public.parse_page(SEARCH_PAGE)
    assert search["observation"] == "WebShop [SEP] Instruction: [SEP] i need a red mug [SEP] Search"
    assert search["has_search_bar"] and search["clickables"] == ["search"] and search["search_form"] == "/fixed_3"
    url = public._with_option("http://h/item_page/fixed_3/B0MUG00000/mug/1/%7B%7D", "color", "red")
    assert json.loads(urllib.parse.unquote(url.rsplit("/", 1)[1])) == {"color": "red"}
    assert public.done_page_reward("Thank you for shopping with us! [SEP] Your score (min 0.0, max 1.0) [SEP] 0.75") == 0.75
    assert public.done_page_reward(results["observation"]) is None


def test_hub_source_names_the_url_it_cannot_reach(tmp_path):
    hub = settings(source="hub", hub={"goals": "human", "url": "http://127.0.0.1:9"})
    with pytest.raises(ConnectionError, match=r"hub.url=http://127.0.0.1:9"):
        get_task(hub).build_games(hub, "train", tmp_path / "train")
    with pytest.raises(ValueError, match="hub.url"):
        get_task(hub).build_games(settings(source="hub", hub={"goals": "human"}), "train", tmp_path / "train")
    with pytest.raises(ValueError, match="hub.goals must be one of synthetic, human"):
        get_task(hub).build_games(settings(source="hub", hub={"goals": "fixed"}), "train", tmp_path / "train")
    assert "fixed" not in get_task(hub).describe(hub) and "http://127.0.0.1:9" in get_task(hub).describe(hub)
