"""ALFWorld episodes: the ReAct loop of the protocol, played in lockstep or one episode at a time.

`play_episodes` advances every live episode together: one generation call per step for all of
them (a TextGenerator from rlbench.generation.textgen, which keeps each episode's prompt cached between
steps), then one step of every game in the environment pool. At most `max_live` episodes are live
at once; when one ends the next game starts (continuous batching), so memory stays bounded.

`lockstep=False` plays the reference's way: one episode at a time, one prompt per call.

Both follow public.py's protocol exactly: episode_start, clean_action, step_observation,
history_entry, at most max_steps steps, success = the game's `won` flag. An episode whose prompt
no longer fits the model's context ends there, lost (`end: "context"`), the same in both modes.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from rlbench.tasks.alfworld import public
from rlbench.tasks.parts import PhasedGenerator


def _finish(record: dict, end: str) -> dict:
    record["end"] = end
    record["won"] = end == "won"
    return record


def play_episodes(
    games: dict,
    generator,
    pool,
    *,
    max_steps: int = public.MAX_STEPS,
    max_new_tokens: int = public.MAX_NEW_TOKENS,
    max_live: int | None = None,
    lockstep: bool = True,
    timings: dict | None = None,
) -> dict:
    """Play every game (key -> game file) with `generator`; key -> episode record
    {task_type, won, steps, end ("won", "max_steps", "done", "context"), actions}.
    `timings` (if given) gets generation_s, env_s and reset_s added up (wall seconds)."""
    timings = timings if timings is not None else {}
    for name in ("generation_s", "env_s", "reset_s"):
        timings.setdefault(name, 0.0)
    keys = list(games)
    width = len(keys) if lockstep else 1
    if max_live:
        width = max(1, min(width, int(max_live)))
    pending = list(keys)
    live: dict = {}  # key -> {"prompt", "record"}
    results: dict = {}

    def start(batch: list) -> None:
        if not batch:
            return
        began = time.perf_counter()
        starts = pool.reset({key: games[key] for key in batch}, max_steps=max_steps)
        timings["reset_s"] += time.perf_counter() - began
        for key in batch:
            observation, _info = starts[key]
            task_type = public.task_type_of(games[key])
            live[key] = {
                "prompt": public.episode_start(task_type, observation),
                "record": {"task_type": task_type, "steps": 0, "actions": []},
            }

    def end(key, how: str) -> None:
        results[key] = _finish(live.pop(key)["record"], how)
        release = getattr(generator, "release", None)
        if release is not None:
            release(key)
        pool.release([key])

    start([pending.pop(0) for _ in range(min(width, len(pending)))])
    while live:
        began = time.perf_counter()
        completions = generator.generate(
            {key: state["prompt"] for key, state in live.items()}, max_new_tokens, list(public.STOP)
        )
        timings["generation_s"] += time.perf_counter() - began
        actions = {}
        for key in list(live):
            completion = completions.get(key)
            if completion is None:  # the prompt no longer fits the model's context
                end(key, "context")
            else:
                actions[key] = public.clean_action(completion)
        if actions:
            began = time.perf_counter()
            stepped = pool.step(actions)
            timings["env_s"] += time.perf_counter() - began
            for key, action in actions.items():
                observation, won, done, _info = stepped[key]
                state = live[key]
                record = state["record"]
                record["steps"] += 1
                record["actions"].append(action)
                state["prompt"] += public.history_entry(action, public.step_observation(action, observation))
                if won:
                    end(key, "won")
                elif record["steps"] >= max_steps:
                    end(key, "max_steps")
                elif done:
                    end(key, "done")
        start([pending.pop(0) for _ in range(min(width - len(live), len(pending)))])
    return {key: results[key] for key in keys}


def game_files(rows: list[dict], eval_dir: Path) -> dict:
    """row id -> the game file of each held-out row."""
    return {row["id"]: Path(eval_dir) / row["game"] for row in rows}


def _environment(settings: dict) -> dict:
    return settings.get("environment") or {}


class ReActRollout:
    """The evaluation's rollout: every held-out game played with the submitted model, in lockstep
    (rlbench.generation.prefix_cache's cached batched generation), the games stepping in a pool of processes."""

    def __init__(self, settings: dict):
        self.settings = settings

    def prepare(self, ctx) -> None:
        ctx.text_generator()  # the model loads before the held-out split is read

    def run(self, rows: list[dict], ctx) -> dict:
        environment = _environment(self.settings)
        workers = environment.get("workers") or os.cpu_count() or 1
        max_live = environment.get("max_live") or ctx.evaluation["batch_size"]
        generator = ctx.text_generator()
        timings: dict = {}

        ctx.phase("environment")
        with public.EnvPool(workers=min(workers, max(1, len(rows)))) as pool:
            episodes = play_episodes(
                game_files(rows, ctx.eval_dir),
                PhasedGenerator(generator, ctx.phase),
                pool,
                max_steps=environment.get("max_steps") or public.MAX_STEPS,
                max_new_tokens=self.settings.get("max_new_tokens") or public.MAX_NEW_TOKENS,
                max_live=max_live,
                timings=timings,
            )
            timings["env_worker_s"] = pool.env_seconds
        return {"episodes": episodes, "timings": timings, "generator": getattr(generator, "stats", None)}

    def code_files(self) -> list[Path]:
        from rlbench.generation import full_prompt, kv_buffer, prefix_cache, textgen, textgen_base, vllm_text

        generation = (textgen, textgen_base, full_prompt, prefix_cache, kv_buffer, vllm_text)
        return [Path(public.__file__), *(Path(module.__file__) for module in generation)]


class SuccessScorer:
    """Success rate (primary), mean steps and success per task type, from the episodes."""

    def score(self, rows: list[dict], samples: dict, ctx):
        from rlbench.tasks.base import EvalResult

        episodes = samples["episodes"]
        items, per_type, won_by_type = [], {}, {}
        for row in rows:  # every held-out row is scored: a missing episode would be a harness bug
            episode = episodes[row["id"]]
            items.append(
                {
                    "id": row["id"],
                    "task_type": row["task_type"],
                    "won": bool(episode["won"]),
                    "steps": episode["steps"],
                    "end": episode["end"],
                    "actions": episode["actions"],
                }
            )
            per_type[row["task_type"]] = per_type.get(row["task_type"], 0) + 1
            won_by_type[row["task_type"]] = won_by_type.get(row["task_type"], 0) + int(bool(episode["won"]))
        n = len(items)
        won = sum(item["won"] for item in items)
        metrics = {
            "success_rate": round(100.0 * won / n, 4) if n else 0.0,
            "won": won,
            "mean_steps": round(sum(item["steps"] for item in items) / n, 4) if n else 0.0,
            "per_type_success": {kind: round(100.0 * won_by_type[kind] / count, 4) for kind, count in sorted(per_type.items())},
            "context_exhausted": sum(item["end"] == "context" for item in items),
        }
        timings = samples.get("timings") or {}
        for name in ("generation_s", "env_s", "reset_s"):
            if name in timings:
                metrics[name] = round(timings[name], 3)
        return EvalResult(metrics=metrics, primary="success_rate", n=n, items=items)
