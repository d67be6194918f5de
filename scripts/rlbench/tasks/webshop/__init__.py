"""WebShop (L3): buy the product an instruction describes in a text web shop; success rate of the
submitted model under RD-Agent's evaluation protocol.

The shop, the reward and the prompt protocol are in public.py (the workspace's task.py). Two
sources:

- `offline` (default): a generated catalogue (`catalogue_size` products, generate.py) and
  synthetic goals in WebShop's style. A seeded quarter of the products (from `data_seed`) are
  the held-out targets; training goals (`train_size`) ask only for the other products, each with
  the scripted expert's winning trajectory; the held-out goals (`eval_size`) are drawn with the
  installation's secret salt and never share an instruction text with a training goal.
- `hub` with `hub.goals: synthetic` (default; the reference's): WebShop's small data (1,000
  products; `hub.data_dir`, else downloaded as RD-Agent does), its synthetic goals shuffled with
  seed 233 as `WebAgentTextEnv(observation_mode="text", num_products=1000)` builds them
  (hub_data.py; the price draws WebShop leaves unseeded come from `hub.price_seed`); sessions
  0..eval_size-1 are held out (RD-Agent's 100 instructions), the next `train_size` goals (none with
  a held-out instruction) are the agent's; the shop is played in-process over those products.
- `hub` with `hub.goals: human`: the original WebShop site (princeton-nlp/WebShop's Flask app,
  `hub.url`), whose goal pages `{url}/fixed_{i}` (its human goals) are the sessions; goals
  0..eval_size-1 are held out, the next `train_size` are the agent's (session indices only).

Goals are built by the workflow rule generate_games into results/levels/online/<task>/
{train,heldout}; prepare_train / prepare_eval turn them into the splits.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from rlbench.fileio.jsonio import read_jsonl, write_json, write_jsonl
from rlbench.tasks.base import EVAL_FILE, TRAIN_FILE, Task, require_salt, salt_fingerprint, salted_seed
from rlbench.tasks.capacity import SplitCapacity
from rlbench.tasks.parts import built_split
from rlbench.tasks.webshop import public
from rlbench.tasks.webshop.rollout import PRODUCTS_FILE, RewardScorer, WebShopRollout, goals_variant, hub_url

PUBLIC = Path(__file__).with_name("public.py")
#: RD-Agent's MIT notice: task.py carries its WebShop prompt strings.
RD_AGENT_LICENSE = Path(__file__).resolve().parents[2] / "assets" / "LICENSE-RD-Agent"
GOALS_FILE = "goals.jsonl"
MANIFEST = "manifest.json"
DEFAULT_TRAIN_GOALS = 400
DEFAULT_EVAL_GOALS = 100
DEFAULT_CATALOGUE = 300
GOAL_KEYS = (
    "asin",
    "category",
    "query",
    "name",
    "product_category",
    "attributes",
    "goal_options",
    "price_upper",
    "weight",
)

DESCRIPTION = """\
# Task: WebShop (interactive online shopping)

Improve the base model's success rate on WebShop: a text web shop where the model must find and
buy the product an instruction describes ("i am looking for a long lasting eye shadow palette
with color: dark brown, and price lower than 40.00 dollars") by searching, opening products,
choosing options and clicking Buy Now, one action per step. This is an interactive task: the
reward comes from whole shopping episodes, not from single answers.

- Training data: {train_desc}
- Environment: `task.py` is the shop the grader uses.{env_desc}
- Evaluation: {eval_desc}, played with the protocol in `task.py`:
  - at every step the model gets a chat (`task.messages`, RD-Agent's prompt): a system message
    (output only one action), then a task line, the instruction, the page's available actions
    (`search[<your query>]` when the page has a search bar, `click[...]` for each clickable), four
    rules, the last 5 steps as `Observation k` (the page after action k) / `Action k`, then the
    current page again as `Observation <n+1>` and `Action <n+1>:`;
  - greedy decoding, at most {max_new_tokens} new tokens, stop at the first newline; the reply
    goes through `task.clean_action` and then to the shop;
  - actions: `search[keywords]` (from any page) or `click[x]` with x one of the page's
    clickables; anything else changes nothing;
  - only Buy Now ends an episode, with reward `task.get_reward`: the share of matched goal
    attributes, goal options and the price bound (each a slot), times a product-type factor
    (0 / 0.1 / 0.5 / 1); no purchase within {max_steps} steps, or a prompt that outgrows the
    model's context, scores 0.
- Metric: success rate, the percentage of held-out episodes with reward >= 0.5 (0-100);
  the mean reward x 100 and the percentage with reward 1 (WebShop's own measures), mean steps
  and context losses are reported beside it.
"""

OFFLINE_TRAIN = """`data/train.jsonl`, {train} goals, one JSON object per line: `id`,
  `instruction`, the target `asin`, `attributes`, `goal_options` (option name -> value),
  `price_upper`, `category`, `query`, `name`, `product_category`, `weight`, and `expert`: a
  scripted shopper's winning trajectory (`action` / `observation` pairs, the observation being the
  page after the action, as the prompt's history shows it; `expert_reward` 1.0;
  `task.expert_chats` turns one into the grader's prompts). `data/products.jsonl` is the shop's
  catalogue ({catalogue} products)."""
OFFLINE_ENV = """
  `task.Catalogue(task.load_products("data/products.jsonl"))` builds the shop once;
  `task.WebShopEnv(catalogue)` plays one episode (`reset(goal_row)`, `step(action)` ->
  observation, reward, done, info; `available_actions()`, `get_instruction_text()`); use it on
  the training goals to collect trajectories and rewards (online RL)."""
OFFLINE_EVAL = """{eval} held-out goals that you never see, in the same shop, each asking for
  a product that no training goal asks for"""
SYNTHETIC_TRAIN = """`data/train.jsonl`, {train} goals of WebShop's text environment (its
  synthetic goals over its 1,000-product data, sessions {first} onwards, none with a held-out
  instruction), one JSON object per line: `id`, `session`, `instruction`, the target `asin`,
  `attributes`, `goal_options` (option name -> value), `price_upper`, `category`, `query`,
  `name`, `product_category`, `weight`. `data/products.jsonl` is the shop's catalogue (WebShop's
  products, each with the `price` a purchase is judged by)."""
SYNTHETIC_EVAL = """WebShop's synthetic goals 0..{last} (RD-Agent's {eval} instructions), in the
  same shop"""
HUB_TRAIN = """`data/train.jsonl`, {train} rows `id`, `session`: goal indices of the original
  WebShop site (goals {first}..{last}; the goals themselves live on the server)."""
HUB_ENV = """
  `task.HubWebShopEnv(url)` plays the original WebShop site at {url} (`reset(session)`,
  `step(action)`, as WebShopEnv)."""
HUB_EVAL = """the site's goals 0..{last} ({eval} instructions)"""


class WebShop(Task):
    name = "webshop"
    public_module_path = PUBLIC

    # -- goals: built by the generate_games rule --------------------------------------------
    def build_games(
        self, settings: dict, split: str, out_dir: Path, *, salt: str | None = None, workers: int = 1
    ) -> dict:
        """Write the goals of `split` ("train" or "heldout") to out_dir (goals.jsonl, the
        catalogue products.jsonl for the offline source, manifest.json); returns the manifest."""
        if split not in ("train", "heldout"):
            raise ValueError(f"unknown WebShop split {split!r} (train or heldout)")
        out_dir = Path(out_dir)
        if settings.get("source", "offline") == "hub":
            return self._hub_goals(settings, split, out_dir)
        from rlbench.tasks.webshop import generate

        data_seed = int(settings.get("data_seed", 0))
        train_size = settings.get("train_size") or DEFAULT_TRAIN_GOALS
        catalogue = generate.generate_catalogue(data_seed, settings.get("catalogue_size") or DEFAULT_CATALOGUE)
        train = generate.training_goals(catalogue, data_seed, train_size)
        if split == "train":
            goals = train
        else:
            seed = salted_seed(require_salt(salt, self.name), self.name, data_seed)
            goals = generate.heldout_goals(
                catalogue, seed, settings.get("eval_size") or DEFAULT_EVAL_GOALS, {g["instruction"] for g in train}
            )
        env = public.WebShopEnv(public.Catalogue(list(catalogue.products)))
        for goal in goals:  # every goal must be winnable: the expert buys it with reward 1
            trajectory, reward = generate.expert_trajectory(env, goal)
            if reward != 1.0:
                raise RuntimeError(f"the expert scores {reward} on generated goal {goal['id']}: a generator bug")
            if split == "train":
                goal.update(expert=trajectory, expert_reward=reward)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_jsonl(out_dir / PRODUCTS_FILE, catalogue.products)
        write_jsonl(out_dir / GOALS_FILE, goals)
        manifest = {
            "source": "offline",
            "split": split,
            "summary": {
                "goals": len(goals),
                "products": len(catalogue.products),
                "target_products": len({g["asin"] for g in goals}),
                "goals_with_options": sum(bool(g["goal_options"]) for g in goals),
            },
        }
        write_json(out_dir / MANIFEST, manifest)
        return manifest

    def _hub_goals(self, settings: dict, split: str, out_dir: Path) -> dict:
        """hub.goals synthetic: the reference's goals (hub_data.reference_goals), sessions
        0..eval_size-1 held out, the next train_size (skipping held-out instructions) for training,
        with WebShop's products. hub.goals human: session indices of the original site (its first
        goal page is fetched: the server must answer)."""
        eval_size = settings.get("eval_size") or DEFAULT_EVAL_GOALS
        train_size = settings.get("train_size") or DEFAULT_TRAIN_GOALS
        if goals_variant(settings) == "synthetic":
            return self._synthetic_goals(settings, split, out_dir, eval_size, train_size)
        public.HubWebShopEnv(hub_url(settings)).reset(0)
        sessions = range(eval_size) if split == "heldout" else range(eval_size, eval_size + train_size)
        rows = [{"id": f"{split}-{i:05d}", "session": i} for i in sessions]
        out_dir.mkdir(parents=True, exist_ok=True)
        write_jsonl(out_dir / GOALS_FILE, rows)
        manifest = {
            "source": "hub",
            "goals": "human",
            "split": split,
            "summary": {"goals": len(rows), "first_session": sessions.start, "goals_variant": "human"},
        }
        write_json(out_dir / MANIFEST, manifest)
        return manifest

    def _synthetic_goals(self, settings: dict, split: str, out_dir: Path, eval_size: int, train_size: int) -> dict:
        from rlbench.tasks.webshop import hub_data

        folder = hub_data.data_dir(settings)
        price_seed = int((settings.get("hub") or {}).get("price_seed") or 0)
        products, prices, goals = hub_data.reference_goals(folder, price_seed)
        if eval_size > len(goals):
            raise ValueError(f"webshop: eval_size {eval_size} exceeds the {len(goals)} synthetic goals of {folder}")
        heldout_texts = {g["instruction_text"] for g in goals[:eval_size]}
        if split == "heldout":
            sessions = list(range(eval_size))
        else:
            sessions = [i for i in range(eval_size, len(goals)) if goals[i]["instruction_text"] not in heldout_texts]
            if len(sessions) < train_size:
                raise ValueError(
                    f"webshop: train_size {train_size} exceeds the {len(sessions)} synthetic goals of {folder} after "
                    f"the {eval_size} held-out sessions; ask for fewer"
                )
            sessions = sessions[:train_size]
        rows = []
        for i in sessions:
            goal = goals[i]
            rows.append(
                {
                    "id": f"{split}-{i:05d}",
                    "session": i,
                    "instruction": goal["instruction_text"],
                    **{k: goal[k] for k in GOAL_KEYS},
                }
            )
        out_dir.mkdir(parents=True, exist_ok=True)
        write_jsonl(out_dir / PRODUCTS_FILE, [hub_data.product_record(p, prices[p["asin"]]) for p in products])
        write_jsonl(out_dir / GOALS_FILE, rows)
        manifest = {
            "source": "hub",
            "goals": "synthetic",
            "split": split,
            "protocol": "WebAgentTextEnv(observation_mode='text', num_products=1000) synthetic goals, "
            f"random.seed({hub_data.GOAL_SHUFFLE_SEED}) shuffle, goal i = session i",
            "data_files": hub_data.data_fingerprint(folder),
            "summary": {
                "goals_variant": "synthetic",
                "price_seed": price_seed,
                "goal_shuffle_seed": hub_data.GOAL_SHUFFLE_SEED,
                "num_products": hub_data.NUM_PRODUCTS,
                "goals": len(rows),
                "products": len(products),
                "goals_available": len(goals),
                "first_session": sessions[0] if sessions else None,
                "last_session": sessions[-1] if sessions else None,
                "skipped_heldout_instructions": (sessions[-1] + 1 - eval_size - len(sessions)) if sessions and split == "train" else 0,
            },
        }
        write_json(out_dir / MANIFEST, manifest)
        return manifest

    # -- splits -------------------------------------------------------------------------
    def split_sizes(self, settings: dict) -> tuple[int, int]:
        return settings.get("train_size") or DEFAULT_TRAIN_GOALS, settings.get("eval_size") or DEFAULT_EVAL_GOALS

    def split_capacity(self, settings: dict) -> SplitCapacity | None:
        """offline: the distinct instructions the generated catalogue can ask for about its training and
        its held-out target products (generate.goal_capacity); hub: no bound known here (the site's goals)."""
        if _is_hub(settings):
            goals_variant(settings)  # a bad hub.goals is refused when the config is checked
            return None
        from rlbench.tasks.webshop import generate

        size = settings.get("catalogue_size") or DEFAULT_CATALOGUE
        catalogue = generate.generate_catalogue(int(settings.get("data_seed", 0)), size)
        train = generate.goal_capacity(catalogue, catalogue.train_asins)
        held_out = generate.goal_capacity(catalogue, catalogue.heldout_asins)
        return SplitCapacity(
            source=f"the generated catalogue of catalogue_size {size} ({train:,} distinct instructions about its "
            f"training products, {held_out:,} about its held-out ones)",
            train=train,
            eval=held_out,
            grows_with="catalogue_size",
        )

    def prepare_train(self, settings: dict, train_dir: Path, *, sources: dict | None = None) -> dict:
        goals_dir = built_split(sources, "train_games", "WebShop")
        train_dir = Path(train_dir)
        train_dir.mkdir(parents=True, exist_ok=True)
        goals = list(read_jsonl(goals_dir / GOALS_FILE))
        variant = goals_variant(settings)
        if variant == "human":
            rows = [{"id": g["id"], "session": g["session"]} for g in goals]
        elif variant == "synthetic":
            rows = [{"id": g["id"], "session": g["session"], "instruction": g["instruction"], **{k: g[k] for k in GOAL_KEYS}} for g in goals]
            shutil.copyfile(goals_dir / PRODUCTS_FILE, train_dir / PRODUCTS_FILE)
        else:
            rows = [
                {
                    "id": g["id"],
                    "instruction": g["instruction"],
                    **{k: g[k] for k in GOAL_KEYS},
                    "expert": g["expert"],
                    "expert_reward": g["expert_reward"],
                }
                for g in goals
            ]
            shutil.copyfile(goals_dir / PRODUCTS_FILE, train_dir / PRODUCTS_FILE)
        write_jsonl(train_dir / TRAIN_FILE, rows)
        return {
            "task": self.name,
            "source": settings.get("source", "offline"),
            "goals": variant,
            "train_rows": len(rows),
            "train_goals_manifest": json.loads((goals_dir / MANIFEST).read_text()).get("summary", {}),
        }

    def prepare_eval(
        self, settings: dict, train_dir: Path, eval_dir: Path, *, salt: str | None = None, sources: dict | None = None
    ) -> dict:
        goals_dir = built_split(sources, "heldout_games", "WebShop")
        eval_dir = Path(eval_dir)
        eval_dir.mkdir(parents=True, exist_ok=True)
        rows = list(read_jsonl(goals_dir / GOALS_FILE))
        train_rows = list(read_jsonl(Path(train_dir) / TRAIN_FILE))
        # Disjoint by construction; checked again on what is actually written.
        variant = goals_variant(settings)
        if variant == "human":
            shared = sorted({r["session"] for r in rows} & {r["session"] for r in train_rows})
            what = "sessions"
        elif variant == "synthetic":
            shared = sorted({r["session"] for r in rows} & {r["session"] for r in train_rows})
            shared += sorted({r["instruction"] for r in rows} & {r["instruction"] for r in train_rows})
            what = "sessions or instructions"
            shutil.copyfile(goals_dir / PRODUCTS_FILE, eval_dir / PRODUCTS_FILE)
        else:
            shared = sorted({r["instruction"] for r in rows} & {r["instruction"] for r in train_rows})
            shared += sorted({r["asin"] for r in rows} & {r["asin"] for r in train_rows})
            what = "instructions or target products"
            shutil.copyfile(goals_dir / PRODUCTS_FILE, eval_dir / PRODUCTS_FILE)
        if shared:
            raise RuntimeError(
                f"{len(shared)} held-out WebShop {what} are also in the training split: {shared[:5]} (the training "
                "goals must be built with the same eval_size as the held-out ones)"
            )
        write_jsonl(eval_dir / EVAL_FILE, rows)
        result = {
            "goals": variant,
            "eval_rows": len(rows),
            "heldout_goals_manifest": json.loads((goals_dir / MANIFEST).read_text()).get("summary", {}),
        }
        if not _is_hub(settings):
            result["salt_sha256"] = salt_fingerprint(require_salt(salt, self.name))
        return result

    def describe(self, settings: dict) -> str:
        environment = settings.get("environment") or {}
        train = settings.get("train_size") or DEFAULT_TRAIN_GOALS
        eval_size = settings.get("eval_size") or DEFAULT_EVAL_GOALS
        variant = goals_variant(settings)
        if variant == "human":
            url = (settings.get("hub") or {}).get("url") or "hub.url"
            train_desc = HUB_TRAIN.format(train=train, first=eval_size, last=eval_size + train - 1)
            env_desc, eval_desc = HUB_ENV.format(url=url), HUB_EVAL.format(last=eval_size - 1, eval=eval_size)
        elif variant == "synthetic":
            train_desc = SYNTHETIC_TRAIN.format(train=train, first=eval_size)
            env_desc, eval_desc = OFFLINE_ENV, SYNTHETIC_EVAL.format(last=eval_size - 1, eval=eval_size)
        else:
            catalogue = settings.get("catalogue_size") or DEFAULT_CATALOGUE
            train_desc = OFFLINE_TRAIN.format(train=train, catalogue=catalogue)
            env_desc, eval_desc = OFFLINE_ENV, OFFLINE_EVAL.format(eval=eval_size)
        return DESCRIPTION.format(
            train_desc=train_desc,
            env_desc=env_desc,
            eval_desc=eval_desc,
            max_new_tokens=settings.get("max_new_tokens") or public.MAX_NEW_TOKENS,
            max_steps=environment.get("max_steps") or public.MAX_STEPS,
        )

    def exposed_files(self, settings: dict) -> dict:
        return {"task.py": PUBLIC, "LICENSE-RD-Agent-prompts": RD_AGENT_LICENSE}

    def training_split_keys(self, settings: dict) -> tuple[str, ...]:
        # The reference's goals: training goals are the sessions after the held-out ones.
        return ("eval_size",) if _is_hub(settings) else ()

    # -- evaluation -----------------------------------------------------------------------
    def rollout(self, settings: dict):
        return WebShopRollout(settings)

    def scorer(self, settings: dict):
        return RewardScorer(goals_variant(settings))


def _is_hub(settings: dict) -> bool:
    return settings.get("source", "offline") == "hub"


TASK_CLASS = WebShop
