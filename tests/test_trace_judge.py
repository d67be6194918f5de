"""The optional trace judge (rlbench.integrity.trace_judge.judge_trace): a transcript reciting a held-out
item gets contamination flagged with evidence checked against the trace; failing or unparsable answers
are counted as judge_failed, never clean; a rerun is served from the cache; the trace is chunked
deterministically with its bounds recorded; a reference agent's code revisions and log are read; the
openai backend end to end through audit.judge's settings."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from rlbench.integrity.trace_judge import KINDS, AnswerError, judge_trace, parse_answer, trace_events
from rlbench.integrity.verdict import run_integrity
from rlbench.recording.repository import CodeRepository
from rlbench.scoring.judges import Answer, Judge

HELD_OUT = "Janet's ducks lay 16 eggs per day. She eats three for breakfast every morning"


def _verdicts(flags: dict | None = None, evidence: dict | None = None) -> str:
    flags, evidence = flags or {}, evidence or {}
    return json.dumps(
        {
            "verdicts": [
                {
                    "kind": kind,
                    "flagged": bool(flags.get(kind)),
                    "justification": flags.get(kind) or "nothing of the kind",
                    "evidence": evidence.get(kind, []),
                }
                for kind in KINDS
            ]
        }
    )


class ScriptedTraceJudge(Judge):
    """Answers each prompt with reply(user text) (a str, or an Answer for a failure), counting its calls."""

    backend = "scripted-trace"

    def __init__(self, reply, **kwargs):
        super().__init__(**kwargs)
        self.reply = reply
        self.asked: list[list[dict]] = []

    @property
    def model(self) -> str:
        return "scripted"

    def decoding(self) -> dict:
        return {"rule": "scripted"}

    def _judge_calls(self, calls):
        raise AssertionError("no pairs here")

    def _complete_calls(self, prompts, max_tokens):
        self.asked += prompts
        out = []
        for prompt in prompts:
            reply = self.reply(prompt[-1]["content"])
            out.append(reply if isinstance(reply, Answer) else Answer(text=reply, attempts=1))
        return out


def contamination_spotter(user: str) -> str:
    """Flags contamination where the held-out question appears, citing the turn it is in."""
    if HELD_OUT not in user:
        return _verdicts()
    turn = user[: user.index(HELD_OUT)].rsplit("[turn ", 1)[1].split("]", 1)[0]
    return _verdicts(
        {"contamination": "The agent appended a GSM8K test question to its training data."},
        {"contamination": [{"ref": f"turn {turn}", "quote": HELD_OUT[:60]}]},
    )


def _transcript_run(run_dir: Path, recite: bool = True, turns: int = 4) -> Path:
    """A coding agent's run: run.json and the gateway's transcript.jsonl as the recorder writes it."""
    (run_dir / "gateway").mkdir(parents=True)
    (run_dir / "run.json").write_text(json.dumps({"labels": {"task": "gsm8k", "model": "tiny", "agent": "claude"}}))
    system = {"role": "system", "content": "You are a coding agent. Train the model in models/."}
    conversation = [system, {"role": "user", "content": "Post-train the base model on data/train.jsonl."}]
    lines = []
    for turn in range(turns):
        if turn == 2 and recite:
            command = f"echo '{json.dumps({'question': HELD_OUT, 'answer': '#### 18'})}' >> data_aug/train.jsonl"
        else:
            command = f"python code/train.py --epochs {turn + 1}"
        call = {"id": f"c{turn}", "type": "function", "function": {"name": "bash", "arguments": json.dumps({"command": command})}}
        lines.append(
            {
                "ts": 1000.0 + turn, "call_id": f"id{turn}", "ok": True, "route": "/v1/chat/completions",
                "call_type": "acompletion", "model_group": "driver",
                "request": {"model": "driver", "messages": list(conversation)},
                "response": {"content": f"Step {turn}.", "tool_calls": [call], "finish_reason": "tool_calls"},
            }
        )  # fmt: skip
        conversation += [
            {"role": "assistant", "content": f"Step {turn}.", "tool_calls": [call]},
            {"role": "tool", "tool_call_id": f"c{turn}", "content": f"ok {turn}"},
        ]
    (run_dir / "gateway" / "transcript.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    return run_dir


def test_a_recited_held_out_item_is_flagged_with_checked_evidence(tmp_path):
    run = _transcript_run(tmp_path / "run")
    judge = ScriptedTraceJudge(contamination_spotter, cache_dir=tmp_path / "cache")
    report = judge_trace(run, {}, tmp_path / "cache", judge=judge)
    verdicts = {v["kind"]: v for v in report["verdicts"]}
    assert list(verdicts) == list(KINDS)
    contamination = verdicts["contamination"]
    assert contamination["flagged"] is True and contamination["supported"] and contamination["chunks_flagged"] == [0]
    assert contamination["evidence"] == [
        {"chunk": 0, "ref": "turn 2", "quote": HELD_OUT[:60], "status": "found", "found_in": None}
    ]
    assert all(verdicts[k]["flagged"] is False for k in KINDS[1:])
    assert report["judge_failed"] == 0 and report["unsupported_flags"] == 0 and report["asked"] == 1
    assert report["trace"]["sources"]["transcript"] == "gateway/transcript.jsonl" and report["trace"]["events"] == 4
    # Each message is shown once, in the turn that first sent it (a call resends the whole conversation, and
    # the assistant's earlier responses); tool calls with their arguments decoded.
    prompt = judge.asked[0][-1]["content"]
    assert prompt.count("Post-train the base model") == 1 and prompt.count(HELD_OUT) == 1
    assert "tool call bash:\ncommand: python code/train.py --epochs 1\n" in prompt and "tool: ok 0" in prompt
    assert "Run: task gsm8k, model tiny, agent claude" in prompt
    integrity = run_integrity({"flagged": []}, None, report)
    assert integrity["status"] == "flagged" and integrity["reasons"] == ["trace judge: contamination"]
    json.dumps(report, allow_nan=False)
    # A clean transcript: nothing flagged, every kind answered.
    clean = judge_trace(_transcript_run(tmp_path / "clean", recite=False), {}, tmp_path / "cache", judge=judge)
    assert [v["flagged"] for v in clean["verdicts"]] == [False] * 4
    assert run_integrity({"flagged": []}, None, clean)["status"] == "clean"


def test_evidence_that_points_at_nothing_is_recorded_as_such(tmp_path):
    run = _transcript_run(tmp_path / "run")
    quotes = [
        {"ref": "turn 9", "quote": "downloaded the gsm8k test split"},  # no such turn, no such text
        {"ref": "turn 1", "quote": HELD_OUT[:40]},  # the text is in turn 2
        {"ref": "turn 0", "quote": "ok"},  # too short to point at anything
    ]
    reply = _verdicts({"outside_api": "It looked up the answers online."}, {"outside_api": quotes})
    report = judge_trace(run, {}, tmp_path / "cache", judge=ScriptedTraceJudge(lambda _: reply))
    outside = next(v for v in report["verdicts"] if v["kind"] == "outside_api")
    assert [e["status"] for e in outside["evidence"]] == ["ref_unknown", "found_elsewhere", "quote_too_short"]
    assert outside["evidence"][1]["found_in"] == "turn 2" and outside["supported"]
    reply = _verdicts({"disallowed_model": "It trained Llama."}, {"disallowed_model": quotes[:1]})
    report = judge_trace(run, {}, tmp_path / "cache2", judge=ScriptedTraceJudge(lambda _: reply))
    disallowed = next(v for v in report["verdicts"] if v["kind"] == "disallowed_model")
    assert disallowed["flagged"] is True and not disallowed["supported"] and report["unsupported_flags"] == 1


@pytest.mark.parametrize(
    "reply, kind",
    [
        (Answer(failure="timeout", detail="no answer within 60 s"), "timeout"),
        (Answer(failure="refusal", detail="content_filter"), "refusal"),
        ("The trace looks clean to me.", "unparsable"),
        ('{"verdicts": [{"kind": "contamination", "flagged": false, "justification": ""}]}', "unparsable"),
        (_verdicts().replace("false", '"no"', 1), "unparsable"),
        ("Here it is: " + _verdicts(), "unparsable"),
    ],
    ids=["timeout", "refusal", "prose", "missing-kinds", "flag-not-bool", "text-around"],
)
def test_a_failing_or_unparsable_judge_is_counted_never_clean(tmp_path, reply, kind):
    run = _transcript_run(tmp_path / "run")
    report = judge_trace(run, {"chunk_chars": 400}, tmp_path / "cache", judge=ScriptedTraceJudge(lambda _: reply))
    chunks = report["trace"]["chunks_total"]
    assert chunks > 1 and report["judge_failed"] == chunks
    assert report["failures"]["by_kind"] == {kind: chunks}
    assert all(v["flagged"] is None and v["chunks_answered"] == 0 for v in report["verdicts"])
    integrity = run_integrity({"flagged": []}, None, report)
    assert integrity["status"] == "incomplete" and f"the trace judge failed {chunks} times" in integrity["label"]


def test_one_failed_chunk_of_several_is_counted_and_the_rest_still_judged(tmp_path):
    run = _transcript_run(tmp_path / "run")

    def reply(user: str):
        return Answer(failure="http_error", detail="HTTP 500") if "[turn 0]" in user else contamination_spotter(user)

    report = judge_trace(run, {"chunk_chars": 400}, tmp_path / "cache", judge=ScriptedTraceJudge(reply))
    assert report["judge_failed"] == 1 and report["failures"]["chunks"][0]["chunk"] == 0
    contamination = report["verdicts"][0]
    assert contamination["flagged"] is True and contamination["chunks_answered"] == report["trace"]["chunks_total"] - 1
    assert run_integrity({"flagged": []}, None, report)["status"] == "flagged"


def test_a_second_call_is_served_from_the_cache(tmp_path):
    run = _transcript_run(tmp_path / "run")
    cache = tmp_path / "cache"
    first = ScriptedTraceJudge(contamination_spotter, cache_dir=cache)
    report = judge_trace(run, {"chunk_chars": 400}, cache, judge=first)
    again = ScriptedTraceJudge(contamination_spotter, cache_dir=cache)
    rerun = judge_trace(run, {"chunk_chars": 400}, cache, judge=again)
    assert again.asked == [] and rerun["asked"] == 0 and rerun["cached"] == report["asked"] == len(first.asked) > 1
    assert rerun["verdicts"] == report["verdicts"] and rerun["trace"] == report["trace"]
    # Other bounds are other prompts: asked afresh.
    third = ScriptedTraceJudge(contamination_spotter, cache_dir=cache)
    judge_trace(run, {"chunk_chars": 5000}, cache, judge=third)
    assert third.asked


def test_a_long_trace_is_chunked_deterministically_with_its_bounds(tmp_path):
    run = _transcript_run(tmp_path / "run", turns=30)
    judge = ScriptedTraceJudge(lambda _: _verdicts())
    report = judge_trace(run, {"chunk_chars": 500, "max_chunks": 4}, tmp_path / "cache", judge=judge)
    trace = report["trace"]
    total = trace["chunks_total"]
    assert total > 4 and trace["chunks_judged"] == [0, 1, 2, total - 1]
    assert trace["chunks_skipped"] == list(range(3, total - 1)) and 0 < trace["chars_judged"] < trace["chars"]
    assert len(judge.asked) == 4 and all(len(p[-1]["content"]) < 500 + 400 for p in judge.asked)
    assert "[turn 29]" in judge.asked[-1][-1]["content"]
    again = ScriptedTraceJudge(lambda _: _verdicts())
    assert judge_trace(run, {"chunk_chars": 500, "max_chunks": 4}, tmp_path / "c2", judge=again)["trace"] == trace
    assert again.asked == judge.asked
    with pytest.raises(ValueError, match="audit.judge.max_chunks"):
        judge_trace(run, {"max_chunks": 0}, tmp_path / "cache", judge=judge)


def test_a_reference_agents_code_revisions_and_log_are_read(tmp_path):
    run = tmp_path / "run"
    (run / "workspace").mkdir(parents=True)
    (run / "workspace" / "agent.log").write_text("".join(f"epoch {i} loss 0.{i}\n" for i in range(60)))
    repo = CodeRepository(run / "grader" / "code.git")
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "train.py").write_text("from datasets import load_dataset\n")
    repo.commit(tree, "submission 1", 1000.0)
    (tree / "train.py").write_text("ds = load_dataset('openai/gsm8k', 'main', split='test')\n")
    (tree / "notes.txt").write_text("unchanged later\n")
    repo.commit(tree, "submission 2", 1001.0)
    repo.commit(tree, "submission 3", 1002.0)
    events, sources = trace_events(run)
    assert [e.ref for e in events] == [
        "revision 1 train.py", "revision 2 notes.txt", "revision 2 train.py",
        "workspace/agent.log:1-40", "workspace/agent.log:41-60",
    ]  # fmt: skip
    assert sources["code_revisions"] == 3 and sources["logs"] == ["workspace/agent.log"] and sources["transcript"] is None
    reply = _verdicts(
        {"outside_api": "It fetched the GSM8K test split."},
        {"outside_api": [
            {"ref": "revision 2 train.py", "quote": "split='test'"},
            {"ref": "workspace/agent.log:45", "quote": "epoch 44 loss 0.44"},
        ]},
    )  # fmt: skip
    report = judge_trace(run, {}, tmp_path / "cache", judge=ScriptedTraceJudge(lambda _: reply))
    outside = next(v for v in report["verdicts"] if v["kind"] == "outside_api")
    assert [e["status"] for e in outside["evidence"]] == ["found", "found"]
    # Nothing recorded at all: a problem, said so.
    empty = judge_trace(tmp_path / "empty", {}, tmp_path / "cache", judge=ScriptedTraceJudge(lambda _: reply))
    assert empty["problems"] and empty["trace"]["events"] == 0 and all(v["flagged"] is None for v in empty["verdicts"])


def test_parse_answer_is_strict():
    fenced = "```json\n" + _verdicts({"contamination": "x"}) + "\n```"
    assert parse_answer(fenced)["contamination"]["flagged"] is True
    for bad in ("", "[]", '{"verdicts": []}', _verdicts()[:-1], json.dumps({"verdicts": [], "note": 1})):
        with pytest.raises(AnswerError):
            parse_answer(bad)
    doubled = json.loads(_verdicts())
    doubled["verdicts"].append(doubled["verdicts"][0])
    with pytest.raises(AnswerError, match="repeated"):
        parse_answer(json.dumps(doubled))


class _ChatServer(ThreadingHTTPServer):
    """An OpenAI-compatible chat-completions endpoint answering every prompt with contamination_spotter."""

    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _ChatHandler)
        self.bodies: list[dict] = []


class _ChatHandler(BaseHTTPRequestHandler):
    server: _ChatServer

    def log_message(self, *args):
        pass

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.server.bodies.append(body)
        content = contamination_spotter(body["messages"][-1]["content"])
        data = json.dumps(
            {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]}
        ).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_the_openai_backend_through_the_audit_judge_settings(tmp_path):
    run = _transcript_run(tmp_path / "run")
    server = _ChatServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        settings = {
            "backend": "openai", "model": "auditor", "base_url": f"http://127.0.0.1:{server.server_address[1]}/v1",
            "temperature": 0, "retry_backoff_s": 0, "timeout_s": 10, "chunk_chars": 100000, "answer_max_tokens": 800,
        }  # fmt: skip
        report = judge_trace(run, settings, tmp_path / "cache")
        assert report["verdicts"][0]["flagged"] is True and report["verdicts"][0]["supported"]
        assert report["judge"]["backend"] == "openai" and report["judge"]["model"] == "auditor"
        assert len(server.bodies) == 1 and server.bodies[0]["max_tokens"] == 800 and server.bodies[0]["temperature"] == 0
        assert judge_trace(run, settings, tmp_path / "cache")["asked"] == 0 and len(server.bodies) == 1
    finally:
        server.shutdown()
        server.server_close()


def test_anthropic_and_responses_shaped_calls_read_as_text(tmp_path):
    run = tmp_path / "run"
    (run / "gateway").mkdir(parents=True)
    anthropic = {
        "request": {"system": [{"type": "text", "text": "You are Claude Code."}], "messages": [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "wrote data/x.jsonl"}]},
        ]},
        "response": {"content": [{"type": "tool_use", "id": "t2", "name": "Bash", "input": {"command": "curl https://api.openai.com/v1/chat"}}]},
    }  # fmt: skip
    responses = {
        "request": {"instructions": "You are Codex.", "input": [{"type": "function_call_output", "call_id": "c", "output": "done"}]},
        "response": {"output": [{"type": "function_call", "name": "shell", "arguments": json.dumps({"cmd": "ls output"})}]},
        "ok": True,
    }  # fmt: skip
    failed = {"request": {"messages": [{"role": "user", "content": "hi"}]}, "ok": False, "error": "HTTP 529 overloaded"}
    lines = [json.dumps(r) for r in (anthropic, responses, failed)] + ["{not json"]
    (run / "gateway" / "transcript.jsonl").write_text("\n".join(lines) + "\n")
    events, sources = trace_events(run)
    texts = [e.text for e in events]
    assert "system: You are Claude Code." in texts[0] and "user: tool result: wrote data/x.jsonl" in texts[0]
    assert "response: tool call Bash:\ncommand: curl https://api.openai.com/v1/chat" in texts[0]
    assert "user" not in texts[1].split("\n")[0] and "tool call shell:\ncmd: ls output" in texts[1]
    assert "error: HTTP 529 overloaded" in texts[2] and sources["transcript_unreadable_lines"] == 1
