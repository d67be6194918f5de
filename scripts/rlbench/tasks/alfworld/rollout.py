"""ALFWorld episodes: the ReAct loop of the protocol, played in lockstep or one episode at a time.

`play_episodes` advances every live episode together: one generation call per step for all of
them (a TextGenerator from rlbench.generation.textgen, which keeps each
episode's prompt cached between steps), while the environment pool steps and resets games in its
worker processes. At most `max_live` episodes are live at once; when one ends the next game starts
(continuous batching), so memory stays bounded. With a pool that answers without waiting
(public.EnvPool: send_reset / send_step / receive), a game's reset or step is submitted as soon
as it is known, the next pending games' resets are submitted ahead (one per worker) and games are
built while the batch decodes; a generation call waits until every live episode's observation
has arrived (a call decodes as long as its slowest row: calls for the episodes ready so far cost
more forwards than the wait, measured).

`lockstep=False` plays the reference's way: one episode at a time, one prompt per call.

Both follow public.py's protocol exactly: episode_start, clean_action, step_observation,
history_entry, at most max_steps steps, success = the game's `won` flag. An episode whose prompt
no longer fits the model's context ends there, lost (`end: "context"`), the same in both modes.
Each episode's outcome depends on its own game and prompts alone, never on which episodes share a
generation call.
"""

from __future__ import annotations

import atexit
import os
import time
from pathlib import Path

from rlbench.tasks.alfworld import public
from rlbench.tasks.parts import PhasedGenerator


def _finish(record: dict, end: str) -> dict:
    record["end"] = end
    record["won"] = end == "won"
    return record


class _Waiting:
    """A pool with blocking reset / step (e.g. games played in this process) behind the
    non-blocking interface: a request is carried out when it is sent."""

    workers = 0  # nothing to build ahead of time

    def __init__(self, pool, timings: dict):
        self.pool = pool
        self.timings = timings  # the blocking calls' wall time goes to reset_s / env_s
        self.answers: dict = {}

    def send_reset(self, games: dict, max_steps: int) -> None:
        began = time.perf_counter()
        self.answers.update(self.pool.reset(games, max_steps=max_steps))
        self.timings["reset_s"] += time.perf_counter() - began

    def send_step(self, actions: dict) -> None:
        began = time.perf_counter()
        self.answers.update(self.pool.step(actions))
        self.timings["env_s"] += time.perf_counter() - began

    def receive(self, keys=None, wait: bool = True) -> dict:
        chosen = list(self.answers) if keys is None else list(keys)
        return {key: self.answers.pop(key) for key in chosen}

    def release(self, keys) -> None:
        self.pool.release(keys)


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
    `timings` (if given) gets generation_s, env_s and reset_s added up: wall seconds spent
    generating, and waiting for step answers and for game resets (with a non-blocking pool, the
    environment's work done while the batch decodes is not waited for: it shows in none of them)."""
    timings = timings if timings is not None else {}
    for name in ("generation_s", "env_s", "reset_s"):
        timings.setdefault(name, 0.0)
    keys = list(games)
    width = len(keys) if lockstep else 1
    if max_live:
        width = max(1, min(width, int(max_live)))
    envs = pool if hasattr(pool, "send_step") else _Waiting(pool, timings)
    ahead = int(getattr(envs, "workers", 0) or 0) if lockstep else 0
    pending = list(keys)
    started: list = []  # keys whose reset was sent, in order; the first `width` are live
    stepping: set = set()  # keys whose step was sent, answer still to come
    ready: dict = {}  # key -> prompt to generate for (its observation has arrived)
    states: dict = {}  # key -> {"prompt", "record"} once its reset has arrived
    results: dict = {}

    def submit_resets() -> None:
        batch = [pending.pop(0) for _ in range(min(width + ahead - len(started), len(pending)))]
        if batch:
            started.extend(batch)
            envs.send_reset({key: games[key] for key in batch}, max_steps=max_steps)

    def end(key, how: str) -> None:
        results[key] = _finish(states.pop(key)["record"], how)
        started.remove(key)
        release = getattr(generator, "release", None)
        if release is not None:
            release(key)
        envs.release([key])

    def arrived(key, answer) -> None:
        if key not in stepping:  # a reset
            observation, _info = answer
            task_type = public.task_type_of(games[key])
            states[key] = {
                "prompt": public.episode_start(task_type, observation),
                "record": {"task_type": task_type, "steps": 0, "actions": []},
            }
            return
        stepping.discard(key)
        observation, won, done, _info = answer
        state = states[key]
        record = state["record"]
        action = record["actions"][-1]
        state["prompt"] += public.history_entry(action, public.step_observation(action, observation))
        if won:
            end(key, "won")
        elif record["steps"] >= max_steps:
            end(key, "max_steps")
        elif done:
            end(key, "done")

    def take(answers: dict) -> None:
        for key, answer in answers.items():
            arrived(key, answer)

    submit_resets()
    while started:
        # Every step sent is waited for (a worker serves steps first); every reset that has
        # arrived is taken; when no episode is ready yet, the next answer is waited for.
        while True:
            take(envs.receive(wait=False))
            submit_resets()
            if stepping:
                began = time.perf_counter()
                take(envs.receive(list(stepping)))
                timings["env_s"] += time.perf_counter() - began
                continue
            live = started[:width]
            ready = {key: states[key]["prompt"] for key in live if key in states}
            # A call decodes as long as its slowest row, so it waits until every live episode can
            # join: calls for the episodes ready so far multiplied the forwards (2,029 -> 2,828 on
            # 50 games, the first evaluation 10 % slower on 2 cores); the next games' resets, sent
            # ahead, still overlap the decode.
            if not started or (ready and len(ready) == len(live)):
                break
            began = time.perf_counter()
            take(envs.receive(wait=True))
            timings["reset_s"] += time.perf_counter() - began
        if not ready:
            break
        began = time.perf_counter()
        completions = generator.generate(ready, max_new_tokens, list(public.STOP))
        timings["generation_s"] += time.perf_counter() - began
        actions = {}
        for key in ready:
            completion = completions.get(key)
            if completion is None:  # the prompt no longer fits the model's context
                end(key, "context")
            else:
                action = public.clean_action(completion)
                record = states[key]["record"]
                record["steps"] += 1
                record["actions"].append(action)
                actions[key] = action
        if actions:
            stepping.update(actions)
            envs.send_step(actions)
        submit_resets()
    return {key: results[key] for key in keys}


def game_files(rows: list[dict], eval_dir: Path) -> dict:
    """row id -> the game file of each held-out row."""
    return {row["id"]: Path(eval_dir) / row["game"] for row in rows}


def _environment(settings: dict) -> dict:
    return settings.get("environment") or {}


#: the folder of the evaluation split holding its games' stored translations (prepare_eval)
TRANSLATIONS = "translations"
_SHARED_POOLS: dict = {}  # (workers, translations) -> EnvPool, kept for the process's later evaluations


def shared_pool(workers: int, translations: Path | None = None):
    """This process's environment pool of `workers` processes (reading stored translations from
    `translations`, if given), started on first use and kept for later evaluations (the grader's
    evaluation worker plays the same held-out games for every submission: each game goes to the
    same worker, which resets its already-built env again). A pool whose worker died is replaced;
    the pools close when the process exits."""
    slot = (workers, str(translations) if translations is not None else None)
    pool = _SHARED_POOLS.get(slot)
    if pool is None or not pool.alive:
        if pool is not None:
            pool.close()
        if not _SHARED_POOLS:
            atexit.register(close_shared_pools)
        pool = _SHARED_POOLS[slot] = public.EnvPool(workers=workers, translations=translations)
    return pool


def close_shared_pools() -> None:
    while _SHARED_POOLS:
        _SHARED_POOLS.popitem()[1].close()


class ReActRollout:
    """The evaluation's rollout: every held-out game played with the submitted model, in lockstep
    (rlbench.generation.prefix_cache's cached batched generation), the games stepping in this
    process's shared pool of environment processes (kept between evaluations)."""

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
        stored = Path(ctx.eval_dir) / TRANSLATIONS  # the held-out games' (prepare_eval)
        pool = shared_pool(min(workers, max(1, len(rows))), stored if stored.is_dir() else None)
        games = game_files(rows, ctx.eval_dir)
        busy, reused = pool.env_seconds, sum(pool.reused)
        try:
            episodes = play_episodes(
                games,
                PhasedGenerator(generator, ctx.phase),
                pool,
                max_steps=environment.get("max_steps") or public.MAX_STEPS,
                max_new_tokens=self.settings.get("max_new_tokens") or public.MAX_NEW_TOKENS,
                max_live=max_live,
                timings=timings,
            )
        except BaseException:
            # An interrupted evaluation may leave answers in flight: the next one starts afresh.
            _SHARED_POOLS.pop(next((slot for slot, kept in _SHARED_POOLS.items() if kept is pool), None), None)
            pool.close()
            raise
        timings["env_worker_s"] = pool.env_seconds - busy
        timings["games_reused"] = sum(pool.reused) - reused
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
