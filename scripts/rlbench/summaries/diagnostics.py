"""Runtime recording and post-hoc summaries: artifacts, process metrics, per-iteration reports.

Two sets of process metrics, kept apart so that a paper name never carries another meaning:

* `paper_metrics` -> summary.json["metrics"]: the ten process metrics of SPEC §4, computed as the
  reference harness (RD-Agent AutoRL-Bench, rdagent/scenarios/rl/autorl_bench/core/metrics.py,
  `compute_metrics`) computes them, over the submissions it would record in scores.json
  (`ledger.is_submission`), in ledger order.
* `extra_metrics` -> summary.json["metrics_extra"]: ours, under names the paper does not use
  (validity by grader status, copies by weight fingerprint, non-strict monotonicity...).

summary.jsonl holds one record per recorded submission (an iteration of train -> submit) with the
fields of the reference's summary skill (core/skill.md): iteration, timestamp, duration_s, status,
exit_code, score, improvement, train_type, failure_type; our extra fields use other names.
"""

from __future__ import annotations

import difflib
import io
import os
import re
import stat
import sys
import tempfile
import tokenize
from collections import Counter
from datetime import datetime
from pathlib import Path

from rlbench.fileio import nofollow
from rlbench.grader.checks import snapshot_code, workspace_checkpoint_manifest
from rlbench.fileio.jsonio import read_json, read_jsonl
from rlbench.recording.ledger import SCORED, is_scored, is_submission, iso_timestamp
from rlbench.summaries.modes import FINAL, audit_mode
from rlbench.recording.repository import (
    CODE_GIT,
    CodeRepository,
    RecordingError,
    code_revisions,
    summarize_trace,
    workspace_usage,
)

# Route labels (SPEC §4). TRAINING_ROUTES are real training routes ("coding success").
GRPO, PPO, DPO, SFT_ONLY, SFT_RL = "GRPO", "PPO", "DPO", "SFT-only", "SFT+RL"
COPY, MISSING, UNKNOWN = "Copy", "Placeholder/Missing", "unknown"
TRAINING_ROUTES = (GRPO, PPO, DPO, SFT_ONLY, SFT_RL)
ROUTE_LABELS = TRAINING_ROUTES + (COPY, MISSING, UNKNOWN)
ONLINE_RL_ROUTES = frozenset({GRPO, PPO, SFT_RL})  # routes that build rollouts of the policy
# Failure types (SPEC §4; the reference's skill.md rule 4 names the same six).
CODE_ERROR, ROLLOUT_WRONG, TIMEOUT_NO_SUBMISSION = "code_error_runtime", "rollout_logic_wrong", "timeout_no_submission"
COPY_FALLBACK, DIVERGED, UNKNOWN_FAILURE = "copy_model_fallback", "training_diverged", "unknown"
FAILURE_TYPES = (CODE_ERROR, ROLLOUT_WRONG, TIMEOUT_NO_SUBMISSION, COPY_FALLBACK, DIVERGED, UNKNOWN_FAILURE)
INTERACTIVE_LEVELS = frozenset({"L3"})

# What each training method looks like in code. Class names count only when called (an import
# alone proves nothing); bare method words (`loss_type="dpo"`, `trl sft`, `adv_estimator=grpo`)
# count anywhere except in full-line comments.
METHOD_PATTERNS = {
    "grpo": re.compile(r"\bGRPO(?:Trainer|Config)\s*\(|(?i:\bgrpo\b)"),
    # Other online policy-gradient methods (RLOO) are counted with PPO.
    "ppo": re.compile(r"\b(?:PPO|RLOO)(?:Trainer|Config)\s*\(|(?i:\b(?:ppo|rloo)\b)"),
    # "DPO (and other preference methods)".
    "preference": re.compile(
        r"\b(?:Online)?(?:DPO|ORPO|KTO|CPO|BCO|XPO|NashMD)(?:Trainer|Config)\s*\(|(?i:\b(?:dpo|orpo|kto|simpo)\b)"
    ),
    "sft": re.compile(r"\bSFT(?:Trainer|Config)\s*\(|\bSeq2SeqTrainer\s*\(|(?<![\w.])Trainer\s*\(|(?i:\bsft\b)"),
}
ROUTE_SUFFIXES = {".py", ".sh", ".bash", ".yaml", ".yml", ".toml", ".cfg"}
CODE_SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".json", ".toml", ".cfg", ".txt", ".md"}
MAX_SCAN_BYTES = 2_000_000
_FULL_LINE_COMMENT = re.compile(r"^\s*#.*$", re.M)
# Hyper-parameters shown as "key configuration" in summary.md.
CONFIG_KEYS = (
    "learning_rate",
    "lr",
    "num_train_epochs",
    "epochs",
    "max_steps",
    "per_device_train_batch_size",
    "batch_size",
    "gradient_accumulation_steps",
    "num_generations",
    "beta",
    "lora_r",
    "lora_rank",
    "lora_alpha",
)
_CONFIG_ASSIGN = re.compile(r"(?<![\w.])(" + "|".join(CONFIG_KEYS) + r")[\"']?\s*[=:](?!=)\s*")
# The reference's iteration status values (skill.md: 成功 / 失败).
SUCCESS, FAILED = "success", "failed"
# summary.jsonl leaves out our long-text fields (the reference keeps it to quantifiable fields).
JSONL_OMITTED = ("error", "key_config", "key_code_lines", "snippet", "code_diff", "diff_against")
# collect_artifacts: the model versions under output/ (directories holding a checkpoint), found
# without following a link: at most this many, in a walk of at most this many entries, and the
# bytes read to fingerprint them all (beyond: listed with sizes, fingerprint null).
MODEL_VERSIONS_MAX = 200
OUTPUT_WALK_MAX_ENTRIES = 100_000
OUTPUT_WALK_MAX_DEPTH = 8
MODEL_HASH_MAX_BYTES = 32 << 30
# Files of the final workspace listed one by one in artifacts.json (all are counted).
FINAL_LISTING_MAX = 2000


# -- code --------------------------------------------------------------------------------------
def _code_files(code_dir: Path, suffixes: set[str] = CODE_SUFFIXES) -> list[Path]:
    if not code_dir or not Path(code_dir).is_dir():
        return []
    return sorted(p for p in Path(code_dir).rglob("*") if p.is_file() and p.suffix in suffixes)


def _code_text(code_dir: Path | None) -> str:
    """The code and configs under code_dir, full-line comments removed."""
    parts = []
    for path in _code_files(code_dir, ROUTE_SUFFIXES):
        if path.stat().st_size <= MAX_SCAN_BYTES:
            parts.append(_FULL_LINE_COMMENT.sub("", path.read_text(errors="replace")))
    return "\n".join(parts)


def training_methods(code_dir: Path | None) -> set[str]:
    """Which of grpo, ppo, preference, sft the code under code_dir uses."""
    text = _code_text(code_dir)
    return {name for name, pattern in METHOD_PATTERNS.items() if pattern.search(text)}


def detect_route(code_dir: Path | None) -> str | None:
    """GRPO, PPO, DPO, SFT-only or SFT+RL from the code; None when no training method shows.

    SFT+RL is SFT plus an online RL method (GRPO/PPO); SFT before DPO stays DPO (a preference
    method, not online RL). Several RL methods: GRPO before PPO before DPO."""
    return route_of(training_methods(code_dir))


def route_of(methods: set[str]) -> str | None:
    """detect_route's label for a set of training methods."""
    if methods & {"grpo", "ppo"} and "sft" in methods:
        return SFT_RL
    for method, label in (("grpo", GRPO), ("ppo", PPO), ("preference", DPO), ("sft", SFT_ONLY)):
        if method in methods:
            return label
    return None


def _expression(text: str, start: int, limit: int = 60) -> str:
    """The expression starting at text[start]: up to a top-level comma, closing bracket or newline."""
    depth, quote, i = 0, None, start
    while i < len(text) and i - start < 200:
        char = text[i]
        if quote:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "([{":
            depth += 1
        elif char in ")]}":
            if depth == 0:
                break
            depth -= 1
        elif char == "\n" or (depth == 0 and char in ",#"):
            break
        i += 1
    value = text[start:i].strip()
    return value if len(value) <= limit else value[: limit - 3] + "..."


# A value that is only a type annotation (`max_steps: int` in a signature), not a setting.
_ANNOTATION = re.compile(r"^(?:int|float|str|bool|None|Optional\[.*\]|(?:int|float|str) \| None)$")
_IDENTIFIER = re.compile(r"^[A-Za-z_]\w*$")
_LORA_RANK = re.compile(r"\bLoraConfig\s*\([^)]*?(?<![\w.])r\s*=\s*")


def key_configuration(code_dir: Path | None) -> dict[str, str]:
    """The first value the code gives each of CONFIG_KEYS (as written, e.g. 'env_float("LR", 5e-4)');
    a bare name set at the start of a line elsewhere in the code shows that assignment too
    ("SFT_LR (= 2e-5)"); type annotations (`max_steps: int`) are not values."""
    found: dict[str, str] = {}
    text = _code_text(code_dir)
    for match in _CONFIG_ASSIGN.finditer(text):
        key = match.group(1)
        if key not in found:
            value = _expression(text, match.end())
            if value and not _ANNOTATION.match(value):
                found[key] = value
    lora = _LORA_RANK.search(text)  # peft's LoraConfig(r=...): the LoRA rank
    if lora and "lora_r" not in found:
        found["lora_r"] = _expression(text, lora.end())
    for key, value in found.items():
        if _IDENTIFIER.match(value) and value not in CONFIG_KEYS:
            assigned = re.search(rf"^{re.escape(value)}\s*(?::[^=\n]*)?=(?!=)\s*", text, re.M)
            if assigned:
                found[key] = f"{value} (= {_expression(text, assigned.end())})"
    return {key: found[key] for key in CONFIG_KEYS if key in found}


# -- ledger entries --------------------------------------------------------------------------
def recorded_submissions(ledger: list[dict]) -> list[dict]:
    """The entries the reference would record in scores.json, in ledger (= completion) order."""
    return [e for e in ledger if is_submission(e) and not e.get("pending")]


def entry_score(entry: dict) -> float:
    """The entry's score as the reference records it: 0.0 when it could not be scored."""
    score = entry.get("score")
    return 0.0 if score is None else float(score)


def finished_at(entry: dict) -> float | None:
    """Unix time when the entry's evaluation finished: the instant its ISO `timestamp` names.

    `responded_at` is that instant as unix seconds, exact and free of the ISO string's missing
    time zone; ledgers without it fall back to parsing the ISO `timestamp`."""
    responded = entry.get("responded_at")
    if isinstance(responded, (int, float)):
        return float(responded)
    stamp = entry.get("timestamp")
    if isinstance(stamp, str):
        try:
            return datetime.fromisoformat(stamp).timestamp()
        except ValueError:
            return None
    return None


def _iso(entry: dict) -> str | None:
    stamp = entry.get("timestamp")
    if isinstance(stamp, str):
        return stamp
    finished = finished_at(entry)
    return None if finished is None else iso_timestamp(finished)


def resolves_to(model_path: object, workspace: Path, target: Path) -> bool:
    """Whether model_path names target. The reference resolves model_path with Path.resolve(),
    i.e. against the harness's current directory, so a relative path ("models/...") never matches
    there although the agent, working in the workspace, meant the workspace's directory; we resolve
    relative paths against the workspace, which is what the reference means."""
    if not isinstance(model_path, str) or not model_path:
        return False
    path = Path(model_path)
    try:
        return (path if path.is_absolute() else Path(workspace) / path).resolve() == Path(target).resolve()
    except (OSError, ValueError):
        return False


def is_base_path(entry: dict, workspace: Path, base_model: str | None) -> bool:
    """The submission's model_path is the workspace's base model directory (models/<hf_id>).

    The grader's `resolved_path` (model_path resolved in the workspace, relative to it) says the
    same and survives a run directory that moved after the run."""
    if not base_model:
        return False
    if entry.get("resolved_path") is not None and Path(entry["resolved_path"]) == Path(base_model):
        return True
    return resolves_to(entry.get("model_path"), workspace, Path(workspace) / base_model)


def is_base_weights(entry: dict, baseline_fingerprint: str | None) -> bool:
    """The submitted weights are the base model's, wherever they were saved (output/v1...)."""
    return baseline_fingerprint is not None and entry.get("fingerprint") == baseline_fingerprint


# -- run_meta ----------------------------------------------------------------------------------
def _int_or_none(value) -> int | None:
    return None if value is None else int(value)


def load_run_meta(workspace: Path, run: dict, submissions: list[dict]) -> dict:
    """start_time, timeout_s, last_submit_time, end_time as the reference reads them from
    run_meta.json (int unix seconds; end_time = when the run actually ended). A field the file
    lacks comes from run.json (truncated to int, as the reference stores it) or, for
    last_submit_time, from the last recorded submission's finish time."""
    path = Path(workspace) / "run_meta.json"
    meta = read_json(path) if path.exists() else {}
    meta = meta if isinstance(meta, dict) else {}
    finishes = [t for t in (finished_at(e) for e in submissions) if t is not None]
    fallback = {
        "start_time": _int_or_none(run.get("start_time")),
        "timeout_s": _int_or_none(run.get("time_limit_s")),
        "end_time": _int_or_none(run.get("end_time")),
        "last_submit_time": int(max(finishes)) if finishes else None,
    }
    return {key: _int_or_none(meta.get(key)) if meta.get(key) is not None else value for key, value in fallback.items()}


# -- process metrics -----------------------------------------------------------------------------
def paper_metrics(
    submissions: list[dict],
    run_meta: dict,
    baseline_score: float | None,
    workspace: Path,
    base_model: str | None,
) -> dict:
    """The ten process metrics exactly as core/metrics.py `compute_metrics` defines them.

    submissions: the recorded submissions (`recorded_submissions`), in order. base_model: the base
    model's directory relative to the workspace (models/<hf_id>). Delays are whole seconds since
    run_meta's start_time, truncated with int() as the reference does."""
    scores = [entry_score(e) for e in submissions]  # metrics.py:35, failed entries score 0.0
    start, end = run_meta.get("start_time"), run_meta.get("end_time")
    timeout_s, last_submit = run_meta.get("timeout_s"), run_meta.get("last_submit_time")

    def delay(entry: dict) -> int | None:
        finished = finished_at(entry)
        return None if finished is None else int(finished - start)

    valid = [s for s in scores if s and s > 0]  # metrics.py:37: valid = score > 0
    first_valid_idx = next((i for i, s in enumerate(scores, start=1) if s and s > 0), None)  # :40-44
    time_to_first_improvement = None
    if baseline_score is not None and start:  # :59-65: the first entry above the baseline, then stop
        for entry, score in zip(submissions, scores):
            if score > baseline_score:
                time_to_first_improvement = delay(entry)
                break
    time_to_best = None
    if start and submissions:  # :86-90: max() keeps the first of tied best scores
        best_index = max(range(len(scores)), key=lambda i: scores[i])
        time_to_best = delay(submissions[best_index])
    copy_model_count = None
    if base_model:  # :72-79
        copy_model_count = sum(1 for e in submissions if is_base_path(e, workspace, base_model))
    return {
        "valid_submission_rate": len(valid) / len(scores) if scores else None,  # :38
        "first_valid_idx": first_valid_idx,
        "first_valid_delay": delay(submissions[first_valid_idx - 1]) if start and first_valid_idx else None,  # :52-56
        "score_trajectory": scores,  # :100
        "time_to_first_improvement": time_to_first_improvement,
        "time_to_best": time_to_best,
        # :67-70: strict increases over all consecutive entries / (n - 1); None under 2 entries
        "monotonic_ratio": (
            sum(1 for a, b in zip(scores, scores[1:]) if b > a) / (len(scores) - 1) if len(scores) >= 2 else None
        ),
        "copy_model_count": copy_model_count,
        "time_used_ratio": (end - start) / timeout_s if start and end and timeout_s else None,  # :81-83
        "last_submit_gap": int(end - last_submit) if end and last_submit else None,  # :92-94
    }


def extra_metrics(
    ledger: list[dict],
    submissions: list[dict],
    baseline_score: float | None,
    baseline_fingerprint: str | None,
) -> dict:
    """Our process metrics, under names the paper does not use.

    scored_* : validity by grader status (scored or cached: a real evaluation of the submitted
    weights) instead of score > 0; copy_weights_count: submissions whose weights equal the base
    model's (fingerprint), wherever they were saved; nondecreasing_ratio: b >= a over consecutive
    scored submissions only; *_since_start_s: when the submission was made (since_start_s)."""
    scored = [(i, e) for i, e in enumerate(submissions, start=1) if is_scored(e)]
    scored_scores = [entry_score(e) for _, e in scored]
    best = max(scored, key=lambda pair: entry_score(pair[1]), default=None)
    first_improvement = next(
        (i for i, e in scored if baseline_score is not None and entry_score(e) > baseline_score), None
    )
    steps = list(zip(scored_scores, scored_scores[1:]))
    return {
        "requests": len(ledger),
        # Requests that are not submissions (ledger.is_submission): request errors, repeats, grader errors.
        "refused_requests": len(ledger) - len(submissions),
        "status_counts": dict(Counter(e.get("status") or "unknown" for e in submissions)),
        "scored_submissions": len(scored),
        "scored_submission_rate": len(scored) / len(submissions) if submissions else None,
        "first_scored_idx": scored[0][0] if scored else None,
        "first_scored_since_start_s": scored[0][1].get("since_start_s") if scored else None,
        "first_improvement_idx": first_improvement,
        "best_scored_idx": best[0] if best else None,
        "best_scored_since_start_s": best[1].get("since_start_s") if best else None,
        "nondecreasing_ratio": sum(1 for a, b in steps if b >= a) / len(steps) if steps else None,
        "copy_weights_count": sum(1 for e in submissions if is_base_weights(e, baseline_fingerprint)),
    }


# -- iterations ----------------------------------------------------------------------------------
def snapshot_code_dir(grader_dir: Path, entry: dict) -> Path | None:
    """grader/snapshots/NNNN/code, the agent's code when this submission was made (the grader
    deletes NNNN/model for non-best entries but keeps the code)."""
    submission_id = entry.get("submission_id")
    if not isinstance(submission_id, int):
        return None
    path = Path(grader_dir) / "snapshots" / f"{submission_id:04d}" / "code"
    return path if path.is_dir() else None


def train_type(
    entry: dict,
    code_dir: Path | None,
    *,
    baseline_fingerprint: str | None,
    workspace: Path,
    base_model: str | None,
) -> str:
    """The iteration's route label: Copy for the base weights (by fingerprint or by path); else the
    route of the code snapshot; else unknown for evaluated weights (trained by code outside code/)
    and Placeholder/Missing for a submission with nothing evaluable and no training code."""
    if is_base_weights(entry, baseline_fingerprint) or is_base_path(entry, workspace, base_model):
        return COPY
    route = detect_route(code_dir)
    if route:
        return route
    return UNKNOWN if is_scored(entry) else MISSING


def iteration_failure(entry: dict, label: str, baseline_score: float | None, level: str | None) -> str | None:
    """The failure type of one iteration; None when it improved on the baseline.

    Copy -> copy_model_fallback; not evaluable (refused, evaluation failed) -> code_error_runtime;
    a grader error -> unknown (not the agent's doing); an online-RL route on an interactive (L3)
    task without gain -> rollout_logic_wrong; below the baseline -> training_diverged; else unknown."""
    if label == COPY:
        return COPY_FALLBACK
    if entry.get("status") == "grader_error":
        return UNKNOWN_FAILURE
    if not is_scored(entry):
        return CODE_ERROR
    if baseline_score is None:
        return UNKNOWN_FAILURE
    score = entry_score(entry)
    if score > baseline_score:
        return None
    if level in INTERACTIVE_LEVELS and label in ONLINE_RL_ROUTES:
        return ROLLOUT_WRONG
    return DIVERGED if score < baseline_score else UNKNOWN_FAILURE


def iterations(
    submissions: list[dict],
    *,
    grader_dir: Path,
    workspace: Path,
    base_model: str | None,
    baseline_score: float | None,
    baseline_fingerprint: str | None,
    start_time: float | None,
    exit_code: int | None,
    level: str | None = None,
) -> list[dict]:
    """One record per recorded submission (an iteration of train -> submit).

    Reference fields (core/skill.md rule 9): iteration (1-based); timestamp (the submission's ISO
    timestamp, when its evaluation finished); duration_s (int seconds since the previous iteration
    ended, the first since run start); status (success: evaluated, failed: not); exit_code (the
    agent's exit code, on the last iteration only: its own commands are not observed); score (0.0
    when not evaluated); improvement (score - baseline); train_type; failure_type. Ours: refusal
    (the grader's refusal code), submission_id, model_path, grader_status, best_so_far,
    best_iteration, valid_so_far, eval_seconds, since_start_s, error, key_config."""
    records, previous, best, best_iteration, valid_so_far = [], start_time, None, None, 0
    for index, entry in enumerate(submissions, start=1):
        score = entry_score(entry)
        if best is None or score > best:
            best, best_iteration = score, index
        valid_so_far += score > 0
        code_dir = snapshot_code_dir(grader_dir, entry)
        label = train_type(
            entry, code_dir, baseline_fingerprint=baseline_fingerprint, workspace=workspace, base_model=base_model
        )
        finished = finished_at(entry)
        improvement = entry.get("improvement")
        if improvement is None and baseline_score is not None:
            improvement = round(score - baseline_score, 4)
        records.append(
            {
                "iteration": index,
                "timestamp": _iso(entry),
                "duration_s": int(finished - previous) if finished is not None and previous is not None else None,
                "status": SUCCESS if is_scored(entry) else FAILED,
                "exit_code": exit_code if index == len(submissions) else None,
                "score": score,
                "improvement": improvement,
                "train_type": label,
                "failure_type": iteration_failure(entry, label, baseline_score, level),
                "refusal": entry.get("reason") if entry.get("status") == "refused" else None,
                "submission_id": entry.get("submission_id"),
                "model_path": entry.get("model_path"),
                "grader_status": entry.get("status"),
                "best_so_far": best,
                "best_iteration": best_iteration,
                "valid_so_far": valid_so_far,
                "eval_seconds": entry.get("elapsed_seconds"),
                "since_start_s": entry.get("since_start_s"),
                "error": entry.get("error"),
                "key_config": key_configuration(code_dir),
            }
        )
        previous = finished if finished is not None else previous
    return records


def jsonl_record(record: dict) -> dict:
    """A summary.jsonl line: the record without its long-text fields."""
    return {k: v for k, v in record.items() if k not in JSONL_OMITTED}


# -- iteration stories (summary.md: what was done, why, key code lines, snippet, diff) ------------
#: The unified diff shown per iteration is cut after this many lines.
DIFF_MAX_LINES = 200
#: At most this many key code lines per iteration, each cut to KEY_LINE_MAX_CHARS.
KEY_LINES_MAX = 8
KEY_LINE_MAX_CHARS = 160
#: The snippet around the main training call: this many lines before it and after it.
SNIPPET_BEFORE, SNIPPET_AFTER = 7, 8
# A training call: `trainer.train(...)` (the main one), else a trainer's construction.
_TRAIN_CALL = re.compile(r"\.train\s*\(")
_TRAINER_CONSTRUCTION = re.compile(r"\b\w*Trainer\s*\(")
_TRL_IMPORT = re.compile(r"^\s*(?:from\s+trl\b|import\s+trl\b)")


def code_texts(code_dir: Path | None, suffixes: set[str] = CODE_SUFFIXES) -> dict[str, str]:
    """{relative path: text} of the code files under code_dir (a grader snapshot: link-free),
    files over MAX_SCAN_BYTES left out; {} when there is no directory."""
    texts = {}
    for path in _code_files(code_dir, suffixes):
        if path.stat().st_size <= MAX_SCAN_BYTES:
            texts[path.relative_to(code_dir).as_posix()] = path.read_text(errors="replace")
    return texts


def _code_line(text: str) -> str:
    line = text.strip()
    return line if len(line) <= KEY_LINE_MAX_CHARS else line[: KEY_LINE_MAX_CHARS - 3] + "..."


def _prose_lines(name: str, text: str) -> set[int]:
    """1-based numbers of the lines of a Python file that are prose, not code: docstrings and the
    inner lines of multi-line strings (read with tokenize; a file it cannot read: none)."""
    if not name.endswith(".py"):
        return set()
    prose: set[int] = set()
    previous = tokenize.NEWLINE
    try:
        for token in tokenize.generate_tokens(io.StringIO(text).readline):
            if token.type == tokenize.STRING:
                first, last = token.start[0], token.end[0]
                if previous in (tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
                    prose.update(range(first, last + 1))  # a string statement: a docstring
                else:
                    prose.update(range(first + 1, last + 1))
            if token.type not in (tokenize.COMMENT, tokenize.NL):
                previous = token.type
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return set()
    return prose


def _is_code(line: str, number: int, prose: set[int]) -> bool:
    return bool(line.strip()) and not line.lstrip().startswith("#") and number not in prose


def _config_line(line: str) -> bool:
    """A line that sets one of CONFIG_KEYS (not a signature's annotation such as `max_steps: int`)."""
    if re.match(r"\s*(?:async\s+)?def\s", line):
        return False
    for match in _CONFIG_ASSIGN.finditer(line):
        value = _expression(line, match.end())
        if value and not _ANNOTATION.match(value):
            return True
    return False


def key_code_lines(texts: dict[str, str], limit: int = KEY_LINES_MAX) -> list[str]:
    """"file:line: code" for the lines that show the training, at most `limit`, in file order:
    first TRL imports, trainers' constructions and `.train(` calls, then lines setting CONFIG_KEYS;
    when there are none, METHOD_PATTERNS matches. Comments, docstrings and multi-line strings are
    skipped (route files only)."""
    strong, config, method = [], [], []
    for name, text in texts.items():
        if Path(name).suffix not in ROUTE_SUFFIXES:
            continue
        prose = _prose_lines(name, text)
        for number, line in enumerate(text.splitlines(), start=1):
            if not _is_code(line, number, prose):
                continue
            where = (name, number, _code_line(line))
            if _TRL_IMPORT.search(line) or _TRAINER_CONSTRUCTION.search(line) or _TRAIN_CALL.search(line):
                strong.append(where)
            elif _config_line(line):
                config.append(where)
            elif any(p.search(line) for p in METHOD_PATTERNS.values()):
                method.append(where)
    chosen = (strong + config)[:limit] or method[:limit]
    order = {name: i for i, name in enumerate(texts)}
    return [f"{name}:{number}: {line}" for name, number, line in sorted(chosen, key=lambda w: (order[w[0]], w[1]))]


def training_snippet(texts: dict[str, str]) -> dict | None:
    """The lines around the main training call: the first `.train(` call of a Python file, else
    the first trainer construction, else the first METHOD_PATTERNS match; {"file", "line" (of
    the call), "start" (first line shown), "text"}; None when the code shows no training."""
    python = {name: text for name, text in texts.items() if name.endswith(".py")}
    prose = {name: _prose_lines(name, text) for name, text in python.items()}
    for pattern in (_TRAIN_CALL, _TRAINER_CONSTRUCTION, *METHOD_PATTERNS.values()):
        for name, text in python.items():
            lines = text.splitlines()
            for index, line in enumerate(lines):
                if not _is_code(line, index + 1, prose[name]) or not pattern.search(line):
                    continue
                start = max(0, index - SNIPPET_BEFORE)
                shown = lines[start : index + SNIPPET_AFTER + 1]
                return {"file": name, "line": index + 1, "start": start + 1, "text": "\n".join(shown)}
    return None


def code_diff(old: dict[str, str], new: dict[str, str], old_label: str, new_label: str) -> str:
    """The unified diff (difflib) from one code snapshot to another, file by file in path order,
    cut after DIFF_MAX_LINES lines (a last line says how many were left out); "" when equal."""
    lines: list[str] = []
    for name in sorted(set(old) | set(new)):
        a, b = old.get(name), new.get(name)
        if a == b:
            continue
        lines += difflib.unified_diff(
            (a or "").splitlines(),
            (b or "").splitlines(),
            fromfile=f"{old_label}/{name}" if a is not None else "/dev/null",
            tofile=f"{new_label}/{name}" if b is not None else "/dev/null",
            lineterm="",
        )
    if len(lines) > DIFF_MAX_LINES:
        lines = lines[:DIFF_MAX_LINES] + [f"... ({len(lines) - DIFF_MAX_LINES} more diff lines not shown)"]
    return "\n".join(lines)


def _names(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" and {len(names) - limit} more" if len(names) > limit else "")


def what_was_done(record: dict, previous: dict | None, old: dict[str, str] | None, new: dict[str, str] | None) -> str:
    """The iteration's changes, from its code snapshot against the previous one's (`previous`:
    the latest earlier iteration with a snapshot): files added / changed / removed, the training
    type's change, the key configuration's changes ("learning_rate 1e-5 -> 5e-6")."""
    if new is None:
        return f"submitted {record.get('model_path')} (no code snapshot recorded)"
    parts = []
    if previous is None or old is None:
        parts.append(f"first recorded code: {len(new)} file(s) ({_names(sorted(new))})" if new else "no code files")
        parts.append(f"training type {record['train_type']}")
        config = record.get("key_config") or {}
        if config:
            parts.append("configuration " + ", ".join(f"{k}={v}" for k, v in config.items()))
        return "; ".join(parts)
    added = sorted(set(new) - set(old))
    removed = sorted(set(old) - set(new))
    changed = sorted(n for n in set(old) & set(new) if old[n] != new[n])
    if added:
        parts.append(f"added {_names(added)}")
    if changed:
        parts.append(f"changed {_names(changed)}")
    if removed:
        parts.append(f"removed {_names(removed)}")
    if not (added or changed or removed):
        parts.append(f"no code change since iteration {previous['iteration']}")
    if previous["train_type"] != record["train_type"]:
        parts.append(f"training type {previous['train_type']} -> {record['train_type']}")
    before, after = previous.get("key_config") or {}, record.get("key_config") or {}
    moves = []
    for key in CONFIG_KEYS:
        if before.get(key) != after.get(key):
            moves.append(f"{key} {before.get(key, 'unset')} -> {after.get(key, 'unset')}")
    if moves:
        parts.append("configuration " + ", ".join(moves))
    return "; ".join(parts)


def why(record: dict, previous: dict | None) -> str:
    """The evidence from the previous iteration that the next one answers: its score and
    improvement (or that it was not evaluated), its failure type, its error's first line."""
    if previous is None:
        return "first submission"
    if previous["status"] == SUCCESS:
        evidence = (
            f"iteration {previous['iteration']} scored {_fmt(previous['score'])} "
            f"(improvement {_fmt(previous['improvement'], True)}, best so far {_fmt(previous['best_so_far'])})"
        )
    else:
        evidence = f"iteration {previous['iteration']} was not evaluated (grader: {previous['grader_status']})"
    if previous["failure_type"]:
        evidence += f"; its failure type: {previous['failure_type']}"
    if str(previous.get("error") or "").strip():
        evidence += f"; its error: {_first_line(str(previous['error']).strip().splitlines()[0], 200)}"
    return evidence


def add_iteration_stories(grader_dir: Path, records: list[dict]) -> None:
    """Give each record what summary.md shows beside its numbers: what_was_done, why,
    key_code_lines, snippet, code_diff (unified diff against diff_against, the latest earlier
    iteration with a code snapshot, or None). Deterministic: read from the grader's snapshots."""
    previous_code: tuple[dict, dict[str, str]] | None = None
    for index, record in enumerate(records):
        code_dir = snapshot_code_dir(grader_dir, record)
        texts = code_texts(code_dir) if code_dir is not None else None
        earlier, old = previous_code if previous_code else (None, None)
        record["what_was_done"] = what_was_done(record, earlier, old, texts)
        record["why"] = why(record, records[index - 1] if index else None)
        record["key_code_lines"] = key_code_lines(texts or {})
        record["snippet"] = training_snippet(texts or {})
        record["diff_against"] = earlier["iteration"] if earlier is not None and texts is not None else None
        record["code_diff"] = (
            code_diff(old, texts, f"iteration-{earlier['iteration']}", f"iteration-{record['iteration']}")
            if record["diff_against"] is not None
            else ""
        )
        if texts is not None:
            previous_code = (record, texts)


# -- interactive (L3) failure types ---------------------------------------------------------------
ROLLOUT_CONSTRUCTION, REWARD_DATA_DESIGN = "rollout_construction_failure", "reward_data_design_failure"
TRAINING_COLLAPSE, EARLY_CODING = "training_collapse", "early_coding_failure"
STATIC_SHORTCUT = "static_shortcut_without_transfer"
INTERACTIVE_FAILURE_TYPES = (ROLLOUT_CONSTRUCTION, REWARD_DATA_DESIGN, TRAINING_COLLAPSE, EARLY_CODING, STATIC_SHORTCUT)
#: Routes that train on a fixed dataset, never on the policy's own interaction with the environment.
STATIC_ROUTES = frozenset({SFT_ONLY, DPO})
#: Code that builds rollouts by acting in the environment: env.step / env.reset, an environment
#: class's construction (WebShopEnv, gym.make), or a request to an environment server.
ENV_CALL = re.compile(
    r"(?i:\b\w*env\w*\s*\.\s*(?:step|reset)\s*\()"
    r"|\b\w*Env\s*\("
    r"|\bgym(?:nasium)?\s*\.\s*make\s*\("
    r"|\b(?:requests|httpx|aiohttp|session|client)\s*\.\s*(?:get|post|request)\s*\("
)
_ERROR_LINE = re.compile(r"Traceback|\w*(?:Error|Exception)\b|(?i:\bfailed\b|\bexit code\b|\bnan\b)")
_NAMES_ROLLOUT = re.compile(r"(?i)rollout|environment|\benv\b|\benv\.|\w+_env\b|env_server|env_url")
_NAMES_REWARD = re.compile(r"(?i)reward")
# A logged reward_std: TRL's log dicts hold numbers, or strings of them ('reward_std': '0').
_REWARD_STD = re.compile(r"[\"']?reward_std[\"']?\s*[:=]\s*[\"']?(-?[0-9][0-9.eE+-]*)")
_REWARD_DEF = re.compile(r"^(\s*)def\s+(\w*reward\w*)\s*\(", re.M | re.I)
_CONSTANT_RETURN = re.compile(
    r"^\s*return\s+(?:\[\s*)?(-?\d+(?:\.\d*)?(?:e-?\d+)?)\s*"
    r"(?:\]\s*\*\s*len\s*\(.*\)|for\s+.*\]|\])?\s*$"
)
#: The agent's log files read for evidence (the tail of each, without following a link).
LOG_TAIL_BYTES = 4 << 20
EVIDENCE_MAX = 6


def _read_log_tail(path: Path) -> str:
    """The last LOG_TAIL_BYTES of a regular file, opened without following a link; "" otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return ""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return ""
        os.lseek(fd, max(0, info.st_size - LOG_TAIL_BYTES), os.SEEK_SET)
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")
    finally:
        os.close(fd)


def agent_log_lines(run_dir: Path) -> list[tuple[str, int, str]]:
    """(log name, line number in the part read, line) of the agent's logs: workspace/agent.log,
    then run_dir/logs/*.log in name order."""
    run_dir = Path(run_dir)
    paths = [run_dir / "workspace" / "agent.log"]
    logs = run_dir / "logs"
    if logs.is_dir() and not logs.is_symlink():
        paths += sorted(p for p in logs.glob("*.log"))
    lines = []
    for path in paths:
        name = path.relative_to(run_dir).as_posix()
        for number, line in enumerate(_read_log_tail(path).splitlines(), start=1):
            lines.append((name, number, line))
    return lines


def constant_reward_functions(texts: dict[str, str]) -> list[str]:
    """"file:line: def name" of each Python reward function (a def whose name holds "reward")
    whose every return gives one and the same numeric constant (or a list of it)."""
    found = []
    for name, text in texts.items():
        if not name.endswith(".py"):
            continue
        lines = text.splitlines()
        for match in _REWARD_DEF.finditer(text):
            indent = len(match.group(1))
            first = text.count("\n", 0, match.start())
            values = set()
            other_return = False
            for line in lines[first + 1 :]:
                if line.strip() and len(line) - len(line.lstrip()) <= indent:
                    break
                if re.match(r"\s*return\b", line):
                    constant = _CONSTANT_RETURN.match(line)
                    if constant:
                        values.add(float(constant.group(1)))
                    else:
                        other_return = True
            if len(values) == 1 and not other_return:
                found.append(f"{name}:{first + 1}: {_code_line(lines[first])} returns only {values.pop():g}")
    return found


def _quote(line: str, limit: int = 200) -> str:
    return _first_line(line, limit)


def interactive_failure(
    run_dir: Path,
    run: dict,
    records: list[dict],
    level: str | None,
    baseline_score: float | None,
    run_failure: str | None,
) -> dict | None:
    """The interactive-task failure type of an L3 run that did not improve (SPEC §4), with the
    evidence that decided it; None for other levels and for runs that improved (run_failure None).

    Code: the latest recorded snapshot, else the final workspace code/ (read through the grader's
    link-free copy). Online RL: an iteration's train type in ONLINE_RL_ROUTES (or, with no such
    iteration, the code's route). In this order:

    1. rollout_construction_failure: an online-RL route whose code never calls the environment
       (ENV_CALL), or whose errors (grader errors, agent log) name the rollout or environment;
    2. reward_data_design_failure: errors naming the reward, a reward function that returns a
       constant, a training log whose reward_std is always 0, or GRPO code without any reward;
    3. early_coding_failure: nothing evaluated (no submission, only failed ones, or only the base
       model resubmitted);
    4. training_collapse: every evaluated trained submission below the baseline;
    5. static_shortcut_without_transfer: a static-dataset route (SFT-only, DPO) at or under the baseline;
    6. otherwise: an online route that acted in the environment and gained nothing
       (reward_data_design_failure: no learning signal), else static_shortcut_without_transfer."""
    if level not in INTERACTIVE_LEVELS or run_failure is None:
        return None
    run_dir = Path(run_dir)
    grader = run_dir / "grader"
    code_dir, code_label = None, None
    for record in reversed(records):
        code_dir = snapshot_code_dir(grader, record)
        if code_dir is not None:
            code_label = f"snapshot of iteration {record['iteration']}"
            break
    with tempfile.TemporaryDirectory(prefix="rlbench-l3-code-") as tmp:
        if code_dir is None and (run_dir / "workspace" / "code").is_dir():
            snapshot_code(run_dir / "workspace", Path(tmp) / "code")
            code_dir, code_label = Path(tmp) / "code", "final code/"
        texts = code_texts(code_dir, ROUTE_SUFFIXES) if code_dir is not None else {}
        code_route = detect_route(code_dir) if code_dir is not None else None
    code_lines = [
        (name, number, line)
        for name, text in texts.items()
        for number, line in enumerate(text.splitlines(), start=1)
        if line.strip() and not line.lstrip().startswith("#")
    ]
    routes = [r["train_type"] for r in records]
    online = next((r for r in routes if r in ONLINE_RL_ROUTES), None) or (
        code_route if code_route in ONLINE_RL_ROUTES else None
    )
    errors = [
        (f"iteration {r['iteration']} grader error", _quote(str(r["error"]).strip().splitlines()[0]))
        for r in records
        if r.get("error") and str(r["error"]).strip()
    ]
    log_errors = [
        (f"{name}:{number}", _quote(line))
        for name, number, line in agent_log_lines(run_dir)
        if _ERROR_LINE.search(line)
    ]
    all_errors = errors + log_errors

    def cite(items: list[tuple[str, str]]) -> list[str]:
        return [f"{where}: {text}" for where, text in items[:EVIDENCE_MAX]]

    def result(kind: str, evidence: list[str]) -> dict:
        return {"type": kind, "evidence": evidence[:EVIDENCE_MAX]}

    # 1. rollouts
    if online and texts:
        env_calls = [(n, i, l) for n, i, l in code_lines if ENV_CALL.search(l)]
        if not env_calls:
            return result(
                ROLLOUT_CONSTRUCTION,
                [
                    f"route {online}: online RL builds rollouts of the policy in the environment",
                    f"{code_label}: no environment call (env.step/reset, an *Env(...), a request to the "
                    f"environment server) in {len(texts)} file(s): {_names(sorted(texts))}",
                ],
            )
    rollout_errors = [(w, t) for w, t in all_errors if _NAMES_ROLLOUT.search(t)]
    if online and rollout_errors:
        return result(ROLLOUT_CONSTRUCTION, [f"route {online}"] + cite(rollout_errors))
    # 2. rewards and data
    reward_evidence = cite([(w, t) for w, t in all_errors if _NAMES_REWARD.search(t)])
    reward_evidence += [f"{code_label}: {line}" for line in constant_reward_functions(texts)]
    stds = [
        (name, number, line, float(m.group(1)))
        for name, number, line in agent_log_lines(run_dir)
        for m in [_REWARD_STD.search(line)]
        if m and re.fullmatch(r"-?[0-9.]+(?:[eE][+-]?[0-9]+)?", m.group(1))
    ]
    if stds and all(value == 0 for *_, value in stds):
        name, number, line, _ = stds[0]
        reward_evidence.append(f"{name}:{number}: {_quote(line)} (reward_std 0 in all {len(stds)} logged steps)")
    if online == GRPO or code_route == GRPO:
        if texts and not any(_NAMES_REWARD.search(l) for _, _, l in code_lines):
            reward_evidence.append(f"{code_label}: GRPO code without any reward (no 'reward' in the code)")
    if reward_evidence:
        return result(REWARD_DATA_DESIGN, reward_evidence)
    # 3. nothing evaluated
    scored = _scored_records(records)
    exit_code = run.get("exit_code")
    if not scored:
        evidence = [
            "no submission recorded"
            if not records
            else f"0 of {len(records)} submission(s) evaluated (grader: "
            + ", ".join(str(r["grader_status"]) for r in records)
            + ")"
        ]
        evidence.append(f"agent exit code {exit_code} (run status {run.get('status')})")
        return result(EARLY_CODING, evidence + cite(all_errors))
    trained = [r for r in scored if r["train_type"] != COPY]
    if not trained:
        return result(
            EARLY_CODING,
            [
                f"only the base model was evaluated ({len(scored)} copy submission(s)): no trained model",
                f"agent exit code {exit_code} (run status {run.get('status')})",
            ]
            + cite(all_errors),
        )
    best = max(trained, key=lambda r: r["score"])
    score_line = (
        f"best trained score {_fmt(best['score'])} (iteration {best['iteration']}, {best['train_type']}) "
        f"vs baseline {_fmt(baseline_score)}"
    )
    # 4. collapse
    if baseline_score is not None and all(r["score"] < baseline_score for r in trained):
        scores = ", ".join(f"{_fmt(r['score'])} (iteration {r['iteration']})" for r in trained)
        return result(
            TRAINING_COLLAPSE,
            [score_line, f"every trained submission below the baseline: {scores}"]
            + cite([(w, t) for w, t in log_errors if re.search(r"(?i)\bnan\b|diverg|collapse", t)]),
        )
    # 5. static shortcut
    route = best["train_type"] if best["train_type"] in TRAINING_ROUTES else code_route
    if route in STATIC_ROUTES or not online:
        return result(
            STATIC_SHORTCUT,
            [
                f"route {route or best['train_type']}: trained on a static dataset, no online interaction",
                score_line + " (no gain)",
            ],
        )
    # 6. online RL that acted in the environment and learned nothing
    return result(
        REWARD_DATA_DESIGN,
        [f"route {online}: the code acts in the environment, yet no learning signal", score_line + " (no gain)"],
    )


# -- run level -----------------------------------------------------------------------------------
def _scored_records(records: list[dict]) -> list[dict]:
    return [r for r in records if r["grader_status"] in SCORED]


def run_route(records: list[dict]) -> str:
    """The run's route: Placeholder/Missing when nothing was evaluated, Copy when every evaluated
    submission was the base model, else the train type of the best evaluated non-copy submission
    (the first of tied ones); when that one's code shows no method, the latest that does."""
    scored = _scored_records(records)
    if not scored:
        return MISSING
    trained = [r for r in scored if r["train_type"] != COPY]
    if not trained:
        return COPY
    best = max(trained, key=lambda r: r["score"])
    if best["train_type"] in TRAINING_ROUTES:
        return best["train_type"]
    return next((r["train_type"] for r in reversed(trained) if r["train_type"] in TRAINING_ROUTES), best["train_type"])


def coding_success(route: str) -> bool:
    """SPEC §4: the run's route is a real training route."""
    return route in TRAINING_ROUTES


def improvement_success(records: list[dict]) -> bool:
    """SPEC §4: at least one evaluated submission with Δ > 0."""
    return any((r["improvement"] or 0) > 0 for r in _scored_records(records))


def failure_type(run: dict, records: list[dict], level: str | None = None) -> str | None:
    """The run's failure type (SPEC §4); None when a submission improved on the baseline.

    No submission: timeout_no_submission when the budget ran out, code_error_runtime when the agent
    failed, else unknown. Nothing evaluable: code_error_runtime. Only base-model copies evaluated:
    copy_model_fallback. An online-RL route on an interactive (L3) task: rollout_logic_wrong.
    Every trained submission below the baseline: training_diverged. Otherwise unknown."""
    if improvement_success(records):
        return None
    if not records:
        if run.get("status") == "timeout" or run.get("timed_out"):
            return TIMEOUT_NO_SUBMISSION
        return CODE_ERROR if run.get("status") in ("failed", "error") else UNKNOWN_FAILURE
    scored = _scored_records(records)
    if not scored:
        return CODE_ERROR if any(r["failure_type"] == CODE_ERROR for r in records) else UNKNOWN_FAILURE
    trained = [r for r in scored if r["train_type"] != COPY]
    if not trained:
        return COPY_FALLBACK
    if level in INTERACTIVE_LEVELS and run_route(records) in ONLINE_RL_ROUTES:
        return ROLLOUT_WRONG
    if all(r["improvement"] is not None and r["improvement"] < 0 for r in trained):
        return DIVERGED
    return UNKNOWN_FAILURE


# -- artifacts and the whole summary ---------------------------------------------------------------
def base_model_dir(workspace: Path, base_model: str | None = None) -> str | None:
    """models/<hf_id> relative to the workspace: as given, else the one model under models/."""
    if base_model:
        return base_model
    models = Path(workspace) / "models"
    found = sorted({p.parent for p in models.rglob("config.json")}) if models.is_dir() else []
    return str(found[0].relative_to(workspace)) if len(found) == 1 else None


def _checkpoint_dirs(workspace: Path) -> tuple[list[Path], bool]:
    """The directories under workspace/output that hold a checkpoint (a config.json or a
    *.safetensors regular file directly inside), found without following a link, sorted; and
    whether the search stopped early (OUTPUT_WALK_MAX_ENTRIES, MODEL_VERSIONS_MAX)."""
    root = Path(os.path.realpath(workspace))
    try:
        top = nofollow.open_directory_inside(root, root / "output")
    except (OSError, ValueError):
        return [], False
    found: set[Path] = set()
    truncated = False
    try:
        walk = nofollow.walk(top, OUTPUT_WALK_MAX_DEPTH, skip_unreadable=True)
        try:
            for count, entry in enumerate(walk, 1):
                if count > OUTPUT_WALK_MAX_ENTRIES or len(found) > MODEL_VERSIONS_MAX:
                    truncated = True
                    break
                weights = entry.name == "config.json" or entry.name.endswith(".safetensors")
                if weights and stat.S_ISREG(entry.st.st_mode):
                    found.add(root / "output" / entry.rel.parent)
        finally:
            walk.close()
    finally:
        os.close(top)
    dirs = sorted(found, key=lambda p: p.relative_to(root).parts)
    return dirs[:MODEL_VERSIONS_MAX], truncated or len(dirs) > MODEL_VERSIONS_MAX


def model_versions(workspace: Path, ledger: list[dict] | None = None, max_bytes: int = MODEL_HASH_MAX_BYTES) -> dict:
    """Every checkpoint directory under workspace/output: path (relative to the workspace), files
    (name, size, sha256), bytes, the fingerprint the grader would give it (grader.checks, no link
    followed; null when over the byte budget or when a file was a link or unreadable: see
    skipped/truncated), and the submissions whose weights it holds (`submitted_as`, by fingerprint)."""
    workspace = Path(workspace)
    root = Path(os.path.realpath(workspace))
    dirs, truncated = _checkpoint_dirs(workspace)
    by_fingerprint: dict[str, list[int]] = {}
    for entry in ledger or []:
        if entry.get("fingerprint") and isinstance(entry.get("submission_id"), int):
            by_fingerprint.setdefault(entry["fingerprint"], []).append(entry["submission_id"])
    versions, left = [], max_bytes
    for directory in dirs:
        manifest = workspace_checkpoint_manifest(workspace, directory, max_bytes=max(left, 0))
        left -= manifest["bytes"]
        versions.append(
            {
                "path": str(directory.relative_to(root)),
                "files": manifest["files"],
                "bytes": manifest["bytes"],
                "fingerprint": manifest["fingerprint"],
                "skipped": manifest["skipped"],
                "truncated": manifest["truncated"],
                "submitted_as": by_fingerprint.get(manifest["fingerprint"], []) if manifest["fingerprint"] else [],
            }
        )
    return {"versions": versions, "truncated": truncated}



def model_version_count(workspace: Path) -> int:
    """How many model versions the workspace left under output/: the checkpoint directories
    (_checkpoint_dirs, no link followed) holding a config.json regular file, as artifacts.json
    lists them in `model_versions`; nothing is read or hashed."""
    count = 0
    for directory in _checkpoint_dirs(Path(workspace))[0]:
        try:
            count += stat.S_ISREG(os.lstat(directory / "config.json").st_mode)
        except OSError:
            pass
    return count

def _revision_methods(grader_dir: Path, revision: str, tree: str, cache: dict[str, set[str]]) -> set[str] | None:
    """training_methods of one code.git revision (exported to a temporary directory: its files
    as committed, nothing of git's checkout machinery involved); None when it cannot be read.
    cache: by tree (an unchanged code/ is read once)."""
    repo = CodeRepository(Path(grader_dir) / CODE_GIT)
    if tree in cache:
        return cache[tree]
    try:
        with tempfile.TemporaryDirectory(prefix="rlbench-rev-") as tmp:
            repo.export(revision, Path(tmp))
            methods = training_methods(Path(tmp))
    except (RecordingError, OSError, ValueError) as exc:
        print(f"diagnostics: code revision {revision}: {exc}", file=sys.stderr)
        return None
    cache[tree] = methods
    return methods


def final_code_methods(workspace: Path) -> set[str]:
    """training_methods of the workspace's final code/, read through the grader's link-free,
    bounded copy (grader.checks.snapshot_code): the agent's links are not followed."""
    with tempfile.TemporaryDirectory(prefix="rlbench-final-code-") as tmp:
        snapshot_code(Path(workspace), Path(tmp) / "code")
        return training_methods(Path(tmp) / "code")


def code_methods(grader_dir: Path, ledger: list[dict]) -> tuple[list[tuple[int, set[str]]], str]:
    """(submission_id, training methods) for every recorded request whose code was recorded, in
    ledger order: from its code.git revision (`code_revision`), else from its code snapshot
    directory; and the evidence used ("code revisions", "code snapshots", or both)."""
    revisions, sources, cache = [], set(), {}
    trees = {r["sha"]: r["tree"] for r in code_revisions(grader_dir)}
    for entry in ledger:
        sid = entry.get("submission_id")
        if entry.get("pending") or not isinstance(sid, int):
            continue
        methods = None
        revision = entry.get("code_revision")
        if revision and revision in trees:
            methods = _revision_methods(grader_dir, revision, trees[revision], cache)
            if methods is not None:
                sources.add("code revisions")
        if methods is None:
            code_dir = snapshot_code_dir(grader_dir, entry)
            if code_dir is None:
                continue
            methods = training_methods(code_dir)
            sources.add("code snapshots")
        revisions.append((sid, methods))
    evidence = " and ".join(sorted(sources)) or "no code recorded"
    return revisions, evidence


def audit_run_mode(
    run_dir: Path,
    mode: str | None,
    ledger: list[dict],
    baseline_fingerprint: str | None,
    base_model: str | None,
) -> dict:
    """modes.audit_mode over the run's recorded code (code_methods) and its final code/ state;
    "trained weights" are scored submissions of weights other than the base model's."""
    run_dir = Path(run_dir)
    workspace, grader = run_dir / "workspace", run_dir / "grader"
    revisions, evidence = code_methods(grader, ledger)
    if (workspace / "code").exists() or (workspace / "code").is_symlink():
        revisions.append((FINAL, final_code_methods(workspace)))
        evidence += " + final code/"
    trained = any(
        is_scored(e)
        and not e.get("pending")
        and not is_base_weights(e, baseline_fingerprint)
        and not is_base_path(e, workspace, base_model)
        for e in ledger
    )
    return audit_mode(mode, revisions, submitted_trained_weights=trained, evidence=evidence)


def collect_artifacts(run_dir: Path, manifest: dict | None = None) -> dict:
    """What a run left behind: submissions, code, model versions, best checkpoint, logs; and the
    records of runtime recording: the final state of the workspace (files and bytes per top-level
    directory, the first FINAL_LISTING_MAX files), every model version under output/ (models), the
    code revisions (grader/code.git), the resource trace summary (resources.jsonl)."""
    workspace, grader = run_dir / "workspace", run_dir / "grader"
    run = read_json(run_dir / "run.json")
    ledger_path = grader / "ledger.jsonl"
    ledger = list(read_jsonl(ledger_path)) if ledger_path.exists() else []
    submissions = recorded_submissions(ledger)
    best_model = grader / "best_model"
    log = workspace / "agent.log"
    models = model_versions(workspace, ledger)
    final_methods = final_code_methods(workspace)
    return {
        "status": run["status"],
        "requests": len(ledger),
        "submissions": len(submissions),
        "scored_submissions": sum(1 for e in submissions if is_scored(e)),
        "base_model": base_model_dir(workspace, (manifest or {}).get("model")),
        "code_files": [str(p.relative_to(workspace)) for p in _code_files(workspace / "code")],
        # Directories under output/ holding a config.json (no link followed); `models` has the detail.
        "model_versions": [
            v["path"] for v in models["versions"] if any(f["name"] == "config.json" for f in v["files"])
        ],
        "best": run.get("best"),
        "best_model": str(best_model) if best_model.is_dir() else None,
        "snapshots": sorted(p.name for p in (grader / "snapshots").iterdir()) if (grader / "snapshots").is_dir() else [],
        "agent_log_bytes": log.stat().st_size if log.exists() else 0,
        "final_code_route": route_of(final_methods) or MISSING,
        # Ours, runtime recording:
        "mode": (manifest or {}).get("mode"),
        "final_state": workspace_usage(workspace, listing=FINAL_LISTING_MAX),
        "models": models,
        "code_revisions": [
            {"sha": r["sha"], "submission": r["submission"], "time": r["time"]} for r in code_revisions(grader)
        ],
        "resources": summarize_trace(run_dir / "resources.jsonl"),
    }


def summarize(
    run_dir: Path,
    run: dict,
    final: dict,
    baseline: dict,
    level: str | None = None,
    base_model: str | None = None,
    mode: str | None = None,
) -> tuple[dict, list[dict]]:
    """summary.json and the summary.jsonl records of one run directory.

    baseline: the grader's baseline (score, fingerprint); final: final.json; base_model:
    models/<hf_id> (artifacts.json "base_model"); mode: the agent's operating mode (its registry
    entry, recorded in workspace.json; read from there when not given). summary.json's `mode` and
    `mode_audit` (modes.audit_mode over the recorded code revisions) are ours, beside the
    reference's fields."""
    run_dir = Path(run_dir)
    workspace, grader = run_dir / "workspace", run_dir / "grader"
    ledger_path = grader / "ledger.jsonl"
    ledger = list(read_jsonl(ledger_path)) if ledger_path.exists() else []
    submissions = recorded_submissions(ledger)
    base_model = base_model_dir(workspace, base_model)
    meta = load_run_meta(workspace, run, submissions)
    records = iterations(
        submissions,
        grader_dir=grader,
        workspace=workspace,
        base_model=base_model,
        baseline_score=baseline.get("score"),
        baseline_fingerprint=baseline.get("fingerprint"),
        start_time=meta["start_time"],
        exit_code=run.get("exit_code"),
        level=level,
    )
    route = run_route(records)
    summary = {
        "labels": run.get("labels", {}),
        "level": level,
        "status": run["status"],
        "exit_code": run.get("exit_code"),
        "timed_out": run.get("timed_out"),
        "baseline": final.get("baseline_score", baseline.get("score")),
        "best": final.get("score"),
        "delta": final.get("delta"),
        "submissions": len(submissions),
        "valid_submissions": sum(1 for e in submissions if entry_score(e) > 0),  # the paper's "valid"
        "scored_submissions": sum(1 for e in submissions if is_scored(e)),
        "route": route,
        "coding_success": coding_success(route),
        "improvement_success": improvement_success(records),
        "failure_type": failure_type(run, records, level),
        "run_meta": meta,
        "metrics": paper_metrics(submissions, meta, baseline.get("score"), workspace, base_model),
        "metrics_extra": extra_metrics(ledger, submissions, baseline.get("score"), baseline.get("fingerprint")),
    }
    if mode is None and (run_dir / "workspace.json").is_file():
        manifest = read_json(run_dir / "workspace.json")
        mode = manifest.get("mode") if isinstance(manifest, dict) else None
    summary["mode"] = mode or "free"
    summary["mode_audit"] = audit_run_mode(run_dir, mode, ledger, baseline.get("fingerprint"), base_model)
    # The paper's leaderboard groups by (scaffold, driver LLM, mode): the coding-agent tool and its driver for
    # LLM agents (run.json `llm`), "reference" and no driver for the scripted reference agents. Token totals
    # come from the run's LLM gateway.
    llm = run.get("llm") if isinstance(run.get("llm"), dict) else {}
    summary["scaffold"] = (llm.get("agent_tool") or {}).get("name") or "reference"
    summary["driver"] = (llm.get("driver") or {}).get("model")
    summary["tokens"] = llm.get("tokens")
    summary["stopped_by"] = run.get("stopped_by")
    # The evaluation's own metrics (ours; "metrics" above are the paper's process metrics): which
    # metric the scores are (the primary one, delta's), the final evaluation's and the baseline's
    # whole metrics dicts, and the grader's noise measured on the baseline (its band goes beside delta).
    summary["primary_metric"] = final.get("primary_metric") or baseline.get("primary_metric")
    summary["eval_metrics"] = final.get("metrics")
    summary["baseline_metrics"] = final.get("baseline_metrics") or baseline.get("metrics")
    summary["grader_noise"] = final.get("grader_noise") or baseline.get("grader_noise")
    summary.update(run_overview(run_dir, run, meta, submissions, records))
    summary["interactive_failure"] = interactive_failure(
        run_dir, run, records, level, baseline.get("score"), summary["failure_type"]
    )
    add_iteration_stories(grader, records)
    # The optional LLM narrative (rlbench.summaries.narrative.add_narrative) fills these in when it is on.
    summary["narrative"] = None
    for record in records:
        record["narrative"] = None
    return summary, records


def run_overview(run_dir: Path, run: dict, meta: dict, submissions: list[dict], records: list[dict]) -> dict:
    """summary.json's run-level overview fields (ours, beside the reference's):

    budget_s (run_meta timeout_s), duration_s (run_meta end_time - start_time), best_index (1-based
    index of the best evaluated submission, the first of ties), code_files (code files in the
    final code/), model_versions (checkpoint directories with a config.json under output/),
    zero_score_share (share of submissions scoring 0, failed ones included), exec_success (any
    submission evaluated), cost_usd (the LLM gateway's cost), timeline (per submission: iteration,
    since_start_s, score, scored, train_type) and routes_used (the training routes of the
    iterations, in order of first use)."""
    workspace = Path(run_dir) / "workspace"
    start, end = meta.get("start_time"), meta.get("end_time")
    scored = [(i, e) for i, e in enumerate(submissions, start=1) if is_scored(e)]
    best = max(scored, key=lambda pair: entry_score(pair[1]), default=None)
    llm = run.get("llm") if isinstance(run.get("llm"), dict) else {}
    tokens = llm.get("tokens") if isinstance(llm.get("tokens"), dict) else {}
    cost = tokens.get("cost_usd")
    routes: list[str] = []
    for record in records:
        if record["train_type"] in TRAINING_ROUTES and record["train_type"] not in routes:
            routes.append(record["train_type"])
    return {
        "budget_s": meta.get("timeout_s"),
        "duration_s": end - start if start is not None and end is not None else None,
        "best_index": best[0] if best else None,
        "code_files": 0 if (workspace / "code").is_symlink() else len(_code_files(workspace / "code")),
        "model_versions": model_version_count(workspace),
        "zero_score_share": (
            sum(1 for e in submissions if entry_score(e) == 0) / len(submissions) if submissions else None
        ),
        "exec_success": bool(scored),
        "cost_usd": float(cost) if isinstance(cost, (int, float)) and not isinstance(cost, bool) else None,
        "timeline": [
            {
                "iteration": record["iteration"],
                "since_start_s": record["since_start_s"],
                "score": record["score"],
                "scored": record["grader_status"] in SCORED,
                "train_type": record["train_type"],
            }
            for record in records
        ],
        "routes_used": routes,
    }


# -- summary.md --------------------------------------------------------------------------------------
def _fmt(value, signed: bool = False) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:+.4g}" if signed else f"{value:.4g}"
    return str(value)


def _first_line(text: str, limit: int = 300) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _mode_lines(summary: dict) -> list[str]:
    """The operating mode and its audit: one line, and one more per violation."""
    audit = summary.get("mode_audit")
    if not audit:
        return []
    methods = ", ".join(audit["methods_used"]) or "none"
    if not audit["violation"]:
        return [f"- mode: {audit['mode']} (no violation; training methods in the code: {methods})"]
    lines = [
        f"- mode: {audit['mode']}: **MODE VIOLATION** "
        f"(training methods in the code: {methods}; evidence: {audit['evidence']})"
    ]
    for violation in audit["violations"]:
        where = violation["submission_id"]
        where = "the run" if where is None else "final code/" if where == FINAL else f"submission {where}"
        lines.append(f"  - {where}: {violation['why']}")
    return lines


def _noise_note(summary: dict) -> str:
    """" (metric; grader noise ±band over K baseline evaluations)" where known."""
    parts = [summary["primary_metric"]] if summary.get("primary_metric") else []
    noise = summary.get("grader_noise")
    if isinstance(noise, dict) and noise.get("repeats", 1) > 1:
        parts.append(f"grader noise ±{_fmt(noise.get('band'))} over {noise['repeats']} baseline evaluations")
    return f" ({'; '.join(parts)})" if parts else ""


def _overview_lines(summary: dict) -> list[str]:
    """The run_overview and interactive_failure fields, where summarize gave them."""
    if "budget_s" not in summary:
        return []
    lines = [
        f"- time: {_fmt(summary['duration_s'])} s of a {_fmt(summary['budget_s'])} s budget; "
        f"best submission: {_fmt(summary['best_index'])}; routes used: {', '.join(summary['routes_used']) or 'none'}; "
        f"code files: {summary['code_files']}; model versions: {summary['model_versions']}; "
        f"zero-score share: {_fmt(summary['zero_score_share'])}; LLM cost: "
        + (f"${summary['cost_usd']:.2f}" if summary["cost_usd"] is not None else "-")
    ]
    failure = summary.get("interactive_failure")
    if failure:
        lines.append(f"- interactive failure: {failure['type']}")
        lines += [f"  - evidence: {_first_line(item)}" for item in failure["evidence"]]
    narrative = summary.get("narrative")
    if isinstance(narrative, dict) and narrative.get("generated"):
        lines.append(
            f"- narrative lines are generated by an LLM ({narrative['model']}) and marked so; "
            "everything else is computed"
        )
    return lines


def _story_lines(record: dict) -> list[str]:
    """summary.md's account of one iteration beside its numbers (add_iteration_stories; the
    narrative when rlbench.summaries.narrative generated one): what was done, why, the key code lines, the
    snippet around the main training call, the diff against the previous snapshot."""
    lines = []
    if record.get("what_was_done"):
        lines.append(f"- what was done: {record['what_was_done']}")
    if record.get("why"):
        lines.append(f"- why: {record['why']}")
    narrative = record.get("narrative")
    if isinstance(narrative, dict) and narrative.get("generated") and narrative.get("text"):
        lines.append(
            f"- narrative (generated by {narrative['model']}, an LLM; not checked): "
            + _first_line(narrative["text"], 1000)
        )
    if record.get("key_code_lines"):
        lines.append("- key code lines:")
        lines += [f"  - `{line}`" if "`" not in line else f"  - {line}" for line in record["key_code_lines"]]
    snippet = record.get("snippet")
    if snippet:
        lines += [
            "",
            f"Main training call, {snippet['file']}:{snippet['line']} (from line {snippet['start']}):",
            "",
            *_fenced(snippet["text"], "python"),
        ]
    if record.get("code_diff"):
        lines += [
            "",
            f"<details><summary>code diff against iteration {record['diff_against']}</summary>",
            "",
            *_fenced(record["code_diff"], "diff"),
            "",
            "</details>",
        ]
    return lines


def _fenced(text: str, language: str) -> list[str]:
    """A Markdown code block of text: its fence one backtick longer than any run of backticks inside."""
    fence = "`" * max(3, max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    return [f"{fence}{language}", text, fence]


def summary_markdown(summary: dict, records: list[dict]) -> str:
    """summary.md: the run at a glance, then one section per iteration."""
    labels, metrics = summary["labels"], summary["metrics"]
    yes = {True: "yes", False: "no"}
    lines = [
        f"# {labels.get('task')} / {labels.get('model')} / {labels.get('agent')} / seed {labels.get('seed')}",
        "",
        f"- status: {summary['status']} (exit code {_fmt(summary['exit_code'])})",
        f"- route: {summary['route']} (coding success: {yes[summary['coding_success']]}, "
        f"improvement success: {yes[summary['improvement_success']]})",
        *_mode_lines(summary),
        f"- baseline {_fmt(summary['baseline'])}, best {_fmt(summary['best'])}, delta {_fmt(summary['delta'], True)}"
        + _noise_note(summary),
        f"- submissions: {summary['submissions']} ({summary['valid_submissions']} valid: score > 0; "
        f"{summary['scored_submissions']} evaluated), failure type: {summary['failure_type'] or 'none'}",
        *_overview_lines(summary),
        "- process metrics: "
        + ", ".join(f"{k} {_fmt(v)}" for k, v in metrics.items() if k != "score_trajectory"),
        "- score trajectory: " + (" → ".join(_fmt(s) for s in metrics["score_trajectory"]) or "-"),
        "",
    ]
    for record in records:
        when = (record["timestamp"] or "-")[:16].replace("T", " ")
        lines += [
            f"## Iteration {record['iteration']} ({when}, {_fmt(record['duration_s'])} s): {record['model_path']}",
            "",
            f"- status: {record['status']} (grader: {record['grader_status']}"
            + (f"; agent exit code {record['exit_code']})" if record["exit_code"] is not None else ")"),
            f"- score {_fmt(record['score'])} | improvement {_fmt(record['improvement'], True)} | "
            f"best so far {_fmt(record['best_so_far'])} (iteration {record['best_iteration']})",
            f"- training type: {record['train_type']}",
        ]
        if record["key_config"]:
            lines.append("- key configuration: " + ", ".join(f"{k}={v}" for k, v in record["key_config"].items()))
        rate = f"valid_submission_rate so far {record['valid_so_far']}/{record['iteration']}"
        if record["failure_type"] is None:
            new_best = ", new best" if record["best_iteration"] == record["iteration"] else ""
            lines.append(f"- progress: {_fmt(record['improvement'], True)} over the baseline{new_best}; {rate}")
        else:
            problem = record["failure_type"]
            if record["refusal"]:
                problem += f" (refused: {record['refusal']})"
            if record["error"]:
                problem += f": {_first_line(record['error'])}"
            lines.append(f"- problem: {problem}; {rate}")
        lines += _story_lines(record)
        lines.append("")
    if not records:
        lines.append("No submission was recorded.")
    return "\n".join(lines) + "\n"
