"""The LLM gateway's transcript read back: its records, and the readable text of what a call sent and
got, whatever the coding agent's wire format (chat completions, Anthropic messages, the Responses API,
Gemini).

The gateway's recorder (rlbench.coding_agents.gateway.recorder) writes <run_dir>/gateway/transcript.jsonl,
one line per call: ts, call_id, ok, route, call_type, model_group, request (the body the client sent;
its repeated parts, DEDUP_KEYS, in full the first time and afterwards only as `<key>_sha256`), response
(content, tool_calls, finish_reason; or an Anthropic message's content, or a Responses output) and usage,
or error/refused; and usage.jsonl, one line per call with the same ts (latency_s, model, tokens).

- `read_records(path)`: the complete lines' JSON objects, and how many lines were unreadable;
- `text_of(value)`: the text of a message content, a tool call or result, or a response part;
- `message_text(message)`: "role: text" of one request message (the trace judge's events);
- `response_key(content, tool_calls)`: what an assistant message resent in a later request shares with
  the response it repeats;
- `message_entries(message, call_names)` and `response_entries(response)`: one request message, or one
  response, as entries {role, name?, text, error?} (roles: system, user, assistant, tool (a tool's
  output), tool_call, reasoning); call_names maps a tool call's id to its tool's name.
"""

from __future__ import annotations

import json
from pathlib import Path

#: where the gateway's recorder writes the transcript and the usage records, in a run directory
TRANSCRIPT = Path("gateway") / "transcript.jsonl"
USAGE = Path("gateway") / "usage.jsonl"
#: request parts written once, then as `<key>_sha256` (the recorder's DEDUP_KEYS: the recorder runs inside
#: the gateway's own interpreter and is not imported here)
DEDUP_KEYS = ("tools", "system", "instructions", "systemInstruction", "system_instruction")
#: the request keys holding the conversation: chat and Anthropic, Responses, Gemini
MESSAGE_KEYS = ("messages", "input", "contents")
SYSTEM_KEYS = ("system", "instructions", "systemInstruction", "system_instruction")


def read_records(path: Path) -> tuple[list[dict], int]:
    """The JSON objects of a JSONL file's complete lines (a line still being written is left out), and
    how many complete lines were not one."""
    records, unreadable = [], 0
    path = Path(path)
    if path.is_symlink() or not path.is_file():
        return records, unreadable
    with path.open("rb") as handle:
        for raw in handle:
            if not raw.endswith(b"\n"):
                break
            try:
                record = json.loads(raw)
            except ValueError:
                unreadable += 1
                continue
            if isinstance(record, dict):
                records.append(record)
            else:
                unreadable += 1
    return records, unreadable


def arguments_text(value) -> str:
    """A tool call's arguments, readable: a JSON string decoded, string values shown as they are."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    if isinstance(value, dict):
        return "\n".join(
            f"{key}: {item}" if isinstance(item, str) else f"{key}: {json.dumps(item, ensure_ascii=False, sort_keys=True)}"
            for key, item in value.items()
        )
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def _call(value: dict) -> dict | None:
    """The tool call a part is or holds (chat `function`, Anthropic tool_use, Responses *_call, Gemini
    functionCall), else None."""
    kind = value.get("type")
    if isinstance(value.get("function"), dict):
        return value["function"]
    if kind in ("tool_use", "function_call", "custom_tool_call") or (
        isinstance(kind, str) and kind.endswith("_call") and "name" in value
    ):
        return value
    if isinstance(value.get("functionCall"), dict):
        return value["functionCall"]
    return None


def _call_arguments(call: dict):
    return next((call[k] for k in ("arguments", "input", "args") if k in call), None)


def _is_result(value: dict) -> bool:
    kind = value.get("type")
    return kind in ("tool_result", "function_call_output", "custom_tool_call_output") or "functionResponse" in value


def _result_body(value: dict):
    if "functionResponse" in value:
        response = value["functionResponse"]
        return response.get("response", response) if isinstance(response, dict) else response
    return value.get("content", value.get("output"))


def text_of(value) -> str:
    """The readable text of a message content, a tool call or result, or a response part (chat,
    Anthropic, Responses and Gemini shapes; anything else as JSON)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "\n".join(t for t in (text_of(v) for v in value) if t)
    if not isinstance(value, dict):
        return str(value)
    call = _call(value)
    if call is not None:
        return f"tool call {call.get('name')}:\n{arguments_text(_call_arguments(call))}"
    if _is_result(value):
        return f"tool result: {text_of(_result_body(value))}"
    if isinstance(value.get("text"), str):
        return value["text"]
    for key in ("content", "parts"):
        if key in value:
            return text_of(value[key])
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


def message_text(message) -> str:
    """One request message as "role: text" (content, then its tool calls)."""
    if not isinstance(message, dict):
        return f"message: {text_of(message)}"
    role = message.get("role") or message.get("type") or "message"
    parts = [text_of(message.get("content", message.get("parts")))] if ("content" in message or "parts" in message) else []
    if message.get("tool_calls"):
        parts.append(text_of(message["tool_calls"]))
    if not parts:
        parts.append(text_of({k: v for k, v in message.items() if k != "role"}))
    return f"{role}: " + "\n".join(p for p in parts if p)


def response_key(content, tool_calls) -> str:
    """What an assistant message resent in a later request shares with the response it repeats."""
    return " ".join((text_of(content) + " " + text_of(tool_calls or [])).split())


# -- entries: what the run explorer shows -------------------------------------------------------------


def _role(role) -> str:
    return {"model": "assistant", "developer": "system"}.get(role, role) if isinstance(role, str) else "message"


def _entry(role: str, text: str, name=None, error: bool = False) -> dict:
    entry = {"role": role, "text": text}
    if name is not None:
        entry["name"] = str(name)
    if error:
        entry["error"] = True
    return entry


def _call_entry(call: dict) -> dict:
    return _entry("tool_call", arguments_text(_call_arguments(call)), call.get("name") or "?")


def _result_entry(part: dict, call_names: dict) -> dict:
    if "functionResponse" in part and isinstance(part["functionResponse"], dict):
        name = part["functionResponse"].get("name")
    else:
        call_id = part.get("tool_use_id") or part.get("call_id") or part.get("tool_call_id")
        name = call_names.get(call_id) or part.get("name") or call_id
    return _entry("tool", text_of(_result_body(part)), name, error=part.get("is_error") is True)


def _parts_entries(role: str, parts: list, call_names: dict) -> list[dict]:
    """A content list (Anthropic blocks, chat parts, Gemini parts, Responses message content) split into
    text, tool calls and tool results."""
    entries, texts = [], []
    for part in parts:
        if isinstance(part, dict) and _call(part) is not None:
            entries.append(_call_entry(_call(part)))
        elif isinstance(part, dict) and _is_result(part):
            entries.append(_result_entry(part, call_names))
        elif isinstance(part, dict) and part.get("type") in ("thinking", "reasoning") or (
            isinstance(part, dict) and part.get("thought") is True
        ):
            entries.append(_entry("reasoning", text_of(part.get("thinking") or part.get("summary") or part.get("text"))))
        else:
            text = text_of(part)
            if text:
                texts.append(text)
    if texts:
        entries.insert(0, _entry(role, "\n".join(texts)))
    return entries


def message_entries(message, call_names: dict) -> list[dict]:
    """One request message (chat, Anthropic, Responses input item, Gemini content) as entries."""
    if not isinstance(message, dict):
        return [_entry("user", text_of(message))]
    kind = message.get("type")
    if _call(message) is not None and "role" not in message:  # a Responses function_call item, resent
        return [_call_entry(_call(message))]
    if _is_result(message):  # a Responses function_call_output item
        return [_result_entry(message, call_names)]
    if kind == "reasoning":
        return [_entry("reasoning", text_of(message.get("summary")))]
    role = _role(message.get("role"))
    if role == "tool":  # chat: the tool's output, answering tool_call_id
        name = message.get("name") or call_names.get(message.get("tool_call_id")) or message.get("tool_call_id")
        return [_entry("tool", text_of(message.get("content")), name)]
    content = message.get("content", message.get("parts"))
    entries = _parts_entries(role, content, call_names) if isinstance(content, list) else (
        [_entry(role, text_of(content))] if content else []
    )
    for call in message.get("tool_calls") or []:
        if isinstance(call, dict):
            entries.append(_call_entry(_call(call) or call))
    return entries


def response_entries(response) -> list[dict]:
    """A recorded response (the recorder's summary: chat, Anthropic, Responses or Gemini) as entries."""
    if response is None:
        return []
    if not isinstance(response, dict):
        return [_entry("assistant", text_of(response))]
    entries = []
    if response.get("reasoning_content"):
        entries.append(_entry("reasoning", text_of(response["reasoning_content"])))
    if "output" in response and isinstance(response["output"], list):  # Responses
        for item in response["output"]:
            entries += message_entries(item, {}) if isinstance(item, dict) else [_entry("assistant", text_of(item))]
        return [{**e, "role": "assistant"} if e["role"] == "user" else e for e in entries]
    if isinstance(response.get("candidates"), list):  # Gemini, as the upstream answered
        for candidate in response["candidates"]:
            content = candidate.get("content") if isinstance(candidate, dict) else None
            if isinstance(content, dict) and isinstance(content.get("parts"), list):
                entries += _parts_entries("assistant", content["parts"], {})
        return entries
    content = response.get("content")
    if isinstance(content, list):  # Anthropic blocks (or chat parts)
        entries += _parts_entries("assistant", content, {})
    elif content:
        entries.append(_entry("assistant", text_of(content)))
    for call in response.get("tool_calls") or []:
        if isinstance(call, dict):
            entries.append(_call_entry(_call(call) or call))
    if not entries and response:
        known = {"content", "tool_calls", "finish_reason", "stop_reason", "status", "reasoning_content"}
        rest = {k: v for k, v in response.items() if k not in known}
        if rest:
            entries.append(_entry("assistant", json.dumps(rest, ensure_ascii=False, sort_keys=True, default=str)))
    return entries


def call_ids(entries_source) -> dict:
    """Tool call id -> tool name, from a recorded response (to name the tool results of the next calls)."""
    found = {}
    if not isinstance(entries_source, dict):
        return found
    parts = []
    for key in ("tool_calls", "content", "output"):
        if isinstance(entries_source.get(key), list):
            parts += entries_source[key]
    for part in parts:
        if not isinstance(part, dict):
            continue
        call = _call(part)
        if call is None:
            continue
        call_id = part.get("id") or part.get("call_id") or call.get("id")
        if call_id is not None:
            found[call_id] = call.get("name")
    return found
