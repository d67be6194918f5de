"""Reference agent: GRPO with TRL's GRPOTrainer on the task's own rule reward.

Rewards: task.reward(completion, row) (1.0 for the right final answer) plus a small format reward:
the task's own `task.format_reward(completion)` when task.py defines one (HumanEval: 0.1 when the
extracted code compiles), else 0.1 when the completion has a '####' answer line, 0.05 when it at
least ends up with a number (GSM8K-style tasks).
Every GRPO_STEPS_PER_ROUND steps it saves output/v{k} and submits it, for up to GRPO_ROUNDS rounds
while /time leaves room for another.

Env: GRPO_ROUNDS (1), GRPO_STEPS_PER_ROUND (6), GRPO_LR (1e-5), GRPO_NUM_GENERATIONS (4),
GRPO_MAX_COMPLETION_LENGTH (32), GRPO_BATCH_SIZE (4 completions per step; a multiple of
GRPO_NUM_GENERATIONS), GRPO_MAX_TRAIN_ROWS (all), AGENT_SEED (0).
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_env import (  # noqa: E402
    SEED, Rounds, env_float, env_int, exit_unless_time_to_train, load_base_model, load_rows, load_task, log,
    trainer_dir,
)

from datasets import Dataset  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

ROUNDS = env_int("GRPO_ROUNDS", 1)
STEPS = env_int("GRPO_STEPS_PER_ROUND", 6)

task = load_task()
rows = load_rows(env_int("GRPO_MAX_TRAIN_ROWS", None))
# Each row travels whole (as JSON) to the reward functions, which hand it to task.reward.
dataset = Dataset.from_list([{"prompt": task.format_prompt(row), "row": json.dumps(row)} for row in rows])
log(f"GRPO on {len(dataset)} prompts, {ROUNDS} rounds x {STEPS} steps")


def text_of(completion) -> str:
    """Conversational completions are message lists: take the assistant's content."""
    if isinstance(completion, str):
        return completion
    return "".join(m["content"] for m in completion if m.get("role") == "assistant")


def task_reward(completions, row, **kwargs) -> list[float]:
    return [float(task.reward(text_of(c), json.loads(r))) for c, r in zip(completions, row)]


def format_reward(completions, **kwargs) -> list[float]:
    texts = [text_of(c) for c in completions]
    if hasattr(task, "format_reward"):
        return [float(task.format_reward(t)) for t in texts]
    return [0.1 if "####" in t else 0.05 if task.extract_answer(t) is not None else 0.0 for t in texts]


exit_unless_time_to_train()
model, tokenizer, on_gpu = load_base_model()

config = GRPOConfig(
    output_dir=trainer_dir("grpo"),
    max_steps=ROUNDS * STEPS,
    per_device_train_batch_size=env_int("GRPO_BATCH_SIZE", 4),
    num_generations=env_int("GRPO_NUM_GENERATIONS", 4),
    max_completion_length=env_int("GRPO_MAX_COMPLETION_LENGTH", 32),
    learning_rate=env_float("GRPO_LR", 1e-5),
    use_vllm=False,
    logging_steps=1,
    save_strategy="no",
    report_to="none",
    seed=SEED,
    use_cpu=not on_gpu,
    bf16=on_gpu,
    disable_tqdm=True,
)
rounds = Rounds(tokenizer, ROUNDS, STEPS)
trainer = GRPOTrainer(
    model=model,
    reward_funcs=[task_reward, format_reward],
    args=config,
    train_dataset=dataset,
    processing_class=tokenizer,
    callbacks=[rounds],
)
trainer.train()
log(f"done: {rounds.scored} scored submissions")
sys.exit(0 if rounds.scored else 1)
