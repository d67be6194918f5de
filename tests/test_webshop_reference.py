"""WebShop as the reference runs it: golden tests against outputs of the reference's own code.

- prompts.json: RD-Agent's build_react_prompt / _format_available_actions and create_llm_fn's
  system message (benchmarks/webshop/eval.py at 471eb30d1ec03f35631c532c58a52ce75d684037) run on
  fixed inputs; our task.py must render the same system and user strings byte for byte.
- goals.json: princeton-nlp/WebShop's own load_products / get_synthetic_goals and SimServer's
  seed-233 shuffle (commit in the file) run on data/, a small catalogue in WebShop's layout, with
  the price draws seeded as hub.price_seed seeds them; the hub source's goals must be the same,
  goal i being session i (RD-Agent plays sessions 0..99).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rlbench.fileio.jsonio import read_jsonl
from rlbench.tasks import get_task
from rlbench.tasks.base import EvalContext
from rlbench.tasks.webshop import GOAL_KEYS, hub_data, public

FIXTURES = Path(__file__).parent / "fixtures" / "reference" / "webshop"
DATA = FIXTURES / "data"
PROMPTS = json.loads((FIXTURES / "prompts.json").read_text())
GOALS = json.loads((FIXTURES / "goals.json").read_text())


def test_fixtures_cite_the_reference_code():
    assert PROMPTS["_source"]["commit"] == "471eb30d1ec03f35631c532c58a52ce75d684037"
    assert PROMPTS["_source"]["path"] == "rdagent/scenarios/rl/autorl_bench/benchmarks/webshop/eval.py"
    assert GOALS["_source"]["repository"] == "princeton-nlp/WebShop" and len(GOALS["_source"]["commit"]) == 40
    longest = max(PROMPTS["cases"], key=lambda case: len(case["history"]))
    assert len(longest["history"]) > public.HISTORY_WINDOW


# -- the prompt --------------------------------------------------------------------------------
@pytest.mark.parametrize("case", PROMPTS["cases"], ids=lambda case: case["name"])
def test_prompt_is_the_references_byte_for_byte(case):
    history = [tuple(entry) for entry in case["history"]]
    chat = public.messages(case["instruction"], case["available_actions"], history, case["observation"])
    assert chat == [
        {"role": "system", "content": case["expected_system"]},
        {"role": "user", "content": case["expected_user"]},
    ]
    assert public.format_available_actions(case["available_actions"]) == case["expected_available_actions"]


# -- the goals ---------------------------------------------------------------------------------
@pytest.mark.parametrize("case", GOALS["cases"], ids=lambda c: f"price_seed{c['price_seed']}-n{c['num_products']}")
def test_goals_products_and_prices_are_webshops(case):
    products, prices, goals = hub_data.reference_goals(DATA, case["price_seed"], case["num_products"])
    assert [p["asin"] for p in products] == case["asins"]  # 'nan', over-long and duplicate ASINs skipped
    assert prices == case["product_prices"]
    for product in products:  # the fields WebShop's loader derives (pages, search and reward read them)
        assert {key: product[key] for key in case["products"][product["asin"]]} == case["products"][product["asin"]]
    assert goals == case["goals"]


def hub_settings(**overrides) -> dict:
    base = {
        "name": "webshop",
        "module": "webshop",
        "level": "L3",
        "source": "hub",
        "metric": "success_rate",
        "train_size": 20,
        "eval_size": 100,
        "data_seed": 0,
        "max_new_tokens": None,
        "environment": {"max_steps": 50},
        "hub": {"goals": "synthetic", "data_dir": str(DATA), "price_seed": 0, "url": None},
    }
    return {**base, **overrides}


@pytest.fixture(scope="module")
def hub_splits(tmp_path_factory):
    root = tmp_path_factory.mktemp("webshop-hub")
    settings = hub_settings()
    task = get_task(settings)
    games = {split: root / "levels" / split for split in ("train", "heldout")}
    manifests = {split: task.build_games(settings, split, games[split]) for split in games}
    train_dir, eval_dir = root / "data" / "train", root / "data" / "eval"
    train_manifest = task.prepare_train(settings, train_dir, sources={"train_games": games["train"]})
    eval_manifest = task.prepare_eval(settings, train_dir, eval_dir, sources={"heldout_games": games["heldout"]})
    return {"task": task, "settings": settings, "games": games, "manifests": manifests, "train": train_dir,
            "eval": eval_dir, "train_manifest": train_manifest, "eval_manifest": eval_manifest}


def as_reference(row: dict) -> dict:
    """A goal row of ours in WebShop's goal dict's keys."""
    return {"instruction_text": row["instruction"], **{key: row[key] for key in GOAL_KEYS}}


def test_heldout_goals_are_the_text_environments_sessions_0_to_99(hub_splits):
    expected = next(c for c in GOALS["cases"] if c["price_seed"] == 0 and c["num_products"] == 1000)["goals"]
    held_out = list(read_jsonl(hub_splits["eval"] / "eval.jsonl"))
    assert [row["session"] for row in held_out] == list(range(100))
    assert [as_reference(row) for row in held_out] == [{k: g[k] for k in as_reference(held_out[0])} for g in expected[:100]]
    train = list(read_jsonl(hub_splits["train"] / "train.jsonl"))
    assert len(train) == 20 and min(row["session"] for row in train) >= 100
    assert all(as_reference(row) == {k: expected[row["session"]][k] for k in as_reference(row)} for row in train)
    assert not {r["instruction"] for r in train} & {r["instruction"] for r in held_out}
    summary = hub_splits["manifests"]["heldout"]["summary"]
    assert summary["goals_variant"] == "synthetic" and summary["price_seed"] == 0 and summary["goal_shuffle_seed"] == 233
    assert hub_splits["eval_manifest"]["heldout_goals_manifest"]["price_seed"] == 0
    assert hub_splits["eval_manifest"]["goals"] == "synthetic" and hub_splits["train_manifest"]["goals"] == "synthetic"
    assert set(hub_splits["manifests"]["train"]["data_files"]) == set(hub_data.REQUIRED)
    # the shop: WebShop's products, with the prices the goals were drawn against
    shop = {p["asin"]: p for p in public.load_products(hub_splits["eval"] / "products.jsonl")}
    assert list(shop) == GOALS["cases"][0]["asins"]
    assert {a: p["price"] for a, p in shop.items()} == GOALS["cases"][0]["product_prices"]
    description = hub_splits["task"].describe(hub_splits["settings"])
    assert "sessions 100 onwards" in description and "synthetic goals 0..99" in description


class PlannedGenerator:
    """Each episode (key) gets the next action of its plan; the prompts are kept."""

    name = "planned"

    def __init__(self, plans: dict):
        self.plans, self.prompts = plans, {}

    def chat_prompt(self, messages):
        assert messages[0]["content"] == PROMPTS["cases"][0]["expected_system"]
        return messages[-1]["content"]

    def generate(self, prompts, max_new_tokens, stop):
        out = {}
        for key, prompt in prompts.items():
            seen = self.prompts.setdefault(key, [])
            seen.append(prompt)
            plan = self.plans[key]
            out[key] = plan[len(seen) - 1] if len(seen) <= len(plan) else "click[nothing]"
        return out


def test_the_hub_shop_plays_in_process_and_records_the_goals_variant(hub_splits):
    rows = list(read_jsonl(hub_splits["eval"] / "eval.jsonl"))[:6]
    (hub_splits["eval"] / "six").mkdir(exist_ok=True)
    small = hub_splits["eval"] / "six"
    (small / "eval.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (small / "products.jsonl").write_bytes((hub_splits["eval"] / "products.jsonl").read_bytes())
    from rlbench.tasks.webshop import generate

    env = public.WebShopEnv(public.load_products(small / "products.jsonl"))
    plans = {row["id"]: [step["action"] for step in generate.expert_trajectory(env, row)[0]] for row in rows}
    generator = PlannedGenerator(plans)
    ctx = EvalContext(hub_splits["settings"], model_dir=None, eval_dir=small, backend=generator, evaluation={"batch_size": 3})
    try:
        result = hub_splits["task"].evaluate(ctx)
    finally:
        ctx.close()
    assert result.metrics["goals"] == "synthetic" and result.n == 6
    assert all(item["end"] == "bought" for item in result.items) and result.score > 0
    # the history is RD-Agent's: "Observation k" is the page after action k, repeated as the current page
    second = next(iter(generator.prompts.values()))[1]
    assert second.count("\nObservation 1: ") == 1 and "\nAction 1: search[" in second
    page_after_search = second.split("\nObservation 1: ")[1].split("\nAction 1: ")[0]
    assert page_after_search.startswith("Instruction: [SEP] ") and second.endswith(f"\nObservation 2: {page_after_search}\nAction 2:")


# -- the data folder ---------------------------------------------------------------------------
def test_missing_data_says_what_to_do(tmp_path, monkeypatch):
    settings = hub_settings(hub={"goals": "synthetic", "data_dir": str(tmp_path / "nowhere")})
    with pytest.raises(FileNotFoundError, match="hub.data_dir=.*is not a folder"):
        hub_data.data_dir(settings)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="items_shuffle_1000.json, items_ins_v2_1000.json not in hub.data_dir"):
        hub_data.data_dir(hub_settings(hub={"data_dir": str(tmp_path / "empty")}))
    monkeypatch.setattr(hub_data, "DEFAULT_DATA_DIR", tmp_path / "cache")
    monkeypatch.setattr(hub_data.shutil, "which", lambda name: None)
    monkeypatch.setitem(sys.modules, "gdown", None)  # not installed
    with pytest.raises(RuntimeError, match="gdown, which is not installed.*hub.data_dir"):
        hub_data.data_dir(hub_settings(hub={"goals": "synthetic"}))
    with pytest.raises(ValueError, match="train_size 500 exceeds"):
        get_task(hub_settings()).build_games(hub_settings(train_size=500), "train", tmp_path / "train")
