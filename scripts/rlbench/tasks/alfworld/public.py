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
import hashlib
import io
import json
import os
import pickle
import subprocess
import sys
import tempfile
import threading
import time
from collections import OrderedDict, deque
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
#: translations of (domain, problem) kept per process (least recently used dropped beyond this)
TRANSLATION_CACHE_SIZE = 512


def _memoise(function, size: int | None = None):
    """`function` answering repeated calls (same hashable arguments) from a cache; an unhashable
    argument bypasses it. size: at most that many answers, least recently used dropped."""
    cache: OrderedDict = OrderedDict()

    @functools.wraps(function)
    def memoised(*args, **kwargs):
        key = (args, tuple(sorted(kwargs.items())))
        try:
            value = cache[key]
        except KeyError:
            value = cache[key] = function(*args, **kwargs)
            if size is not None and len(cache) > size:
                cache.popitem(last=False)
            return value
        except TypeError:  # an unhashable argument: no caching
            return function(*args, **kwargs)
        cache.move_to_end(key)
        return value

    return memoised


#: a directory of stored Fast Downward translations (store_translations) that speed_up_textworld
#: reads a game's translation from instead of computing it; EnvPool(translations=DIR) sets it in
#: its workers. Only for directories this process's owner wrote: the files are pickles.
TRANSLATIONS_ENV = "RLBENCH_ALFWORLD_TRANSLATIONS"


@functools.lru_cache(maxsize=1)
def _translator_version() -> str:
    import importlib.metadata

    try:
        return importlib.metadata.version("fast-downward-textworld")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def translation_path(directory: str | Path, domain: str, problem: str, optimize: bool) -> Path:
    """Where a (domain, problem, optimize) translation is stored: named by the hash of its inputs
    and the translator's version, so that a stored file can only ever answer the same question."""
    inputs = "\0".join([_translator_version(), "optimize" if optimize else "plain", domain, problem])
    return Path(directory) / f"{hashlib.sha256(inputs.encode()).hexdigest()}.pickle"


def store_translations(game_files, directory: str | Path) -> int:
    """Compute and store (directory/<hash>.pickle) both Fast Downward translations that a reset of
    each game needs (textworld's PddlState translates the game's PDDL domain and problem plain and
    optimised), skipping those already there. Returns how many were written. The evaluation
    stores its held-out games' once, before any agent runs, so that even a first evaluation's
    resets skip the translation (about 2/3 of building a game)."""
    import inspect

    import fast_downward

    translate = inspect.unwrap(fast_downward.pddl2sas)  # the translator itself, not the memo or the store
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    written = 0
    for game_file in game_files:
        data = json.loads(Path(game_file).read_text())
        for optimize in (False, True):
            path = translation_path(directory, data["pddl_domain"], data["pddl_problem"], optimize)
            if path.exists():
                continue
            with contextlib.redirect_stdout(io.StringIO()):
                result = translate(data["pddl_domain"], data["pddl_problem"], optimize=optimize)
            partial = path.with_name(f".{path.name}.{os.getpid()}")
            partial.write_bytes(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
            os.replace(partial, path)
            written += 1
    return written


def _stored(translate):
    """`translate` (fast_downward.pddl2sas) answered from the TRANSLATIONS_ENV directory where the
    translation is stored there; computed otherwise."""

    @functools.wraps(translate)
    def stored(domain, problem, verbose=False, optimize=False):
        directory = os.environ.get(TRANSLATIONS_ENV)
        if directory and not verbose:
            try:
                return pickle.loads(translation_path(directory, domain, problem, optimize).read_bytes())
            except FileNotFoundError:
                pass
        return translate(domain, problem, verbose=verbose, optimize=optimize)

    return stored


def _copy_context(context: dict) -> dict:
    """textworld's textgen.copy_context with the variables and the mapping copied one level deep
    instead of deep-copied. The grammar derivation only ever adds entries to a copy's two dicts
    (textgen.query), and their values (the game's EntityInfo objects, which the context shares
    through entity_infos anyway, and textworld.logic Variables) are only read (the grammar's
    expressions are attribute reads such as {o.name}); the deep copies were over half of the
    engine's time per step."""
    return {
        "state": context["state"],
        "facts": context["facts"],
        "variables": dict(context["variables"]),
        "mapping": dict(context["mapping"]),
        "entity_infos": context["entity_infos"],
    }


def speed_up_textworld() -> None:
    """Memoise two pure functions of the engine that it recomputes over and over, and copy less:
    - textworld's grammar-template parser (about 70 % of a step's time re-parses the same templates);
    - Fast Downward's PDDL -> SAS translation of a game (about 80 % of a reset: every reset builds
      the game's planning state twice, each translating the problem twice, and every episode of
      the same game translates the same text again), read from stored translations where the
      TRANSLATIONS_ENV directory holds them (store_translations);
    - the grammar derivation's context copies (_copy_context: one level deep, not deep).
    Idempotent; outcomes are identical (tested). Call before creating envs."""
    global _SPED_UP
    if _SPED_UP:
        return
    import fast_downward
    import textworld.envs.pddl.textgen as textgen
    import textworld.logic as logic

    for module in (logic, textgen):
        module._parse_and_convert = _memoise(module._parse_and_convert)
    # The translation's result (the parsed task, read only afterwards, and the SAS text) depends
    # on the domain and problem texts alone; textworld's PddlState looks it up on the module.
    # Stored translations (store_translations) are read instead where TRANSLATIONS_ENV names them.
    fast_downward.pddl2sas = _memoise(_stored(fast_downward.pddl2sas), TRANSLATION_CACHE_SIZE)
    textgen.copy_context = _copy_context  # looked up on the module by every caller
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
#: built games a worker keeps after their episodes end, to reset them again (least recently used
#: closed beyond this)
IDLE_ENVS = 256
#: EnvPool's workers run this much nicer than their parent: games are built while the batch
#: decodes, and on few cores the decoding threads must not wait behind them (a thread pool whose
#: threads are preempted stalls at every operation)
WORKER_NICENESS = 10


class _Worker:
    """One worker's games: live episodes by key, and finished episodes' built envs parked per
    (game file, max_steps) for the next reset of that game (a reset rebuilds the whole game state
    from the game file: a parked env starts exactly like a new one; tested)."""

    def __init__(self, idle_limit: int = IDLE_ENVS):
        self.live: dict = {}
        self.idle: OrderedDict = OrderedDict()
        self.idle_limit = idle_limit
        self.reused = 0

    def _park(self, env) -> None:
        slot = (str(env.game_file), env.max_steps)
        self.idle.setdefault(slot, []).append(env)
        self.idle.move_to_end(slot)
        while sum(len(envs) for envs in self.idle.values()) > self.idle_limit:
            oldest, envs = next(iter(self.idle.items()))
            envs.pop(0).close()
            if not envs:
                del self.idle[oldest]

    def reset(self, key: str, game_file: str, max_steps: int):
        if key in self.live:
            self._park(self.live.pop(key))
        slot = (str(Path(game_file).resolve()), max_steps)
        parked = self.idle.get(slot)
        if parked:
            env = parked.pop()
            if not parked:
                del self.idle[slot]
            self.reused += 1
        else:
            env = GameEnv(game_file, max_steps=max_steps)
        self.live[key] = env
        return env, env.reset()

    def close(self, key: str) -> None:
        env = self.live.pop(key, None)
        if env is not None:
            self._park(env)

    def close_all(self) -> None:
        for env in [*self.live.values(), *(env for envs in self.idle.values() for env in envs)]:
            env.close()
        self.live, self.idle = {}, OrderedDict()


def _next_request(queue: deque) -> dict:
    """The request to serve next: steps and closes go before earlier resets (a reset builds a
    game, a step is quick) unless an earlier request names one of their keys; else the oldest."""
    earlier: set = set()
    for index, request in enumerate(queue):
        try:
            keys = {json.dumps(item[0]) for item in request.get("items", [])} | {json.dumps(k) for k in request.get("keys", [])}
        except (TypeError, IndexError, KeyError, AttributeError):  # malformed: answered in its turn
            break
        if request.get("op") != "reset" and not keys & earlier:
            del queue[index]
            return request
        earlier |= keys
    return queue.popleft()


def serve(stdin=None, stdout=None) -> None:
    """An environment worker: JSON lines in, JSON lines out. Requests (an optional "id" is echoed
    back in the answer):
    {"op": "reset", "items": [[key, game_file, max_steps], ...]} -> {"results": [[key, observation, info, task_type], ...], "seconds": s}
    {"op": "step", "items": [[key, action], ...]} -> {"results": [[key, observation, won, done, info], ...], "seconds": s}
    {"op": "close", "keys": [...]} -> {"results": []}
    Requests are answered one at a time; a step or close is served before resets received earlier
    unless one of those names its keys. A finished game's env is kept and reset again when the
    same game (and max_steps) is reset next. An error answers {"error": "..."} and the worker
    carries on."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    # The engine prints progress; only protocol lines may reach stdout.
    real_stdout, sys.stdout = stdout, sys.stderr
    games = _Worker()
    speed_up_textworld()
    queue: deque = deque()
    arrived = threading.Condition()
    ended = []

    def read() -> None:
        for line in stdin:
            if not line.strip():
                continue
            try:
                request = json.loads(line)
            except ValueError as error:
                request = {"op": "invalid", "error": str(error)}
            with arrived:
                queue.append(request)
                arrived.notify()
        with arrived:
            ended.append(True)
            arrived.notify()

    threading.Thread(target=read, daemon=True).start()
    try:
        while True:
            with arrived:
                while not queue and not ended:
                    arrived.wait()
                if not queue:
                    return
                request = _next_request(queue)
            real_stdout.write(json.dumps(_answer(games, request)) + "\n")
            real_stdout.flush()
    finally:
        games.close_all()


def _answer(games: _Worker, request: dict) -> dict:
    started = time.perf_counter()
    try:
        op = request["op"]
        results = []
        if op == "reset":
            for key, game_file, max_steps in request["items"]:
                env, (observation, info) = games.reset(json.dumps(key), game_file, max_steps)
                results.append([key, observation, _plain(info), env.task_type])
        elif op == "step":
            for key, action in request["items"]:
                env = games.live.get(json.dumps(key))
                if env is None:
                    raise KeyError(f"no live episode {key!r} (reset it first)")
                observation, won, done, info = env.step(action)
                results.append([key, observation, won, done, _plain(info)])
        elif op == "close":
            for key in request.get("keys", []):
                games.close(json.dumps(key))
        elif op == "invalid":
            raise ValueError(f"unreadable request: {request['error']}")
        else:
            raise ValueError(f"unknown op {op!r}")
        answer = {"results": results, "seconds": time.perf_counter() - started, "reused": games.reused}
    except Exception as error:  # noqa: BLE001 - reported to the caller, the worker lives on
        answer = {"error": f"{type(error).__name__}: {error}"}
    if "id" in request:
        answer["id"] = request["id"]
    return answer


def _plain(info: dict) -> dict:
    """What a step's info may carry to the player: won and the admissible commands (never facts)."""
    return {"won": bool(info.get("won")), "admissible_commands": list(info.get("admissible_commands") or [])}


class EnvPool:
    """Games played in `workers` processes, each running this file's `serve`. Keys (any JSON
    value) name episodes. A game is always played by the same worker (the first one it went to),
    which keeps its built env between episodes and resets it again. Requests to different workers
    run in parallel, the workers `nice` more than this process; `env_seconds` adds up the workers'
    own busy time.

    reset() and step() wait for their answers. Without waiting: send_reset() / send_step() submit
    (each reset on its own, so that its answer comes back as soon as that game is built; a worker
    serves steps before resets it received earlier), and receive() collects whatever answers have
    arrived: key -> (observation, info) after a reset, (observation, won, done, info) after a step.

    translations: a directory of stored translations (store_translations) the workers read games'
    translations from (a game not stored there is translated as usual)."""

    def __init__(self, workers: int = 1, python: str | None = None, env: dict | None = None, nice: int = WORKER_NICENESS,
                 translations: str | Path | None = None):  # fmt: skip
        self.workers = max(1, int(workers))
        self.translations = translations
        self._procs = []
        child_env = {**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"}
        if translations is not None:
            child_env[TRANSLATIONS_ENV] = str(Path(translations).resolve())
        for _ in range(self.workers):
            self._procs.append(
                subprocess.Popen(
                    [python or sys.executable, str(Path(__file__).resolve()), "serve", f"--nice={int(nice)}"],
                    stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                    text=True, env=child_env, bufsize=1,
                )
            )
        self._owner: dict = {}  # key token -> worker of its current episode
        self._home: dict = {}  # game file -> worker (where its built env is kept)
        self._homed = [0] * self.workers
        self._lock = threading.Condition()
        self._sent = 0
        self._requests: dict = {}  # request id -> (worker, op, key tokens)
        self._answers: dict = {}  # key token -> answer (a result tuple, or an error text)
        self._dead: dict = {}  # worker -> why
        self.env_seconds = 0.0
        self.reused = [0] * self.workers  # resets served by a kept env, per worker
        self._readers = [threading.Thread(target=self._read, args=(i,), daemon=True) for i in range(self.workers)]
        for reader in self._readers:
            reader.start()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def alive(self) -> bool:
        return bool(self._procs) and not self._dead and all(proc.poll() is None for proc in self._procs)

    # -- the workers' answers --------------------------------------------------------------------
    def _read(self, index: int) -> None:
        for line in self._procs[index].stdout:
            try:
                answer = json.loads(line)
            except ValueError:
                answer = {"error": f"unreadable answer {line[:200]!r}"}
            with self._lock:
                _worker, op, tokens = self._requests.pop(answer.get("id"), (index, None, []))
                if "error" in answer:
                    for token in tokens:
                        self._answers[token] = f"environment worker {index}: {answer['error']}"
                else:
                    self.env_seconds += answer.get("seconds", 0.0)
                    self.reused[index] = answer.get("reused", self.reused[index])
                    for item in answer["results"]:
                        token = json.dumps(item[0])
                        self._answers[token] = (item[1], item[2]) if op == "reset" else tuple(item[1:5])
                self._lock.notify_all()
        with self._lock:
            self._dead[index] = f"environment worker {index} died"
            for worker, _op, tokens in self._requests.values():
                for token in tokens:
                    if worker == index:
                        self._answers.setdefault(token, self._dead[index])
            self._lock.notify_all()

    def _send(self, worker: int, request: dict, tokens: list) -> None:
        if worker in self._dead:
            raise RuntimeError(self._dead[worker])
        with self._lock:
            self._sent += 1
            request = {**request, "id": self._sent}
            self._requests[self._sent] = (worker, request["op"], tokens)
            for token in tokens:
                self._answers.pop(token, None)
        proc = self._procs[worker]
        proc.stdin.write(json.dumps(request) + "\n")
        proc.stdin.flush()

    def _waited_for(self) -> set:
        return {token for _worker, op, tokens in self._requests.values() if op != "close" for token in tokens}

    def receive(self, keys=None, wait: bool = True) -> dict:
        """Answers that have arrived, key -> result (each handed out once). keys: wait for (and
        return only) those; None: everything arrived so far, waiting (if `wait`) for at least one
        answer when none is there yet and some is still to come. A failed request raises."""
        tokens = None if keys is None else {json.dumps(key) for key in keys}
        with self._lock:
            if tokens is not None:
                while wait and not tokens <= set(self._answers):
                    self._lock.wait()
                chosen = [token for token in tokens if token in self._answers]
            else:
                while wait and not self._answers and self._waited_for():
                    self._lock.wait()
                chosen = list(self._answers)
            out = {token: self._answers.pop(token) for token in chosen}
        for token, answer in out.items():
            if isinstance(answer, str):
                raise RuntimeError(answer)
        return {_key(json.loads(token)): answer for token, answer in out.items()}

    def pending(self) -> int:
        """Resets and steps sent whose answers have not been received yet."""
        with self._lock:
            return len(self._waited_for()) + len(self._answers)

    # -- requests --------------------------------------------------------------------------------
    def _home_of(self, game: str) -> int:
        if game not in self._home:
            worker = min(range(self.workers), key=lambda i: (self._homed[i], i))
            self._home[game] = worker
            self._homed[worker] += 1
        return self._home[game]

    def send_reset(self, games: dict, max_steps: int = MAX_STEPS) -> None:
        """key -> game file: start (or restart) those episodes, without waiting."""
        for key, game in games.items():
            token = json.dumps(key)
            game = str(Path(game).resolve())
            previous = self._owner.get(token)
            worker = self._home_of(game)
            if previous is not None and previous != worker:
                self._send(previous, {"op": "close", "keys": [key]}, [])
            self._owner[token] = worker
            self._send(worker, {"op": "reset", "items": [[key, game, max_steps]]}, [token])

    def send_step(self, actions: dict) -> None:
        """key -> action: one step of each of those episodes, without waiting."""
        requests: dict[int, list] = {}
        for key, action in actions.items():
            worker = self._owner.get(json.dumps(key))
            if worker is None:
                raise KeyError(f"no episode {key!r} in this pool (reset it first)")
            requests.setdefault(worker, []).append([key, action])
        for worker, items in requests.items():
            self._send(worker, {"op": "step", "items": items}, [json.dumps(item[0]) for item in items])

    def reset(self, games: dict, max_steps: int = MAX_STEPS) -> dict:
        """key -> game file: start (or restart) those episodes; key -> (observation, info)."""
        self.send_reset(games, max_steps=max_steps)
        return self.receive(list(games))

    def step(self, actions: dict) -> dict:
        """key -> action: one step of each of those episodes; key -> (observation, won, done, info)."""
        self.send_step(actions)
        return self.receive(list(actions))

    def release(self, keys) -> None:
        """Those episodes ended (their games stay built in their workers)."""
        requests: dict[int, list] = {}
        for key in keys:
            worker = self._owner.pop(json.dumps(key), None)
            if worker is not None:
                requests.setdefault(worker, []).append(key)
        for worker, batch in requests.items():
            self._send(worker, {"op": "close", "keys": batch}, [])

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
        for reader in self._readers:
            reader.join(timeout=5)
        self._procs = []


def _key(key):
    """JSON turns tuple keys into lists; give them back as tuples (hashable)."""
    return tuple(_key(k) for k in key) if isinstance(key, list) else key


if __name__ == "__main__":
    if sys.argv[1:2] == ["serve"] and all(arg.startswith("--nice=") for arg in sys.argv[2:]):
        for arg in sys.argv[2:]:
            os.nice(int(arg.split("=", 1)[1]))
        serve()
    else:
        sys.exit(f"usage: python {Path(__file__).name} serve [--nice=N]   (an environment worker speaking JSON lines, N: niceness added)")
