"""Failure typing (SPEC §4): the failure type of each iteration and of a run, and the interactive-task (L3)
failure type of a run with the evidence that decided it.
"""

from __future__ import annotations

import os
import re
import stat
import tempfile
from pathlib import Path

from rlbench.grader.snapshot import snapshot_code
from rlbench.recording.ledger import is_scored
from rlbench.summaries.agent_code import ROUTE_SUFFIXES, code_line, code_texts
from rlbench.summaries.formatting import first_line, fmt, name_list
from rlbench.summaries.routes import (
    COPY,
    DPO,
    GRPO,
    ONLINE_RL_ROUTES,
    SFT_ONLY,
    TRAINING_ROUTES,
    detect_route,
    run_route,
    scored_records,
)
from rlbench.summaries.submissions import entry_score, snapshot_code_dir

# Failure types (SPEC §4; the reference's skill.md rule 4 names the same six).
CODE_ERROR, ROLLOUT_WRONG, TIMEOUT_NO_SUBMISSION = "code_error_runtime", "rollout_logic_wrong", "timeout_no_submission"
COPY_FALLBACK, DIVERGED, UNKNOWN_FAILURE = "copy_model_fallback", "training_diverged", "unknown"
FAILURE_TYPES = (CODE_ERROR, ROLLOUT_WRONG, TIMEOUT_NO_SUBMISSION, COPY_FALLBACK, DIVERGED, UNKNOWN_FAILURE)
INTERACTIVE_LEVELS = frozenset({"L3"})


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


def improvement_success(records: list[dict]) -> bool:
    """SPEC §4: at least one evaluated submission with Δ > 0."""
    return any((r["improvement"] or 0) > 0 for r in scored_records(records))


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
    scored = scored_records(records)
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
                found.append(f"{name}:{first + 1}: {code_line(lines[first])} returns only {values.pop():g}")
    return found


def _quote(line: str, limit: int = 200) -> str:
    return first_line(line, limit)


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
                    f"environment server) in {len(texts)} file(s): {name_list(sorted(texts))}",
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
    scored = scored_records(records)
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
        f"best trained score {fmt(best['score'])} (iteration {best['iteration']}, {best['train_type']}) "
        f"vs baseline {fmt(baseline_score)}"
    )
    # 4. collapse
    if baseline_score is not None and all(r["score"] < baseline_score for r in trained):
        scores = ", ".join(f"{fmt(r['score'])} (iteration {r['iteration']})" for r in trained)
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
