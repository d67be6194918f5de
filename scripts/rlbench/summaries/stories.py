"""The account of each iteration that summary.md shows beside its numbers: what was done, why, the key
code lines, the snippet around the main training call, the diff against the previous code snapshot.
"""

from __future__ import annotations

import difflib
import io
import re
import tokenize
from pathlib import Path

from rlbench.summaries.agent_code import (
    CONFIG_KEYS,
    METHOD_PATTERNS,
    ROUTE_SUFFIXES,
    code_line,
    code_texts,
    config_line,
)
from rlbench.summaries.formatting import first_line, fmt, name_list
from rlbench.summaries.iterations import SUCCESS
from rlbench.summaries.submissions import snapshot_code_dir

#: The unified diff shown per iteration is cut after this many lines.
DIFF_MAX_LINES = 200
#: At most this many key code lines per iteration, each cut to agent_code.KEY_LINE_MAX_CHARS.
KEY_LINES_MAX = 8
#: The snippet around the main training call: this many lines before it and after it.
SNIPPET_BEFORE, SNIPPET_AFTER = 7, 8
# A training call: `trainer.train(...)` (the main one), else a trainer's construction.
_TRAIN_CALL = re.compile(r"\.train\s*\(")
_TRAINER_CONSTRUCTION = re.compile(r"\b\w*Trainer\s*\(")
_TRL_IMPORT = re.compile(r"^\s*(?:from\s+trl\b|import\s+trl\b)")


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
            where = (name, number, code_line(line))
            if _TRL_IMPORT.search(line) or _TRAINER_CONSTRUCTION.search(line) or _TRAIN_CALL.search(line):
                strong.append(where)
            elif config_line(line):
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


def what_was_done(record: dict, previous: dict | None, old: dict[str, str] | None, new: dict[str, str] | None) -> str:
    """The iteration's changes, from its code snapshot against the previous one's (`previous`:
    the latest earlier iteration with a snapshot): files added / changed / removed, the training
    type's change, the key configuration's changes ("learning_rate 1e-5 -> 5e-6")."""
    if new is None:
        return f"submitted {record.get('model_path')} (no code snapshot recorded)"
    parts = []
    if previous is None or old is None:
        parts.append(f"first recorded code: {len(new)} file(s) ({name_list(sorted(new))})" if new else "no code files")
        parts.append(f"training type {record['train_type']}")
        config = record.get("key_config") or {}
        if config:
            parts.append("configuration " + ", ".join(f"{k}={v}" for k, v in config.items()))
        return "; ".join(parts)
    added = sorted(set(new) - set(old))
    removed = sorted(set(old) - set(new))
    changed = sorted(n for n in set(old) & set(new) if old[n] != new[n])
    if added:
        parts.append(f"added {name_list(added)}")
    if changed:
        parts.append(f"changed {name_list(changed)}")
    if removed:
        parts.append(f"removed {name_list(removed)}")
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
            f"iteration {previous['iteration']} scored {fmt(previous['score'])} "
            f"(improvement {fmt(previous['improvement'], True)}, best so far {fmt(previous['best_so_far'])})"
        )
    else:
        evidence = f"iteration {previous['iteration']} was not evaluated (grader: {previous['grader_status']})"
    if previous["failure_type"]:
        evidence += f"; its failure type: {previous['failure_type']}"
    if str(previous.get("error") or "").strip():
        evidence += f"; its error: {first_line(str(previous['error']).strip().splitlines()[0], 200)}"
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
