"""The run explorer's turns: a coding agent's LLM calls read back from the gateway's transcript in each wire
format the recorder writes (chat completions, Anthropic messages, Responses, Gemini), and a reference
agent's agent.log lines dated by the resource trace."""

from __future__ import annotations

import json
from pathlib import Path

from rlbench.explorer.turns import (
    LABEL_CHARS, MIN_TEXT_CHARS, TEXT_CHARS, llm_turns, log_turns, run_turns, tool_names, within_page,
)  # fmt: skip

START = 1_000.0


def write_transcript(run_dir: Path, records: list[dict], usage: list[dict] | None = None) -> None:
    (run_dir / "gateway").mkdir(parents=True, exist_ok=True)
    (run_dir / "gateway" / "transcript.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    if usage is not None:
        (run_dir / "gateway" / "usage.jsonl").write_text("".join(json.dumps(u) + "\n" for u in usage))


def test_chat_completions_turns_show_only_what_each_call_added(tmp_path):
    system = {"role": "system", "content": "You are an agent."}
    user = {"role": "user", "content": "Train the model."}
    call = {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": "ls"})}}
    first = {"ts": START + 10, "ok": True, "request": {"messages": [system, user], "tools_sha256": "ab", "tools": [{}]},
             "response": {"content": None, "tool_calls": [call], "finish_reason": "tool_calls"},
             "usage": {"prompt_tokens": 100, "completion_tokens": 7}}
    resent = {"role": "assistant", "content": None, "tool_calls": [call]}
    output = {"role": "tool", "tool_call_id": "c1", "content": "train.py\n"}
    second = {"ts": START + 20, "ok": True, "request": {"messages": [system, user, resent, output], "tools_sha256": "ab"},
              "response": {"content": "Done.", "tool_calls": None}, "usage": {"prompt_tokens": 150, "completion_tokens": 2}}
    failed = {"ts": START + 30, "ok": False, "request": {"messages": [system, user]}, "error": "upstream 500"}
    write_transcript(tmp_path, [first, second, failed], [
        {"ts": START + 10, "latency_s": 1.5, "model": "upstream-model"}, {"ts": START + 20, "latency_s": 0.5},
    ])
    turns = llm_turns(tmp_path, START)
    assert [(t["i"], t["t"], t["kind"], t["ok"]) for t in turns] == [(0, 10.0, "llm", True), (1, 20.0, "llm", True),
                                                                   (2, 30.0, "llm", False)]
    one, two, three = turns
    assert [(m["role"], m["text"]) for m in one["messages"]] == [("system", "You are an agent."), ("user", "Train the model.")]
    assert one["response"] == [{"role": "tool_call", "name": "bash", "text": "command: ls"}]
    assert one["tools"] == ["bash"] and one["label"] == "bash: command: ls"
    assert (one["tokens_in"], one["tokens_out"], one["latency_s"], one["model"]) == (100, 7, 1.5, "upstream-model")
    # The second call resends the conversation: only the tool's output is new (named after the call it answers).
    assert two["messages"] == [{"role": "tool", "name": "bash", "text": "train.py\n"}]
    assert two["label"] == "Done." and two["tools"] == []
    assert three["messages"] == [] and three["error"] == "upstream 500" and three["label"] == "error: upstream 500"
    assert tool_names(turns) == ["bash"]


def test_anthropic_turns_name_tool_results_and_keep_their_errors(tmp_path):
    use = {"type": "tool_use", "id": "tu1", "name": "Bash", "input": {"command": "cat no-such-file.txt"}}
    first = {"ts": START + 5, "ok": True,
             "request": {"system": [{"type": "text", "text": "You are Claude Code."}], "system_sha256": "s1",
                         "messages": [{"role": "user", "content": [{"type": "text", "text": "Go."}]}]},
             "response": {"content": [{"type": "thinking", "thinking": "Let me look."}, use], "stop_reason": "tool_use"}}
    result = {"type": "tool_result", "tool_use_id": "tu1", "is_error": True, "content": "cat: no-such-file.txt: No such file"}
    second = {"ts": START + 6, "ok": True,
              "request": {"system_sha256": "s1", "messages": [
                  {"role": "user", "content": [{"type": "text", "text": "Go."}]},
                  {"role": "assistant", "content": [{"type": "thinking", "thinking": "Let me look."}, use]},
                  {"role": "user", "content": [result]}]},
              "response": {"content": [{"type": "text", "text": "The file is missing."}], "stop_reason": "end_turn"}}
    write_transcript(tmp_path, [first, second])
    one, two = llm_turns(tmp_path, START)
    assert [m["role"] for m in one["messages"]] == ["system", "user"] and one["messages"][0]["text"] == "You are Claude Code."
    assert one["response"] == [{"role": "reasoning", "text": "Let me look."},
                               {"role": "tool_call", "name": "Bash", "text": "command: cat no-such-file.txt"}]
    # The system prompt, sent once and then only as its hash, is not shown again; the resent answer neither.
    assert two["messages"] == [{"role": "tool", "name": "Bash", "text": "cat: no-such-file.txt: No such file", "error": True}]
    assert two["ok"] and two["label"] == "The file is missing."


def test_responses_and_gemini_turns(tmp_path):
    call = {"type": "function_call", "call_id": "k1", "name": "shell", "arguments": json.dumps({"command": ["ls"]})}
    responses = [
        {"ts": START + 1, "ok": True, "request": {"instructions": "Be brief.", "input": "Train it."},
         "response": {"output": [{"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}]}, call],
                      "status": "completed"}},
        {"ts": START + 2, "ok": True, "request": {"instructions_sha256": "x", "input": [
            {"role": "user", "content": [{"type": "input_text", "text": "Train it."}]}, call,
            {"type": "function_call_output", "call_id": "k1", "output": "train.py"}]},
         "response": {"output": [{"type": "message", "role": "assistant",
                                  "content": [{"type": "output_text", "text": "Listed."}]}]}},
    ]
    write_transcript(tmp_path, responses)
    one, two = llm_turns(tmp_path, START)
    assert one["messages"] == [{"role": "system", "text": "Be brief."}, {"role": "user", "text": "Train it."}]
    assert one["response"] == [{"role": "reasoning", "text": "plan"}, {"role": "tool_call", "name": "shell", "text": 'command: ["ls"]'}]
    # The structured user message is new in form (shown), the resent call is not, the call's output is named.
    assert {"role": "tool", "name": "shell", "text": "train.py"} in two["messages"]
    assert not any(m["role"] == "tool_call" for m in two["messages"])
    assert two["response"] == [{"role": "assistant", "text": "Listed."}]

    gemini = tmp_path / "gemini"
    write_transcript(gemini, [
        {"ts": START + 3, "ok": True, "request": {"systemInstruction": {"parts": [{"text": "Sys."}]}, "contents": [
            {"role": "user", "parts": [{"text": "Hi."}]},
            {"role": "model", "parts": [{"functionCall": {"name": "run_shell_command", "args": {"command": "ls"}}}]},
            {"role": "user", "parts": [{"functionResponse": {"name": "run_shell_command", "response": {"output": "a.py"}}}]}]},
         "response": {"candidates": [{"content": {"role": "model", "parts": [{"text": "Only a.py."}]}}]}},
    ])
    (turn,) = llm_turns(gemini, START)
    assert [m["role"] for m in turn["messages"]] == ["system", "user", "tool_call", "tool"]
    assert turn["messages"][3]["name"] == "run_shell_command" and "a.py" in turn["messages"][3]["text"]
    assert turn["response"] == [{"role": "assistant", "text": "Only a.py."}]


def test_long_texts_and_labels_are_bounded_and_odd_lines_tolerated(tmp_path):
    huge = "x" * (TEXT_CHARS + 500)
    write_transcript(tmp_path, [{"ts": START, "ok": True, "request": {"messages": [{"role": "user", "content": huge}]},
                                 "response": {"content": "y " * 400}}])
    with open(tmp_path / "gateway" / "transcript.jsonl", "a") as handle:
        handle.write("[1]\nnot json\n{\"ts\": 5, \"ok\": true")  # not records, and a line still being written
    (turn,) = llm_turns(tmp_path, START)
    assert turn["messages"][0]["text"].endswith("[500 more characters]")
    assert len(turn["label"]) == LABEL_CHARS and "\n" not in turn["label"]


def test_agent_log_lines_are_dated_by_the_trace_and_errors_flagged(tmp_path):
    (tmp_path / "workspace").mkdir()
    lines = ["loading model\n", "step 1 loss 2.3\n", "Traceback (most recent call last):\n", "RuntimeError: CUDA out of memory\n"]
    (tmp_path / "workspace" / "agent.log").write_text("".join(lines))
    # Samples every 5 s: the log was 0, 14, 30 then 100 bytes long.
    sizes = [0, 14, 30, 100]
    (tmp_path / "resources.jsonl").write_text(
        "".join(json.dumps({"ts": START + 5 * k, "cpu_percent": 1.0, "agent_log_bytes": size}) + "\n"
                for k, size in enumerate(sizes))
    )
    turns = run_turns(tmp_path, START)
    assert [(t["kind"], t["t"], t["ok"], t["t_exact"]) for t in turns] == [
        ("log", 5.0, True, False), ("log", 10.0, True, False), ("log", 15.0, False, False), ("log", 15.0, False, False)]
    assert turns[3]["label"] == "RuntimeError: CUDA out of memory" and turns[3]["error"] == turns[3]["label"]
    # Without the trace's field (an older run) a line's time is unknown, never guessed.
    (tmp_path / "resources.jsonl").write_text(json.dumps({"ts": START, "cpu_percent": 1.0}) + "\n")
    assert {t["t"] for t in log_turns(tmp_path, START)} == {None}


def test_a_huge_agent_log_keeps_its_first_and_last_lines(tmp_path, monkeypatch):
    import rlbench.explorer.turns as turns_module

    monkeypatch.setattr(turns_module, "LOG_LINES", 10)
    (tmp_path / "workspace").mkdir()
    (tmp_path / "workspace" / "agent.log").write_text("".join(f"line {k}\n" for k in range(100)))
    labels = [t["label"] for t in log_turns(tmp_path, START)]
    assert labels[:5] == [f"line {k}" for k in range(5)] and labels[-5:] == [f"line {k}" for k in range(95, 100)]
    assert labels[5] == "... [90 lines of agent.log not shown]" and len(labels) == 11


def test_a_transcript_wins_over_agent_log_and_nothing_gives_no_turns(tmp_path):
    assert run_turns(tmp_path, None) == []
    (tmp_path / "workspace").mkdir()
    (tmp_path / "workspace" / "agent.log").write_text("tool stdout\n")
    write_transcript(tmp_path, [{"ts": 7.0, "ok": True, "request": {"messages": [{"role": "user", "content": "hi"}]},
                                 "response": {"content": "hello"}}])
    (turn,) = run_turns(tmp_path, None)  # no start recorded: the first call is t 0
    assert turn["kind"] == "llm" and turn["t"] == 0.0


def test_a_long_runs_texts_are_cut_evenly_to_fit_the_page():
    def turn(*sizes):
        return {"messages": [{"role": "tool", "text": "x" * n} for n in sizes], "response": [{"role": "assistant", "text": "ok"}]}

    small = [turn(10, 20)]
    assert within_page(small, budget=100) == [turn(10, 20)]  # fits: unchanged
    turns = [turn(50_000, 3_000), turn(20_000, 100)]
    within_page(turns, budget=20_000)
    lengths = [len(e["text"]) for t in turns for e in t["messages"]]
    # The short texts stay whole; the long ones share what is left (about 8,450 each, plus the cut's note).
    assert lengths[1] == 3_000 and lengths[3] == 100
    assert all(MIN_TEXT_CHARS < n < 8_500 for n in (lengths[0], lengths[2]))
    assert "more characters]" in turns[0]["messages"][0]["text"]
