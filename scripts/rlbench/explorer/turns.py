"""The agent's turns on the run's time axis: a coding agent's LLM calls (the gateway's transcript), or a
reference agent's agent.log lines.

An LLM turn is one transcript record: its time (the record's ts, when the call was answered), whether
it succeeded, the messages its request added to the conversation, its response (text, tool calls,
reasoning), tokens and latency (usage.jsonl's record with the same ts). A request resends the whole
conversation: a message is shown at the first call that sent it (the same message sent again later is
not shown again), and an assistant message that resends an earlier call's response is not shown as a
new message. A deduplicated system prompt (`system_sha256`, the recorder's DEDUP_KEYS) is shown when
it changes.

A log turn is one line of workspace/agent.log. The log itself has no times: the resource trace's
agent_log_bytes (the log's size at each sample, rlbench.recording.trace) gives each line the time of
the first sample by which it had been started (within one sampling interval of when it was written,
so t_exact is false); without that field a line's time is unknown (null). A line is an error when it
looks like one (ERROR_LINE: a traceback, an exception, an error, out of memory, killed).

Bounds: a text is cut at TEXT_CHARS characters, a label at LABEL_CHARS; at most LOG_LINES lines of
agent.log are kept (the first and the last halves; one turn says how many were left out between); when
all the turns' texts together pass PAGE_CHARS (a long run's page must still open in a browser), every
text is cut at the length that brings them under it (never below MIN_TEXT_CHARS), the longest first.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import re
from pathlib import Path

from rlbench.recording.trace import read_trace
from rlbench.recording.transcript import (
    MESSAGE_KEYS,
    SYSTEM_KEYS,
    TRANSCRIPT,
    USAGE,
    call_ids,
    message_entries,
    read_records,
    response_entries,
    text_of,
)

TEXT_CHARS = 20_000
PAGE_CHARS = 40_000_000
MIN_TEXT_CHARS = 1_000
LABEL_CHARS = 200
LOG_LINES = 20_000
AGENT_LOG = Path("workspace") / "agent.log"
ERROR_LINE = re.compile(
    r"Traceback \(most recent call last\)|\b\w*(Error|Exception)\b|\bERROR\b|\berror:|\bFAILED\b"
    r"|out of memory|\bKilled\b|\bSegmentation fault\b"
)


def _cut(text: str, limit: int = TEXT_CHARS) -> str:
    if len(text) <= limit:
        return text
    return text[:limit] + f"\n... [{len(text) - limit} more characters]"


def _label(text: str) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= LABEL_CHARS else line[: LABEL_CHARS - 1] + "…"


def _digest(value) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


def _int(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _bounded(entries: list[dict]) -> list[dict]:
    return [{**e, "text": _cut(e["text"])} for e in entries]


def turn_label(ok: bool, error: str | None, response: list[dict]) -> str:
    """One line saying what the call did: its error, its tool calls (name: first argument line), else
    the start of its answer."""
    if not ok:
        return _label(f"error: {error or 'the call failed'}")
    calls = [e for e in response if e["role"] == "tool_call"]
    if calls:
        return _label("; ".join(f"{e.get('name')}: {e['text'].splitlines()[0] if e['text'] else ''}" for e in calls))
    answer = next((e["text"] for e in response if e["role"] == "assistant" and e["text"].strip()), "")
    return _label(answer or "(no text)")


def llm_turns(run_dir: Path, start: float | None) -> list[dict]:
    """One turn per transcript record (see the module docstring)."""
    records, _ = read_records(Path(run_dir) / TRANSCRIPT)
    if not records:
        return []
    usage = {}
    for record in read_records(Path(run_dir) / USAGE)[0]:
        usage.setdefault(repr(record.get("ts")), record)
    origin = start if start is not None else next(
        (r["ts"] for r in records if isinstance(r.get("ts"), (int, float))), None
    )
    seen: set[str] = set()
    answered: set[str] = set()  # digests of the earlier responses' entries, not shown again when resent
    call_names: dict = {}
    systems: dict[str, str] = {}  # <key>_sha256 -> text
    shown_system: dict[str, str] = {}  # key -> digest last shown
    turns = []
    for index, record in enumerate(records):
        request = record.get("request") if isinstance(record.get("request"), dict) else {}
        messages: list[dict] = []
        for key in SYSTEM_KEYS:
            digest = request.get(f"{key}_sha256")
            if request.get(key):
                text = text_of(request[key])
                digest = digest or _digest(text)
                systems[digest] = text
            if digest and shown_system.get(key) != digest:
                shown_system[key] = digest
                messages.append({"role": "system", "text": systems.get(digest, f"(as sent earlier: {key} {digest})")})
        conversation = []
        for key in MESSAGE_KEYS:
            value = request.get(key)
            conversation += value if isinstance(value, list) else ([value] if value else [])
        for message in conversation:
            digest = _digest(message)
            if digest in seen:
                continue
            seen.add(digest)
            entries = message_entries(message, call_names)
            if entries and all(_digest(e) in answered for e in entries):
                continue  # an earlier call's answer, resent as part of the conversation
            messages += entries
        ok = record.get("ok") is not False
        error = None
        if not ok:
            error = text_of(record.get("refused") or record.get("error") or "the call failed")
        recorded = record.get("response")
        response = response_entries(recorded)
        if isinstance(recorded, dict):
            call_names.update(call_ids(recorded))
        answered.update(_digest(e) for e in response)
        used = record.get("usage") if isinstance(record.get("usage"), dict) else {}
        billed = usage.get(repr(record.get("ts")), {})
        ts = record.get("ts")
        t = round(ts - origin, 3) if isinstance(ts, (int, float)) and origin is not None else None
        turns.append({
            "i": index,
            "t": t,
            "t_exact": t is not None,
            "kind": "llm",
            "ok": ok,
            "error": None if error is None else _cut(error),
            "label": turn_label(ok, error, response),
            "tools": sorted({str(e.get("name")) for e in response if e["role"] == "tool_call"}),
            "model": billed.get("model") or record.get("model_group"),
            "tokens_in": _int(used.get("prompt_tokens", billed.get("prompt_tokens"))),
            "tokens_out": _int(used.get("completion_tokens", billed.get("completion_tokens"))),
            "latency_s": billed.get("latency_s") if isinstance(billed.get("latency_s"), (int, float)) else None,
            "messages": _bounded(messages),
            "response": _bounded(response),
        })  # fmt: skip
    return turns


def _log_times(run_dir: Path, start: float | None) -> tuple[list[int], list[float]]:
    """(agent_log_bytes, t) of the resource trace's samples that have the field, in order."""
    read = read_trace(Path(run_dir) / "resources.jsonl")
    sizes, times = [], []
    for sample in read[0] if read else []:
        size = sample.get("agent_log_bytes")
        if isinstance(size, int) and not isinstance(size, bool) and isinstance(sample.get("ts"), (int, float)):
            origin = start if start is not None else sample["ts"]
            if sizes and size < sizes[-1]:
                continue  # the log only grows; a smaller size is not a later state of it
            sizes.append(size)
            times.append(round(sample["ts"] - origin, 3))
    return sizes, times


def _log_turn(i: int, line: str, t: float | None) -> dict:
    text = line.rstrip("\r\n")
    ok = ERROR_LINE.search(text) is None
    label = _label(text)
    return {
        "i": i, "t": t, "t_exact": False, "kind": "log", "ok": ok, "error": None if ok else label,
        "label": label, "tools": [], "model": None, "tokens_in": None, "tokens_out": None, "latency_s": None,
        "messages": [], "response": [{"role": "log", "text": _cut(text)}] if len(text) > LABEL_CHARS else [],
    }  # fmt: skip


def log_turns(run_dir: Path, start: float | None) -> list[dict]:
    """One turn per agent.log line (see the module docstring)."""
    path = Path(run_dir) / AGENT_LOG
    if path.is_symlink() or not path.is_file():
        return []
    sizes, times = _log_times(run_dir, start)
    lines: list[tuple[int, str]] = []  # (byte offset, text)
    offset = 0
    with path.open("rb") as handle:
        for raw in handle:
            lines.append((offset, raw.decode("utf-8", errors="replace")))
            offset += len(raw)
    if len(lines) > LOG_LINES:
        half = LOG_LINES // 2
        left_out = len(lines) - 2 * half
        gap = (lines[half][0], f"... [{left_out} lines of agent.log not shown]")
        lines = lines[:half] + [gap] + lines[-half:]

    def when(offset: int) -> float | None:
        k = bisect.bisect_right(sizes, offset)  # the first sample whose log was longer than the line's start
        return times[k] if k < len(times) else None

    return [_log_turn(i, text, when(offset)) for i, (offset, text) in enumerate(lines)]


def within_page(turns: list[dict], budget: int | None = None) -> list[dict]:
    """The turns with every text cut at one length chosen so that all of them together stay under budget
    characters (PAGE_CHARS; not below MIN_TEXT_CHARS each); unchanged when they already fit."""
    budget = PAGE_CHARS if budget is None else budget
    lengths = sorted(len(e["text"]) for t in turns for e in (*t["messages"], *t["response"]))
    if sum(lengths) <= budget:
        return turns
    # the largest cut such that sum(min(length, cut)) <= budget
    remaining, cut = budget, MIN_TEXT_CHARS
    for k, length in enumerate(lengths):
        share = remaining // (len(lengths) - k)
        if length > share:
            cut = max(MIN_TEXT_CHARS, share)
            break
        remaining -= length
    for turn in turns:
        for key in ("messages", "response"):
            turn[key] = [{**e, "text": _cut(e["text"], cut)} if len(e["text"]) > cut else e for e in turn[key]]
    return turns


def run_turns(run_dir: Path, start: float | None) -> list[dict]:
    """The run's turns: its LLM calls where the gateway recorded a transcript, else its agent.log lines."""
    return within_page(llm_turns(run_dir, start) or log_turns(run_dir, start))


def tool_names(turns: list[dict]) -> list[str]:
    """Every tool name called in the turns, sorted."""
    return sorted({name for turn in turns for name in turn["tools"]})
