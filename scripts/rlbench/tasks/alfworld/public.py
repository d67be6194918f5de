"""ALFWorld (Level 3): the environment, the prompt format and the reward, as the grader uses them.

This file is the workspace's task.py. The grader evaluates a submitted model with exactly these
functions; an agent may use them to collect trajectories on its training games (data/games/),
to build SFT data from the expert trajectories in data/train.jsonl, and to compute rewards.

Protocol (as the reference harness and the ReAct paper's ALFWorld notebook):
- each episode is one game of the official `alfworld` engine (AlfredTWEnv, textworld + PDDL);
- the model reads a ReAct prompt: an instruction line, two few-shot examples of the game's task
  type (react_prompts.json, ReAct's alfworld_3prompts.json, MIT), "Here is the task.", the
  game's initial observation (the welcome banner removed), then "\\n>". As in the reference
  harness (RD-Agent commit 81649dd), the workspace does not get react_prompts.json: render
  prompts with examples of your own (`episode_start(..., examples=expert_examples(rows))`);
- at every step it continues the text greedily up to the first newline (at most 100 new tokens);
  the stripped text is the action, sent to the game as is; the prompt grows by
  " {action}\\n{observation}\\n>"; an action starting with "think:" gets the observation "OK.";
- an episode ends when the game is won or after 50 steps; reward = 1 if won else 0;
- metrics: success rate (primary, 0-100), mean steps, success per task type.

Note: the engine (alfworld 0.4.x) places an object with `move <obj> to <recep>`; the ReAct
few-shot examples were written for an older engine and say `put <obj> in/on <recep>`, which the
current engine answers with "Nothing happens.". The admissible commands of a state are in
info["admissible_commands"].

Playing a training game (the environment runs inside your workspace; it only ever sees the
games you give it):

    import task
    env = task.GameEnv("data/games/<game dir>/trial_0/game.tw-pddl")
    observation, info = env.reset()             # observation: banner removed
    observation, won, done, info = env.step("go to desk 1")

Many games at once, each in one of `workers` processes (what the grader does):

    with task.EnvPool(workers=4) as pool:
        starts = pool.reset({"a": game_a, "b": game_b})    # key -> (observation, info)
        results = pool.step({"a": "look", "b": "go to desk 1"})  # key -> (observation, won, done, info)

or from a shell: `python task.py serve` speaks the pool's JSON-lines protocol on stdin/stdout.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

MAX_STEPS = 50
MAX_NEW_TOKENS = 100
STOP = ["\n"]

#: task type -> the few-shot key of react_prompts.json, in the reference's order (prefix match
#: on the game's directory name: "<task_type>-<Object>-...").
TASK_PREFIXES = {
    "pick_and_place": "put",
    "pick_clean_then_place": "clean",
    "pick_heat_then_place": "heat",
    "pick_cool_then_place": "cool",
    "look_at_obj": "examine",
    "pick_two_obj": "puttwo",
}
TASK_TYPES = {
    1: "pick_and_place_simple",
    2: "look_at_obj_in_light",
    3: "pick_clean_then_place_in_recep",
    4: "pick_heat_then_place_in_recep",
    5: "pick_cool_then_place_in_recep",
    6: "pick_two_obj_and_place",
}
PROMPTS_FILE = "react_prompts.json"
#: ALFWorld's valid_unseen split (the held-out games of the paper), games per task type: 134.
VALID_UNSEEN_MIX = {
    "pick_and_place_simple": 24,
    "pick_clean_then_place_in_recep": 31,
    "pick_heat_then_place_in_recep": 23,
    "pick_cool_then_place_in_recep": 21,
    "look_at_obj_in_light": 18,
    "pick_two_obj_and_place": 17,
}


# -- prompt format -----------------------------------------------------------------------------
def _prompts_path() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / PROMPTS_FILE, here / "data" / PROMPTS_FILE):
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"{PROMPTS_FILE} (ReAct's few-shot examples, which the grader's prompt begins with) is not here: "
        "as in the reference harness, the workspace does not get it. Pass examples of your own, e.g. "
        "task.episode_start(task_type, observation, examples=task.expert_examples(training_rows))"
    )


@functools.lru_cache(maxsize=1)
def react_prompts() -> dict:
    return json.loads(_prompts_path().read_text())


def prompt_key(task_type: str) -> str:
    """The few-shot key ('put', 'clean', ...) of a task type or a game directory name."""
    for prefix, key in TASK_PREFIXES.items():
        if task_type.startswith(prefix):
            return key
    raise ValueError(f"unknown ALFWorld task type {task_type!r}; known prefixes: {', '.join(TASK_PREFIXES)}")


def few_shot_prompt(task_type: str, examples: dict | None = None) -> str:
    """The shared beginning of every episode prompt of a task type: two ReAct examples,
    `react_<key>_1` then `react_<key>_0`, from `examples` (react_prompts.json's layout) or, when
    None, from react_prompts.json (the grader's; not in the workspace)."""
    key = prompt_key(task_type)
    prompts = react_prompts() if examples is None else examples
    return (
        "Interact with a household to solve a task. Here are two examples.\n"
        + prompts[f"react_{key}_1"]
        + prompts[f"react_{key}_0"]
        + "\nHere is the task.\n"
    )


def expert_example(row: dict) -> str:
    """A training row's expert trajectory as a few-shot example in ReAct's format: the initial
    observation, then "> {action}\n{observation}\n" per step."""
    text = row["initial_observation"] + "\n>"
    for step in row.get("expert") or []:
        action = clean_action(step["action"])
        text += history_entry(action, step_observation(action, step["observation"]))
    return text[:-1]


def expert_examples(rows: list[dict]) -> dict:
    """Few-shot examples in react_prompts.json's layout (`react_<key>_0`, `react_<key>_1`) from
    the first two expert trajectories of each task type among `rows` (training rows with
    `task_type` and `expert`); a type with one trajectory uses it twice."""
    by_key: dict[str, list[str]] = {}
    for row in rows:
        if row.get("expert") and row.get("task_type"):
            by_key.setdefault(prompt_key(row["task_type"]), []).append(expert_example(row))
    examples = {}
    for key, texts in by_key.items():
        examples[f"react_{key}_0"] = texts[0]
        examples[f"react_{key}_1"] = texts[1] if len(texts) > 1 else texts[0]
    return examples


def initial_observation(raw: str) -> str:
    """The game's first observation without the '-= Welcome to TextWorld, ALFRED! =-' banner."""
    return "\n".join(raw.split("\n\n")[1:])


def process_observation(observation: str) -> str:
    """ReAct's observation clean-up (drops a 'You arrive at loc N. ' prefix)."""
    if observation.startswith("You arrive at loc "):
        observation = observation[observation.find(". ") + 2 :]
    return observation


def episode_start(task_type: str, first_observation: str, examples: dict | None = None) -> str:
    """The prompt before the first action: few-shot examples (`examples`, or the grader's
    react_prompts.json), the task, then '\\n>'."""
    return few_shot_prompt(task_type, examples) + first_observation + "\n>"


def clean_action(completion: str) -> str:
    """The action the game receives: the completion up to the first newline, stripped."""
    return completion.split("\n", 1)[0].strip()


def history_entry(action: str, observation: str) -> str:
    """What one step appends to the prompt."""
    return f" {action}\n{observation}\n>"


def step_observation(action: str, observation: str) -> str:
    """The observation the model reads after an action (thoughts get 'OK.')."""
    observation = process_observation(observation)
    return "OK." if action.startswith("think:") else observation


def reward(won: bool) -> float:
    """The episode's reward: 1 if the game was won, else 0 (success = the game's `won` flag)."""
    return 1.0 if won else 0.0


# -- the engine --------------------------------------------------------------------------------
def ensure_alfworld_data_dir() -> None:
    # alfworld.info creates $ALFWORLD_DATA (default ~/.cache/alfworld) when imported.
    if not os.environ.get("ALFWORLD_DATA"):
        os.environ["ALFWORLD_DATA"] = os.path.join(tempfile.gettempdir(), f"alfworld-data-{os.getuid()}")


_SPED_UP = False


def speed_up_textworld() -> None:
    """Memoise textworld's grammar-template parser (about 70 % of a step's time goes to re-parsing
    the same templates). Idempotent; outcomes are identical (tested). Call before creating envs."""
    global _SPED_UP
    if _SPED_UP:
        return
    import textworld.envs.pddl.textgen as textgen
    import textworld.logic as logic

    for module in (logic, textgen):
        original = module._parse_and_convert
        cache: dict = {}

        def memoised(*args, _original=original, _cache=cache, **kwargs):
            key = (args, tuple(sorted(kwargs.items())))
            try:
                return _cache[key]
            except KeyError:
                value = _cache[key] = _original(*args, **kwargs)
                return value
            except TypeError:  # an unhashable argument: no caching
                return _original(*args, **kwargs)

        module._parse_and_convert = memoised
    _SPED_UP = True


def env_config(data_dir: str | Path, max_steps: int = MAX_STEPS) -> dict:
    """An AlfredTWEnv config (the keys of alfworld's base_config.yaml) over one data folder."""
    ensure_alfworld_data_dir()
    from alfworld.info import ALFRED_PDDL_PATH, ALFRED_TWL2_PATH

    data_dir = str(data_dir)
    return {
        "dataset": {
            "data_path": data_dir,
            "eval_id_data_path": data_dir,
            "eval_ood_data_path": data_dir,
            "num_train_games": -1,
            "num_eval_games": -1,
        },
        "logic": {"domain": ALFRED_PDDL_PATH, "grammar": ALFRED_TWL2_PATH},
        "env": {
            "type": "AlfredTWEnv",
            "domain_randomization": False,
            "task_types": list(TASK_TYPES),
            "expert_timeout_steps": 150,
            "expert_type": "handcoded",
            "goal_desc_human_anns_prob": 0.0,
        },
        "controller": {"type": "oracle", "debug": False, "load_receps": True},
        "general": {"random_seed": 42, "use_cuda": False, "task": "alfred", "training_method": "dagger"},
        "dagger": {"training": {"max_nb_steps_per_episode": max_steps}},
    }


def task_type_of(game_file: str | Path) -> str:
    """The task type of a game, from its traj_data.json."""
    return json.loads((Path(game_file).parent / "traj_data.json").read_text())["task_type"]


class GameEnv:
    """One game played through alfworld's own AlfredTWEnv (eval mode: no expert, no facts).

    reset() -> (observation, info): the initial observation without the banner;
    step(action) -> (observation, won, done, info): the raw step feedback (process it with
    step_observation for the prompt). info holds 'admissible_commands' and 'won'. done is True
    when the game is won or after max_steps steps."""

    def __init__(self, game_file: str | Path, max_steps: int = MAX_STEPS, speed_up: bool = True):
        self.game_file = Path(game_file).resolve()
        if not self.game_file.is_file():
            raise FileNotFoundError(f"no ALFWorld game at {self.game_file}")
        self.task_type = task_type_of(self.game_file)
        self.max_steps = max_steps
        if speed_up:
            speed_up_textworld()
        from alfworld.agents.environment.alfred_tw_env import AlfredTWEnv

        with contextlib.redirect_stdout(io.StringIO()):  # AlfredTWEnv prints progress
            alfred = AlfredTWEnv(env_config(self.game_file.parent, max_steps), train_eval="eval_out_of_distribution")
        if alfred.num_games != 1:
            raise ValueError(f"{self.game_file} is not a solvable ALFWorld game (traj_data.json, solvable: true)")
        self._env = alfred.init_env(batch_size=1)
        self.steps = 0

    def reset(self) -> tuple[str, dict]:
        observations, infos = self._env.reset()
        self.steps = 0
        return initial_observation(observations[0]), _first(infos)

    def step(self, action: str) -> tuple[str, bool, bool, dict]:
        observations, _scores, dones, infos = self._env.step([action])
        self.steps += 1
        info = _first(infos)
        return observations[0], bool(info["won"]), bool(dones[0]), info

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._env.close()


def _first(infos: dict) -> dict:
    return {key: value[0] for key, value in infos.items()}


def play(game_file: str | Path, policy, max_steps: int = MAX_STEPS) -> dict:
    """Play one game with `policy(prompt, info) -> completion` in the evaluation's loop (one
    episode, the whole prompt every step: the reference's loop). Returns won, steps, actions."""
    env = GameEnv(game_file, max_steps=max_steps)
    try:
        observation, info = env.reset()
        prompt = episode_start(env.task_type, observation)
        actions = []
        for step in range(1, max_steps + 1):
            action = clean_action(policy(prompt, info))
            raw, won, done, info = env.step(action)
            actions.append(action)
            prompt += history_entry(action, step_observation(action, raw))
            if done:
                return {"won": won, "steps": step, "actions": actions}
        return {"won": False, "steps": max_steps, "actions": actions}
    finally:
        env.close()


# -- a pool of environment processes -----------------------------------------------------------
def serve(stdin=None, stdout=None) -> None:
    """An environment worker: JSON lines in, JSON lines out. Requests:
    {"op": "reset", "items": [[key, game_file, max_steps], ...]} -> {"results": [[key, observation, info, task_type], ...], "seconds": s}
    {"op": "step", "items": [[key, action], ...]} -> {"results": [[key, observation, won, done, info], ...], "seconds": s}
    {"op": "close", "keys": [...]} -> {"results": []}
    An error answers {"error": "..."} and the worker carries on."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    # The engine prints progress; only protocol lines may reach stdout.
    real_stdout, sys.stdout = stdout, sys.stderr
    envs: dict = {}
    speed_up_textworld()
    for line in stdin:
        if not line.strip():
            continue
        started = time.perf_counter()
        try:
            request = json.loads(line)
            op = request["op"]
            results = []
            if op == "reset":
                for key, game_file, max_steps in request["items"]:
                    key = json.dumps(key)
                    if key in envs:
                        envs.pop(key).close()
                    env = envs[key] = GameEnv(game_file, max_steps=max_steps)
                    observation, info = env.reset()
                    results.append([json.loads(key), observation, _plain(info), env.task_type])
            elif op == "step":
                for key, action in request["items"]:
                    observation, won, done, info = envs[json.dumps(key)].step(action)
                    results.append([key, observation, won, done, _plain(info)])
            elif op == "close":
                for key in request.get("keys", []):
                    env = envs.pop(json.dumps(key), None)
                    if env is not None:
                        env.close()
            else:
                raise ValueError(f"unknown op {op!r}")
            answer = {"results": results, "seconds": time.perf_counter() - started}
        except Exception as error:  # noqa: BLE001 - reported to the caller, the worker lives on
            answer = {"error": f"{type(error).__name__}: {error}"}
        real_stdout.write(json.dumps(answer) + "\n")
        real_stdout.flush()


def _plain(info: dict) -> dict:
    """What a step's info may carry to the player: won and the admissible commands (never facts)."""
    return {"won": bool(info.get("won")), "admissible_commands": list(info.get("admissible_commands") or [])}


class EnvPool:
    """Games played in `workers` processes, each running this file's `serve`. Keys (any JSON
    value) name episodes; a key keeps its worker until it is reset again. Requests to different
    workers run in parallel; `env_seconds` adds up the workers' own busy time."""

    def __init__(self, workers: int = 1, python: str | None = None, env: dict | None = None):
        self.workers = max(1, int(workers))
        self._procs = []
        child_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        for _ in range(self.workers):
            self._procs.append(
                subprocess.Popen(
                    [python or sys.executable, str(Path(__file__).resolve()), "serve"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                    text=True, env=child_env, bufsize=1,
                )
            )
        self._owner: dict = {}
        self._next = 0
        self.env_seconds = 0.0

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _worker_for(self, key) -> int:
        token = json.dumps(key)
        if token not in self._owner:
            self._owner[token] = self._next % self.workers
            self._next += 1
        return self._owner[token]

    def _ask(self, requests: dict[int, dict]) -> list:
        answers: dict[int, dict] = {}

        def exchange(index: int, request: dict) -> None:
            proc = self._procs[index]
            proc.stdin.write(json.dumps(request) + "\n")
            proc.stdin.flush()
            line = proc.stdout.readline()
            answers[index] = json.loads(line) if line else {"error": f"environment worker {index} died"}

        threads = [threading.Thread(target=exchange, args=item) for item in requests.items()]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        results = []
        for index in sorted(answers):
            answer = answers[index]
            if "error" in answer:
                raise RuntimeError(f"environment worker {index}: {answer['error']}")
            self.env_seconds += answer.get("seconds", 0.0)
            results.extend(answer["results"])
        return results

    def reset(self, games: dict, max_steps: int = MAX_STEPS) -> dict:
        """key -> game file: start (or restart) those episodes; key -> (observation, info)."""
        requests: dict[int, dict] = {}
        for key, game in games.items():
            self._owner.pop(json.dumps(key), None)
            worker = self._worker_for(key)
            requests.setdefault(worker, {"op": "reset", "items": []})["items"].append([key, str(game), max_steps])
        out = {}
        for key, observation, info, _task_type in self._ask(requests):
            out[_key(key)] = (observation, info)
        return out

    def step(self, actions: dict) -> dict:
        """key -> action: one step of each of those episodes; key -> (observation, won, done, info)."""
        requests: dict[int, dict] = {}
        for key, action in actions.items():
            worker = self._worker_for(key)
            requests.setdefault(worker, {"op": "step", "items": []})["items"].append([key, action])
        return {_key(key): (obs, won, done, info) for key, obs, won, done, info in self._ask(requests)}

    def release(self, keys) -> None:
        requests: dict[int, dict] = {}
        for key in keys:
            token = json.dumps(key)
            if token in self._owner:
                requests.setdefault(self._owner.pop(token), {"op": "close", "keys": []})["keys"].append(key)
        if requests:
            self._ask(requests)

    def close(self) -> None:
        for proc in self._procs:
            with contextlib.suppress(Exception):
                proc.stdin.close()
        for proc in self._procs:
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs = []


def _key(key):
    """JSON turns tuple keys into lists; give them back as tuples (hashable)."""
    return tuple(_key(k) for k in key) if isinstance(key, list) else key


if __name__ == "__main__":
    if sys.argv[1:] == ["serve"]:
        serve()
    else:
        sys.exit(f"usage: python {Path(__file__).name} serve   (an environment worker speaking JSON lines)")
