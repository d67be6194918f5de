"""The offline WebShop shop: a seeded product catalogue, synthetic goals and a scripted expert.

The catalogue imitates WebShop's product records (asin, name, query, product_category path with
`›`, description, bullet points, pricing string, customization options, attributes) over a fixed
table of product types. Goals follow WebShop's `get_synthetic_goals`: a target product, a subset
of its attributes, one value per option, an instruction text, a price bound drawn from the first
four multiples of 10 above the product's price (seeded here; WebShop's draw is not), and a weight.

The split is a partition of the products: a seeded quarter of them (from `data_seed`, see
`HELDOUT_SHARE`) are held-out targets, the rest training targets, so no held-out goal ever asks
for a product a training goal asks for. Training goals are drawn with `data_seed`; held-out
goals with the salted seed, skipping any instruction text a training goal already has.

Everything is drawn from `random.Random` instances seeded with fixed strings or integers, so the
same seeds always give byte-identical products and goals.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from random import Random

from rlbench.tasks.webshop import public

HELDOUT_SHARE = 0.25
ASIN_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
MAX_GOAL_ATTRIBUTES = 3


@dataclass(frozen=True)
class ProductType:
    """One kind of product: where it sits, how it is searched for, what it can be."""

    category: str  # WebShop's short category
    path: str  # product_category, `›`-separated
    query: str  # the search query the product was "scraped" with
    title: str  # the type's noun phrase in titles (spaCy must find nouns in it)
    article: str  # "a", "an" or "some", for instructions
    variants: tuple[str, ...]  # title endings
    attributes: tuple[str, ...]
    options: tuple[tuple[str, tuple[str, ...]], ...]  # option name -> values
    price: tuple[float, float]  # range of the (low) price


BEAUTY_EYES = "Beauty & Personal Care › Makeup › Eyes"
HAIR = "Beauty & Personal Care › Hair Care › Shampoo & Conditioner"
SKIN = "Beauty & Personal Care › Skin Care › Face"
MEN_SHIRTS = "Clothing, Shoes & Jewelry › Men › Clothing › Shirts"
WOMEN_DRESSES = "Clothing, Shoes & Jewelry › Women › Clothing › Dresses"
MEN_SHOES = "Clothing, Shoes & Jewelry › Men › Shoes › Athletic"
SNACKS = "Grocery & Gourmet Food › Snacks › Chips & Crisps"
BARS = "Grocery & Gourmet Food › Snacks › Nutrition Bars"
COFFEE = "Grocery & Gourmet Food › Beverages › Coffee"
LIVING = "Home & Kitchen › Furniture › Living Room Furniture"
BEDDING = "Home & Kitchen › Bedding › Sheets & Pillowcases"
COOKWARE = "Home & Kitchen › Kitchen & Dining › Cookware"
AUDIO = "Electronics › Headphones › Earbud Headphones"
KEYBOARDS = "Electronics › Computers & Accessories › Keyboards"
CHARGERS = "Electronics › Accessories › Chargers & Adapters"
YOGA = "Sports & Outdoors › Exercise & Fitness › Yoga"
HYDRATION = "Sports & Outdoors › Outdoor Recreation › Hydration"
DOGS = "Pet Supplies › Dogs › Toys & Food"

PRODUCT_TYPES: tuple[ProductType, ...] = (
    ProductType("beauty", BEAUTY_EYES, "eye shadow palette", "Eye Shadow Palette", "an",
                ("with Mirror", "Matte and Shimmer", "12 Shades", "for Everyday Looks"),
                ("long lasting", "cruelty free", "paraben free", "highly pigmented", "easy to apply", "travel size"),
                (("color", ("dark brown", "rose gold", "nude", "smoky black", "plum")), ("size", ("mini", "full size"))),
                (9, 45)),
    ProductType("beauty", BEAUTY_EYES, "mascara", "Volumizing Mascara", "a",
                ("for Sensitive Eyes", "with Curved Brush", "Smudge Proof Formula"),
                ("long lasting", "waterproof", "cruelty free", "clump free", "easy to remove"),
                (("color", ("black", "brown black", "dark brown")), ("count", ("pack of 1", "pack of 2", "pack of 3"))),
                (5, 25)),
    ProductType("beauty", BEAUTY_EYES, "eyeliner pencil", "Eyeliner Pencil", "an",
                ("with Sharpener", "Retractable Tip", "Ultra Fine Line"),
                ("long lasting", "waterproof", "smudge proof", "cruelty free", "easy to apply"),
                (("color", ("black", "brown", "navy", "charcoal")), ("count", ("pack of 1", "pack of 2"))),
                (4, 20)),
    ProductType("beauty", HAIR, "shampoo", "Shampoo", "a",
                ("for Dry Hair", "Daily Care Formula", "Salon Formula"),
                ("sulfate free", "paraben free", "natural ingredients", "color safe", "dry hair", "cruelty free"),
                (("size", ("8 ounce", "16 ounce", "32 ounce")), ("scent", ("coconut", "lavender", "argan oil", "unscented"))),
                (6, 30)),
    ProductType("beauty", HAIR, "hair conditioner", "Hair Conditioner", "a",
                ("for Curly Hair", "Deep Moisture", "with Argan Oil"),
                ("sulfate free", "silicone free", "natural ingredients", "damaged hair", "cruelty free"),
                (("size", ("8 ounce", "16 ounce", "33.8 ounce")), ("scent", ("coconut", "citrus", "unscented"))),
                (6, 30)),
    ProductType("beauty", SKIN, "face moisturizer", "Face Moisturizer", "a",
                ("with Hyaluronic Acid", "Lightweight Gel Cream", "for Day and Night"),
                ("oil free", "fragrance free", "sensitive skin", "non comedogenic", "dermatologist tested"),
                (("size", ("1.7 ounce", "2.5 ounce", "3.4 ounce")),),
                (8, 48)),
    ProductType("fashion", MEN_SHIRTS, "men's t-shirts", "Crew Neck T-Shirt", "a",
                ("for Men", "Short Sleeve Tee", "Classic Fit"),
                ("machine washable", "cotton blend", "tagless", "moisture wicking", "regular fit"),
                (("color", ("black", "white", "navy blue", "heather gray", "olive green")),
                 ("size", ("small", "medium", "large", "x-large"))),
                (9, 35)),
    ProductType("fashion", MEN_SHIRTS, "men's polo shirts", "Polo Shirt", "a",
                ("for Men", "Pique Cotton", "Slim Fit Golf Shirt"),
                ("machine washable", "button closure", "quick drying", "slim fit", "short sleeve"),
                (("color", ("black", "white", "burgundy", "royal blue")), ("size", ("small", "medium", "large", "x-large"))),
                (14, 45)),
    ProductType("fashion", WOMEN_DRESSES, "women's dresses", "Maxi Dress", "a",
                ("for Women", "Floral Print Summer Dress", "with Pockets"),
                ("machine washable", "short sleeve", "v neck", "elastic waist", "lightweight fabric"),
                (("color", ("black", "navy blue", "floral pink", "coral")), ("size", ("small", "medium", "large"))),
                (19, 60)),
    ProductType("fashion", MEN_SHOES, "men's running shoes", "Running Shoes", "some",
                ("for Men", "Breathable Mesh Sneakers", "Lightweight Trainers"),
                ("non slip", "rubber sole", "breathable mesh", "arch support", "lace up"),
                (("color", ("black", "gray", "blue", "white")), ("size", ("8", "9", "10", "11", "12"))),
                (29, 95)),
    ProductType("grocery", SNACKS, "potato chips", "Kettle Potato Chips", "some",
                ("Snack Bags", "Family Size", "Variety Pack"),
                ("gluten free", "non gmo", "kettle cooked", "individually wrapped", "low sodium"),
                (("flavor", ("sea salt", "barbecue", "salt and vinegar", "jalapeno")), ("count", ("pack of 6", "pack of 12", "pack of 24"))),
                (8, 30)),
    ProductType("grocery", BARS, "protein bars", "Protein Bar", "a",
                ("20g Protein", "Meal Replacement Snack", "Variety Pack"),
                ("high protein", "gluten free", "low sugar", "keto friendly", "individually wrapped"),
                (("flavor", ("chocolate chip", "peanut butter", "cookie dough", "vanilla almond")), ("count", ("pack of 12", "pack of 24"))),
                (15, 40)),
    ProductType("grocery", COFFEE, "ground coffee", "Ground Coffee", "some",
                ("Medium Roast Blend", "Premium Arabica Beans", "Bag"),
                ("fair trade", "usda organic", "non gmo", "arabica beans", "rich flavor"),
                (("flavor", ("medium roast", "dark roast", "french vanilla", "hazelnut")), ("size", ("12 ounce", "2 pound"))),
                (7, 32)),
    ProductType("furniture", LIVING, "coffee table", "Coffee Table", "a",
                ("with Storage Shelf", "for Living Room", "Rectangle Cocktail Table"),
                ("easy assembly", "solid wood", "mid century", "storage space", "living room"),
                (("color", ("walnut", "white", "black", "rustic oak")),),
                (60, 240)),
    ProductType("furniture", LIVING, "bookshelf", "Bookshelf", "a",
                ("5 Tier Storage Rack", "Open Display Shelf", "for Home Office"),
                ("easy assembly", "space saving", "industrial style", "sturdy metal frame", "home office"),
                (("color", ("rustic brown", "white", "black")), ("size", ("3 tier", "4 tier", "5 tier"))),
                (40, 180)),
    ProductType("furniture", BEDDING, "bed sheets", "Bed Sheet Set", "a",
                ("4 Piece Microfiber Set", "Hotel Luxury Sheets", "with Pillowcases"),
                ("deep pocket", "machine washable", "breathable", "wrinkle free", "hotel quality"),
                (("color", ("white", "gray", "navy blue", "sage green")), ("size", ("twin", "full", "queen", "king"))),
                (20, 70)),
    ProductType("furniture", COOKWARE, "nonstick frying pan", "Nonstick Frying Pan", "a",
                ("with Lid", "Granite Skillet", "for Everyday Cooking"),
                ("dishwasher safe", "oven safe", "induction compatible", "easy to clean", "stay cool handle"),
                (("size", ("8 inch", "10 inch", "12 inch")),),
                (18, 65)),
    ProductType("electronics", AUDIO, "wireless earbuds", "Wireless Earbuds", "some",
                ("with Charging Case", "Bluetooth Headphones", "for Sports"),
                ("noise cancelling", "water resistant", "long battery life", "fast charging", "built in microphone"),
                (("color", ("black", "white", "navy blue")),),
                (19, 120)),
    ProductType("electronics", KEYBOARDS, "wireless keyboard", "Wireless Keyboard", "a",
                ("for Windows and Mac", "Quiet Keys", "with Number Pad"),
                ("rechargeable battery", "quiet typing", "ergonomic design", "multi device", "plug and play"),
                (("color", ("black", "white", "pink")), ("style", ("full size", "compact"))),
                (20, 90)),
    ProductType("electronics", CHARGERS, "usb c charger", "USB C Charger", "a",
                ("Fast Wall Charger", "Compact Power Adapter", "for Phone and Tablet"),
                ("fast charging", "compact design", "foldable plug", "overheat protection"),
                (("style", ("20w", "30w", "65w")), ("count", ("1 pack", "2 pack"))),
                (9, 45)),
    ProductType("sports", YOGA, "yoga mat", "Yoga Mat", "a",
                ("with Carrying Strap", "Extra Thick Exercise Mat", "for Pilates and Floor Workouts"),
                ("non slip", "eco friendly", "extra thick", "lightweight", "easy to clean"),
                (("color", ("purple", "black", "teal", "blue")), ("size", ("4mm", "6mm", "8mm"))),
                (15, 60)),
    ProductType("sports", HYDRATION, "water bottle", "Insulated Water Bottle", "an",
                ("with Straw Lid", "Stainless Steel Flask", "for Sports and Travel"),
                ("bpa free", "leak proof", "double wall insulated", "dishwasher safe", "keeps drinks cold"),
                (("size", ("18 ounce", "32 ounce", "40 ounce")), ("color", ("black", "white", "green", "blue"))),
                (12, 45)),
    ProductType("pets", DOGS, "dog chew toys", "Dog Chew Toy", "a",
                ("for Aggressive Chewers", "Durable Rubber Bone", "Teething Toy"),
                ("non toxic", "durable rubber", "dental care", "easy to clean"),
                (("size", ("small", "medium", "large")),),
                (7, 28)),
    ProductType("pets", DOGS, "dry dog food", "Dry Dog Food", "some",
                ("for Adult Dogs", "Natural Recipe", "High Protein Kibble"),
                ("grain free", "high protein", "no artificial preservatives", "made in usa"),
                (("flavor", ("chicken and rice", "lamb and rice", "salmon")), ("size", ("5 pound", "15 pound", "30 pound"))),
                (15, 80)),
)  # fmt: skip

BRANDS = (
    "Lumora", "Brightfield", "Cobaltine", "Vessara", "Oakhurst", "Pennywise", "Quillon", "Marlowe",
    "Zentrix", "Halcyra", "Norvale", "Ridgeway", "Solenne", "Tamsin", "Verdance", "Wrenley",
    "Ashgrove", "Bellcourt", "Caldera", "Dunmore", "Everly", "Fenwick", "Glenhaven", "Harlow",
)  # fmt: skip
BENEFITS = (
    "made for everyday use", "tested for quality and safety", "a thoughtful gift idea",
    "backed by our satisfaction guarantee", "designed with care", "loved by thousands of customers",
)  # fmt: skip
INSTRUCTION_TEMPLATES = (
    "i am looking for {article} {attributes} {query}",
    "i need {article} {query} that is {attributes}",
    "find me {article} {attributes} {query}",
    "i want to buy {article} {query} which is {attributes}",
)


@dataclass(frozen=True)
class GeneratedCatalogue:
    """The raw product records (products.jsonl, catalogue order) and the partition of their
    ASINs into training and held-out targets (never written where an agent can read it)."""

    products: tuple[dict, ...]
    train_asins: tuple[str, ...]
    heldout_asins: tuple[str, ...]

    def by_asin(self, asin: str) -> dict:
        return next(p for p in self.products if p["asin"] == asin)


# -- the catalogue -----------------------------------------------------------------------------
def _asin(rng: Random, taken: set[str]) -> str:
    while True:
        asin = "B0" + "".join(rng.choice(ASIN_ALPHABET) for _ in range(8))
        if asin not in taken:
            taken.add(asin)
            return asin


def _cents(value: float) -> float:
    """A shop price: whole dollars and 99 cents."""
    return math.floor(value) + 0.99


def _product(kind: ProductType, rng: Random, asin: str, titles: set[str]) -> dict:
    attributes = rng.sample(kind.attributes, rng.randint(min(3, len(kind.attributes)), len(kind.attributes)))
    while True:
        brand, variant = rng.choice(BRANDS), rng.choice(kind.variants)
        lead = attributes[0].title() + " " if rng.random() < 0.4 else ""
        title = f"{brand} {lead}{kind.title} {variant}"
        if title not in titles:
            titles.add(title)
            break
    options = {}  # in name order, as products.jsonl (sorted keys) stores them
    for name, values in sorted(kind.options):
        if rng.random() < 0.8:
            chosen = rng.sample(values, rng.randint(min(2, len(values)), len(values)))
            options[name] = [{"value": value, "image": None} for value in chosen]
    low = _cents(rng.uniform(*kind.price))
    if rng.random() < 0.3:
        high = low + rng.randint(3, 20)
        pricing, price = f"${low:.2f} - ${high:.2f}", round(rng.uniform(low, high), 2)
    else:
        pricing, price = f"${low:.2f}", low
    noun = kind.title.lower()
    description = (
        f"The {brand} {noun} is {' and '.join(attributes[:2])}. "
        f"{variant} - {rng.choice(BENEFITS)}. Shop {kind.query} from {brand} with confidence."
    )
    bullets = [f"{attribute.upper()}: this {noun} is {rng.choice(BENEFITS)}" for attribute in attributes]
    return {
        "asin": asin,
        "name": title,
        "category": kind.category,
        "query": kind.query,
        "product_category": kind.path,
        "full_description": description,
        "small_description": bullets,
        "pricing": pricing,
        "price": price,
        "customization_options": options,
        "attributes": attributes,
        "images": [],
    }


def generate_catalogue(data_seed: int, n_products: int = 300) -> GeneratedCatalogue:
    """`n_products` products spread evenly over PRODUCT_TYPES, in a seeded order, with a seeded
    HELDOUT_SHARE of them set aside as held-out targets."""
    rng = Random(f"webshop-catalogue-{data_seed}")
    taken: set[str] = set()
    titles: set[str] = set()
    products = [
        _product(PRODUCT_TYPES[i % len(PRODUCT_TYPES)], rng, _asin(rng, taken), titles) for i in range(n_products)
    ]
    rng.shuffle(products)
    asins = [p["asin"] for p in products]
    heldout = set(Random(f"webshop-partition-{data_seed}").sample(asins, max(1, round(HELDOUT_SHARE * len(asins)))))
    return GeneratedCatalogue(
        products=tuple(products),
        train_asins=tuple(a for a in asins if a not in heldout),
        heldout_asins=tuple(a for a in asins if a in heldout),
    )


# -- goals -------------------------------------------------------------------------------------
def _bound_candidates(price: float) -> list[int]:
    """The first four multiples of 10 (10..990) above `price`."""
    return [m for m in range(10, 1000, 10) if m > price][:4]


def price_bound(price: float, rng: Random) -> float | None:
    """WebShop's price bound: of the first four multiples of 10 (10..990) above `price`, the
    larger of two drawn at random; None (no bound) when fewer than two exist."""
    candidates = _bound_candidates(price)
    return float(max(rng.sample(candidates, 2))) if len(candidates) >= 2 else None


def instruction_text(
    product: dict, attributes: list[str], goal_options: dict, price_upper: float | None, rng: Random
) -> str:
    """'i am looking for a long lasting eye shadow palette with color: dark brown, and size:
    mini, and price lower than 40.00 dollars' (one of INSTRUCTION_TEMPLATES; options sorted)."""
    kind = next(k for k in PRODUCT_TYPES if k.query == product["query"] and k.path == product["product_category"])
    wanted = attributes[0] if len(attributes) == 1 else ", ".join(attributes[:-1]) + " and " + attributes[-1]
    text = rng.choice(INSTRUCTION_TEMPLATES).format(article=kind.article, attributes=wanted, query=kind.query)
    if goal_options:
        text += " with " + ", and ".join(f"{name}: {value}" for name, value in sorted(goal_options.items()))
    if price_upper is not None:
        text += f", and price lower than {price_upper:.2f} dollars"
    return text


def attribute_frequencies(catalogue: GeneratedCatalogue) -> Counter:
    return Counter(a for p in catalogue.products for a in p["attributes"])


def make_goal(product: dict, rng: Random, frequencies: Counter) -> dict:
    """One synthetic goal for `product`: 1-3 of its attributes, one value per option, a price
    bound and an instruction; weight = mean 1/frequency of its attributes (WebShop's)."""
    attributes = rng.sample(product["attributes"], rng.randint(1, min(MAX_GOAL_ATTRIBUTES, len(product["attributes"]))))
    goal_options = {
        name: rng.choice([entry["value"] for entry in values])
        for name, values in sorted(product["customization_options"].items())
    }
    bound = price_bound(product["price"], rng)
    return {
        "asin": product["asin"],
        "category": product["category"],
        "query": product["query"],
        "name": product["name"],
        "product_category": product["product_category"],
        "instruction": instruction_text(product, attributes, goal_options, bound, rng),
        "attributes": attributes,
        "goal_options": goal_options,
        "price_upper": bound if bound is not None else public.NO_PRICE_BOUND,
        "weight": sum(1 / frequencies[a] for a in attributes) / len(attributes),
    }


def goal_capacity(catalogue: GeneratedCatalogue, asins: Iterable[str]) -> int:
    """The most goals with distinct instructions make_goal can give about these target products: per
    product, its ordered choices of 1 to MAX_GOAL_ATTRIBUTES attributes x its option values x the price
    bounds price_bound can draw x the instruction templates. An upper bound (two products may share an
    instruction), known before any goal is drawn: the sizes a config may ask for."""
    total = 0
    for asin in asins:
        product = catalogue.by_asin(asin)
        n = len(product["attributes"])
        attributes = sum(math.perm(n, k) for k in range(1, min(MAX_GOAL_ATTRIBUTES, n) + 1))
        options = math.prod(len(values) for values in product["customization_options"].values())
        candidates = len(_bound_candidates(product["price"]))
        bounds = candidates - 1 if candidates >= 2 else 1  # the larger of two distinct candidates; or no bound
        total += attributes * options * bounds * len(INSTRUCTION_TEMPLATES)
    return total


def _draw_goals(
    catalogue: GeneratedCatalogue,
    asins: tuple[str, ...],
    rng: Random,
    n: int,
    prefix: str,
    exclude_instructions: Iterable[str],
) -> list[dict]:
    """`n` goals with distinct instructions, cycling over the target products in seeded rounds
    (every target gets a goal before any gets a second)."""
    frequencies = attribute_frequencies(catalogue)
    seen = set(exclude_instructions)
    goals: list[dict] = []
    for _ in range(max(1, 50 * n // max(1, len(asins)))):
        for asin in rng.sample(asins, len(asins)):
            goal = make_goal(catalogue.by_asin(asin), rng, frequencies)
            if goal["instruction"] in seen:
                continue
            seen.add(goal["instruction"])
            goals.append({"id": f"{prefix}-{len(goals):05d}", **goal})
            if len(goals) == n:
                return goals
    raise ValueError(
        f"only {len(goals)} distinct {prefix} goals fit in a catalogue of {len(catalogue.products)} products; ask for fewer"
    )


def training_goals(catalogue: GeneratedCatalogue, data_seed: int, n: int) -> list[dict]:
    """`n` goals on training targets, drawn with `data_seed`."""
    return _draw_goals(catalogue, catalogue.train_asins, Random(f"webshop-train-goals-{data_seed}"), n, "train", set())


def heldout_goals(
    catalogue: GeneratedCatalogue, seed: int, n: int, exclude_instructions: Iterable[str] = ()
) -> list[dict]:
    """`n` goals on held-out targets, drawn with `seed` (the salted seed), none with an
    instruction text in `exclude_instructions` (the training goals')."""
    return _draw_goals(catalogue, catalogue.heldout_asins, Random(seed), n, "heldout", set(exclude_instructions))


# -- the expert --------------------------------------------------------------------------------
def expert_trajectory(env: public.WebShopEnv, goal: dict) -> tuple[list[dict], float]:
    """A scripted shopper: search[<the target's title>], click the target (paging with 'next >'
    as needed), click each goal option value, buy. Returns ([{action, observation}], reward)."""
    steps: list[dict] = []

    def act(action: str) -> tuple[float, bool]:
        observation, reward, done, _info = env.step(action)
        steps.append({"action": action, "observation": observation})
        return reward, done

    env.reset(goal)
    target = env.catalogue.by_asin[goal["asin"]]
    act(f"search[{target['Title'].lower()}]")
    if goal["asin"] not in env.hits:
        raise ValueError(f"the expert's search for {target['Title']!r} does not find {goal['asin']}")
    for _ in range(env.hits.index(goal["asin"]) // public.PRODUCT_WINDOW):
        act(f"click[{public.NEXT}]")
    act(f"click[{goal['asin'].lower()}]")
    for value in goal["goal_options"].values():
        act(f"click[{value}]")
    reward, done = act(f"click[{public.BUY_NOW}]")
    if not done:
        raise ValueError(f"the expert could not buy {goal['asin']}")
    return steps, reward
