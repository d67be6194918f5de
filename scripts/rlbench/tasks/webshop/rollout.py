"""WebShop episodes: RD-Agent's evaluation loop, played in lockstep with continuous batching.

Every live episode is advanced together: one generation call per step with all live episodes'
chat prompts (public.messages rendered by the generator's chat template), then one step of each
episode's shop. At most `max_live` episodes are live at once; when one ends the next goal starts.
The shops step in-process: one WebShopEnv per episode over one shared Catalogue (the products and
their BM25 index: the offline catalogue, or WebShop's products for the hub source's synthetic goals),
or, for the hub source's human goals, one HubWebShopEnv per episode over the original site.

An episode ends at Buy Now (its reward), after max_steps steps (reward 0), or when its prompt no
longer fits the model's context (reward 0, `end: "context"`).

The prompt is rebuilt at every step (the page's actions, then a sliding window of the last steps)
and a turn is one short action, so the evaluation plays with the generator for rebuilt prompts
(`episode_generator`: generation.row_cache, each prompt from its longest cached prefix with no
padding, prompt-lookup drafts), not the lockstep batch decode of growing prompts.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from rlbench.generation.row_cache import for_rebuilt_prompts
from rlbench.tasks.parts import PhasedGenerator
from rlbench.tasks.webshop import public

PRODUCTS_FILE = "products.jsonl"


def episode_generator(generator):
    """The generator WebShop's episodes are played with, given the evaluation's text generator:
    generation.row_cache's for prompts rebuilt at every step over the same model (the hf
    backend), vLLM's and the reference loop as they are."""
    return for_rebuilt_prompts(generator)


def play_episodes(
    goals: dict,
    make_env: Callable[[], object],
    generator,
    *,
    max_steps: int = public.MAX_STEPS,
    max_new_tokens: int = public.MAX_NEW_TOKENS,
    max_live: int | None = None,
    timings: dict | None = None,
) -> dict:
    """Play every goal (key -> what `env.reset` takes) with `generator`; key -> episode record
    {reward, success, steps, end ("bought", "max_steps", "context"), actions}. `timings` (if
    given) gets generation_s and env_s added up (wall seconds)."""
    timings = timings if timings is not None else {}
    for name in ("generation_s", "env_s"):
        timings.setdefault(name, 0.0)
    keys = list(goals)
    width = max(1, min(len(keys), int(max_live or len(keys) or 1)))
    pending = list(keys)
    live: dict = {}  # key -> {"env", "instruction", "observation", "history", "record"}
    results: dict = {}

    def start() -> None:
        began = time.perf_counter()
        while pending and len(live) < width:
            key = pending.pop(0)
            env = make_env()
            observation = env.reset(goals[key])
            live[key] = {
                "env": env,
                "instruction": env.get_instruction_text(),
                "observation": observation,
                "history": [],
                "record": {"reward": 0.0, "steps": 0, "actions": []},
            }
        timings["env_s"] += time.perf_counter() - began

    def end(key, how: str, reward: float = 0.0) -> None:
        record = live.pop(key)["record"]
        record.update(end=how, reward=reward, success=public.is_success(reward))
        results[key] = record
        release = getattr(generator, "release", None)
        if release is not None:
            release(key)

    start()
    while live:
        prompts = {
            key: generator.chat_prompt(
                public.messages(
                    state["instruction"],
                    state["env"].available_actions(),
                    state["history"],
                    state["observation"],
                )
            )
            for key, state in live.items()
        }
        began = time.perf_counter()
        completions = generator.generate(prompts, max_new_tokens, list(public.STOP))
        timings["generation_s"] += time.perf_counter() - began
        began = time.perf_counter()
        for key in list(live):
            completion = completions.get(key)
            if completion is None:  # the prompt no longer fits the model's context
                end(key, "context")
                continue
            state = live[key]
            action = public.clean_action(completion)
            observation, reward, done, _info = state["env"].step(action)
            state["history"].append((action, observation))  # RD-Agent's: the page after the action
            state["observation"] = observation
            record = state["record"]
            record["steps"] += 1
            record["actions"].append(action)
            if done:
                end(key, "bought", float(reward))
            elif record["steps"] >= max_steps:
                end(key, "max_steps")
        timings["env_s"] += time.perf_counter() - began
        start()
    return {key: results[key] for key in keys}


#: hub.goals values: the reference's synthetic goals of WebShop's data (played in-process), or the
#: human goals of a running WebShop Flask site (its /fixed_<i> pages).
HUB_GOALS = ("synthetic", "human")


def goals_variant(settings: dict) -> str:
    """Which goals an evaluation plays: "synthetic" (source hub, RD-Agent's: WebShop's synthetic
    goals, sessions 0..eval_size-1), "human" (source hub, hub.goals: human: the Flask site's
    human goals), or "generated" (source offline: the generated catalogue's goals)."""
    if settings.get("source", "offline") != "hub":
        return "generated"
    goals = (settings.get("hub") or {}).get("goals") or "synthetic"
    if goals not in HUB_GOALS:
        raise ValueError(
            f"webshop: hub.goals must be one of {', '.join(HUB_GOALS)} (synthetic: the reference's goals from "
            f"WebShop's data; human: the goals of a WebShop Flask site at hub.url), not {goals!r}"
        )
    return goals


def hub_url(settings: dict) -> str:
    """The original WebShop site's address (settings hub.url)."""
    url = (settings.get("hub") or {}).get("url")
    if not url:
        raise ValueError(
            "webshop: hub.goals: human needs tasks.webshop.hub.url, the address of a running WebShop "
            "Flask site (web_agent_site, e.g. http://localhost:3000); or use hub.goals: synthetic (the "
            "reference's goals, no server) or source: offline"
        )
    return str(url)


class WebShopRollout:
    """The evaluation's rollout: every held-out goal played with the submitted model."""

    def __init__(self, settings: dict):
        self.settings = settings

    def prepare(self, ctx) -> None:
        ctx.text_generator()  # the model loads before the held-out split is read

    def _envs(self, rows: list[dict], eval_dir: Path) -> tuple[dict, Callable[[], object]]:
        """key -> what reset() takes, and a factory of environments."""
        if goals_variant(self.settings) == "human":
            url = hub_url(self.settings)
            return {row["id"]: row["session"] for row in rows}, lambda: public.HubWebShopEnv(url)
        catalogue = public.Catalogue(public.load_products(Path(eval_dir) / PRODUCTS_FILE))
        return {row["id"]: row for row in rows}, lambda: public.WebShopEnv(catalogue)

    def run(self, rows: list[dict], ctx) -> dict:
        environment = self.settings.get("environment") or {}
        max_live = environment.get("max_live") or ctx.evaluation["batch_size"]
        generator = episode_generator(ctx.text_generator())
        timings: dict = {}

        ctx.phase("environment")
        goals, make_env = self._envs(rows, ctx.eval_dir)
        episodes = play_episodes(
            goals,
            make_env,
            PhasedGenerator(generator, ctx.phase),
            max_steps=environment.get("max_steps") or public.MAX_STEPS,
            max_new_tokens=self.settings.get("max_new_tokens") or public.MAX_NEW_TOKENS,
            max_live=max_live,
            timings=timings,
        )
        return {"episodes": episodes, "timings": timings, "generator": getattr(generator, "stats", None)}

    def code_files(self) -> list[Path]:
        from rlbench.generation import full_prompt, kv_buffer, prefix_cache, row_cache, textgen, textgen_base, vllm_text

        generation = (textgen, textgen_base, full_prompt, prefix_cache, kv_buffer, row_cache, vllm_text)
        return [Path(public.__file__), *(Path(module.__file__) for module in generation)]


def _rate(count: int, n: int) -> float:
    return round(100.0 * count / n, 4) if n else 0.0


class RewardScorer:
    """Success rate (reward >= 0.5, primary; RD-Agent's score), mean reward x 100 and full-success
    rate (reward == 1, WebShop's own), avg_reward (0-1, RD-Agent's accuracy_summary), mean steps and
    context losses, from the episodes; `goals` names the goals played (goals_variant)."""

    def __init__(self, goals: str = "generated"):
        self.goals = goals

    def score(self, rows: list[dict], samples: dict, ctx):
        from rlbench.tasks.base import EvalResult

        episodes = samples["episodes"]
        items = []
        for row in rows:  # every held-out row is scored: a missing episode would be a harness bug
            episode = episodes[row["id"]]
            items.append(
                {
                    "id": row["id"],
                    "reward": episode["reward"],
                    "success": bool(episode["success"]),
                    "steps": episode["steps"],
                    "end": episode["end"],
                    "actions": episode["actions"],
                }
            )
        n = len(items)
        successes = sum(item["success"] for item in items)
        metrics = {
            "success_rate": _rate(successes, n),
            "mean_reward": round(100.0 * sum(item["reward"] for item in items) / n, 4) if n else 0.0,
            "avg_reward": round(sum(item["reward"] for item in items) / n, 6) if n else 0.0,
            "full_success_rate": _rate(sum(item["reward"] == 1.0 for item in items), n),
            "success_count": successes,
            "avg_steps": round(sum(item["steps"] for item in items) / n, 4) if n else 0.0,
            "context_exhausted": sum(item["end"] == "context" for item in items),
            "goals": self.goals,
        }
        timings = samples.get("timings") or {}
        for name in ("generation_s", "env_s"):
            if name in timings:
                metrics[name] = round(timings[name], 3)
        return EvalResult(metrics=metrics, primary="success_rate", n=n, items=items)
