"""The per-run LLM gateway (rlbench.coding_agents.gateway) and the scripted upstream (tests/fixtures/scripted_llm.py).

The gateway tests start the real LiteLLM proxy (a subprocess from .tools/venvs/gateway) in front of the scripted
chat-completions server and talk real HTTP to it in the four wire formats the tools use. They skip when the
gateway venv is not installed (`rlbench setup-agents`). One proxy serves all the format checks; the call
limit, the token limit and the dead upstream each need a proxy of their own (about 7 s to start each).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent / "fixtures"))

import scripted_llm  # noqa: E402
from rlbench.coding_agents.gateway import recorder  # noqa: E402
from rlbench.coding_agents.gateway.gateway import GatewayError, GatewayLimits, LLMGateway, litellm_binary, proxy_config  # noqa: E402
from scripted_llm import ScriptedLLM, dead_port, read_log, summed_usage  # noqa: E402

KEY_ENV = "RLBENCH_TEST_GATEWAY_PROVIDER_KEY"
PROVIDER_KEY = "sk-provider-test-7f3a9c-never-in-records"
MODEL = "claude-sonnet-4-5"
SCRIPT = [{"command": "echo hi > hello.txt"}, {"finish": "All done."}]
BASH = {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}

needs_gateway = pytest.mark.skipif(
    not litellm_binary().exists(),
    reason=f"the LLM gateway venv is not installed ({litellm_binary()}): run `rlbench setup-agents`",
)


# ---------------------------------------------------------------------------------------------------
# The scripted upstream (no proxy needed)


def subset(sub: dict, full: dict) -> bool:
    return all(full.get(k) == v for k, v in sub.items())


def chat_tool(name: str, parameters: dict) -> dict:
    return {"type": "function", "function": {"name": name, "parameters": parameters}}


@pytest.mark.parametrize(
    ("name", "parameters", "expected"),
    [
        (
            "Bash",
            {
                "type": "object",
                "properties": {
                    "command": {"type": "string"},
                    "description": {"type": "string"},
                    "timeout": {"type": "number"},
                },
                "required": ["command"],
            },
            {"command": "ls -la"},
        ),
        (
            "exec_command",
            {
                "type": "object",
                "properties": {
                    "cmd": {"type": "string"},
                    "login": {"type": "boolean"},
                    "yield_time_ms": {"type": "number"},
                },
                "required": ["cmd"],
            },
            {"cmd": "ls -la"},
        ),
        (
            "shell",
            {
                "type": "object",
                "properties": {
                    "command": {"type": "array", "items": {"type": "string"}},
                    "workdir": {"type": "string"},
                },
                "required": ["command"],
            },
            {"command": ["bash", "-lc", "ls -la"]},
        ),
        (
            "run_shell_command",
            {"type": "OBJECT", "properties": {"command": {"type": "STRING"}}, "required": ["command"]},
            {"command": "ls -la"},
        ),
        ("bash", {"type": "object", "properties": {"command": {"type": "string"}}}, {"command": "ls -la"}),
        # OpenHands-style: strict, with required enum / boolean / defaulted keys beside the command
        (
            "terminal",
            {
                "type": "object",
                "additionalProperties": False,
                "properties": {
                    "command": {"type": "string"},
                    "is_input": {"type": "boolean"},
                    "timeout": {"type": ["number", "null"], "default": None},
                    "security_risk": {"type": "string", "enum": ["LOW", "MEDIUM", "HIGH"]},
                    "summary": {"type": "string", "default": "run it"},
                },
                "required": ["command", "is_input", "security_risk", "summary"],
            },
            {"command": "ls -la", "is_input": False, "security_risk": "LOW", "summary": "run it"},
        ),
    ],
)
def test_scripted_fills_each_shell_tool_from_its_schema(name, parameters, expected):
    body = {
        "messages": [{"role": "user", "content": "go"}],
        "tools": [chat_tool("other", {}), chat_tool(name, parameters)],
    }
    reply = scripted_llm.decide(body, [{"command": "ls -la"}], dict(scripted_llm.DEFAULT_OPTIONS))
    assert reply["tool"] == name
    assert reply["arguments"] == expected


def test_scripted_prefers_tools_in_order_and_finishes_per_tool():
    options = dict(scripted_llm.DEFAULT_OPTIONS)
    both = {"messages": [], "tools": [chat_tool("bash", BASH), chat_tool("Bash", BASH)]}
    assert scripted_llm.decide(both, [{"command": "x"}], options)["tool"] == "Bash"
    history = [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": "a"},
        {"role": "tool", "content": "b"},
    ]
    finish = [{"command": "x"}, {"finish": "bye", "command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}]
    # OpenHands: its finish tool, with exactly the keys it declares
    oh = {
        "messages": history,
        "tools": [
            chat_tool("terminal", BASH),
            chat_tool(
                "finish", {"type": "object", "properties": {"message": {"type": "string"}}, "required": ["message"]}
            ),
        ],
    }
    assert subset({"tool": "finish", "arguments": {"message": "bye"}}, scripted_llm.decide(oh, finish, options))
    # mini-swe-agent: the finish step's command
    mini = {"messages": history, "tools": [chat_tool("bash", BASH)]}
    assert scripted_llm.decide(mini, finish, options)["arguments"] == {
        "command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    }
    # the others: plain text, no tool call
    plain = scripted_llm.decide(mini, [{"command": "x"}, {"finish": "bye"}], options)
    assert (plain["tool"], plain["content"]) == (None, "bye")
    # past the end of the script: the finish step again
    long = history + [{"role": "assistant", "content": "c"}, {"role": "user", "content": "d"}] * 3
    assert scripted_llm.decide({"messages": long, "tools": [chat_tool("bash", BASH)]}, finish[1:], options)["step"] == 4
    # a side call without tools: a short reply; with the fence option, the command in a fenced block
    assert scripted_llm.decide({"messages": []}, finish, options)["content"] == "OK."
    fenced = scripted_llm.decide({"messages": []}, finish, {**options, "fence": "mswea_bash_command"})["content"]
    assert fenced.endswith("```mswea_bash_command\nx\n```")


def test_scripted_counts_a_split_assistant_turn_once():
    messages = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "u"},
        {"role": "assistant", "content": "thinking"},
        {"role": "assistant", "tool_calls": []},  # one turn, split
        {"role": "tool", "content": "out"},
        {"role": "assistant", "content": "again"},
        {"role": "user", "content": "u"},
    ]
    assert scripted_llm.assistant_turns(messages) == 2


def test_scripted_server_streams_logs_and_dies_on_stop(tmp_path):
    log = tmp_path / "requests.jsonl"
    script = {"steps": SCRIPT, "prompt_tokens": 7, "completion_tokens": 3}
    with ScriptedLLM(script, log) as llm, httpx.Client(trust_env=False, timeout=10) as client:
        body = {
            "model": "m",
            "stream": True,
            "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": "go"}],
            "tools": [chat_tool("bash", BASH)],
        }
        with client.stream(
            "POST", f"{llm.url}/chat/completions", json=body, headers={"Authorization": "Bearer k"}
        ) as r:
            assert r.status_code == 200
            data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
        assert data[-1] == "[DONE]"
        chunks = [json.loads(d) for d in data[:-1]]
        assert chunks[-1]["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}
        args = "".join(
            tc["function"].get("arguments", "")
            for c in chunks
            if c["choices"]
            for tc in c["choices"][0]["delta"].get("tool_calls") or []
        )
        assert json.loads(args) == {"command": "echo hi > hello.txt"}
        plain = client.post(f"{llm.url}/chat/completions", json={"model": "m", "messages": []}).json()
        assert plain["choices"][0]["finish_reason"] == "stop" and plain["usage"]["total_tokens"] == 10
        assert client.post(f"{llm.url}/responses", json={}).status_code == 404
        url = llm.url
    records = read_log(log)
    assert [r["path"] for r in records] == ["/v1/chat/completions", "/v1/chat/completions", "/v1/responses"]
    assert subset({"step": 0, "has_tools": True, "tools": ["bash"], "stream": True, "auth": "Bearer k"}, records[0])
    assert summed_usage(records) == {"calls": 2, "input_tokens": 14, "output_tokens": 6, "total_tokens": 20}
    with pytest.raises(httpx.ConnectError):
        httpx.post(f"{url}/chat/completions", json={}, timeout=5)


def test_scripted_server_command_line(tmp_path):
    import subprocess

    (tmp_path / "s.json").write_text(json.dumps(SCRIPT))
    proc = subprocess.Popen(
        [
            sys.executable,
            str(Path(scripted_llm.__file__)),
            "--script",
            str(tmp_path / "s.json"),
            "--log",
            str(tmp_path / "r.jsonl"),
            "--port-file",
            str(tmp_path / "port"),
            "--fail-status",
            "503",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert "listening on" in proc.stdout.readline()
        port = int((tmp_path / "port").read_text())
        r = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={"messages": []}, timeout=5)
        assert r.status_code == 503
        assert read_log(tmp_path / "r.jsonl")[0]["reply"] == "error"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# ---------------------------------------------------------------------------------------------------
# Bookkeeping and configuration (no proxy needed)


def test_limit_messages_and_dead_streaks():
    totals = recorder.new_totals()
    for record in [
        {
            "ok": True,
            "route": "/v1/messages",
            "prompt_tokens": 100,
            "completion_tokens": 20,
            "total_tokens": 120,
            "cache_read_tokens": 30,
            "cost_usd": 0.25,
        },
        {"ok": False, "route": "/v1/messages", "status": 500, "error": "boom"},
        {"ok": False, "route": "/v1/messages", "status": 400, "error": "context too long"},  # a live endpoint
        {"ok": False, "route": "/v1/responses", "status": None, "error": "Connection error"},
        {"ok": False, "refused": "call limit 4 reached (4 calls made)", "route": "/v1/messages"},
    ]:
        recorder.add_record(totals, record)
    assert subset(
        {
            "calls": 4,
            "failed_calls": 3,
            "refused_calls": 1,
            "input_tokens": 100,
            "output_tokens": 20,
            "cache_read_tokens": 30,
            "total_tokens": 120,
            "consecutive_failures": 1,
        },
        totals,
    )
    assert totals["by_route"] == {"/v1/messages": 3, "/v1/responses": 1}
    assert recorder.limit_message(totals, {}) is None
    assert recorder.limit_message(totals, {"calls": 4}) == "call limit 4 reached (4 calls made)"
    assert recorder.limit_message(totals, {"calls": 5}) is None
    assert recorder.limit_message(totals, {"tokens": 120}) == "token limit 120 reached (120 tokens used)"
    assert recorder.limit_message(totals, {"cost_usd": 0.2}) == "cost limit $0.2 reached ($0.250000 spent)"
    assert recorder.limit_message(totals, {"cost_usd": 0.5, "tokens": 1000}) is None


def test_read_records_takes_only_complete_lines(tmp_path):
    path = tmp_path / "usage.jsonl"
    path.write_text('{"ok": true}\nnot json\n{"ok": fal')
    records, offset = recorder.read_records(str(path))
    assert records == [{"ok": True}] and offset == len('{"ok": true}\nnot json\n')
    with open(path, "a") as f:
        f.write("se}\n")
    assert recorder.read_records(str(path), offset) == ([{"ok": False}], path.stat().st_size)


def test_proxy_config_per_provider():
    compatible = proxy_config(
        {
            "model": MODEL,
            "provider": "openai-compatible",
            "upstream_model": "qwen",
            "base_url": "http://127.0.0.1:8000/v1",
        },
        None,
        30,
    )
    names = [e["model_name"] for e in compatible["model_list"]]
    assert names == [MODEL, "*"]
    for entry in compatible["model_list"]:
        assert subset(
            {
                "model": "openai/qwen",
                "api_base": "http://127.0.0.1:8000/v1",
                "use_chat_completions_api": True,
                "max_retries": 0,
            },
            entry["litellm_params"],
        )
        assert entry["model_info"] == {"supports_reasoning": False}
    settings = compatible["litellm_settings"]
    assert subset(
        {
            "drop_params": True,
            "num_retries": 0,
            "use_chat_completions_url_for_anthropic_messages": True,
            "callbacks": "rlbench_gw_recorder.recorder",
        },
        settings,
    )
    assert compatible["general_settings"] == {"master_key": "os.environ/LITELLM_MASTER_KEY"}
    for provider, prefix in (("anthropic", "anthropic/"), ("openai", "openai/"), ("gemini", "gemini/")):
        config = proxy_config({"model": "m", "provider": provider, "key_env": "K"}, "K", 30)
        params = config["model_list"][0]["litellm_params"]
        assert params["model"] == prefix + "m" and params["api_key"] == "os.environ/K"
        assert "use_chat_completions_api" not in params and "model_info" not in config["model_list"][0]
    with pytest.raises(GatewayError, match="provider"):
        proxy_config({"model": "m", "provider": "azure"}, None, 30)
    with pytest.raises(GatewayError, match="base_url"):
        proxy_config({"model": "m", "provider": "openai-compatible"}, None, 30)


def test_gateway_refuses_a_missing_key_or_binary(tmp_path, monkeypatch):
    monkeypatch.delenv(KEY_ENV, raising=False)
    driver = {"model": MODEL, "provider": "anthropic", "key_env": KEY_ENV}
    with pytest.raises(GatewayError, match="not installed"):
        LLMGateway(driver, tmp_path / "gw", litellm_bin=tmp_path / "nope").__enter__()
    fake = tmp_path / "litellm"
    fake.write_text("#!/bin/sh\necho 'fake proxy: cannot start'\nexit 3\n")
    fake.chmod(0o755)
    with pytest.raises(GatewayError, match="not set"):
        LLMGateway(driver, tmp_path / "gw", litellm_bin=fake).__enter__()
    monkeypatch.setenv(KEY_ENV, PROVIDER_KEY)
    with pytest.raises(GatewayError, match=r"exited during startup \(code 3\)[\s\S]*fake proxy: cannot start"):
        LLMGateway(driver, tmp_path / "gw", litellm_bin=fake).__enter__()


FAKE_PROXY = """#!{python}
# A stand-in for the litellm command: answers 200 to everything on --port, or fails to bind when a file "busy"
# lies beside it (its environment is the gateway's, built from scratch: no test variable reaches it).
import http.server, os, sys
here = os.path.dirname(os.path.abspath(__file__))
port = int(sys.argv[sys.argv.index("--port") + 1])
open(os.path.join(here, "pids"), "a").write(f"{{os.getpid()}}\\n")
if os.path.exists(os.path.join(here, "busy")):
    print(f"ERROR: [Errno 98] error while attempting to bind on ('127.0.0.1', {{port}}): address already in use")
    sys.exit(1)
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.send_header("Content-Length", "2"); self.end_headers(); self.wfile.write(b"{{}}")
    def log_message(self, *a): pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
"""


@pytest.fixture
def fake_proxy(tmp_path, monkeypatch):
    path = tmp_path / "litellm"
    path.write_text(FAKE_PROXY.format(python=sys.executable))
    path.chmod(0o755)
    return path


def test_gateway_proxy_dies_with_the_harness(tmp_path, fake_proxy):
    """A harness killed with -9 cannot stop its gateway: the kernel does (PR_SET_PDEATHSIG)."""
    import subprocess

    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); from pathlib import Path\n"
        "from rlbench.coding_agents.gateway.gateway import LLMGateway\n"
        "gw = LLMGateway({'model': 'm', 'provider': 'openai-compatible', 'base_url': 'http://127.0.0.1:9/v1'},"
        " Path(sys.argv[2]), litellm_bin=Path(sys.argv[3])).__enter__()\n"
        "print(gw.proc.pid, flush=True); import time; time.sleep(60)\n"
    )
    harness = subprocess.Popen(
        [sys.executable, "-c", code, str(Path(recorder.__file__).parents[2]), str(tmp_path / "gw"), str(fake_proxy)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        proxy_pid = int(harness.stdout.readline())
        assert psutil.pid_exists(proxy_pid)
        harness.kill()
        harness.wait(timeout=10)
        psutil.Process(proxy_pid).wait(timeout=10) if psutil.pid_exists(proxy_pid) else None
        assert not psutil.pid_exists(proxy_pid)
    finally:
        harness.kill()
        harness.wait(timeout=10)


def test_gateway_retries_a_taken_port(tmp_path, fake_proxy):
    (tmp_path / "busy").touch()
    gateway = LLMGateway(
        {"model": "m", "provider": "openai-compatible", "base_url": "http://127.0.0.1:9/v1"},
        tmp_path / "gw",
        litellm_bin=fake_proxy,
    )
    with pytest.raises(GatewayError, match="could not bind a port"):
        gateway.__enter__()
    assert len((tmp_path / "pids").read_text().split()) == 3
    (tmp_path / "busy").unlink()
    with LLMGateway(
        {"model": "m", "provider": "openai-compatible", "base_url": "http://127.0.0.1:9/v1"},
        tmp_path / "gw2",
        litellm_bin=fake_proxy,
    ) as gateway:
        assert httpx.get(gateway.url + "/health/liveliness", timeout=5).status_code == 200
        pid = gateway.proc.pid
    assert not psutil.pid_exists(pid)


# ---------------------------------------------------------------------------------------------------
# Through the real proxy


@pytest.fixture(scope="module")
def provider_key():
    old = os.environ.get(KEY_ENV)
    os.environ[KEY_ENV] = PROVIDER_KEY
    yield PROVIDER_KEY
    if old is None:
        os.environ.pop(KEY_ENV, None)
    else:
        os.environ[KEY_ENV] = old


def start_gateway(records_dir: Path, base_url: str, limits: GatewayLimits | None = None, **driver) -> LLMGateway:
    driver = {
        "model": MODEL,
        "provider": "openai-compatible",
        "upstream_model": "scripted-model",
        "base_url": base_url,
        "key_env": KEY_ENV,
        **driver,
    }
    gateway = LLMGateway(driver, records_dir, limits)
    started = time.monotonic()
    gateway.__enter__()
    print(f"\ngateway up in {time.monotonic() - started:.1f} s ({records_dir.name})")
    return gateway


def settle(gateway: LLMGateway, calls: int, timeout_s: float = 10) -> dict:
    """The usage once `calls` calls are recorded: the proxy logs a call just after it has answered it."""
    deadline = time.monotonic() + timeout_s
    while (usage := gateway.usage())["calls"] + usage["refused_calls"] < calls and time.monotonic() < deadline:
        time.sleep(0.05)
    return usage


def assert_stopped(gateway: LLMGateway) -> None:
    pid = gateway.proc.pid
    started = time.monotonic()
    gateway.__exit__(None, None, None)
    print(f"gateway stopped in {time.monotonic() - started:.1f} s")
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    strays = [
        p for p in psutil.process_iter(["cmdline"]) if str(gateway.config_path) in " ".join(p.info["cmdline"] or [])
    ]
    assert strays == []


def assert_no_secret(records_dir: Path, *secrets: str) -> None:
    files = [p for p in records_dir.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"config.yaml", "proxy.log", "usage.jsonl", "transcript.jsonl"}
    for path in files:
        data = path.read_bytes()
        for secret in secrets:
            assert secret.encode() not in data, f"a key was written to {path}"


def sse_events(response: httpx.Response) -> list[dict]:
    return [
        json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ") and line[6:] != "[DONE]"
    ]


@pytest.fixture(scope="module")
def upstream(tmp_path_factory):
    log = tmp_path_factory.mktemp("upstream") / "requests.jsonl"
    with ScriptedLLM(SCRIPT, log) as llm:
        yield llm


@pytest.fixture(scope="module")
def exchanges(tmp_path_factory, upstream, provider_key):
    """One proxy; each wire format once (streamed where the tools stream); the raw answers, the gateway, the records."""
    records_dir = tmp_path_factory.mktemp("run") / "gateway"
    gateway = start_gateway(records_dir, upstream.url)
    out: dict = {"gateway": gateway, "records_dir": records_dir, "seconds": {}}
    bearer = {"Authorization": f"Bearer {gateway.key}"}
    user = [{"role": "user", "content": "make hello.txt"}]
    try:
        with httpx.Client(base_url=gateway.url, trust_env=False, timeout=60) as client:

            def timed(name, fn):
                started = time.monotonic()
                out[name] = fn()
                out["seconds"][name] = round(time.monotonic() - started, 2)

            timed(
                "chat",
                lambda: client.post(
                    "/v1/chat/completions",
                    headers=bearer,
                    json={"model": MODEL, "messages": user, "tools": [chat_tool("bash", BASH)]},
                ),
            )

            def chat_stream():
                body = {
                    "model": MODEL,
                    "stream": True,
                    "stream_options": {"include_usage": True},
                    "messages": user,
                    "tools": [chat_tool("bash", BASH)],
                }
                with client.stream("POST", "/v1/chat/completions", headers=bearer, json=body) as r:
                    return r.status_code, sse_events(r)

            timed("chat_stream", chat_stream)

            def messages_stream():
                body = {
                    "model": MODEL,
                    "max_tokens": 256,
                    "stream": True,
                    "messages": user,
                    "thinking": {"type": "enabled", "budget_tokens": 1024},  # as Claude Code always sends
                    "system": [{"type": "text", "text": "You are a coding agent."}],
                    "tools": [{"name": "Bash", "description": "run a shell command", "input_schema": BASH}],
                }
                headers = {"x-api-key": gateway.key, "anthropic-version": "2023-06-01"}
                with client.stream("POST", "/v1/messages?beta=true", headers=headers, json=body) as r:
                    return r.status_code, sse_events(r)

            timed("messages", messages_stream)

            def responses_stream():
                body = {
                    "model": "gpt-5",
                    "stream": True,
                    "input": [
                        {
                            "type": "message",
                            "role": "user",
                            "content": [{"type": "input_text", "text": "make hello.txt"}],
                        }
                    ],
                    "tools": [
                        {
                            "type": "function",
                            "name": "exec_command",
                            "parameters": {
                                "type": "object",
                                "properties": {"cmd": {"type": "string"}},
                                "required": ["cmd"],
                            },
                        }
                    ],
                }
                with client.stream("POST", "/v1/responses", headers=bearer, json=body) as r:
                    return r.status_code, sse_events(r)

            timed("responses", responses_stream)

            def gemini_stream():
                body = {
                    "contents": [{"role": "user", "parts": [{"text": "make hello.txt"}]}],
                    "tools": [
                        {
                            "functionDeclarations": [
                                {
                                    "name": "run_shell_command",
                                    "parameters": {
                                        "type": "OBJECT",
                                        "properties": {"command": {"type": "STRING"}},
                                        "required": ["command"],
                                    },
                                }
                            ]
                        }
                    ],
                }
                url = "/v1beta/models/gemini-2.5-flash-lite:streamGenerateContent?alt=sse"
                with client.stream("POST", url, headers={"x-goog-api-key": gateway.key}, json=body) as r:
                    return r.status_code, sse_events(r)

            timed("gemini", gemini_stream)
            timed(
                "side_call",
                lambda: client.post(
                    "/v1/chat/completions",
                    headers=bearer,
                    json={
                        "model": "claude-haiku-4-5-20251001",
                        "messages": [{"role": "user", "content": "a title please"}],
                    },
                ),
            )
            timed(
                "bad_key",
                lambda: client.post(
                    "/v1/chat/completions",
                    headers={"Authorization": f"Bearer {PROVIDER_KEY}"},
                    json={"model": MODEL, "messages": user},
                ),
            )
        print(f"per-call seconds: {out['seconds']}")
        yield out
    finally:
        if gateway.proc is not None and gateway.proc.poll() is None:
            gateway.__exit__(None, None, None)


@needs_gateway
@pytest.mark.tools
def test_chat_completions(exchanges):
    chat = exchanges["chat"]
    assert chat.status_code == 200, chat.text
    message = chat.json()["choices"][0]["message"]
    assert message["tool_calls"][0]["function"]["name"] == "bash"
    assert json.loads(message["tool_calls"][0]["function"]["arguments"]) == {"command": "echo hi > hello.txt"}
    assert chat.json()["usage"]["total_tokens"] == 120
    status, chunks = exchanges["chat_stream"]
    assert status == 200
    assert [c["usage"] for c in chunks if c.get("usage")][-1]["prompt_tokens"] == 100
    assert any(
        tc["function"]["name"] == "bash"
        for c in chunks
        if c.get("choices")
        for tc in c["choices"][0]["delta"].get("tool_calls") or []
        if tc.get("function", {}).get("name")
    )


@needs_gateway
@pytest.mark.tools
def test_anthropic_messages_stream_with_tool_use(exchanges):
    status, events = exchanges["messages"]
    assert status == 200, events
    starts = [e["content_block"] for e in events if e.get("type") == "content_block_start"]
    tool = [b for b in starts if b["type"] == "tool_use"]
    assert tool and tool[0]["name"] == "Bash"
    args = "".join(
        e["delta"]["partial_json"]
        for e in events
        if e.get("type") == "content_block_delta" and e["delta"].get("type") == "input_json_delta"
    )
    assert json.loads(args) == {"command": "echo hi > hello.txt"}
    delta = [e for e in events if e.get("type") == "message_delta"][-1]
    assert delta["delta"]["stop_reason"] == "tool_use"
    assert delta["usage"]["input_tokens"] == 100 and delta["usage"]["output_tokens"] == 20


@needs_gateway
@pytest.mark.tools
def test_responses_stream(exchanges):
    status, events = exchanges["responses"]
    assert status == 200, events
    calls = [
        e["item"]
        for e in events
        if e.get("type") == "response.output_item.done" and e["item"]["type"] == "function_call"
    ]
    assert calls and calls[0]["name"] == "exec_command"
    assert json.loads(calls[0]["arguments"]) == {"cmd": "echo hi > hello.txt"}
    completed = [e for e in events if e.get("type") == "response.completed"][-1]
    assert (
        completed["response"]["usage"]["input_tokens"] == 100 and completed["response"]["usage"]["output_tokens"] == 20
    )


@needs_gateway
@pytest.mark.tools
def test_gemini_stream_generate_content(exchanges):
    status, chunks = exchanges["gemini"]
    assert status == 200, chunks
    parts = [p for c in chunks for cand in c.get("candidates") or [] for p in cand["content"].get("parts") or []]
    calls = [p["functionCall"] for p in parts if "functionCall" in p]
    assert calls == [{"name": "run_shell_command", "args": {"command": "echo hi > hello.txt"}}]
    assert chunks[-1]["usageMetadata"]["promptTokenCount"] == 100
    assert chunks[-1]["usageMetadata"]["candidatesTokenCount"] == 20


@needs_gateway
@pytest.mark.tools
def test_side_calls_under_other_names_and_the_key_check(exchanges):
    side = exchanges["side_call"]
    assert side.status_code == 200, side.text  # the wildcard entry: any model name reaches the driver
    assert side.json()["choices"][0]["message"]["content"] == "OK."
    # only the per-run key opens the gateway (with no database, LiteLLM answers another key: 400 "No connected db.")
    assert exchanges["bad_key"].status_code in (400, 401, 403), exchanges["bad_key"].text


@needs_gateway
@pytest.mark.tools
def test_records_match_what_the_upstream_returned(exchanges, upstream):
    gateway, records_dir = exchanges["gateway"], exchanges["records_dir"]
    settle(gateway, 6)
    upstream_log = upstream.requests()
    # every call reached the upstream's chat completions (Gotcha 3), with the provider key
    assert {r["path"] for r in upstream_log} == {"/v1/chat/completions"}
    assert {r["auth"] for r in upstream_log} == {f"Bearer {PROVIDER_KEY}"}
    assert len(upstream_log) == 6
    usage_lines = [json.loads(line) for line in (records_dir / "usage.jsonl").read_text().splitlines()]
    transcript = [json.loads(line) for line in (records_dir / "transcript.jsonl").read_text().splitlines()]
    assert len(usage_lines) == len(transcript) == 7
    # the wrong key: recorded, not a call (lines are written as calls end, so not necessarily last)
    assert [u.get("rejected") for u in usage_lines].count(True) == 1
    assert [t.get("rejected") for t in transcript].count(True) == 1
    usage_lines = [u for u in usage_lines if not u.get("rejected")]
    transcript = [t for t in transcript if not t.get("rejected")]
    assert all(
        u["ok"] and u["prompt_tokens"] == 100 and u["completion_tokens"] == 20 and u["total_tokens"] == 120
        for u in usage_lines
    )
    assert {u["call_type"] for u in usage_lines} >= {"acompletion", "anthropic_messages", "aresponses"}
    streamed = {u["route"]: u["stream"] for u in usage_lines}
    assert streamed["/v1/messages"] and streamed["/v1/responses"]
    assert "claude-haiku-4-5-20251001" in {u["model_group"] for u in usage_lines} | {
        u["model_group"] for u in transcript
    }

    expected = summed_usage(upstream_log)
    usage = gateway.usage()
    assert subset(
        {
            "calls": expected["calls"],
            "failed_calls": 0,
            "refused_calls": 0,
            "rejected_calls": 1,
            "input_tokens": expected["input_tokens"],
            "output_tokens": expected["output_tokens"],
            "total_tokens": expected["total_tokens"],
            "cost_usd": 0.0,
        },
        usage,
    )
    assert usage["by_route"] == {
        "/v1/chat/completions": 3,
        "/v1/messages": 1,
        "/v1/responses": 1,
        "/v1beta/models/gemini-2.5-flash-lite:streamGenerateContent": 1,
    }
    assert gateway.limit_reached() is None and gateway.endpoint_dead() is None

    # the transcript: the request as the client sent it, and the response
    by_route = {t["route"]: t for t in transcript}
    anthropic = by_route["/v1/messages"]
    assert anthropic["request"]["messages"] == [{"role": "user", "content": "make hello.txt"}]
    assert anthropic["request"]["tools"][0]["name"] == "Bash" and anthropic["request"]["tools_sha256"]
    assert anthropic["request"]["system"][0]["text"] == "You are a coding agent."
    assert "metadata" not in anthropic["request"] and "litellm_metadata" not in anthropic["request"]
    assert anthropic["response"]["tool_calls"][0]["function"]["name"] == "Bash"
    assert by_route["/v1/responses"]["request"]["input"][0]["content"][0]["text"] == "make hello.txt"
    gemini = by_route["/v1beta/models/gemini-2.5-flash-lite:streamGenerateContent"]
    assert gemini["request"]["contents"][0]["parts"][0]["text"] == "make hello.txt"
    # the same tools twice (chat, chat_stream): in full once, by hash both times; the side call has none
    chats = [t for t in transcript if t["route"] == "/v1/chat/completions"]
    assert sorted(("tools" in t["request"], "tools_sha256" in t["request"]) for t in chats) == [
        (False, False),
        (False, True),
        (True, True),
    ]
    assert all(t["response"]["content"] is not None or t["response"]["tool_calls"] for t in transcript)

    config = yaml.safe_load((records_dir / "config.yaml").read_text())
    # the key reaches the proxy under the gateway's own variable name (pass-through routes read the usual ones)
    assert config["model_list"][0]["litellm_params"]["api_key"] == "os.environ/RLBENCH_GW_PROVIDER_KEY"
    assert_no_secret(records_dir, PROVIDER_KEY, gateway.key)
    assert_stopped(gateway)
    assert gateway.usage()["calls"] == 6  # still readable after exit


@needs_gateway
@pytest.mark.tools
def test_call_limit_refuses_with_429(tmp_path, upstream, provider_key):
    gateway = start_gateway(tmp_path / "gateway", upstream.url, GatewayLimits(calls=2))
    try:
        before = len(upstream.requests())
        with httpx.Client(base_url=gateway.url, trust_env=False, timeout=60) as client:
            bearer = {"Authorization": f"Bearer {gateway.key}"}
            body = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}]}
            assert [client.post("/v1/chat/completions", headers=bearer, json=body).status_code for _ in range(2)] == [
                200,
                200,
            ]
            settle(gateway, 2)
            assert gateway.limit_reached() == "call limit 2 reached (2 calls made)"
            refused = client.post("/v1/chat/completions", headers=bearer, json=body)
            assert refused.status_code == 429
            assert "call limit 2 reached" in refused.json()["error"]["message"]
            anthropic = client.post(
                "/v1/messages",
                headers={"x-api-key": gateway.key},
                json={
                    "model": MODEL,
                    "max_tokens": 16,
                    "stream": True,
                    "messages": [{"role": "user", "content": "hi"}],
                },
            )
            assert anthropic.status_code == 429 and anthropic.json()["error"]["type"] == "rate_limit_error"
        assert len(upstream.requests()) - before == 2  # the refused calls never reached the upstream
        usage = gateway.usage()
        assert (usage["calls"], usage["refused_calls"], usage["total_tokens"]) == (2, 2, 240)
        assert gateway.endpoint_dead() is None
        # a proxy that dies is an endpoint that is dead
        os.kill(gateway.proc.pid, signal.SIGKILL)
        gateway.proc.wait(timeout=10)
        assert "exited" in (gateway.endpoint_dead() or "")
    finally:
        assert_stopped(gateway)
    assert_no_secret(tmp_path / "gateway", PROVIDER_KEY, gateway.key)


@needs_gateway
@pytest.mark.tools
def test_token_limit_refuses_and_cost_is_priced(tmp_path, provider_key):
    upstream = ScriptedLLM({"steps": SCRIPT, "cached_tokens": 30}, tmp_path / "requests.jsonl").__enter__()
    gateway = start_gateway(
        tmp_path / "gateway",
        upstream.url,
        GatewayLimits(tokens=250),
        input_cost_per_token=1e-6,
        output_cost_per_token=2e-6,
    )
    try:
        with httpx.Client(base_url=gateway.url, trust_env=False, timeout=60) as client:
            bearer = {"Authorization": f"Bearer {gateway.key}"}
            body = {"model": MODEL, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
            codes = []
            for i in range(4):  # one after the other, as an agent calls (tokens count once a call is logged)
                with client.stream("POST", "/v1/chat/completions", headers=bearer, json=body) as r:
                    r.read()
                    codes.append(r.status_code)
                settle(gateway, i + 1)
            assert codes == [200, 200, 200, 429]  # 240 tokens < 250 lets the third in; 360 stops the fourth
        assert gateway.limit_reached() == "token limit 250 reached (360 tokens used)"
        usage = gateway.usage()
        assert (usage["calls"], usage["refused_calls"], usage["total_tokens"]) == (3, 1, 360)
        assert usage["cache_read_tokens"] == 90
        assert usage["cost_usd"] > 0 and usage["cost_usd"] <= 3 * (100 * 1e-6 + 20 * 2e-6) + 1e-12
        assert summed_usage(upstream.requests())["total_tokens"] == 360
    finally:
        assert_stopped(gateway)
        upstream.stop()


@needs_gateway
@pytest.mark.tools
def test_dead_upstream_fails_fast_and_is_reported(tmp_path, provider_key):
    gateway = start_gateway(tmp_path / "gateway", f"http://127.0.0.1:{dead_port()}/v1")
    try:
        deads = []
        with httpx.Client(base_url=gateway.url, trust_env=False, timeout=60) as client:
            for _ in range(3):
                started = time.monotonic()
                r = client.post(
                    "/v1/chat/completions",
                    headers={"Authorization": f"Bearer {gateway.key}"},
                    json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]},
                )
                assert r.status_code >= 500
                assert time.monotonic() - started < 15
                settle(gateway, len(deads) + 1)
                deads.append(gateway.endpoint_dead())
        assert deads[:2] == [None, None]
        assert deads[2] and "the last 3 LLM calls failed" in deads[2] and "Connection error" in deads[2]
        usage = gateway.usage()
        assert (usage["calls"], usage["failed_calls"], usage["total_tokens"]) == (3, 3, 0)
        lines = [json.loads(line) for line in (tmp_path / "gateway" / "usage.jsonl").read_text().splitlines()]
        assert all(not u["ok"] and u["error"] and u["status"] >= 500 for u in lines)
    finally:
        assert_stopped(gateway)
    assert_no_secret(tmp_path / "gateway", PROVIDER_KEY, gateway.key)


@pytest.mark.parametrize(
    "failure, grace_s, dead",
    [
        ({"status": 500, "no_answer": True, "error": "Connection error."}, 300, True),  # nobody answers
        ({"status": 401, "error": "invalid x-api-key"}, 300, True),  # a wrong key never heals
        ({"status": 529, "error": "Overloaded"}, 300, False),  # an overloaded provider may recover
        ({"status": 503, "error": "Service Unavailable"}, 0, True),  # ... unless it lasts the grace period
    ],
)
def test_a_dead_endpoint_is_given_up_at_once_but_a_transient_5xx_streak_only_after_its_grace(
    tmp_path, failure, grace_s, dead
):
    gateway = LLMGateway(
        {"model": MODEL, "provider": "openai-compatible", "base_url": "http://127.0.0.1:9/v1"},
        tmp_path,
        transient_grace_s=grace_s,
    )
    with open(gateway.usage_path, "w") as handle:
        for _ in range(3):
            handle.write(json.dumps({"ts": time.time(), "ok": False, "route": "/v1/messages", **failure}) + "\n")
    reason = gateway.endpoint_dead()
    assert bool(reason) == dead, reason
    if dead:
        assert "the last 3 LLM calls failed" in reason


def test_pass_through_routes_find_no_provider_credential(tmp_path, monkeypatch):
    """The proxy holds the provider key under a name of its own: LiteLLM's pass-through routes, which read the
    providers' usual variables, cannot forward an agent's request to the provider past the records and limits."""
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-real-provider-key-0123456789")
    with ScriptedLLM([{"finish": "ok"}], tmp_path / "up.jsonl") as upstream:
        driver = {
            "model": MODEL,
            "provider": "openai-compatible",
            "base_url": f"http://127.0.0.1:{upstream.port}/v1",
            "key_env": "ANTHROPIC_API_KEY",
        }
        with LLMGateway(driver, tmp_path / "gateway") as gateway:
            headers = {"Authorization": f"Bearer {gateway.key}"}
            body = {"model": "claude-sonnet-4-5", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]}
            r = httpx.post(f"{gateway.url}/anthropic/v1/messages", headers=headers, json=body, timeout=60, trust_env=False)
            assert r.status_code >= 400 and "credential" in r.text
            ok = httpx.post(f"{gateway.url}/v1/chat/completions", headers=headers, timeout=60, trust_env=False,
                            json={"model": MODEL, "messages": [{"role": "user", "content": "hi"}]})
            assert ok.status_code == 200  # the driver itself still gets the key
    assert_no_secret(tmp_path / "gateway", "sk-ant-real-provider-key-0123456789", gateway.key)
