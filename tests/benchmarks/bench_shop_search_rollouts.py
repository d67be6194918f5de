"""Benchmark: WebShop and DeepSearchQA rollouts, lockstep batched vs the reference's loop.

    .venv/bin/python tests/benchmarks/bench_shop_search_rollouts.py [--task webshop|deepsearchqa|both]
        [--model tiny|smollm2-135m-instruct] [--model-dir DIR] [--episodes 20] [--max-steps N]
        [--max-new-tokens N] [--threads N] [--skip-reference] [--json OUT.json]

Builds each task's held-out split offline (the task's own build_games, with a benchmark salt)
and plays the same episodes twice with the same model:
- ours: every live episode advanced in lockstep, one generation call per step, the task's own play
  loop (max_live = all episodes) with the generator its evaluation uses over the hf backend's
  (rlbench.generation.prefix_cache.CachedBatchGenerator): DeepSearchQA's growing prompts, that one
  (one batched decode per call, each episode's prompt kept as KV cache between steps, shared
  prefixes computed once); WebShop's prompts, rebuilt at every step, webshop.rollout's
  episode_generator (rlbench.generation.row_cache.TurnLengthSwitch: that batch decode, or, once the
  first call's turns were one token long, each prompt alone from its longest cached prefix, no
  padding, prompt-lookup drafts; the path taken is printed);
- the reference's loop: one episode at a time (max_live = 1), the whole prompt computed at every
  step (FullPromptGenerator: transformers generate, batch 1).

Both are greedy float32 on CPU, so every episode must come out identical (WebShop: reward, steps,
end, actions; DeepSearchQA: answer, end, steps, actions); differing episodes are counted. Prints
each side's wall time and generation time and the ratios, measured in one run: the machines are
shared and noisy, compare ratios, not seconds.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import yaml  # noqa: E402

from rlbench.fileio.jsonio import read_jsonl  # noqa: E402
from rlbench.models.materialise import prepare_model  # noqa: E402
from rlbench.generation.full_prompt import FullPromptGenerator  # noqa: E402
from rlbench.generation.prefix_cache import CachedBatchGenerator  # noqa: E402
from rlbench.tasks import get_task  # noqa: E402

SALT = "benchmark-salt"


def task_settings(name: str, episodes: int) -> dict:
    settings = yaml.safe_load((ROOT / "config" / "tasks" / f"{name}.yaml").read_text())
    settings.update(source="offline", eval_size=episodes, train_size=20)
    if name == "deepsearchqa":
        settings["kb_size"] = 200
    return settings


def build(name: str, episodes: int, where: Path) -> tuple[dict, Path]:
    settings = task_settings(name, episodes)
    task = get_task(settings)
    task.build_games(settings, "train", where / "train")
    task.build_games(settings, "heldout", where / "heldout", salt=SALT)
    return settings, where / "heldout"


class Timed:
    """A generator whose generate() calls are timed (the rest of a loop is the environment's)."""

    def __init__(self, generator):
        self.generator = generator
        self.seconds = 0.0

    def generate(self, prompts, max_new_tokens, stop):
        began = time.perf_counter()
        try:
            return self.generator.generate(prompts, max_new_tokens, stop)
        finally:
            self.seconds += time.perf_counter() - began

    def chat_prompt(self, messages):
        return self.generator.chat_prompt(messages)

    def release(self, key):
        self.generator.release(key)


def ours_for(name: str, generator):
    """The generator the task's evaluation plays with over the hf backend's `generator`."""
    if name == "webshop":
        from rlbench.tasks.webshop.rollout import episode_generator

        return episode_generator(generator)
    return generator


def play(name: str, built: Path, generator, *, max_live: int, max_steps: int | None, max_new_tokens: int | None) -> dict:
    """key -> the comparable part of each episode."""
    if name == "webshop":
        from rlbench.tasks.webshop import public
        from rlbench.tasks.webshop.rollout import play_episodes

        catalogue = public.Catalogue(public.load_products(built / "products.jsonl"))
        goals = {row["id"]: row for row in read_jsonl(built / "goals.jsonl")}
        episodes = play_episodes(
            goals,
            lambda: public.WebShopEnv(catalogue),
            generator,
            max_steps=max_steps or public.MAX_STEPS,
            max_new_tokens=max_new_tokens or public.MAX_NEW_TOKENS,
            max_live=max_live,
        )
        return {k: [e["reward"], e["steps"], e["end"], e["actions"]] for k, e in episodes.items()}
    from rlbench.tasks.deepsearchqa import public
    from rlbench.tasks.deepsearchqa.rollout import play_questions

    tool = public.SearchTool(public.load_pages(built / "kb.jsonl"))
    problems = {row["id"]: (row["problem"], row["answer_type"]) for row in read_jsonl(built / "questions.jsonl")}
    episodes = play_questions(
        problems,
        generator,
        tool,
        max_steps=max_steps or public.MAX_STEPS,
        max_new_tokens=max_new_tokens or public.MAX_NEW_TOKENS,
        max_live=max_live,
    )
    return {k: [e["answer"], e["end"], e["steps"], e.get("actions")] for k, e in episodes.items()}


def side(name, built, generator, *, max_live, args) -> dict:
    timed = Timed(generator)
    began = time.perf_counter()
    episodes = play(name, built, timed, max_live=max_live, max_steps=args.max_steps, max_new_tokens=args.max_new_tokens)
    path = getattr(generator, "stats", {}).get("path", "cached batch")
    return {"wall_s": time.perf_counter() - began, "generation_s": timed.seconds, "episodes": episodes, "path": path}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=["webshop", "deepsearchqa", "both"], default="both")
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--model-dir", type=Path)
    parser.add_argument("--episodes", type=int, default=20)
    parser.add_argument("--max-steps", type=int)
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--threads", type=int)
    parser.add_argument("--skip-reference", action="store_true")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    tasks = ["webshop", "deepsearchqa"] if args.task == "both" else [args.task]
    report = {}
    with tempfile.TemporaryDirectory(prefix="bench-shop-search-") as scratch:
        scratch = Path(scratch)
        model_dir = args.model_dir
        if model_dir is None:
            spec = yaml.safe_load((ROOT / "config" / "models" / f"{args.model}.yaml").read_text())
            model_dir = scratch / "model"
            prepare_model(spec, model_dir)
        ours_generator = CachedBatchGenerator(model_dir)
        reference_generator = None if args.skip_reference else FullPromptGenerator(model_dir)
        for name in tasks:
            _settings, built = build(name, args.episodes, scratch / name)
            result = {"ours": side(name, built, ours_for(name, ours_generator), max_live=args.episodes, args=args)}
            if reference_generator is not None:
                result["reference"] = side(name, built, reference_generator, max_live=1, args=args)
            ours = result["ours"]
            print(f"\n{name}: {len(ours['episodes'])} episodes, model {args.model_dir or args.model}")
            print(f"  ours (lockstep, path: {ours['path']}): wall {ours['wall_s']:.1f} s, generation {ours['generation_s']:.1f} s")
            if "reference" in result:
                ref = result["reference"]
                same = sum(ours["episodes"][k] == ref["episodes"][k] for k in ours["episodes"])
                result["identical"] = same
                print(f"  reference (one at a time, full prompt): wall {ref['wall_s']:.1f} s, generation {ref['generation_s']:.1f} s")
                print(
                    f"  generation speed-up {ref['generation_s'] / max(ours['generation_s'], 1e-9):.2f}x, "
                    f"total {ref['wall_s'] / max(ours['wall_s'], 1e-9):.2f}x; identical episodes {same}/{len(ours['episodes'])}"
                )
            report[name] = {k: v for k, v in result.items()}
    if args.json:
        args.json.write_text(json.dumps(report, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
