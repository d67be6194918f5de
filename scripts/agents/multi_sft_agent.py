"""Reference agent of the multi-task mode: one model, SFT-trained with TRL's SFTTrainer on every
single-turn task of the run, submitted with task "all" after every round.

For each task of TASKS, in run order, the task's folder tasks/<task>/ gives its task.py and its
training split. A task is single-turn when its task.py has `format_prompt` and `format_target`
and its training rows give a target: its rows become conversational prompt/completion pairs, as
sft_agent.py builds them for one task. The others (the interactive L3 tasks, whose task.py plays
episodes and has no format_target) are left out, with a log line. Each task gives at most
MULTI_SFT_MAX_ROWS_PER_TASK rows (a sample seeded with AGENT_SEED), interleaved round-robin so
that every task is in the data. Every SFT_STEPS_PER_ROUND steps it saves output/v{k} and submits
it with task "all" (every task of the run), for up to SFT_ROUNDS rounds while /time leaves room.
When no task is single-turn it submits a copy of the base model once, so that the run still has
a result, and exits 1. Exit 0 when a submission was scored.

Env: TASKS, SFT_ROUNDS (2), SFT_STEPS_PER_ROUND (10), SFT_LR (5e-5), SFT_BATCH_SIZE (8),
SFT_MAX_LENGTH (none), MULTI_SFT_MAX_ROWS_PER_TASK (256), AGENT_SEED (0).
"""

import random
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from agent_env import (  # noqa: E402
    MODEL_PATH, OUTPUT_DIR, SEED, TASKS, Rounds, env_float, env_int, exit_unless_time_to_train, load_base_model,
    load_rows_at, load_task_at, log, submit, task_dir, trainer_dir,
)

ALL = "all"  # a multi-task submission evaluated on every task of the run
SINGLE_TURN = ("format_prompt", "format_target")


def task_rows(folder: Path, max_rows: int, seed: int) -> tuple[list[dict], str | None]:
    """(rows, None): up to `max_rows` prompt/completion rows of the task in `folder`, a seeded sample of its
    training split; ([], why) when the task is not single-turn."""
    module = load_task_at(folder)
    missing = [name for name in SINGLE_TURN if not callable(getattr(module, name, None))]
    if missing:
        return [], f"its task.py has no {' and no '.join(missing)}: not a single-turn task"
    rows = load_rows_at(folder)
    random.Random(f"{seed}:{folder.name}").shuffle(rows)
    built, failed = [], 0
    for row in rows:
        if len(built) >= max_rows:
            break
        try:
            prompt, target = module.format_prompt(row), module.format_target(row)
        except Exception:  # noqa: BLE001 - a row without what the task's target needs
            failed += 1
            continue
        if not isinstance(prompt, list):
            return [], "its format_prompt gives a text prompt, and this agent trains chat prompts"
        if isinstance(target, str) and target.strip():
            built.append({"prompt": prompt, "completion": [{"role": "assistant", "content": target}]})
    if not built:
        return [], f"none of its {len(rows)} training rows gives a target ({failed} could not be formatted)"
    return built, None


def interleave(per_task: dict[str, list[dict]]) -> list[dict]:
    """Round-robin over the tasks, in their order: row i of every task, then row i + 1...; each row tagged with
    its task."""
    longest = max((len(rows) for rows in per_task.values()), default=0)
    return [{**rows[i], "task": name} for i in range(longest) for name, rows in per_task.items() if i < len(rows)]


def training_rows(names: list[str], max_rows_per_task: int, seed: int, tasks_dir: Path | None = None):
    """(rows, skipped): the interleaved training rows of the single-turn tasks among `names` (each with its
    `task`), and why each other task was left out ({task: why})."""
    per_task, skipped = {}, {}
    for name in names:
        folder = Path(tasks_dir) / name if tasks_dir is not None else task_dir(name)
        rows, why = task_rows(folder, max_rows_per_task, seed)
        if why is None:
            per_task[name] = rows
            log(f"{name}: {len(rows)} training rows")
        else:
            skipped[name] = why
            log(f"{name}: left out, {why}")
    return interleave(per_task), skipped


def submit_base_copy() -> dict | None:
    """Submit a copy of the untouched base model on every task (as copy_agent.py does for one)."""
    target = OUTPUT_DIR / "base"
    for source in sorted(MODEL_PATH.rglob("*")):
        if source.is_file():
            (target / source.relative_to(MODEL_PATH)).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target / source.relative_to(MODEL_PATH))
    return submit(target, task=ALL)


def main() -> int:
    if not TASKS:
        log("TASKS is empty: this agent is for multi-task runs")
        return 1
    rounds_n, steps = env_int("SFT_ROUNDS", 2), env_int("SFT_STEPS_PER_ROUND", 10)
    rows, skipped = training_rows(TASKS, env_int("MULTI_SFT_MAX_ROWS_PER_TASK", 256), SEED)
    if not rows:
        log(f"no single-turn task among {', '.join(TASKS)}: submitting the base model once")
        submit_base_copy()
        return 1
    trained = [name for name in TASKS if name not in skipped]

    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    dataset = Dataset.from_list([{"prompt": r["prompt"], "completion": r["completion"]} for r in rows])
    log(f"SFT on {len(dataset)} rows of {', '.join(trained)}, {rounds_n} rounds x {steps} steps")

    exit_unless_time_to_train()
    model, tokenizer, on_gpu = load_base_model()
    config = SFTConfig(
        output_dir=trainer_dir("multi_sft"),
        max_steps=rounds_n * steps,
        per_device_train_batch_size=env_int("SFT_BATCH_SIZE", 8),
        learning_rate=env_float("SFT_LR", 5e-5),
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=min(5, steps),
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
    rounds = Rounds(tokenizer, rounds_n, steps, task=ALL)
    trainer = SFTTrainer(model=model, args=config, train_dataset=dataset, processing_class=tokenizer, callbacks=[rounds])
    trainer.train()
    log(f"done: {rounds.scored} scored submissions")
    return 0 if rounds.scored else 1


if __name__ == "__main__":
    sys.exit(main())
