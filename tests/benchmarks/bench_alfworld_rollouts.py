"""Benchmark: ALFWorld ReAct rollouts, ours vs the reference's loop, on the same games and model.

    .venv/bin/python tests/benchmarks/bench_alfworld_rollouts.py [--model tiny|smollm2-135m-instruct]
        [--model-dir DIR] [--later-model-dir DIR] [--games-dir DIR] [--episodes 50] [--max-steps 50]
        [--max-new-tokens 100] [--workers 2] [--threads N] [--skip-reference] [--skip-later] [--no-translations]
        [--json OUT.json]

Plays the same held-out-style episodes with two checkpoints, as the grader's evaluation worker
does for successive submissions:
- first evaluation: the model, a fresh environment pool (every game built for the first time,
  its Fast Downward translation read from the store the evaluation split's preparation writes,
  public.store_translations; --no-translations: translated in the worker);
- later evaluation: ANOTHER checkpoint (the same model definition with other weights: --model's
  registry entry with seed + 1, or --later-model-dir) played with the environment pool kept warm
  from the first (rlbench.tasks.alfworld.rollout.shared_pool: each game in the worker that built
  it, reset again) -- the grader's steady state.
Each evaluation is played twice:
- ours: every live episode advanced in lockstep, one batched generation call per step for the
  episodes whose observation is ready (rlbench.generation.prefix_cache.CachedBatchGenerator: the
  shared few-shot prefix computed once and attended to once per prefix group, each episode's
  history kept as KV cache between steps), the games reset and stepped in the pool's --workers
  processes while the batch decodes (rlbench.tasks.alfworld.rollout.play_episodes, lockstep=True);
- the reference's loop: one episode at a time, the whole prompt computed at every step
  (FullPromptGenerator: transformers generate, batch 1), one game environment in process.

Both are greedy float32 on CPU, so every episode must come out identical (won, steps, end, actions);
differing episodes are listed (a flipped greedy token from padding/caching numerics would show
here). Prints, per evaluation, each side's wall time split into generation / environment / reset
(ours: time spent waiting for them; environment work done while the batch decodes is in none), and
the ratios: generation speed-up, total speed-up, and ours' total against its environment waits.

Model: --model names a registry entry under config/models/ (prepared with rlbench.models.materialise.
prepare_model into a temporary folder; smollm2-135m-instruct builds offline in about a minute), or
--model-dir an already prepared model directory. Games: --games-dir reuses the games found there
(any */game.tw-pddl), or generates them there when it is empty or missing; without it they are
generated into a temporary folder (rlbench.tasks.alfworld.generate, heldout split, the
valid_unseen task-type mix scaled to --episodes).

The reference side is slow with a real model (every step recomputes a ~1.5k-token prompt); on a
small CPU use e.g. --model smollm2-135m-instruct --episodes 6 --max-steps 5 --skip-later. Machines
are shared and noisy: compare ratios (each measured within one run), not seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import yaml  # noqa: E402

from rlbench.models.materialise import prepare_model  # noqa: E402
from rlbench.generation.full_prompt import FullPromptGenerator  # noqa: E402
from rlbench.generation.prefix_cache import CachedBatchGenerator  # noqa: E402
from rlbench.tasks.alfworld import public  # noqa: E402
from rlbench.tasks.alfworld.rollout import close_shared_pools, play_episodes, shared_pool  # noqa: E402


class InProcessPool:
    """The reference's environment: games played in this process, one GameEnv per episode, on
    stock textworld (no parser memoisation) (the EnvPool interface: reset / step / release)."""

    def __init__(self):
        self.envs: dict = {}
        self.env_seconds = 0.0

    def reset(self, games: dict, max_steps: int = public.MAX_STEPS) -> dict:
        out = {}
        for key, game in games.items():
            began = time.perf_counter()
            self.release([key])
            with contextlib.redirect_stderr(io.StringIO()):  # textworld's progress bars
                env = self.envs[key] = public.GameEnv(game, max_steps=max_steps, speed_up=False)
                out[key] = env.reset()
            self.env_seconds += time.perf_counter() - began
        return out

    def step(self, actions: dict) -> dict:
        began = time.perf_counter()
        out = {key: self.envs[key].step(action) for key, action in actions.items()}
        self.env_seconds += time.perf_counter() - began
        return out

    def release(self, keys) -> None:
        for key in keys:
            env = self.envs.pop(key, None)
            if env is not None:
                env.close()

    def close(self) -> None:
        self.release(list(self.envs))


def _model_dirs(args, tmp: Path) -> tuple[Path, Path | None]:
    """The first evaluation's model and the later one's (another checkpoint, None: no later one)."""
    later = Path(args.later_model_dir) if args.later_model_dir else None
    if args.model_dir:
        return Path(args.model_dir), later
    spec = yaml.safe_load((ROOT / "config" / "models" / f"{args.model}.yaml").read_text())
    out = tmp / "model"
    began = time.perf_counter()
    prepare_model(spec, out)
    if later is None and not args.skip_later:
        if "seed" not in spec:
            sys.exit(f"--model {args.model} has no seed to vary: give the later checkpoint with --later-model-dir")
        later = tmp / "later-model"
        prepare_model({**spec, "seed": int(spec["seed"]) + 1}, later)
    print(f"model {args.model} prepared in {time.perf_counter() - began:.1f} s", flush=True)
    return out, later


def _games(args, tmp: Path) -> dict:
    folder = Path(args.games_dir) if args.games_dir else tmp / "games"
    found = sorted(folder.rglob("game.tw-pddl")) if folder.is_dir() else []
    if not found:
        from rlbench.tasks.alfworld.generate import TYPE_MIX_VALID_UNSEEN, generate_games

        total = sum(TYPE_MIX_VALID_UNSEEN.values())
        counts = {kind: max(1, math.ceil(args.episodes * n / total)) for kind, n in TYPE_MIX_VALID_UNSEEN.items()}
        began = time.perf_counter()
        generate_games(folder, split="heldout", world_seed=0, game_seed=7, counts=counts, workers=args.workers)
        print(f"{sum(counts.values())} games generated in {time.perf_counter() - began:.1f} s", flush=True)
        found = sorted(folder.rglob("game.tw-pddl"))
    if len(found) < args.episodes:
        print(f"note: only {len(found)} games in {folder}", flush=True)
    # Interleave task types so that a small --episodes still covers several of them.
    by_type: dict = {}
    for game in found:
        by_type.setdefault(game.parent.parent.name.split("-")[0], []).append(game)
    ordered = []
    while any(by_type.values()):
        for kind in sorted(by_type):
            if by_type[kind]:
                ordered.append(by_type[kind].pop(0))
    chosen = ordered[: args.episodes]
    return {str(game.parent.relative_to(folder)): game for game in chosen}


def _play(label: str, games: dict, generator, pool, args, lockstep: bool) -> dict:
    timings: dict = {}
    began = time.perf_counter()
    episodes = play_episodes(
        games,
        generator,
        pool,
        max_steps=args.max_steps,
        max_new_tokens=args.max_new_tokens,
        lockstep=lockstep,
        timings=timings,
    )
    timings["wall_s"] = time.perf_counter() - began
    won = sum(bool(e["won"]) for e in episodes.values())
    steps = sum(e["steps"] for e in episodes.values())
    print(f"{label}: {len(episodes)} episodes, {won} won, {steps} steps, {timings['wall_s']:.1f} s", flush=True)
    return {"episodes": episodes, "timings": timings, "stats": dict(generator.stats)}


def _compare(ours: dict, reference: dict) -> list:
    differing = []
    for key, mine in ours.items():
        theirs = reference[key]
        fields = [f for f in ("won", "steps", "end", "actions") if mine.get(f) != theirs.get(f)]
        if fields:
            first = next(
                (i for i, (a, b) in enumerate(zip(mine["actions"], theirs["actions"])) if a != b),
                min(len(mine["actions"]), len(theirs["actions"])),
            )
            differing.append({"id": key, "fields": fields, "first_differing_step": first + 1})
    return differing


def _report(name: str, side: dict) -> None:
    t = side["timings"]
    other = t["wall_s"] - t["generation_s"] - t["env_s"] - t["reset_s"]
    s = side["stats"]
    print(
        f"  {name:<10} wall {t['wall_s']:8.1f} s = generation {t['generation_s']:8.1f} + environment "
        f"{t['env_s']:7.1f} + reset {t['reset_s']:6.1f} + other {other:5.1f}"
    )
    print(
        f"  {'':<10} prompt tokens {s['prompt_tokens']}, computed {s['prompt_tokens_computed']}, reused "
        f"{s['prompt_tokens_reused']}, generated {s['generated_tokens']}, forward calls {s['forward_calls']}"
    )
    if "env_worker_s" in t:
        print(f"  {'':<10} environment workers busy {t['env_worker_s']:.1f} s, games reset from a kept env {t['games_reused']}")


def _evaluate(label: str, model_dir: Path, games: dict, args, skip_reference: bool) -> dict:
    """One evaluation of one checkpoint: ours on the shared pool (as the grader), then the reference."""
    generator = CachedBatchGenerator(model_dir, device="cpu")
    pool = shared_pool(args.workers, args.translations)
    busy, reused = pool.env_seconds, sum(pool.reused)
    ours = _play(f"{label}, ours", games, generator, pool, args, lockstep=True)
    ours["timings"]["env_worker_s"] = pool.env_seconds - busy
    ours["timings"]["games_reused"] = sum(pool.reused) - reused
    ours["cache_after"] = generator.cached_tokens()
    del generator
    reference = None
    if not skip_reference:
        reference_generator = FullPromptGenerator(model_dir, device="cpu")
        in_process = InProcessPool()
        try:
            reference = _play(f"{label}, reference", games, reference_generator, in_process, args, lockstep=False)
        finally:
            in_process.close()
    return {"ours": ours, "reference": reference}


def _summarise(label: str, evaluation: dict, n_games: int) -> list:
    ours, reference = evaluation["ours"], evaluation["reference"]
    print(f"\n{label}: wall time (s)")
    _report("ours", ours)
    differing = []
    if reference is not None:
        _report("reference", reference)
        o, r = ours["timings"], reference["timings"]
        print(f"{label}: ratios (reference / ours)")
        print(f"  generation speed-up      {r['generation_s'] / max(o['generation_s'], 1e-9):6.1f}x")
        print(f"  total speed-up           {r['wall_s'] / max(o['wall_s'], 1e-9):6.1f}x")
        print(f"  environment speed-up     {(r['env_s'] + r['reset_s']) / max(o['env_s'] + o['reset_s'], 1e-9):6.1f}x")
        differing = _compare(ours["episodes"], reference["episodes"])
        same = n_games - len(differing)
        print(f"{label}: identical outcomes: {'yes' if not differing else 'NO'} ({same} / {n_games} episodes: won, steps, end, every action)")
        for item in differing:
            print(f"  DIFFERS {item['id']}: {', '.join(item['fields'])} (first differing action: step {item['first_differing_step']})")
    o = ours["timings"]
    print(f"{label}: ours' total / its environment waits (env + reset) {o['wall_s'] / max(o['env_s'] + o['reset_s'], 1e-9):6.2f}x")
    return differing


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny", help="registry entry under config/models/ (tiny, smollm2-135m-instruct)")
    parser.add_argument("--model-dir", default=None, help="an already prepared model directory (skips --model)")
    parser.add_argument("--later-model-dir", default=None, help="the later evaluation's checkpoint (default: --model with seed + 1)")
    parser.add_argument("--games-dir", default=None, help="reuse games there (generated there when empty)")
    parser.add_argument("--episodes", type=int, default=50)
    parser.add_argument("--max-steps", type=int, default=public.MAX_STEPS)
    parser.add_argument("--max-new-tokens", type=int, default=public.MAX_NEW_TOKENS)
    parser.add_argument("--workers", type=int, default=2, help="environment processes for our side")
    parser.add_argument("--skip-reference", action="store_true", help="only time our side")
    parser.add_argument("--skip-later", action="store_true", help="only the first evaluation")
    parser.add_argument("--json", default=None, help="write every figure and episode here")
    parser.add_argument("--no-translations", action="store_true",
                        help="our side without the held-out games' stored translations (as before they were stored)")  # fmt: skip
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads for both sides (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)

    evaluations = {}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model_dir, later_dir = _model_dirs(args, tmp)
        games = _games(args, tmp)
        print(f"{len(games)} episodes, at most {args.max_steps} steps, {args.max_new_tokens} new tokens per step", flush=True)
        args.translations = None
        if not args.no_translations:
            # As prepare_eval does for the held-out split, once, before any agent runs.
            args.translations = tmp / "translations"
            began = time.perf_counter()
            public.store_translations(games.values(), args.translations)
            print(f"translations stored for {len(games)} games in {time.perf_counter() - began:.1f} s "
                  "(the evaluation split's preparation, outside every evaluation)", flush=True)  # fmt: skip
        try:
            evaluations["first evaluation"] = _evaluate("first evaluation", model_dir, games, args, args.skip_reference)
            if later_dir is not None and not args.skip_later:
                evaluations["later evaluation (another checkpoint, warm pool)"] = _evaluate(
                    "later evaluation", later_dir, games, args, args.skip_reference
                )
        finally:
            close_shared_pools()

    differing = {label: _summarise(label, evaluation, len(games)) for label, evaluation in evaluations.items()}
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "evaluations": evaluations, "differing": differing}, indent=1, default=str)
        )
    if any(differing.values()):
        sys.exit(1)


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
