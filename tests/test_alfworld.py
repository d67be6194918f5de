"""ALFWorld (L3) through the real evaluation path: generated games, the official engine, the pool
of environment processes, the lockstep ReAct loop and the scorer.

Policies stand in for a model: an expert-plan policy (each game's validated expert commands)
must win every held-out game it plays, a nonsense policy none. The held-out games never reach a
workspace or the environment an agent runs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from rlbench.fileio.jsonio import read_jsonl
from rlbench.tasks import get_task
from rlbench.tasks.alfworld import VALID_UNSEEN_MIX, equal_counts, mix_counts, public
from rlbench.tasks.alfworld.rollout import TRANSLATIONS, play_episodes
from rlbench.tasks.base import EvalContext, new_salt, public_metrics

TYPES = sorted(VALID_UNSEEN_MIX)


def settings(**overrides) -> dict:
    base = {
        "name": "alfworld",
        "module": "alfworld",
        "level": "L3",
        "source": "offline",
        "metric": "success_rate",
        "train_size": 6,
        "eval_size": None,
        "data_seed": 0,
        "environment": {"max_steps": 50, "workers": 2},
    }
    return {**base, **overrides}


class ExpertPolicy:
    """Plays each game's stored walkthrough (the validated expert commands), one per step."""

    name = "expert-plan"

    def __init__(self, games: dict):
        self.plans = {key: json.loads(Path(path).read_text())["walkthrough"] for key, path in games.items()}
        self.turn = {key: 0 for key in games}
        self.calls = 0

    def generate(self, prompts, max_new_tokens, stop):
        self.calls += 1
        out = {}
        for key in prompts:
            plan, index = self.plans[key], self.turn[key]
            self.turn[key] = index + 1
            out[key] = " " + (plan[index] if index < len(plan) else "look") + "\nignored after the stop"
        return out


class NonsensePolicy:
    name = "nonsense"

    def generate(self, prompts, max_new_tokens, stop):
        return {key: " dance with the toaster" for key in prompts}


@pytest.fixture(scope="module")
def splits(tmp_path_factory):
    """6 training games (one per type) and 12 held-out games (two per type), generated once."""
    root = tmp_path_factory.mktemp("alfworld")
    task = get_task(settings())
    salt = new_salt()
    train_games, heldout_games = root / "levels" / "train", root / "levels" / "heldout"
    # Two per type: the test's own mix (the protocol's is valid_unseen's 24/31/23/21/18/17).
    task.build_games(settings(), "train", train_games, workers=2)
    from rlbench.tasks.alfworld.generate import generate_games
    from rlbench.tasks.base import salted_seed

    generate_games(
        heldout_games, split="heldout", world_seed=0, game_seed=salted_seed(salt, "alfworld", 0),
        counts={kind: 2 for kind in TYPES}, workers=2,
    )
    train_dir, eval_dir = root / "data" / "train", root / "data" / "eval"
    train_manifest = task.prepare_train(settings(), train_dir, sources={"train_games": train_games})
    eval_manifest = task.prepare_eval(settings(), train_dir, eval_dir, salt=salt, sources={"heldout_games": heldout_games})
    return {"root": root, "task": task, "train": train_dir, "eval": eval_dir, "salt": salt,
            "train_manifest": train_manifest, "eval_manifest": eval_manifest}


def evaluate(splits, backend, **overrides):
    ctx = EvalContext(settings(**overrides), model_dir=None, eval_dir=splits["eval"], backend=backend)
    try:
        return splits["task"].evaluate(ctx)
    finally:
        ctx.close()


def test_mixes():
    assert mix_counts(None) == VALID_UNSEEN_MIX and sum(mix_counts(None).values()) == 134
    assert sum(mix_counts(12).values()) == 12 and all(v >= 1 for v in mix_counts(12).values())
    assert sum(mix_counts(50).values()) == 50
    assert equal_counts(12) == {kind: 2 for kind in VALID_UNSEEN_MIX}
    assert sum(equal_counts(7).values()) == 7


def test_splits_cover_every_type_and_are_disjoint(splits):
    eval_rows = list(read_jsonl(splits["eval"] / "eval.jsonl"))
    train_rows = list(read_jsonl(splits["train"] / "train.jsonl"))
    assert sorted({row["task_type"] for row in eval_rows}) == TYPES and len(eval_rows) == 12
    assert sorted({row["task_type"] for row in train_rows}) == TYPES and len(train_rows) == 6
    assert splits["eval_manifest"]["shared_task_object_pairs"] == 0
    for row in train_rows:  # the agent's demonstrations: winning expert trajectories on its own games
        assert (splits["train"] / row["game"]).is_file()
        assert row["expert"] and row["expert_steps"] == len(row["expert"]) <= 50
        assert row["initial_observation"].startswith("You are in the middle of a room")


@pytest.mark.slow
def test_nonsense_policy_wins_nothing(splits):
    result = evaluate(splits, NonsensePolicy(), environment={"max_steps": 5, "workers": 2})
    assert result.score == 0.0 and result.metrics["won"] == 0
    assert result.metrics["mean_steps"] == 5  # every episode runs to the step limit
    assert all(item["end"] == "max_steps" and item["actions"] == ["dance with the toaster"] * 5 for item in result.items)


@pytest.mark.slow
def test_lockstep_and_one_at_a_time_agree(splits):
    rows = list(read_jsonl(splits["eval"] / "eval.jsonl"))[::3]  # 4 games of different types
    games = {row["id"]: splits["eval"] / row["game"] for row in rows}
    with public.EnvPool(workers=2) as pool:
        together = play_episodes(games, ExpertPolicy(games), pool, max_live=3)
        alone = play_episodes(games, ExpertPolicy(games), pool, lockstep=False)
    assert together == alone and all(episode["won"] for episode in together.values())


@pytest.mark.slow
def test_textworld_speed_up_keeps_outcomes_identical(splits):
    """The speed-ups (memoised parser and translation, one-level context copies) must not change a
    single observation, admissible command or flag: the walkthrough, then 12 seeded random
    admissible commands from a new episode (other grammar paths than the expert's)."""
    import subprocess
    import sys

    rows = list(read_jsonl(splits["eval"] / "eval.jsonl"))[::4]  # 3 games of different types
    script = (
        "import json, random, sys; sys.path.insert(0, sys.argv[1]); import public\n"
        "out = []\n"
        "for game in sys.argv[3:]:\n"
        "    env = public.GameEnv(game, speed_up=sys.argv[2] == '1')\n"
        "    obs, info = env.reset(); trace = [obs, info['admissible_commands']]\n"
        "    for action in json.load(open(game))['walkthrough'] + ['look', 'nonsense']:\n"
        "        o, won, done, info = env.step(action); trace.append([o, won, done, info['admissible_commands']])\n"
        "    obs, info = env.reset(); trace.append(obs); rng = random.Random(game)\n"
        "    for _ in range(12):\n"
        "        action = rng.choice(info['admissible_commands'])\n"
        "        o, won, done, info = env.step(action); trace.append([action, o, won, done, info['admissible_commands']])\n"
        "        if done: break\n"
        "    out.append(trace)\n"
        "print(json.dumps(out))\n"
    )
    games = [str(splits["eval"] / row["game"]) for row in rows]
    folder = str(Path(public.__file__).parent)
    traces = [
        subprocess.run([sys.executable, "-c", script, folder, flag, *games], capture_output=True, text=True, check=True).stdout
        for flag in ("0", "1")
    ]
    assert traces[0] == traces[1] and json.loads(traces[0])


def _hashes(folder: Path) -> set[str]:
    return {hashlib.sha256(path.read_bytes()).hexdigest() for path in folder.rglob("*") if path.is_file()}


def _problems(folder: Path) -> set[str]:
    return {
        hashlib.sha256(json.loads(path.read_text())["pddl_problem"].encode()).hexdigest()
        for path in folder.rglob("game.tw-pddl")
    }


def test_heldout_games_never_reach_a_workspace_or_the_agents_environment(splits, tmp_path):
    import importlib.util

    from rlbench.agent_run.workspace import prepare_workspace

    task, task_settings = splits["task"], settings()
    workspace, model = tmp_path / "ws", tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    manifest = prepare_workspace(workspace, task, task_settings, model, "org/base", splits["train"])
    heldout_problems = _problems(splits["eval"] / "games")
    assert len(heldout_problems) == 12
    assert not heldout_problems & _problems(workspace)
    assert not _hashes(splits["eval"] / "games") & _hashes(workspace)
    assert not any("eval" in name for name in manifest["files"])
    assert (workspace / "task.py").read_bytes() == Path(public.__file__).read_bytes()
    # The grader's few-shot examples stay with the grader, as in the reference (RD-Agent 81649dd).
    assert not (workspace / public.PROMPTS_FILE).exists() and "ALFWorld" in (workspace / "description.md").read_text()
    # The agent's environment: the workspace's own task.py and pool, over the workspace's games.
    spec = importlib.util.spec_from_file_location("workspace_task", workspace / "task.py")
    agent_task = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(agent_task)
    rows = list(read_jsonl(workspace / "data" / "train.jsonl"))
    with pytest.raises(FileNotFoundError, match="the workspace does not get it"):
        agent_task.episode_start(rows[0]["task_type"], rows[0]["initial_observation"])
    examples = agent_task.expert_examples(rows)
    prompt = agent_task.episode_start(rows[0]["task_type"], rows[0]["initial_observation"], examples=examples)
    key = public.prompt_key(rows[0]["task_type"])
    assert prompt.startswith("Interact with a household to solve a task. Here are two examples.\n" + examples[f"react_{key}_1"])
    assert prompt.endswith("\nHere is the task.\n" + rows[0]["initial_observation"] + "\n>")
    games = {row["id"]: workspace / "data" / row["game"] for row in rows}
    assert not _problems(workspace / "data") & heldout_problems and len(_problems(workspace / "data")) == 6
    with agent_task.EnvPool(workers=2) as pool:
        starts = pool.reset(games)
        assert set(starts) == set(games)
        assert all(observation.startswith("You are in the middle of a room") for observation, _ in starts.values())
        stepped = pool.step({key: "look" for key in games})
        assert all(isinstance(observation, str) and not won for observation, won, _, _ in stepped.values())


@pytest.mark.slow
def test_hub_source_reads_a_local_copy_of_the_official_layout(splits, tmp_path):
    """The hub source on a folder laid out as alfworld-download's (json_2.1.1/{train,valid_unseen})."""
    import shutil

    root = tmp_path / "alfworld-data"
    for split, source in (("train", splits["train"]), ("valid_unseen", splits["eval"])):
        for game in sorted((source / "games").rglob("game.tw-pddl")):
            shutil.copytree(game.parent, root / "json_2.1.1" / split / game.parent.relative_to(source / "games"))
    hub = settings(source="hub", hub={"path": str(root)}, train_size=None, eval_size=None)
    task = get_task(hub)
    task.build_games(hub, "train", tmp_path / "train_games", workers=1)
    task.build_games(hub, "heldout", tmp_path / "heldout_games", workers=1)
    train_dir, eval_dir = tmp_path / "train", tmp_path / "eval"
    task.prepare_train(hub, train_dir, sources={"train_games": tmp_path / "train_games"})
    manifest = task.prepare_eval(hub, train_dir, eval_dir, sources={"heldout_games": tmp_path / "heldout_games"})
    train_rows = list(read_jsonl(train_dir / "train.jsonl"))
    assert len(train_rows) == 6 and all(row["expert"] for row in train_rows)
    assert manifest["eval_rows"] == 12 and "salt_sha256" not in manifest  # public games: no salt
    missing = settings(source="hub", hub={"path": str(tmp_path / "nowhere")})
    with pytest.raises(FileNotFoundError, match="alfworld-download"):
        task.build_games(missing, "train", tmp_path / "x")


def test_expert_example_is_in_react_prompts_layout():
    """An expert trajectory rendered as a few-shot example reads like ReAct's own examples
    (react_prompts.json): the first observation, then "> action\nobservation\n" per step, a
    thought answered "OK."."""
    first = "You are in the middle of a room. Looking quickly around you, you see a desk 1.\nYour task is to: put a pen in desk."
    row = {
        "task_type": "pick_and_place_simple",
        "initial_observation": first,
        "expert": [
            {"action": "think: find the pen", "observation": "ignored"},
            {"action": "go to desk 1 ", "observation": "You arrive at loc 3. On the desk 1, you see a pen 1."},
            {"action": "move pen 1 to desk 1", "observation": "You move the pen 1 to the desk 1."},
        ],
    }
    expected = (
        first + "\n> think: find the pen\nOK.\n> go to desk 1\nOn the desk 1, you see a pen 1.\n"
        "> move pen 1 to desk 1\nYou move the pen 1 to the desk 1.\n"
    )
    assert public.expert_example(row) == expected
    react = public.react_prompts()["react_put_1"]  # the same layout as ReAct's
    assert react.split("\n> ", 1)[0].startswith("You are in the middle of a room") and react.endswith(".\n")
    examples = public.expert_examples([row, {**row, "task_type": "look_at_obj_in_light"}])
    assert examples["react_put_0"] == examples["react_put_1"] == expected and set(examples) == {
        "react_put_0", "react_put_1", "react_examine_0", "react_examine_1"}


def test_a_worker_serves_steps_before_earlier_resets():
    """A step (quick) goes before resets received earlier (games being built), unless one of
    those names its key; otherwise requests are served in order."""
    from collections import deque

    queue = deque([
        {"op": "reset", "items": [["a", "g1", 50]]},
        {"op": "reset", "items": [["b", "g2", 50]]},
        {"op": "step", "items": [["b", "look"]]},  # b's reset is earlier: must wait for it
        {"op": "step", "items": [["c", "look"]]},
        {"op": "close", "keys": ["d"]},
    ])
    served = [public._next_request(queue) for _ in range(len(queue))]
    assert [(r["op"], (r.get("items") or [[r.get("keys", [None])[0]]])[0][0]) for r in served] == [
        ("step", "c"), ("close", "d"), ("reset", "a"), ("reset", "b"), ("step", "b")]


def _trace(env, actions) -> list:
    observation, info = env.reset()
    trace = [observation, info["admissible_commands"], bool(info["won"])]
    for action in actions:
        observation, won, done, info = env.step(action)
        trace.append([observation, won, done, info["admissible_commands"]])
    return trace


def test_a_kept_game_starts_every_episode_identically(splits):
    """A worker keeps a finished game built and resets it for the next episode of that game: the
    episode starts from the identical state (same observation and info) and plays out identically,
    whatever the earlier episode did to it."""
    rows = list(read_jsonl(splits["eval"] / "eval.jsonl"))[::5]  # 3 games of different types
    worker = public._Worker()
    for row in rows:
        game = str(splits["eval"] / row["game"])
        plan = json.loads(Path(game).read_text())["walkthrough"]
        fresh = public.GameEnv(game)
        try:
            expected = _trace(fresh, [*plan, "look"])
        finally:
            fresh.close()
        env, _start = worker.reset("first", game, 50)
        for action in plan[:2] + ["nonsense"]:  # an episode that changed the game's state
            env.step(action)
        worker.close("first")
        reused = worker.reused
        again, _start = worker.reset("second", game, 50)
        assert again is env and worker.reused == reused + 1  # the same built env, not a new one
        assert _trace(again, [*plan, "look"]) == expected
        assert expected[-2][1] and expected[-2][2]  # the walkthrough wins
        worker.close("second")
    worker.close_all()


def test_the_expert_plan_wins_every_heldout_game_and_a_later_evaluation_reuses_the_games(splits):
    """The expert plan wins all 12 held-out games; the grader's next evaluation in the same process
    plays the same games in the same (kept) environment workers, each game reset from its kept env:
    identical episodes."""
    from rlbench.tasks.alfworld.rollout import shared_pool

    rows = list(read_jsonl(splits["eval"] / "eval.jsonl"))
    games = {row["id"]: splits["eval"] / row["game"] for row in rows}
    first = evaluate(splits, ExpertPolicy(games))
    assert first.primary == "success_rate" and first.score == 100.0 and first.n == 12
    assert first.metrics["won"] == 12
    assert set(first.metrics["per_type_success"]) == set(TYPES)
    assert all(rate == 100.0 for rate in first.metrics["per_type_success"].values())
    assert 1 <= first.metrics["mean_steps"] <= 50
    shown = public_metrics(first.to_dict())
    assert shown["metrics"]["per_type_success"] and "items" not in shown
    stored = splits["eval"] / TRANSLATIONS  # prepare_eval's: both translations of every game
    assert len(list(stored.glob("*.pickle"))) == 2 * len(rows)
    pool = shared_pool(2, stored)
    reused = sum(pool.reused)
    later = evaluate(splits, ExpertPolicy(games))
    assert shared_pool(2, stored) is pool and sum(pool.reused) - reused == len(rows)
    assert later.items == first.items and later.score == 100.0


def test_a_stored_translation_answers_instead_of_the_translator(tmp_path, monkeypatch):
    """public._stored: where TRANSLATIONS_ENV names a folder holding the translation of exactly
    these inputs (domain, problem, optimised or not), it is read and the translator is not called;
    any other input is translated as usual; without the variable nothing is read."""
    calls = []

    def translator(domain, problem, verbose=False, optimize=False):
        calls.append((domain, problem, optimize))
        return ("translated", domain, problem, optimize)

    stored = public._stored(translator)
    path = public.translation_path(tmp_path, "(domain)", "(problem)", optimize=True)
    path.write_bytes(__import__("pickle").dumps(("stored",)))
    monkeypatch.delenv(public.TRANSLATIONS_ENV, raising=False)
    assert stored("(domain)", "(problem)", optimize=True)[0] == "translated" and len(calls) == 1
    monkeypatch.setenv(public.TRANSLATIONS_ENV, str(tmp_path))
    assert stored("(domain)", "(problem)", optimize=True) == ("stored",) and len(calls) == 1
    assert stored("(domain)", "(problem)", optimize=False)[0] == "translated"  # the other translation
    assert stored("(domain)", "(other problem)", optimize=True)[0] == "translated" and len(calls) == 3


def test_environment_workers_play_from_stored_translations(splits, tmp_path):
    """store_translations writes both translations of each game; workers given the folder read
    them (a game whose stored files are another game's plays as that other game would, so the
    files really are what the worker used) and play exactly as workers that translate."""
    rows = list(read_jsonl(splits["eval"] / "eval.jsonl"))
    a, b = (str(splits["eval"] / row["game"]) for row in (rows[0], rows[-1]))
    plan = json.loads(Path(a).read_text())["walkthrough"]
    store = tmp_path / "store"
    assert public.store_translations([a, b], store) == 4 and public.store_translations([a], store) == 0

    def play(translations) -> list:
        with public.EnvPool(workers=1, translations=translations) as pool:
            observation, info = pool.reset({"a": a})["a"]
            trace = [[observation, info["admissible_commands"]]]
            for action in plan:
                observation, won, done, info = pool.step({"a": action})["a"]
                trace.append([observation, won, done, info["admissible_commands"]])
        return trace

    translated = play(None)
    assert translated[-1][1] and translated[-1][2]  # the walkthrough wins
    assert play(store) == translated
    swapped = tmp_path / "swapped"  # a's file names holding b's translations
    swapped.mkdir()
    for optimize in (False, True):
        data_a, data_b = (json.loads(Path(game).read_text()) for game in (a, b))
        theirs = public.translation_path(store, data_b["pddl_domain"], data_b["pddl_problem"], optimize)
        mine = public.translation_path(swapped, data_a["pddl_domain"], data_a["pddl_problem"], optimize)
        mine.write_bytes(theirs.read_bytes())
    # Two games can start with the same text (the same room and task, the object elsewhere), so the
    # whole walkthrough is compared: on b's game a's plan does not play as it does on a's.
    assert play(swapped) != translated


def test_the_pool_reports_a_failing_request_and_carries_on(splits, tmp_path):
    rows = list(read_jsonl(splits["eval"] / "eval.jsonl"))[:2]
    with public.EnvPool(workers=1) as pool:
        with pytest.raises(RuntimeError, match="no ALFWorld game"):
            pool.reset({"missing": tmp_path / "nowhere" / "game.tw-pddl"})
        with pytest.raises(RuntimeError, match="no live episode 'missing'"):  # its reset failed
            pool.step({"missing": "look"})
        with pytest.raises(KeyError, match="reset it first"):  # never reset: not even sent
            pool.step({"unknown": "look"})
        starts = pool.reset({row["id"]: splits["eval"] / row["game"] for row in rows})
        assert set(starts) == {row["id"] for row in rows}


class _SlowResets:
    """A non-blocking pool of scripted games (won on the action "win" at the game's step count)
    whose resets arrive one per receive() call, steps at once: the loop sends the next games'
    resets ahead and plays every live episode once its observation has arrived."""

    workers = 2

    def __init__(self, wins_at: dict):
        self.wins_at, self.steps, self.resets, self.answers, self.sent = wins_at, {}, [], {}, []

    def send_reset(self, games, max_steps):
        self.resets.extend(games)
        self.sent.extend(games)

    def send_step(self, actions):
        for key, action in actions.items():
            self.steps[key] += 1
            won = action == "win"
            self.answers[key] = (f"step {self.steps[key]} of {key}", won, won, {})

    def receive(self, keys=None, wait=True):
        if self.resets and (keys is None or self.resets[0] in keys):
            key = self.resets.pop(0)
            self.steps[key] = 0
            self.answers[key] = (f"You are in game {key}.", {})
        chosen = [key for key in self.answers if keys is None or key in keys]
        return {key: self.answers.pop(key) for key in chosen}

    def release(self, keys):
        pass


class _ScriptedPolicy:
    """Says "win" at each game's winning step (counted from its prompt), "wait" before; records
    the keys of every call."""

    def __init__(self, wins_at: dict, pool=None):
        self.wins_at, self.calls, self.pool, self.resets_sent = wins_at, [], pool, []

    def generate(self, prompts, max_new_tokens, stop):
        self.calls.append(sorted(prompts))
        self.resets_sent.append(len(self.pool.sent) if self.pool is not None else None)
        return {key: " win\n" if prompt.count(">") - 1 >= self.wins_at[key] else " wait\n" for key, prompt in prompts.items()}


def test_games_reset_ahead_while_the_live_episodes_play_with_the_same_outcomes(splits, monkeypatch):
    monkeypatch.setattr(public, "episode_start", lambda task_type, observation: observation + "\n>")
    rows = list(read_jsonl(splits["eval"] / "eval.jsonl"))[:6]
    games = {row["id"]: splits["eval"] / row["game"] for row in rows}
    wins_at = {key: i % 3 for i, key in enumerate(games)}
    pool = _SlowResets(wins_at)
    policy = _ScriptedPolicy(wins_at, pool)
    overlapped = play_episodes(games, policy, pool, max_live=4)
    assert policy.resets_sent[0] == 6  # 4 live games and one per worker ahead, before the first call
    # Generation began once the 4 live episodes had their games built; the next games' resets
    # (one per worker) were sent ahead of it.
    assert policy.calls[0] == sorted(list(games)[:4])
    assert all(len(call) <= 4 for call in policy.calls) and max(len(call) for call in policy.calls[1:]) >= 2
    alone = play_episodes(games, _ScriptedPolicy(wins_at), _SlowResets(wins_at), lockstep=False)
    assert overlapped == alone
    assert all(episode["won"] and episode["steps"] == wins_at[key] + 1 for key, episode in overlapped.items())
