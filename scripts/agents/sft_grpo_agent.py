"""Reference agent for interactive (Level-3) tasks such as ALFWorld: SFT warm-up on the expert
trajectories of the training games, then GRPO with online rollouts in live training games.

This is the route the paper found to work on ALFWorld (SFT warm-up, then GRPO with online
rollouts and the environment's reward). Everything follows the workspace's task.py protocol, so
the model trains on exactly the text the grader shows it:

* Episode text. An episode is one token sequence: prompt = tokens of task.episode_start(task type,
  first observation, examples) with few-shot examples written from the training games' expert
  trajectories (the grader's ReAct examples are not in the workspace, as in the reference; the
  layout is the grader's, the examples differ); then, for every step, the tokens of " {action}\\n" (the model's part, loss
  mask 1) and of "{observation}\\n>" (the game's part, mask 0), with
  " {action}\\n{observation}\\n>" == task.history_entry(action, task.step_observation(...)). The
  context of step t is therefore the grader's prompt at step t up to the examples (checked token by token on the
  first episodes: `context_mismatches` in the log), and one causal forward pass over the sequence
  scores every step of the episode at once.
* SFT warm-up (TRL SFTTrainer): one pre-tokenised example per training game, its expert trajectory
  in that format, labels only on the action tokens. That is the same loss as one prompt/completion
  pair per expert step (prompt = the episode so far, completion = " action\\n"), without
  re-encoding the few-shot prefix once per step. No chat template, no EOS appended. A trajectory
  longer than MAX_SEQ_LENGTH keeps the steps that fit (logged). Then output/sft is saved and
  submitted.
* GRPO (TRL GRPOTrainer with `rollout_func`; no vLLM needed): the dataset holds one row per
  training game (its id); TRL's sampler repeats each id G = GRPO_NUM_GENERATIONS times and hands
  GRPO_GAMES_PER_STEP x G ids to `rollout_func`, which plays them all at once: every step one
  batched, sampled `generate` (temperature GRPO_TEMPERATURE, up to GRPO_MAX_NEW_TOKENS tokens,
  stopped at the first newline token) for all live episodes, then one step of each live game
  (task.GameEnv, in this process or in GRPO_ENV_WORKERS forked worker processes), for at most
  GRPO_MAX_EPISODE_STEPS steps or until the context (MAX_SEQ_LENGTH) is full. The action the game
  receives is task.clean_action(sampled text), and the sequence holds its canonical tokens
  " {action}\\n" (what the grader's next prompt holds). rollout_func returns prompt_ids, the
  episode's completion ids, env_mask (1 on action tokens) and the reward; TRL computes the
  group-relative advantage (r - mean of the game's G episodes) / (std + 1e-4) and the clipped
  policy-gradient loss on the action tokens of every step (env tokens masked out).
  Reward = task.reward(won) (1 if won) + GRPO_VALID_ACTION_BONUS x the fraction of steps whose
  action was admissible (think: steps excluded from the count, so thinking earns nothing): a small
  shaping term that only orders the episodes of a group that all lost (0 disables it).
  Every GRPO_STEPS_PER_ROUND optimizer steps output/v{k} is saved and submitted, for up to
  GRPO_ROUNDS rounds while /time leaves room for another.

Defaults depend on the device: on CPU (the benchmark's 300 s smoke budget with the tiny model) a
few short episodes; on GPU the paper-scale settings. Any knob set in the environment wins.

Env (CPU default / GPU default):
  SFT_EPOCHS (1 / 2), SFT_MAX_TRAIN_ROWS (8 / all), SFT_MAX_STEPS (4 / none), SFT_LR (1e-5),
  SFT_BATCH_SIZE (2 / 16 trajectories per optimizer step), SFT_MICRO_BATCH (1 / 2),
  SFT_TIME_FRACTION (0.35: SFT stops after this share of the time left when it starts),
  GRPO_ROUNDS (4 / 50), GRPO_STEPS_PER_ROUND (1 / 5), GRPO_GAMES_PER_STEP (1 / 8),
  GRPO_NUM_GENERATIONS (2 / 8), GRPO_MAX_EPISODE_STEPS (4 / 50), GRPO_MAX_NEW_TOKENS (16 / 64),
  GRPO_TEMPERATURE (1.0), GRPO_LR (1e-6), GRPO_BETA (0.0), GRPO_MICRO_BATCH (2),
  GRPO_GEN_BATCH (episodes per generate call; all / 32), GRPO_VALID_ACTION_BONUS (0.1),
  GRPO_ENV_WORKERS (0 / min(8, CPUs - 1); 0 = games in this process), GRPO_MAX_TRAIN_ROWS (all),
  MAX_SEQ_LENGTH (min(model's max positions, 8192)), GRADIENT_CHECKPOINTING (0 / 1), AGENT_SEED (0).
"""

from __future__ import annotations

import gc
import math
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_env import (  # noqa: E402
    DATA_PATH, OUTPUT_DIR, SEED, Rounds, env_float, env_int, exit_unless_time_to_train, load_base_model, load_rows,
    load_task, log, save_checkpoint, submit, time_left, trainer_dir,
)

import torch  # noqa: E402
from transformers import StoppingCriteria, StoppingCriteriaList, TrainerCallback  # noqa: E402

ON_GPU = torch.cuda.is_available()


def knob_int(name: str, cpu: int | None, gpu: int | None) -> int | None:
    return env_int(name, gpu if ON_GPU else cpu)


# -- knobs -------------------------------------------------------------------------------------
SFT_EPOCHS = knob_int("SFT_EPOCHS", 1, 2)
SFT_MAX_TRAIN_ROWS = knob_int("SFT_MAX_TRAIN_ROWS", 8, None)
SFT_MAX_STEPS = knob_int("SFT_MAX_STEPS", 4, None)
SFT_LR = env_float("SFT_LR", 1e-5)
SFT_BATCH_SIZE = knob_int("SFT_BATCH_SIZE", 2, 16)
SFT_MICRO_BATCH = knob_int("SFT_MICRO_BATCH", 1, 2)
SFT_TIME_FRACTION = env_float("SFT_TIME_FRACTION", 0.35)
GRPO_ROUNDS = knob_int("GRPO_ROUNDS", 4, 50)
GRPO_STEPS_PER_ROUND = knob_int("GRPO_STEPS_PER_ROUND", 1, 5)
GRPO_GAMES_PER_STEP = knob_int("GRPO_GAMES_PER_STEP", 1, 8)
GRPO_NUM_GENERATIONS = knob_int("GRPO_NUM_GENERATIONS", 2, 8)
GRPO_MAX_EPISODE_STEPS = knob_int("GRPO_MAX_EPISODE_STEPS", 4, 50)
GRPO_MAX_NEW_TOKENS = knob_int("GRPO_MAX_NEW_TOKENS", 16, 64)
GRPO_TEMPERATURE = env_float("GRPO_TEMPERATURE", 1.0)
GRPO_LR = env_float("GRPO_LR", 1e-6)
GRPO_BETA = env_float("GRPO_BETA", 0.0)
GRPO_MICRO_BATCH = knob_int("GRPO_MICRO_BATCH", 2, 2)
GRPO_GEN_BATCH = knob_int("GRPO_GEN_BATCH", None, 32)
GRPO_VALID_ACTION_BONUS = env_float("GRPO_VALID_ACTION_BONUS", 0.1)
GRPO_ENV_WORKERS = knob_int("GRPO_ENV_WORKERS", 0, min(8, max(0, (os.cpu_count() or 1) - 1)))
GRPO_MAX_TRAIN_ROWS = env_int("GRPO_MAX_TRAIN_ROWS", None)
MAX_SEQ_LENGTH = env_int("MAX_SEQ_LENGTH", 8192)
GRADIENT_CHECKPOINTING = bool(knob_int("GRADIENT_CHECKPOINTING", 0, 1))
# What the SFT and GRPO trainers share: device, precision, seed, no checkpoints, quiet logs.
TRAINER_COMMON = dict(
    gradient_checkpointing=GRADIENT_CHECKPOINTING,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    seed=SEED,
    use_cpu=not ON_GPU,
    bf16=ON_GPU,
    disable_tqdm=True,
)


# -- episode text as tokens --------------------------------------------------------------------
class Encoder:
    """The protocol's text pieces as token ids: the prompt with the tokenizer's special tokens (as
    the grader encodes its prompt), the pieces after it without."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def prompt(self, text: str) -> list[int]:
        return self.tokenizer(text)["input_ids"]

    def piece(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def action(self, action: str) -> list[int]:
        return self.piece(f" {action}\n")

    def observation(self, observation: str) -> list[int]:
        return self.piece(f"{observation}\n>")


#: The few-shot examples every episode prompt begins with. The grader's (ReAct's) are not in the
#: workspace, as in the reference harness: the agent writes its own, in the same layout, from its
#: training games' expert trajectories (task.expert_examples), written once.
FEW_SHOT: dict = {}


def few_shot_examples(task, rows: list[dict]) -> dict:
    """task.expert_examples of the training rows; a task type without an expert trajectory
    borrows another type's examples, so every type has a prompt."""
    examples = task.expert_examples(rows)
    if not examples:
        raise SystemExit("no training row has an expert trajectory to write few-shot examples from")
    fallback = sorted(examples)
    for key in set(task.TASK_PREFIXES.values()):
        for n in (0, 1):
            examples.setdefault(f"react_{key}_{n}", examples[fallback[n % len(fallback)]])
    return examples


def episode_start(task, task_type: str, observation: str) -> str:
    """task.episode_start with the agent's few-shot examples (written on first use)."""
    if not FEW_SHOT:
        FEW_SHOT.update(few_shot_examples(task, load_rows()))
    return task.episode_start(task_type, observation, examples=FEW_SHOT)


def game_path(row: dict) -> Path:
    return DATA_PATH / row["game"]


def task_type_of(task, row: dict) -> str:
    return row.get("task_type") or task.task_type_of(game_path(row))


def expert_example(task, encoder: Encoder, row: dict, max_length: int) -> tuple[dict | None, int, int]:
    """(example, steps kept, steps in the trajectory) for a training row's expert trajectory:
    {"input_ids", "labels"} with labels only on the action tokens; steps that do not fit in
    max_length are left out (None when not even the first action fits)."""
    prompt = episode_start(task, task_type_of(task, row), row["initial_observation"])
    ids = encoder.prompt(prompt)
    labels = [-100] * len(ids)
    trajectory = row.get("expert") or []
    kept = 0
    for step in trajectory:
        action = task.clean_action(step["action"])
        action_ids = encoder.action(action)
        if len(ids) + len(action_ids) > max_length:
            break
        ids += action_ids
        labels += action_ids
        kept += 1
        observation_ids = encoder.observation(task.step_observation(action, step["observation"]))
        if kept == len(trajectory) or len(ids) + len(observation_ids) >= max_length:
            break  # nothing follows the last action that fits
        ids += observation_ids
        labels += [-100] * len(observation_ids)
    if not kept:
        return None, 0, len(trajectory)
    return {"input_ids": ids, "labels": labels}, kept, len(trajectory)


def sft_examples(task, encoder: Encoder, rows: list[dict], max_length: int) -> list[dict]:
    examples, cut, dropped = [], 0, 0
    for row in rows:
        example, kept, total = expert_example(task, encoder, row, max_length)
        if example is None:
            dropped += 1
            continue
        cut += kept < total
        examples.append(example)
    log(
        f"SFT examples: {len(examples)} expert trajectories "
        f"({sum(sum(label != -100 for label in e['labels']) for e in examples)} action tokens); "
        f"{cut} cut to fit {max_length} tokens, {dropped} dropped (not even the first action fits)"
    )
    return examples


def group_advantages(rewards: list[float], group_size: int, eps: float = 1e-4) -> list[float]:
    """GRPO's group-relative advantage, as TRL computes it (scale_rewards='group'): each reward minus
    its group's mean, over the group's (unbiased) std + eps. Used for the log; TRL trains with its own."""
    out = []
    for start in range(0, len(rewards), group_size):
        group = rewards[start : start + group_size]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((r - mean) ** 2 for r in group) / (len(group) - 1)) if len(group) > 1 else 0.0
        out += [(r - mean) / (std + eps) for r in group]
    return out


def episode_reward(task, won: bool, valid: int, counted: int, bonus: float) -> float:
    """task.reward(won) plus bonus x the fraction of (non-think) steps with an admissible action."""
    shaping = bonus * (valid / counted) if counted and bonus else 0.0
    return float(task.reward(won)) + shaping


# -- the games ---------------------------------------------------------------------------------
class _Games:
    """Live games by key, each a task.GameEnv; a few idle envs are kept per game for reuse."""

    def __init__(self, task, max_steps: int, keep_idle: int = 64):
        self.task, self.max_steps, self.keep_idle = task, max_steps, keep_idle
        self.live: dict = {}
        self.idle: dict[str, list] = {}

    def reset(self, key, game: str):
        pool = self.idle.get(game) or []
        env = pool.pop() if pool else self.task.GameEnv(game, max_steps=self.max_steps)
        self.live[key] = (game, env)
        observation, info = env.reset()
        return observation, _slim(info)

    def step(self, key, action: str):
        observation, won, done, info = self.live[key][1].step(action)
        return observation, won, done, _slim(info)

    def release(self, key):
        game, env = self.live.pop(key)
        if sum(len(v) for v in self.idle.values()) < self.keep_idle:
            self.idle.setdefault(game, []).append(env)
        else:
            env.close()

    def close(self):
        for _game, env in self.live.values():
            env.close()
        for envs in self.idle.values():
            for env in envs:
                env.close()
        self.live, self.idle = {}, {}

    def run(self, ops: list) -> list:
        return [getattr(self, op)(*args) for op, *args in ops]


def _slim(info: dict) -> dict:
    return {"admissible_commands": list(info.get("admissible_commands") or []), "won": bool(info.get("won"))}


def _worker(conn, task_path: str, max_steps: int) -> None:
    import importlib.util

    spec = importlib.util.spec_from_file_location("task", task_path)
    task = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(task)
    games = _Games(task, max_steps)
    while True:
        ops = conn.recv()
        if ops is None:
            break
        try:
            conn.send(("ok", games.run(ops)))
        except Exception as exc:  # noqa: BLE001 - the parent raises it
            conn.send(("error", repr(exc)))
    games.close()


class EnvPool:
    """The training games, played in this process (workers=0) or in forked worker processes; each
    call sends every worker its share and waits for all, so games step in parallel."""

    def __init__(self, task, workers: int, max_steps: int):
        self.local = None
        self.conns, self.procs, self.where = [], [], {}
        if workers <= 0:
            self.local = _Games(task, max_steps)
            return
        import multiprocessing as mp

        context = mp.get_context("fork")
        for _ in range(workers):
            parent, child = context.Pipe()
            proc = context.Process(target=_worker, args=(child, str(task.__file__), max_steps), daemon=True)
            proc.start()
            self.conns.append(parent)
            self.procs.append(proc)

    def _call(self, ops_by_key: dict) -> dict:
        if self.local is not None:
            keys = list(ops_by_key)
            return dict(zip(keys, self.local.run([ops_by_key[k] for k in keys])))
        per_worker: dict[int, list] = {}
        for key in ops_by_key:
            per_worker.setdefault(self.where[key], []).append(key)
        for w, keys in per_worker.items():
            self.conns[w].send([ops_by_key[k] for k in keys])
        results = {}
        for w, keys in per_worker.items():
            status, values = self.conns[w].recv()
            if status != "ok":
                raise RuntimeError(f"environment worker {w} failed: {values}")
            results.update(zip(keys, values))
        return results

    def reset(self, games: dict) -> dict:
        if self.local is None:
            for i, key in enumerate(games):
                self.where[key] = i % len(self.conns)
        return self._call({key: ("reset", key, str(game)) for key, game in games.items()})

    def step(self, actions: dict) -> dict:
        return self._call({key: ("step", key, action) for key, action in actions.items()})

    def release(self, keys) -> None:
        self._call({key: ("release", key) for key in keys})
        for key in keys:
            self.where.pop(key, None)

    def close(self) -> None:
        if self.local is not None:
            self.local.close()
        for conn, proc in zip(self.conns, self.procs):
            try:
                conn.send(None)
            except Exception:  # noqa: BLE001
                pass
            proc.join(timeout=10)


# -- sampling ----------------------------------------------------------------------------------
def newline_token_ids(tokenizer) -> set[int]:
    """Token ids whose text holds a newline (generation stops at the first one, as the grader's)."""
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    return {i for i, text in enumerate(texts) if "\n" in text}


class StopAtNewline(StoppingCriteria):
    def __init__(self, ids: set[int]):
        self.ids = torch.tensor(sorted(ids), dtype=torch.long)

    def __call__(self, input_ids, scores, **kwargs):
        return torch.isin(input_ids[:, -1], self.ids.to(input_ids.device))


@torch.no_grad()
def sample_actions(model, tokenizer, contexts: list[list[int]], *, max_new_tokens: int, temperature: float,
                   newline_ids: set[int], batch: int | None = None) -> list[list[int]]:
    """One sampled continuation per context (left-padded batches), cut after its first newline
    token or end-of-sequence token."""
    device = next(model.parameters()).device
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    stop = StoppingCriteriaList([StopAtNewline(newline_ids)])
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    out: list[list[int]] = []
    batch = batch or len(contexts)
    for start in range(0, len(contexts), batch):
        chunk = contexts[start : start + batch]
        width = max(len(c) for c in chunk)
        input_ids = torch.tensor([[pad] * (width - len(c)) + c for c in chunk], device=device)
        attention = torch.tensor([[0] * (width - len(c)) + [1] * len(c) for c in chunk], device=device)
        kwargs = dict(do_sample=True, temperature=temperature, top_k=0, top_p=1.0) if temperature > 0 else dict(
            do_sample=False
        )
        generated = model.generate(
            input_ids=input_ids, attention_mask=attention, max_new_tokens=max_new_tokens, stopping_criteria=stop,
            pad_token_id=pad, use_cache=True, **kwargs,
        )[:, width:].tolist()
        for ids in generated:
            cut = []
            for token in ids:
                if token in eos:
                    break
                cut.append(token)
                if token in newline_ids:
                    break
            out.append(cut)
    return out


def play(model, tokenizer, task, pool: EnvPool, episodes: list[tuple[object, dict]], *, max_steps: int,
         max_new_tokens: int, temperature: float, max_length: int, newline_ids: set[int],
         gen_batch: int | None = None, check_context: int = 0, stats: dict | None = None) -> list[dict]:
    """Play every (key, row) episode in lockstep with the sampling policy; one record per episode:
    prompt_ids, completion_ids, env_mask, won, steps, valid/counted (admissible non-think actions),
    end ("won", "done", "max_steps", "context"). check_context: compare the first episodes' token
    contexts with the grader's (the whole prompt text re-encoded) at every step."""
    stats = stats if stats is not None else {}
    encoder = Encoder(tokenizer)
    started = pool.reset({key: game_path(row) for key, row in episodes})
    state = {}
    for key, row in episodes:
        observation, info = started[key]
        text = episode_start(task, task_type_of(task, row), observation)
        state[key] = {
            "prompt_ids": encoder.prompt(text), "completion_ids": [], "env_mask": [], "last_action_end": 0,
            "won": False, "steps": 0, "valid": 0, "counted": 0, "end": None, "info": info,
            "text": text if check_context > 0 else None,
        }
        check_context -= 1
    live = [key for key, _ in episodes]
    gen_s = env_s = 0.0
    while live:
        fits = []
        for key in live:
            s = state[key]
            if len(s["prompt_ids"]) + len(s["completion_ids"]) + max_new_tokens > max_length:
                s["end"] = "context"
            else:
                fits.append(key)
        live = fits
        if not live:
            break
        contexts = [state[k]["prompt_ids"] + state[k]["completion_ids"] for k in live]
        for key, context in zip(live, contexts):
            text = state[key]["text"]
            if text is not None and encoder.prompt(text) != context:
                stats["context_mismatches"] = stats.get("context_mismatches", 0) + 1
        began = time.perf_counter()
        samples = sample_actions(model, tokenizer, contexts, max_new_tokens=max_new_tokens, temperature=temperature,
                                 newline_ids=newline_ids, batch=gen_batch)
        gen_s += time.perf_counter() - began
        actions = {key: task.clean_action(tokenizer.decode(ids, skip_special_tokens=True))
                   for key, ids in zip(live, samples)}
        began = time.perf_counter()
        stepped = pool.step(actions)
        env_s += time.perf_counter() - began
        still = []
        for key in live:
            s, action = state[key], actions[key]
            observation, won, done, info = stepped[key]
            if not action.startswith("think:"):
                s["counted"] += 1
                s["valid"] += action in s["info"]["admissible_commands"]
            s["info"] = info
            action_ids = encoder.action(action)
            s["completion_ids"] += action_ids
            s["env_mask"] += [1] * len(action_ids)
            s["last_action_end"] = len(s["completion_ids"])
            shown = task.step_observation(action, observation)
            observation_ids = encoder.observation(shown)
            s["completion_ids"] += observation_ids
            s["env_mask"] += [0] * len(observation_ids)
            if s["text"] is not None:
                s["text"] += task.history_entry(action, shown)
            s["steps"] += 1
            if won:
                s["won"], s["end"] = True, "won"
            elif done:
                s["end"] = "done"
            elif s["steps"] >= max_steps:
                s["end"] = "max_steps"
            else:
                still.append(key)
        live = still
    pool.release([key for key, _ in episodes])
    stats["generation_s"] = stats.get("generation_s", 0.0) + gen_s
    stats["env_s"] = stats.get("env_s", 0.0) + env_s
    records = []
    for key, _row in episodes:
        s = state[key]
        end = s["last_action_end"]  # nothing after the last action is trained on
        records.append({
            "prompt_ids": s["prompt_ids"], "completion_ids": s["completion_ids"][:end], "env_mask": s["env_mask"][:end],
            "won": s["won"], "steps": s["steps"], "valid": s["valid"], "counted": s["counted"], "end": s["end"],
        })
    return records


# -- training ----------------------------------------------------------------------------------
class StopAt(TrainerCallback):
    """Stop training at a wall-clock deadline (SFT must leave time for the RL rounds)."""

    def __init__(self, deadline: float | None):
        self.deadline = deadline

    def on_step_end(self, args, state, control, **kwargs):
        if self.deadline is not None and time.time() > self.deadline:
            log(f"SFT: stopping at step {state.global_step}, its share of the time is used")
            control.should_training_stop = True
        return control


def run_sft(task, model, tokenizer, rows: list[dict], max_length: int) -> None:
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    examples = sft_examples(task, Encoder(tokenizer), rows, max_length)
    if not examples:
        log("SFT: no expert trajectory fits: skipping the warm-up")
        return
    left = time_left()
    deadline = time.time() + SFT_TIME_FRACTION * left if left is not None else None
    accumulation = max(1, SFT_BATCH_SIZE // SFT_MICRO_BATCH)
    total = SFT_MAX_STEPS or SFT_EPOCHS * math.ceil(len(examples) / (accumulation * SFT_MICRO_BATCH))
    config = SFTConfig(
        output_dir=trainer_dir("sft"),
        num_train_epochs=SFT_EPOCHS,
        max_steps=SFT_MAX_STEPS or -1,
        per_device_train_batch_size=SFT_MICRO_BATCH,
        gradient_accumulation_steps=accumulation,
        learning_rate=SFT_LR,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=min(10, total // 10),
        max_length=None,  # the examples are cut to max_length already, at step boundaries
        **TRAINER_COMMON,
    )
    trainer = SFTTrainer(
        model=model, args=config, train_dataset=Dataset.from_list(examples), processing_class=tokenizer,
        callbacks=[StopAt(deadline)],
    )
    began = time.time()
    trainer.train()
    log(f"SFT: {trainer.state.global_step} steps in {time.time() - began:.1f}s")
    del trainer  # its optimizer state: GRPO makes its own
    gc.collect()
    if ON_GPU:
        torch.cuda.empty_cache()


def make_rollout_func(task, tokenizer, rows_by_id: dict, pool: EnvPool, max_length: int):
    newline_ids = newline_token_ids(tokenizer)
    calls = {"n": 0}

    def rollout_func(prompts: list, trainer) -> dict:
        """TRL's hook: one live episode per prompt (a game id, repeated G times by the sampler)."""
        model = trainer.accelerator.unwrap_model(trainer.model)
        was_training = model.training
        model.eval()
        began, stats = time.perf_counter(), {}
        try:
            records = play(
                model, tokenizer, task, pool, [((calls["n"], i), rows_by_id[p]) for i, p in enumerate(prompts)],
                max_steps=GRPO_MAX_EPISODE_STEPS, max_new_tokens=GRPO_MAX_NEW_TOKENS, temperature=GRPO_TEMPERATURE,
                max_length=max_length, newline_ids=newline_ids, gen_batch=GRPO_GEN_BATCH,
                check_context=2 if calls["n"] == 0 else 0, stats=stats,
            )
        finally:
            model.train(was_training)
        calls["n"] += 1
        rewards = [episode_reward(task, r["won"], r["valid"], r["counted"], GRPO_VALID_ACTION_BONUS) for r in records]
        advantages = group_advantages(rewards, trainer.num_generations)
        ends = {}
        for r in records:
            ends[r["end"]] = ends.get(r["end"], 0) + 1
        log(
            f"rollouts {calls['n']}: {len(records)} episodes of {len(set(prompts))} games in "
            f"{time.perf_counter() - began:.1f}s (generation {stats['generation_s']:.1f}s, env {stats['env_s']:.1f}s); "
            f"won {sum(r['won'] for r in records)}, mean steps {sum(r['steps'] for r in records) / len(records):.1f}, "
            f"mean reward {sum(rewards) / len(rewards):.3f}, nonzero advantages "
            f"{sum(abs(a) > 1e-6 for a in advantages)}/{len(advantages)}, ends {ends}"
            + (f", context mismatches {stats['context_mismatches']}" if stats.get("context_mismatches") else "")
        )
        return {
            "prompt_ids": [r["prompt_ids"] for r in records],
            "completion_ids": [r["completion_ids"] for r in records],
            "logprobs": None,  # TRL recomputes them with the training model (no vLLM here)
            "env_mask": [r["env_mask"] for r in records],
            "env_reward": rewards,
        }

    return rollout_func


def env_reward(completions, env_reward, **kwargs) -> list[float]:
    """The episode's reward from the live game (computed in rollout_func)."""
    return [float(r) for r in env_reward]


def build_grpo_trainer(task, model, tokenizer, rows: list[dict], pool: EnvPool, max_length: int, callbacks=()):
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    group = GRPO_NUM_GENERATIONS
    games = max(1, min(GRPO_GAMES_PER_STEP, len(rows)))
    episodes = games * group
    micro = max(1, min(GRPO_MICRO_BATCH, episodes))
    while episodes % micro:
        micro -= 1
    config = GRPOConfig(
        output_dir=trainer_dir("grpo"),
        max_steps=GRPO_ROUNDS * GRPO_STEPS_PER_ROUND,
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=episodes // micro,  # one generation batch (games x G episodes) per step
        num_generations=group,
        max_completion_length=max_length,
        temperature=GRPO_TEMPERATURE,
        learning_rate=GRPO_LR,
        beta=GRPO_BETA,
        use_vllm=False,
        **TRAINER_COMMON,
    )
    dataset = Dataset.from_list([{"prompt": row["id"]} for row in rows])
    return GRPOTrainer(
        model=model,
        reward_funcs=[env_reward],
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=list(callbacks),
        rollout_func=make_rollout_func(task, tokenizer, {row["id"]: row for row in rows}, pool, max_length),
    )


def fits(task, encoder: Encoder, row: dict, max_length: int, max_new_tokens: int) -> bool:
    prompt = episode_start(task, task_type_of(task, row), row["initial_observation"])
    return len(encoder.prompt(prompt)) + max_new_tokens + 8 <= max_length


def main() -> None:
    random.seed(SEED)
    task = load_task()
    rows = load_rows()
    log(f"{len(rows)} training games; device {'GPU' if ON_GPU else 'CPU'}")
    exit_unless_time_to_train()
    # Worker processes are forked now, before the model is loaded (and before CUDA starts).
    pool = EnvPool(task, GRPO_ENV_WORKERS, GRPO_MAX_EPISODE_STEPS)
    try:
        train(task, rows, pool)
    finally:
        pool.close()


def train(task, rows: list[dict], pool: EnvPool) -> None:
    model, tokenizer, _ = load_base_model()
    max_length = min(MAX_SEQ_LENGTH, getattr(model.config, "max_position_embeddings", None) or MAX_SEQ_LENGTH)
    scored = 0

    # 1. SFT warm-up on the expert trajectories, then a first submission.
    sft_rows = random.Random(SEED).sample(rows, len(rows))[:SFT_MAX_TRAIN_ROWS] if SFT_MAX_TRAIN_ROWS else rows
    run_sft(task, model, tokenizer, sft_rows, max_length)
    path = save_checkpoint(model, tokenizer, OUTPUT_DIR / "sft")
    log(f"SFT warm-up saved to {path}")
    began = time.time()
    scored += submit(path) is not None
    submit_s = time.time() - began

    # 2. GRPO with online rollouts in the live training games: a round must leave time for its
    # own submission (as long as the first one took) and a margin.
    left = time_left()
    if left is not None and left < 1.2 * submit_s + 45:
        log(f"only {left:.0f}s left (a submission took {submit_s:.0f}s): no GRPO round")
        sys.exit(0 if scored else 1)
    encoder = Encoder(tokenizer)
    grpo_rows = [row for row in rows if fits(task, encoder, row, max_length, GRPO_MAX_NEW_TOKENS)]
    if len(grpo_rows) < len(rows):
        log(f"GRPO: {len(rows) - len(grpo_rows)} games left out (their first prompt does not fit {max_length} tokens)")
    if GRPO_MAX_TRAIN_ROWS:
        grpo_rows = grpo_rows[:GRPO_MAX_TRAIN_ROWS]
    if not grpo_rows:
        log("GRPO: no game to play")
        sys.exit(0 if scored else 1)
    log(
        f"GRPO on {len(grpo_rows)} games: {GRPO_ROUNDS} rounds x {GRPO_STEPS_PER_ROUND} steps, "
        f"{GRPO_GAMES_PER_STEP} games x {GRPO_NUM_GENERATIONS} episodes per step, <= {GRPO_MAX_EPISODE_STEPS} steps, "
        f"env workers {GRPO_ENV_WORKERS}"
    )
    rounds = Rounds(tokenizer, GRPO_ROUNDS, GRPO_STEPS_PER_ROUND)
    trainer = build_grpo_trainer(task, model, tokenizer, grpo_rows, pool, max_length, callbacks=[rounds])
    rounds.round_started = time.time()
    trainer.train()
    scored += rounds.scored
    log(f"done: {scored} scored submissions")
    sys.exit(0 if scored else 1)


if __name__ == "__main__":
    main()
