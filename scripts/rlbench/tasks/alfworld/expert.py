"""alfworld's handcoded expert, fixed for pick_two_obj_and_place, played through AlfredTWEnv.

Used to validate generated games and to record the expert trajectories stored with them. The
expert runs inside alfworld's own wrapper stack (train mode: PddlEnv -> AlfredDemangler ->
AlfredInfos -> AlfredExpert); nothing here re-implements game logic, and the ground-truth
`facts` the expert reads are never returned.
"""

from __future__ import annotations

import contextlib
import io
import random
import sys
from pathlib import Path

from rlbench.tasks.alfworld.public import (
    ensure_alfworld_data_dir,
    env_config,
    initial_observation,
    speed_up_textworld,
)

_PATCH_MARK = "_rlbench_move_as_put"
_patch_enabled = True  # switched off only by expert_trajectory(stock_expert=True), to show the bug


def patch_expert() -> None:
    """Make alfworld 0.4.2's handcoded expert solve pick_two_obj_and_place. Idempotent.

    The expert's state tracking pops its inventory only after a command containing "put", but the
    0.4.x grammar places objects with "move X to Y"; after the first placement the pick-two policy
    asks to move the same object again, gets "look", then wanders randomly. The fix reads a
    "move X to Y" command as "put X in Y" for state tracking, in the pick-two policy only, so the
    other five task types behave exactly as stock."""
    ensure_alfworld_data_dir()  # importing alfworld creates $ALFWORLD_DATA (default ~/.cache/alfworld)
    from alfworld.agents.expert.handcoded_expert import PickTwoObjAndPlacePolicy

    if getattr(PickTwoObjAndPlacePolicy, _PATCH_MARK, False):
        return
    stock = PickTwoObjAndPlacePolicy.update_state_tracking  # BasePolicy's, inherited

    def update_state_tracking(self, game_state, last_action):
        if _patch_enabled and last_action.startswith("move ") and " to " in last_action:
            obj, recep = last_action[len("move ") :].split(" to ", 1)
            last_action = f"put {obj} in {recep}"
        return stock(self, game_state, last_action)

    PickTwoObjAndPlacePolicy.update_state_tracking = update_state_tracking
    setattr(PickTwoObjAndPlacePolicy, _PATCH_MARK, True)


@contextlib.contextmanager
def _stock_expert(stock: bool):
    global _patch_enabled
    saved, _patch_enabled = _patch_enabled, not stock
    try:
        yield
    finally:
        _patch_enabled = saved


@contextlib.contextmanager
def _kept_random_state():
    # The expert draws from the global `random`; seed it for the episode, then give it back.
    saved = random.getstate()
    try:
        yield
    finally:
        random.setstate(saved)


@contextlib.contextmanager
def _kept_argv():
    # Fast Downward replaces sys.argv on every game load and reset.
    saved = list(sys.argv)
    try:
        yield
    finally:
        sys.argv[:] = saved


def make_expert_env(game_dir: str | Path, max_steps: int = 50):
    """A batch-1 AlfredTWEnv in train mode (with the patched handcoded expert) over one folder."""
    speed_up_textworld()
    patch_expert()
    from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

    quiet = io.StringIO()  # AlfredTWEnv prints progress (and tqdm bars on stderr)
    with contextlib.redirect_stdout(quiet), contextlib.redirect_stderr(quiet), _kept_argv():
        alfred = AlfredTWEnv(env_config(game_dir, max_steps), train_eval="train")
        if alfred.num_games != 1:  # an empty game list makes reset() loop forever
            raise ValueError(f"{game_dir} must hold exactly one solvable game; found {alfred.num_games}")
        return alfred.init_env(batch_size=1)


def expert_trajectory(game_file: str | Path, max_steps: int = 50, seed: int = 0, *, stock_expert: bool = False) -> dict:
    """Play one game with the (patched) handcoded expert, following infos['extra.expert_plan'].

    Returns {"won", "steps", "initial_observation" (banner removed), "trajectory": [{"action",
    "observation" (raw feedback)}, ...]}; on an expert crash also "error". Deterministic for a
    given seed (the expert draws from the global `random`, which is restored afterwards).
    stock_expert=True plays alfworld's unpatched expert (for showing the pick-two bug)."""
    game_file = Path(game_file)
    if game_file.name != "game.tw-pddl" or not game_file.is_file():
        raise FileNotFoundError(f"expected a .../game.tw-pddl file; got {game_file}")
    env = make_expert_env(game_file.parent, max_steps)
    result: dict = {"won": False, "steps": 0, "initial_observation": "", "trajectory": []}
    try:
        with _kept_argv(), _kept_random_state(), _stock_expert(stock_expert):
            random.seed(seed)
            env.seed(seed)
            observations, infos = env.reset()
            result["initial_observation"] = initial_observation(observations[0])
            if infos["won"][0]:
                result["won"] = True
                result["error"] = "won at reset"
                return result
            for step in range(1, max_steps + 1):
                action = infos["extra.expert_plan"][0][0]
                observations, _scores, dones, infos = env.step([action])
                result["trajectory"].append({"action": action, "observation": observations[0]})
                result["steps"] = step
                if dones[0]:
                    break
            result["won"] = bool(infos["won"][0])
    except Exception as exc:  # the stock expert can crash (e.g. random.choice([])); a failed draw
        result["won"] = False
        result["error"] = f"{type(exc).__name__}: {exc}"
    finally:
        with contextlib.suppress(Exception):
            env.close()
    return result
