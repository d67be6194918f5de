"""The LLM gateway's LiteLLM callback: per-call usage and transcript records, and the run's LLM limits.

This module runs INSIDE the LiteLLM proxy process (the gateway venv's interpreter): it imports only the
standard library and, there, litellm. The harness (rlbench.coding_agents.gateway.gateway) copies it next to the proxy's
config.yaml as `rlbench_gw_recorder.py` and names it in `litellm_settings.callbacks`; it also imports it
itself for the bookkeeping shared by both sides (new_totals, add_record, limit_message): without litellm
loaded, the callback class is a plain object and nothing here touches a file.

Configuration, from the proxy's environment (set by the harness):
    RLBENCH_GW_RECORDS   the records directory: usage.jsonl and transcript.jsonl are appended there
    RLBENCH_GW_LIMITS    JSON {"calls": int|null, "tokens": int|null, "cost_usd": float|null}
    RLBENCH_GW_KEY_ENV   name of the variable holding the provider key: its value is scrubbed from every
                         line written (as is LITELLM_MASTER_KEY's), whatever an error message quotes

usage.jsonl, one line per call: ts, ok, route (URL path), call_type, model_group (the name the client
asked for), model (the upstream's), stream, prompt_tokens, completion_tokens, cache_read_tokens,
total_tokens, cost_usd, latency_s, id, status (HTTP status of a failure) and error (its text). A call the
gateway refused because a limit was reached is a line with ok false and `refused` (the reason); it never
reached the upstream and counts as no call; so is a request the proxy rejected before that (a wrong key, a
malformed body), with `rejected` true.

transcript.jsonl, one line per call: ts, call_id, ok, route, call_type, model_group, request (the body the
client sent; large repeated parts, tools/system/instructions, are written in full the first time and
afterwards only as `<key>_sha256`), response (content, tool_calls, finish_reason) or error/refused.

Each line is one os.write() on an O_APPEND descriptor, so a reader that only takes complete lines
(ending in a newline) sees whole records while the proxy runs.

Limits: the pre-call hook refuses a call (HTTP 429, type rate_limit_error) once a limit is reached:
calls admitted so far >= calls (failed calls count), total tokens >= tokens, cost >= cost_usd. Tokens and
cost count once a call is logged, just after it has been answered: calls already in flight when a token or
cost limit is crossed still complete (the call limit is exact). Totals are kept in memory and seeded from an
existing usage.jsonl, so a restarted proxy keeps counting.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import sys
import threading
import time
from typing import Any

if "litellm" in sys.modules:  # inside the proxy, which has loaded litellm before its callbacks
    from litellm.integrations.custom_logger import CustomLogger as _Base
else:  # imported by the harness for the shared bookkeeping below: no litellm there (slow, maybe absent)
    _Base = object

USAGE_FILE = "usage.jsonl"
TRANSCRIPT_FILE = "transcript.jsonl"
REFUSAL_PREFIX = "LLM gateway:"
# Request parts that repeat on every call of a session: written once, then referenced by hash.
DEDUP_KEYS = ("tools", "system", "instructions", "systemInstruction", "system_instruction")
# Body keys that could carry a credential: never written.
SECRET_KEYS = {"api_key", "key", "secret", "authorization", "x-api-key", "api-key"}
ERROR_CHARS = 2000
# Keys LiteLLM adds to the request body it keeps (besides litellm_* and _litellm_*).
LITELLM_KEYS = {
    "proxy_server_request",
    "secret_fields",
    "user_api_key_dict",
    "standard_logging_object",
    "mock_response",
    "drop_params",
}


# ---------------------------------------------------------------------------------------------------
# Bookkeeping shared with the harness


def new_totals() -> dict:
    return {
        "calls": 0,  # calls that went to the upstream: ok + failed
        "failed_calls": 0,
        "refused_calls": 0,  # refused by the gateway (limit reached); not calls
        "rejected_calls": 0,  # rejected by the proxy before any limit check or upstream call (bad key, bad request)
        "input_tokens": 0,
        "output_tokens": 0,
        "cache_read_tokens": 0,
        "total_tokens": 0,
        "cost_usd": 0.0,
        "by_route": {},
        # trailing failures that say the endpoint is unusable (see endpoint_failure), and the last error
        "consecutive_failures": 0,
        "failing_since": None,  # when the trailing streak of such failures began (ts)
        "last_status": None,  # the HTTP status of the last failure
        "last_no_answer": False,  # the last failure got no answer at all (connection refused, DNS, timeout)
        "last_error": None,
        "last_refusal": None,
    }


def endpoint_failure(record: dict) -> bool:
    """Does this failed call say the upstream is unusable? Connection errors and 5xx do, as do 401/403/404
    (a wrong key or model: no later call can succeed). A 400/413/422 (this request's fault) or a 429 (a
    transient rate limit) came from a live endpoint."""
    status = record.get("status")
    try:
        status = int(status) if status is not None else None
    except (TypeError, ValueError):
        status = None
    return status is None or status >= 500 or status in (401, 403, 404)


def add_record(totals: dict, record: dict) -> dict:
    """Fold one usage.jsonl line into totals (in place; also returned)."""
    if record.get("refused"):
        totals["refused_calls"] += 1
        totals["last_refusal"] = record.get("refused")
        return totals
    if record.get("rejected"):
        totals["rejected_calls"] += 1
        return totals
    totals["calls"] += 1
    route = record.get("route") or "?"
    totals["by_route"][route] = totals["by_route"].get(route, 0) + 1
    for key, field in (
        ("input_tokens", "prompt_tokens"),
        ("output_tokens", "completion_tokens"),
        ("cache_read_tokens", "cache_read_tokens"),
        ("total_tokens", "total_tokens"),
    ):
        totals[key] += int(record.get(field) or 0)
    totals["cost_usd"] += float(record.get("cost_usd") or 0.0)
    if record.get("ok"):
        totals["consecutive_failures"] = 0
        totals["failing_since"] = None
    else:
        totals["failed_calls"] += 1
        totals["last_error"] = record.get("error")
        totals["last_status"] = record.get("status")
        totals["last_no_answer"] = bool(record.get("no_answer"))
        if endpoint_failure(record):
            totals["consecutive_failures"] += 1
            if totals["failing_since"] is None:
                totals["failing_since"] = record.get("ts")
        else:
            totals["consecutive_failures"] = 0
            totals["failing_since"] = None
    return totals


def limit_message(totals: dict, limits: dict | None, calls: int | None = None) -> str | None:
    """Why no further call is allowed, or None. `calls` overrides totals["calls"] (the proxy counts admitted calls)."""
    limits = limits or {}
    made = totals["calls"] if calls is None else calls
    if limits.get("calls") is not None and made >= int(limits["calls"]):
        return f"call limit {int(limits['calls'])} reached ({made} calls made)"
    if limits.get("tokens") is not None and totals["total_tokens"] >= int(limits["tokens"]):
        return f"token limit {int(limits['tokens'])} reached ({totals['total_tokens']} tokens used)"
    if limits.get("cost_usd") is not None and totals["cost_usd"] >= float(limits["cost_usd"]):
        return f"cost limit ${float(limits['cost_usd']):g} reached (${totals['cost_usd']:.6f} spent)"
    return None


def read_records(path: str, offset: int = 0) -> tuple[list[dict], int]:
    """The complete JSON lines of a JSONL file from byte `offset`, and the offset after the last complete line."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            data = f.read()
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n")
    if end < 0:
        return [], offset
    records = []
    for line in data[: end + 1].splitlines():
        try:
            value = json.loads(line)
        except ValueError:
            continue
        if isinstance(value, dict):
            records.append(value)
    return records, offset + end + 1


# ---------------------------------------------------------------------------------------------------
# Helpers for the callback


def _jsonable(value: Any, depth: int = 0) -> Any:
    """A JSON-ready copy of a pydantic object / dict / list (depth-limited)."""
    if depth > 40:
        return str(value)
    if hasattr(value, "model_dump"):
        try:
            value = value.model_dump()
        except Exception:  # noqa: BLE001
            return str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v, depth + 1) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, depth + 1) for v in value]
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    return str(value)


def _route(kwargs: dict, slo: dict) -> str | None:
    request = (kwargs.get("litellm_params") or {}).get("proxy_server_request") or {}
    url = request.get("url") if isinstance(request, dict) else None
    if not url:
        url = (slo.get("metadata") or {}).get("user_api_key_request_route")
    if not url:
        return None
    url = str(url)
    if "://" in url:  # absolute URL: keep the path
        url = "/" + url.split("://", 1)[1].partition("/")[2]
    return url.split("?", 1)[0]  # the query may carry a key (Gemini clients' ?key=)


def _request_body(kwargs: dict) -> dict | None:
    request = (kwargs.get("litellm_params") or {}).get("proxy_server_request") or {}
    body = request.get("body") if isinstance(request, dict) else None
    return body if isinstance(body, dict) else None


def _cache_read(usage: Any) -> int:
    usage = _jsonable(usage) if usage is not None else {}
    if not isinstance(usage, dict):
        return 0
    details = usage.get("prompt_tokens_details") or {}
    value = (details.get("cached_tokens") if isinstance(details, dict) else None) or usage.get(
        "cache_read_input_tokens"
    )
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        return 0


def _summarize_response(response: Any) -> Any:
    """The part of a response worth keeping: content and tool calls (chat, Anthropic or Responses shape)."""
    response = _jsonable(response)
    if not isinstance(response, dict):
        return response
    if isinstance(response.get("choices"), list) and response["choices"]:
        choice = response["choices"][0] or {}
        message = choice.get("message") or choice.get("delta") or {}
        out = {
            "content": message.get("content"),
            "tool_calls": message.get("tool_calls"),
            "finish_reason": choice.get("finish_reason"),
        }
        if message.get("reasoning_content"):
            out["reasoning_content"] = message["reasoning_content"]
        return out
    if isinstance(response.get("content"), list):  # Anthropic message
        return {"content": response["content"], "stop_reason": response.get("stop_reason")}
    if isinstance(response.get("output"), list):  # Responses API
        return {"output": response["output"], "status": response.get("status")}
    return {k: v for k, v in response.items() if k not in ("usage", "id", "created", "object")}


def _internal_key(key: Any, value: Any) -> bool:
    """A body key that is no part of what the client sent (LiteLLM adds its own to the same dict), or a credential."""
    key = str(key)
    if key.lower() in SECRET_KEYS or key in LITELLM_KEYS or key.startswith(("litellm_", "_litellm")):
        return True
    # LiteLLM's request metadata (key hash, headers, auth details) under the client's "metadata" name
    return (
        key == "metadata"
        and isinstance(value, dict)
        and any(str(k).startswith(("user_api_key", "headers", "requester_")) for k in value)
    )


def _status_of(exception: Any) -> int | None:
    for attr in ("status_code", "code"):
        value = getattr(exception, attr, None)
        try:
            if value is not None:
                return int(value)
        except (TypeError, ValueError):
            continue
    return None


# ---------------------------------------------------------------------------------------------------
# The callback


class Recorder(_Base):  # type: ignore[misc, valid-type]
    def __init__(self, environ: dict | None = None) -> None:
        if _Base is not object:
            super().__init__()
        env = os.environ if environ is None else environ
        self.records_dir = env.get("RLBENCH_GW_RECORDS") or None
        try:
            self.limits = json.loads(env.get("RLBENCH_GW_LIMITS") or "{}") or {}
        except ValueError:
            self.limits = {}
        secrets = [env.get(env.get("RLBENCH_GW_KEY_ENV") or ""), env.get("LITELLM_MASTER_KEY")]
        self._secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)
        self._lock = threading.Lock()
        self._seen: set[str] = set()  # hashes of deduplicated request parts already written
        self._refused_ids: set[str] = set()
        self._admitted_ids: set[str] = set()  # passed the pre-call hook, not logged yet
        self.totals = new_totals()
        if self.records_dir:
            for record in read_records(os.path.join(self.records_dir, USAGE_FILE))[0]:
                add_record(self.totals, record)
        self.admitted = self.totals["calls"]

    # -- writing -----------------------------------------------------------------------------------------

    def _scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***")
        return text

    def _append(self, name: str, record: dict) -> None:
        if not self.records_dir:
            return
        line = self._scrub(json.dumps(record, default=str, ensure_ascii=False)) + "\n"
        data = line.encode("utf-8", "replace")
        try:
            fd = os.open(os.path.join(self.records_dir, name), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                while data:  # one write for a regular file; the loop only guards a short write
                    data = data[os.write(fd, data) :]
            finally:
                os.close(fd)
        except OSError as error:  # a full disk must not turn into failed LLM calls; it shows in proxy.log
            print(f"rlbench recorder: cannot write {name}: {error}", file=sys.stderr, flush=True)

    def _request_record(self, body: dict | None, kwargs: dict | None = None) -> dict:
        if body is None and kwargs is not None:  # no proxy request body: what litellm was asked to send
            body = {
                "messages": kwargs.get("messages"),
                "tools": kwargs.get("tools"),
                "params": {k: v for k, v in (kwargs.get("optional_params") or {}).items() if k != "tools"},
            }
        out: dict[str, Any] = {}
        for key, value in (body or {}).items():
            if _internal_key(key, value):
                continue
            value = _jsonable(value)
            if key in DEDUP_KEYS and value:
                digest = hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]
                out[f"{key}_sha256"] = digest
                with self._lock:
                    if digest in self._seen:
                        continue
                    self._seen.add(digest)
            out[key] = value
        return out

    # -- limits ------------------------------------------------------------------------------------------

    async def async_pre_call_hook(self, user_api_key_dict, cache, data, call_type):  # noqa: ANN001
        with self._lock:
            reason = limit_message(self.totals, self.limits, calls=max(self.admitted, self.totals["calls"]))
            if reason is None:
                self.admitted += 1
                if (data or {}).get("litellm_call_id"):
                    self._admitted_ids.add(str(data["litellm_call_id"]))
                return data
            self.totals["refused_calls"] += 1
            self.totals["last_refusal"] = reason
        call_id = str((data or {}).get("litellm_call_id") or "")
        if call_id:
            self._refused_ids.add(call_id)
        request = (data or {}).get("proxy_server_request") or {}
        route = _route({"litellm_params": {"proxy_server_request": request}}, {})
        now = time.time()
        self._append(
            USAGE_FILE,
            {
                "ts": now,
                "ok": False,
                "refused": reason,
                "route": route,
                "call_type": str(call_type),
                "model_group": (data or {}).get("model"),
                "status": 429,
            },
        )
        self._append(
            TRANSCRIPT_FILE,
            {
                "ts": now,
                "call_id": call_id,
                "ok": False,
                "route": route,
                "call_type": str(call_type),
                "model_group": (data or {}).get("model"),
                "request": self._request_record(request.get("body") if isinstance(request, dict) else None),
                "refused": reason,
            },
        )
        from fastapi import HTTPException  # a dependency of litellm[proxy]; the proxy answers with its status

        raise HTTPException(
            status_code=429, detail=f"{REFUSAL_PREFIX} {reason}; no further LLM calls are allowed in this run"
        )

    # -- logging -----------------------------------------------------------------------------------------

    def _record(self, kwargs: dict, response_obj: Any, start_time: Any, end_time: Any, ok: bool) -> None:
        kwargs = kwargs or {}
        call_id = str(kwargs.get("litellm_call_id") or "")
        exception = kwargs.get("exception")
        if not ok and (call_id in self._refused_ids or str(exception or "").find(REFUSAL_PREFIX) >= 0):
            self._refused_ids.discard(call_id)
            return  # already recorded by the pre-call hook
        with self._lock:
            admitted = call_id in self._admitted_ids
            self._admitted_ids.discard(call_id)
        slo = kwargs.get("standard_logging_object") or {}
        route = _route(kwargs, slo)
        latency = None
        try:
            latency = round((end_time - start_time).total_seconds(), 4)
        except Exception:  # noqa: BLE001
            latency = slo.get("response_time")
        usage = (slo.get("metadata") or {}).get("usage_object")
        if usage is None and response_obj is not None:
            usage = getattr(response_obj, "usage", None) or (
                response_obj.get("usage") if isinstance(response_obj, dict) else None
            )
        prompt = int(slo.get("prompt_tokens") or 0) if ok else 0
        completion = int(slo.get("completion_tokens") or 0) if ok else 0
        record = {
            "ts": time.time(),
            "ok": ok,
            "route": route,
            "call_type": kwargs.get("call_type") or slo.get("call_type"),
            "model_group": slo.get("model_group"),
            "model": slo.get("model") or kwargs.get("model"),
            "stream": bool(kwargs.get("stream") or slo.get("stream")),
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "cache_read_tokens": _cache_read(usage) if ok else 0,
            "total_tokens": (int(slo.get("total_tokens") or 0) or prompt + completion) if ok else 0,
            "cost_usd": float(slo.get("response_cost") or 0.0) if ok else 0.0,
            "latency_s": latency,
            "id": slo.get("id") or call_id,
        }
        transcript = {
            "ts": record["ts"],
            "call_id": call_id,
            "ok": ok,
            "route": route,
            "call_type": record["call_type"],
            "model_group": record["model_group"],
            "request": self._request_record(_request_body(kwargs), kwargs),
        }
        if ok:
            transcript["response"] = _summarize_response(slo.get("response") or response_obj)
            transcript["usage"] = {
                k: record[k] for k in ("prompt_tokens", "completion_tokens", "cache_read_tokens", "total_tokens")
            }
        else:
            error = str(exception if exception is not None else (slo.get("error_str") or "unknown error"))
            record["status"] = _status_of(exception)
            # No answer from the upstream at all (LiteLLM reports a refused connection as a 500 APIConnectionError).
            kind = type(exception).__name__ if exception is not None else ""
            record["no_answer"] = "Connection" in kind or "Timeout" in kind or any(
                text in error for text in ("Connection error", "Cannot connect", "Connection refused", "timed out")
            )
            record["error"] = transcript["error"] = error[:ERROR_CHARS]
            # Failed before the pre-call hook with a client error (a wrong key, a malformed body): never an LLM call.
            # A connection error or 5xx is an upstream failure even when the admission was not seen (on the Gemini
            # route LiteLLM's failure callback carries another call id than the pre-call hook got).
            status = record["status"]
            if not admitted and status is not None and status < 500:
                record["rejected"] = transcript["rejected"] = True
        with self._lock:
            add_record(self.totals, record)
        self._append(USAGE_FILE, record)
        self._append(TRANSCRIPT_FILE, transcript)

    async def async_log_success_event(self, kwargs, response_obj, start_time, end_time):  # noqa: ANN001
        self._safely(kwargs, response_obj, start_time, end_time, True)

    async def async_log_failure_event(self, kwargs, response_obj, start_time, end_time):  # noqa: ANN001
        self._safely(kwargs, response_obj, start_time, end_time, False)

    def _safely(self, *args: Any) -> None:
        try:
            self._record(*args)
        except Exception as error:  # noqa: BLE001 - a recording bug must not break the call; it shows in proxy.log
            print(
                f"rlbench recorder error: {type(error).__name__}: {self._scrub(str(error))}",
                file=sys.stderr,
                flush=True,
            )


recorder = Recorder() if _Base is not object else None
