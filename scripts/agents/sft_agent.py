"""Reference agent: supervised fine-tuning on the training split with TRL's SFTTrainer.

The data are conversational prompt/completion pairs built by the workspace's task.py, so the
model learns exactly the prompt format the grader uses. Every SFT_STEPS_PER_ROUND steps it saves
output/v{k} and submits it, for up to SFT_ROUNDS rounds while /time leaves room for another.

Env: SFT_ROUNDS (2), SFT_STEPS_PER_ROUND (10), SFT_LR (5e-5), SFT_BATCH_SIZE (8),
SFT_MAX_LENGTH (none: the grader's prompts are trained whole), SFT_MAX_TRAIN_ROWS (all), AGENT_SEED (0).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_env import (  # noqa: E402
    SEED, Rounds, env_float, env_int, exit_unless_time_to_train, load_base_model, load_rows, load_task, log,
    trainer_dir,
)

from datasets import Dataset  # noqa: E402
from trl import SFTConfig, SFTTrainer  # noqa: E402

ROUNDS = env_int("SFT_ROUNDS", 2)
STEPS = env_int("SFT_STEPS_PER_ROUND", 10)

task = load_task()
rows = load_rows(env_int("SFT_MAX_TRAIN_ROWS", None))
dataset = Dataset.from_list([
    {"prompt": task.format_prompt(row), "completion": [{"role": "assistant", "content": task.format_target(row)}]}
    for row in rows
])
log(f"SFT on {len(dataset)} rows, {ROUNDS} rounds x {STEPS} steps")

exit_unless_time_to_train()
model, tokenizer, on_gpu = load_base_model()

config = SFTConfig(
    output_dir=trainer_dir("sft"),
    max_steps=ROUNDS * STEPS,
    per_device_train_batch_size=env_int("SFT_BATCH_SIZE", 8),
    learning_rate=env_float("SFT_LR", 5e-5),
    lr_scheduler_type="constant_with_warmup",
    warmup_steps=min(5, STEPS),
    # No truncation by default: a cut few-shot prompt loses its completion and the row is dropped.
    max_length=env_int("SFT_MAX_LENGTH", None),
    logging_steps=5,
    save_strategy="no",
    report_to="none",
    seed=SEED,
    use_cpu=not on_gpu,
    bf16=on_gpu,
    disable_tqdm=True,
)
rounds = Rounds(tokenizer, ROUNDS, STEPS)
trainer = SFTTrainer(
    model=model, args=config, train_dataset=dataset, processing_class=tokenizer, callbacks=[rounds]
)
trainer.train()
log(f"done: {rounds.scored} scored submissions")
sys.exit(0 if rounds.scored else 1)
