"""What a workspace tells the agent: instructions.md (a single-task run's, the reference's text; a multi-task run's),
the feedback-split note, the mode's rules, and a multi-task run's own description.md.

The two instructions share every paragraph that says the same thing (the layout's common entries, what a checkpoint
is, the GPUs, the response, the time API); a single-task run's text is the reference's, byte for byte.
INSTRUCTIONS and MULTI_INSTRUCTIONS are str.format templates of `hf_id`.
"""

from __future__ import annotations

_SINGLE_HEAD = """\
# Instructions

You are inside an isolated workspace. Your job: post-train the base model so that it scores
higher on the task in `description.md`, within the time budget. Use any method (SFT, DPO, GRPO,
PPO, rollouts with the task's reward...).
"""

_MULTI_HEAD = """\
# Instructions

You are inside an isolated workspace. Your job: post-train the base model into ONE model (one
checkpoint) that scores higher on every task of this multi-task run, listed in `description.md`,
within the time budget. Use any method (SFT, DPO, GRPO, PPO, rollouts with the tasks' rewards...).
"""

_LAYOUT_HEAD = """
## Layout (use relative paths)

- `code/` — your code (writable).
"""

_SINGLE_DATA = """\
- `data/` — the training split (read-only). The evaluation split is held out: you never see it.
"""

_MULTI_TASKS = """\
- `tasks/<task>/` — one folder per task of the run (`description.md` lists them):
  - `data/` — the task's training split (read-only). Its evaluation split is held out: you never see it.
  - `description.md` — the task, its data and how it is evaluated; the paths it names (`data/...`,
    `task.py`) are in this folder.
  - `task.py` — the task's prompt format, answer extraction and reward, exactly as the grader uses
    them, beside any other file the task gives (e.g. `task_protocol.json`).
"""

_MODEL_OUTPUT = """\
- `models/{hf_id}/` — the base model (read-only).
- `output/` — save trained checkpoints here, one directory per version (`output/v1`, `output/v2`...).
"""

_SINGLE_TASK_PY = """\
- `task.py` — the task's prompt format, answer extraction and reward, exactly as the grader uses them.
"""

_RUN_FILES = """\
- `run_meta.json` — the time budget, the single source of truth: `start_time`, `timeout_s`,
  `last_submit_time` (your last submission), `end_time` (null until the run is over), `deadline`
  (`start_time + timeout_s`, when everything you started is stopped); unix seconds.
- `timer.sh` — `bash timer.sh` prints the time left as `Remaining: H:MM` (or `Timer expired!`).
- `scores.json` — your submissions so far, a list of `submission_id`, `timestamp`, `model_path`,
  `score`, `baseline_score`, `improvement`, `elapsed_seconds` and, for one that failed, `error`.
- `submissions.json` — the same with the grader's details: your most recent 1000 requests
  (refused ones too) with their `status` and `reason` (`requests` and `total_submissions` count
  them all), and `best`, your best really scored submission.
"""

_SINGLE_ENV = """
Environment variables: TASK, BASE_MODEL, WORKSPACE, MODEL_PATH, DATA_PATH, OUTPUT_DIR,
GRADING_SERVER_URL.
"""

_MULTI_ENV = """
Environment variables: TASK (`multi`), TASKS (the run's tasks, comma-separated, in run order), BASE_MODEL,
WORKSPACE, MODEL_PATH, DATA_PATH (the `tasks/` folder: task t's training split is in `$DATA_PATH/t/data/`),
OUTPUT_DIR, GRADING_SERVER_URL.
"""

_CHECKPOINT = """
## Submitting

A checkpoint is a full model directory saved with `model.save_pretrained(dir)` and
`tokenizer.save_pretrained(dir)`: safetensors weights only (no .bin/pickle files), no custom
code (`auto_map`), not a LoRA adapter (merge it first with `merge_and_unload()`). Its files must
be real files, not symbolic links, and the files it names (a sharded checkpoint's
`model.safetensors.index.json`) must be in the directory itself. The path must be inside the
workspace: relative (`output/v1`) or absolute (`$OUTPUT_DIR/v1`). The grader copies the
checkpoint when it receives the request: leave it alone until the answer comes.
"""

_SINGLE_REQUEST = """
    curl -X POST "$GRADING_SERVER_URL/submit" -H "Content-Type: application/json" -d '{{"model_path": "output/v1"}}'

    import os, requests
    requests.post(f"{{os.environ['GRADING_SERVER_URL']}}/submit", json={{"model_path": "output/v1"}}).json()
"""

_MULTI_REQUEST = """
    curl -X POST "$GRADING_SERVER_URL/submit" -H "Content-Type: application/json" \\
        -d '{{"model_path": "output/v1", "task": "all"}}'

    import os, requests
    requests.post(f"{{os.environ['GRADING_SERVER_URL']}}/submit", json={{"model_path": "output/v1", "task": "all"}}).json()

`"task"`: `"all"` (the default, when it is left out) evaluates the checkpoint on every task of the run,
one evaluation after another; a task's name (one of TASKS) evaluates it on that task only. Anything
else is refused with HTTP 400, reason `unknown_task` (not a submission).
"""

_GPU = """
Optional `"gpu"`: the GPU(s) to evaluate on, e.g. `"0"` or `"2,3"`, chosen from `available_gpus`
of `GET $GRADING_SERVER_URL/health` (without it the first one is used; on a grader without GPUs,
leave it out). Evaluations on the same GPU run one after another, beside whatever you run there:
leave that GPU the memory to load and run the submitted model (the grader's vLLM backend takes a
fixed share of the GPU's memory, 45% unless the benchmark is configured otherwise).
"""

_RESPONSE = """
The response: `submission_id`, `timestamp` (ISO 8601, when the evaluation finished), `model_path`,
`score` (0-100; 0.0 when the submission could not be scored), `baseline_score` (the base model's),
`improvement` (`score - baseline_score`), `elapsed_seconds` (how long this evaluation took),
`best` (the entry of `scores.json` with the highest score), `total_submissions` (entries in
`scores.json`), and `error` when the submission was refused or its evaluation failed: it says why
and what to change. Also `status` (`scored`, `cached`, `refused`, `failed`, `grader_error`),
`reason` (a stable code for a refusal) and `since_start_s`. HTTP 200 means the weights were
scored; a refusal, or a model that failed to load or generate, has a 4xx status: e.g. 404
`missing_path`, 400 `invalid_path` (a path no file can have: a NUL byte, a name over 255 bytes),
413 `request_too_large` (the body is over 64 KiB: send only the JSON above, never the model).
HTTP 503 with `status` `grader_error` and `"retryable": true` means the grader itself failed: it
is not your model's fault and does not count as a submission; wait `Retry-After` seconds and
send the same request again (weights whose evaluation is killed three times, e.g. out of memory,
get a 422 instead). When generation fails on the held-out split, the error names only the
exception's type, since its details could quote held-out data: reproduce it with task.py's
`format_prompt` on the training data.
Submitting the same weights twice returns the cached score without a new evaluation; the
untouched base model scores the baseline (improvement 0).
"""

_MULTI_RESPONSE = """
In this multi-task run the response also has `tasks`: for each task the submission was evaluated on,
`score`, `baseline_score`, `improvement`, `primary_metric`, `metrics`, `n`, `cached` and, once the
weights were scored, `chat_template` (see "How prompts are rendered" in the task's description).
The top-level `score`, `baseline_score` and `improvement` are the mean over the tasks evaluated in
that submission (every task, or the one named), and `summary` says which: `{{"tasks": [...],
"improved": <how many of them improved on the base model>, "statistic": "mean"}}`. The entries of
`scores.json` carry `task` (what the request asked for) and `tasks` too. As `score` is a mean over
a submission's own tasks, `best` (the entry with the highest `score`) may be a submission evaluated
on one task only. A failure on any one task fails the whole submission, and its `error` names the
task; the tasks scored before it are cached, so submitting the same weights again costs no new
evaluation for them.
"""

_TIME_API = """
`GET $GRADING_SERVER_URL/time` returns `start_time`, `timeout_s`, `last_submit_time`, `end_time`,
`deadline`, `now` and `remaining` (seconds); `GET $GRADING_SERVER_URL/health` returns `status`,
`task`, `workspace` and `available_gpus`."""

_SINGLE_RESULT = """ Your result is the best submission made before the
deadline. At the deadline every process you started is stopped.
"""

_MULTI_RESULT = """

Your result on each task is the best score on that task among the submissions made before the
deadline (one with `"task": "all"` counts for every task); the run's headline is the mean, over the
tasks, of that result's improvement on the base model. At the deadline every process you started
is stopped.
"""

INSTRUCTIONS = (
    _SINGLE_HEAD
    + _LAYOUT_HEAD
    + _SINGLE_DATA
    + _MODEL_OUTPUT
    + _SINGLE_TASK_PY
    + _RUN_FILES
    + _SINGLE_ENV
    + _CHECKPOINT
    + _SINGLE_REQUEST
    + _GPU
    + _RESPONSE
    + _TIME_API
    + _SINGLE_RESULT
)

MULTI_INSTRUCTIONS = (
    _MULTI_HEAD
    + _LAYOUT_HEAD
    + _MULTI_TASKS
    + _MODEL_OUTPUT
    + _RUN_FILES
    + _MULTI_ENV
    + _CHECKPOINT
    + _MULTI_REQUEST
    + _GPU
    + _RESPONSE
    + _MULTI_RESPONSE
    + _TIME_API
    + _MULTI_RESULT
)


# Added to instructions.md when the task's scoring.feedback is split (rlbench.config.scoring_settings): the
# agent is told that its reported scores are on a part of the held-out split, never which part or its size.
FEEDBACK_SPLIT_NOTE = """
## What your scores are measured on

In this run the held-out split has two parts. `/submit`, `scores.json` and `submissions.json` report
each submission's score on one of them (the feedback split). Every new submission is also scored on
the other part, which you are never told about: the benchmark reports both, and how much choosing a
submission by its reported score overstates it.
"""


MODE_RULES = {
    "free": "",
    "sft-only": "\n## Mode: SFT only\n\nUse supervised fine-tuning only (no RL, no preference optimisation).\n",
    "rl-only": "\n## Mode: RL only\n\nImprove the model with reinforcement learning (GRPO, PPO, ...); "
    "SFT may only warm up an RL run.\n",
}


def instructions_text(hf_id: str, mode: str, split: bool, multi: bool = False) -> str:
    """instructions.md: the run's instructions (a multi-task run's when `multi`), the feedback-split note when a
    task's scoring is split, then the mode's rules."""
    template = MULTI_INSTRUCTIONS if multi else INSTRUCTIONS
    return template.format(hf_id=hf_id) + (FEEDBACK_SPLIT_NOTE if split else "") + MODE_RULES[mode]


def multi_description(tasks: list[dict]) -> str:
    """A multi-task run's top-level description.md. `tasks`: in run order, each {"name", "level", "files"} (the
    names of what its folder tasks/<name>/ holds)."""
    rows = "\n".join(
        f"| {t['name']} | {t.get('level') or '-'} | `tasks/{t['name']}/`: {', '.join(f'`{f}`' for f in t['files'])} |"
        for t in tasks
    )
    return f"""\
# Multi-task run: {len(tasks)} tasks, one model

This run has {len(tasks)} tasks. Post-train the base model into ONE model, one checkpoint, that is good on
all of them, and submit it for every task at once (`"task": "all"`).

| Task | Level | Its files |
|---|---|---|
{rows}

Each task's `tasks/<task>/description.md` describes that task as if it were the only one: the paths it
names (`data/train.jsonl`, `task.py`...) are in the task's folder `tasks/<task>/`.

## What counts

- A submission with `"task": "all"` (the default) is evaluated on every task, one with `"task": "<task>"`
  on that task only.
- Each task's result is the best score on that task among your submissions: the score of the best
  submission evaluated on it.
- The run's headline is the mean, over the tasks, of each task's improvement on the base model
  (its result minus the base model's score on it).
- Every task's held-out split stays outside this workspace: you never see it. Train on the training
  splits under `tasks/<task>/data/`.

`instructions.md` gives the layout, the time budget and how to submit.
"""
