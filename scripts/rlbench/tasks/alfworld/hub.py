"""The hub source of ALFWorld: the official games (alfworld-download), collected into a split.

train: json_2.1.1/train (what AlfredTWEnv's "train" mode plays), with the handcoded expert's
trajectory of each game recorded for the agent; heldout: json_2.1.1/valid_unseen, the 134 games
of "eval_out_of_distribution". Games are listed the way AlfredTWEnv lists them (its own
collect_game_files: solvable games of the six task types), sorted, so the split does not depend
on the filesystem's order.
"""

from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import shutil
from pathlib import Path

from rlbench.fileio.jsonio import write_json
from rlbench.tasks.alfworld import public

SPLIT_FOLDERS = {"train": "json_2.1.1/train", "heldout": "json_2.1.1/valid_unseen"}
# The solvable games AlfredTWEnv lists in each folder of the official data (ALFWorld's 3,553 training
# games, the 134 of valid_unseen): the most a hub split can give.
HUB_GAMES = {"train": 3553, "heldout": 134}


def list_games(split_root: Path) -> list[Path]:
    """The solvable games AlfredTWEnv finds under split_root, sorted."""
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

    with contextlib.redirect_stdout(io.StringIO()):
        alfred = AlfredTWEnv(public.env_config(split_root), train_eval="eval_out_of_distribution")
    return sorted(Path(path) for path in alfred.game_files)


def _expert(game_file: str) -> dict:
    from rlbench.tasks.alfworld.expert import expert_trajectory, patch_expert

    public.speed_up_textworld()
    patch_expert()
    return expert_trajectory(game_file)


def _goal(observation: str) -> str:
    marker = "Your task is to: "
    return observation[observation.find(marker) + len(marker) :].strip() if marker in observation else ""


def collect_games(settings: dict, split: str, out_dir: Path, *, root: Path, workers: int = 1) -> dict:
    split_root = Path(root) / SPLIT_FOLDERS[split]
    if not split_root.is_dir():
        raise FileNotFoundError(f"{split_root} is missing: the ALFWorld data under {root} is incomplete (rerun alfworld-download)")
    games = list_games(split_root)
    limit = settings.get("train_size") if split == "train" else settings.get("eval_size")
    if limit:
        games = games[:limit]
    if not games:
        raise ValueError(f"no solvable ALFWorld games under {split_root}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    experts: list[dict | None] = [None] * len(games)
    if split == "train":
        context = multiprocessing.get_context("spawn")
        with context.Pool(max(1, workers)) as pool:
            experts = pool.map(_expert, [str(game) for game in games], chunksize=1)
    records = []
    for game, expert in zip(games, experts):
        relative = game.relative_to(split_root)
        destination = out_dir / relative.parent
        destination.mkdir(parents=True, exist_ok=True)
        for name in ("game.tw-pddl", "traj_data.json"):
            shutil.copyfile(game.parent / name, destination / name)
        traj = json.loads((game.parent / "traj_data.json").read_text())
        # The generator's record format (generate.py): path, task_type, goal, the expert's trajectory.
        record = {"path": relative.as_posix(), "task_type": traj["task_type"]}
        if expert is not None:
            record.update(
                goal=_goal(expert["initial_observation"]),
                initial_observation=expert["initial_observation"],
                trajectory=expert["trajectory"],
                expert_steps=expert["steps"],
                expert_won=expert["won"],
            )
        records.append(record)
    manifest = {
        "source": "hub",
        "split": split,
        "root_folder": SPLIT_FOLDERS[split],
        "games": records,
        "summary": {"games": len(records), "types": _types(records)},
    }
    write_json(out_dir / "manifest.json", manifest)
    return manifest


def _types(records: list[dict]) -> dict:
    counts: dict = {}
    for record in records:
        counts[record["task_type"]] = counts.get(record["task_type"], 0) + 1
    return dict(sorted(counts.items()))
