"""The reference's WebShop goals: the products and synthetic goals of WebShop's small data, as
RD-Agent's evaluator gets them from `WebAgentTextEnv(observation_mode="text", num_products=1000)`.

A re-implementation (WebShop itself is not imported) of princeton-nlp/WebShop at commit
64fa2a5c15c7daa698b9ac93f5bb5437b634c9bd:

- `load_products`: web_agent_site/engine/engine.py `load_products(filepath, num_products=1000,
  human_goals=None)`: the first 1000 records of items_shuffle_1000.json, skipping an ASIN that is
  'nan', longer than 10 characters or seen before; each product's attributes, instruction and
  instruction attributes from items_ins_v2_1000.json (the fields derived for the pages are
  public.prepare_product's, WebShop's too);
- `draw_prices`: engine.py `generate_product_prices`: a price range's price is `uniform(low, high)`;
- `synthetic_goals`: web_agent_site/engine/goal.py `get_synthetic_goals`: for every product that
  has an instruction, one goal per combination of its option values (option names sorted), a
  price bound (the larger of two of the first four multiples of 10 above the price, drawn with
  `sample`), weight = the mean 1 / (goals asking for the attribute) over its attributes;
- `reference_goals`: web_agent_text_env.py `SimServer.__init__`: those goals shuffled with
  `random.seed(233)`; goal i is session i (RD-Agent plays sessions 0-99).

WebShop draws the range prices and the price bounds from Python's global `random` without a seed,
so its goals' price bounds (and the prices a purchase is judged by) change from run to run. Here
they are drawn, in WebShop's order, from `random.Random(price_seed)` (`hub.price_seed`, recorded
in the split's manifest): the same as `random.seed(price_seed)` just before WebShop builds its
server. The order of the goals does not depend on it (the shuffle is seeded).

`ensure_data` finds the three files in `hub.data_dir`, or downloads them as RD-Agent's data.py
does (gdown from Google Drive) into the default folder.
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from random import Random

from rlbench.tasks.webshop import public

PRODUCTS_JSON = "items_shuffle_1000.json"
ATTRIBUTES_JSON = "items_ins_v2_1000.json"
HUMAN_JSON = "items_human_ins.json"
#: Google Drive ids of WebShop's small data, as RD-Agent's benchmarks/webshop/data.py downloads them.
GDRIVE_IDS = {
    PRODUCTS_JSON: "1EgHdxQ_YxqIQlvvq5iKlCrkEKR6-j0Ib",
    ATTRIBUTES_JSON: "1IduG0xl544V_A_jv3tHXC0kyFi7PnyBu",
    HUMAN_JSON: "14Kb5SPBk_jfdLZ_CDBNitW98QLDlKR5O",
}
#: The files the synthetic goals need (WebShop's loader also opens items_human_ins.json, unused here).
REQUIRED = (PRODUCTS_JSON, ATTRIBUTES_JSON)
DEFAULT_DATA_DIR = Path.home() / ".cache" / "webshop" / "data"
NUM_PRODUCTS = 1000  # RD-Agent's num_products
GOAL_SHUFFLE_SEED = 233  # SimServer.__init__
PRICE_RANGE = [10.0 * i for i in range(1, 100)]  # goal.py
NO_BOUND = 1000000  # goal.py's price_upper when no bound is drawn
#: The raw fields a product keeps in products.jsonl (what public.prepare_product reads).
KEPT_FIELDS = (
    "asin",
    "name",
    "category",
    "query",
    "product_category",
    "full_description",
    "small_description",
    "pricing",
    "customization_options",
)


# -- the data folder ---------------------------------------------------------------------------
def data_dir(settings: dict) -> Path:
    """hub.data_dir, else DEFAULT_DATA_DIR; the files are downloaded there when missing."""
    configured = (settings.get("hub") or {}).get("data_dir")
    folder = Path(os.path.expanduser(str(configured))) if configured else DEFAULT_DATA_DIR
    if configured and not folder.is_dir():
        raise FileNotFoundError(
            f"webshop: hub.data_dir={configured} is not a folder; give the folder that holds WebShop's "
            f"{', '.join(GDRIVE_IDS)} (setup.sh's data/ folder), or leave hub.data_dir null to download them"
        )
    return ensure_data(folder, download=not configured)


def ensure_data(folder: Path, download: bool = True) -> Path:
    """`folder`, holding the files the goals need; missing ones are downloaded with gdown (all three,
    as the reference does) when `download`, else a clear error."""
    folder = Path(folder)
    missing = [name for name in REQUIRED if not (folder / name).is_file()]
    if not missing:
        return folder
    if not download:
        raise FileNotFoundError(
            f"webshop: {', '.join(missing)} not in hub.data_dir={folder}; put WebShop's small data there "
            f"(gdown {' / '.join(GDRIVE_IDS.values())}) or leave hub.data_dir null to download it"
        )
    gdown = _gdown_command()
    folder.mkdir(parents=True, exist_ok=True)
    for name, file_id in GDRIVE_IDS.items():
        if (folder / name).is_file():
            continue
        partial = folder / f"{name}.part"
        try:
            subprocess.run([*gdown, file_id, "-O", str(partial)], check=True, timeout=1800)
            json.loads(partial.read_text())  # a Google Drive error page is not JSON
        except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError, ValueError) as exc:
            partial.unlink(missing_ok=True)
            raise RuntimeError(
                f"webshop: downloading {name} (Google Drive id {file_id}) into {folder} failed ({exc}); this "
                "needs the network. Download WebShop's small data elsewhere and set tasks.webshop.hub.data_dir "
                "to its folder, or use source: offline"
            ) from exc
        partial.replace(folder / name)
    return folder


def _gdown_command() -> list[str]:
    if shutil.which("gdown"):
        return ["gdown"]
    try:
        found = importlib.util.find_spec("gdown") is not None
    except (ImportError, ValueError):  # ValueError: a module set to None (tests) has no spec
        found = False
    if not found:
        raise RuntimeError(
            "webshop: source: hub downloads WebShop's data with gdown, which is not installed; "
            "`pip install gdown`, or set tasks.webshop.hub.data_dir to a folder that already holds "
            f"{', '.join(GDRIVE_IDS)}, or use source: offline"
        )
    return [sys.executable, "-m", "gdown"]


def data_fingerprint(folder: Path) -> dict:
    """sha256 of each file the goals are built from."""
    return {name: hashlib.sha256((Path(folder) / name).read_bytes()).hexdigest() for name in REQUIRED}


# -- products and goals (WebShop's, re-implemented) -------------------------------------------
def load_products(folder: Path, num_products: int | None = NUM_PRODUCTS) -> list[dict]:
    """The products engine.load_products keeps (synthetic goals: human_goals unset), in file
    order: raw records (KEPT_FIELDS, `attributes` when items_ins_v2 has them) prepared with
    public.prepare_product, plus `instruction_text` and `instruction_attributes`."""
    records = json.loads((Path(folder) / PRODUCTS_JSON).read_text())
    annotations = json.loads((Path(folder) / ATTRIBUTES_JSON).read_text())
    if num_products is not None:
        records = records[:num_products]  # items_shuffle is already shuffled
    seen: set[str] = set()
    products = []
    for record in records:
        asin = record["asin"]
        if asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        if asin not in annotations:
            raise ValueError(
                f"webshop: product {asin} of {PRODUCTS_JSON} has no entry in {ATTRIBUTES_JSON} (WebShop's loader "
                "fails there too): hub.data_dir must hold the matching files of WebShop's data"
            )
        annotation = annotations[asin]
        raw = {key: record.get(key) for key in KEPT_FIELDS}
        if "attributes" in annotation:  # else WebShop's ['DUMMY_ATTR']
            raw["attributes"] = annotation["attributes"]
        product = public.prepare_product(raw)
        product["instruction_text"] = annotation.get("instruction")
        product["instruction_attributes"] = annotation.get("instruction_attributes")
        products.append(product)
    return products


def draw_prices(products: list[dict], rng: Random) -> dict[str, float]:
    """generate_product_prices: ASIN -> the price a purchase is judged by."""
    prices = {}
    for product in products:
        pricing = product["pricing"]
        if not pricing:
            prices[product["asin"]] = 100.0
        elif len(pricing) == 1:
            prices[product["asin"]] = pricing[0]
        else:
            prices[product["asin"]] = rng.uniform(*pricing[:2])
    return prices


def synthetic_goals(products: list[dict], prices: dict[str, float], rng: Random) -> list[dict]:
    """get_synthetic_goals, in product order (before the shuffle); goals keep WebShop's keys
    (instruction_text, ...)."""
    goals: list[dict] = []
    attribute_counts: dict[str, int] = defaultdict(int)
    for product in products:
        if product.get("instruction_text") is None:
            continue
        asin, attributes = product["asin"], product["instruction_attributes"]
        if not attributes:
            raise ValueError(f"webshop: product {asin} has an instruction but no instruction_attributes in {ATTRIBUTES_JSON}")
        bounds = [p for p in PRICE_RANGE if p > prices[asin]][:4]
        if len(bounds) >= 2:
            _, price_upper = sorted(rng.sample(bounds, 2))
            price_text = f", and price lower than {price_upper:.2f} dollars"
        else:
            price_upper, price_text = NO_BOUND, ""
        names = sorted(product["options"])
        for combination in itertools.product(*(product["options"][name] for name in names)):
            goal_options = dict(zip(names, combination))
            option_text = ", and ".join(f"{k}: {v}" for k, v in goal_options.items())
            option_text = " with " + option_text if option_text else ""
            goals.append(
                {
                    "asin": asin,
                    "category": product["category"],
                    "query": product["query"],
                    "name": product["Title"],
                    "product_category": product["product_category"],
                    "instruction_text": f"{product['instruction_text']}{option_text}{price_text}",
                    "attributes": attributes,
                    "price_upper": price_upper,
                    "goal_options": goal_options,
                }
            )
            for attribute in attributes:
                attribute_counts[attribute] += 1
    for goal in goals:
        goal["weight"] = sum(1.0 / attribute_counts[a] for a in goal["attributes"]) / len(goal["attributes"])
    return goals


def reference_goals(
    folder: Path, price_seed: int, num_products: int | None = NUM_PRODUCTS
) -> tuple[list[dict], dict[str, float], list[dict]]:
    """(products, ASIN -> price, goals in session order) of a WebShop text environment over
    `folder`'s data, its unseeded price draws taken from Random(price_seed)."""
    products = load_products(folder, num_products)
    rng = Random(price_seed)  # one stream, as WebShop's global random: the prices, then the bounds
    prices = draw_prices(products, rng)
    goals = synthetic_goals(products, prices, rng)
    Random(GOAL_SHUFFLE_SEED).shuffle(goals)  # random.seed(233); random.shuffle(self.goals)
    return products, prices, goals


def product_record(product: dict, price: float) -> dict:
    """A product as products.jsonl stores it: the raw fields, and the drawn `price`."""
    record = {key: product.get(key) for key in KEPT_FIELDS}
    if "attributes" in product:
        record["attributes"] = product["attributes"]
    record["price"] = price
    return record
