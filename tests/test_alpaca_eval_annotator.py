"""AlpacaEval's annotator as the reference runs it (RD-Agent's `annotators_gpt52_fn` through alpaca_eval),
the paper's variant and ours: golden requests, alpaca_eval's per-instruction order, its parser, and what a
failed call becomes under each annotator.

The golden data (tests/fixtures/reference/alpaca_eval/, see its SOURCE.md) are alpaca_eval's own output:
the requests it sent with the reference's config files and the preferences it returned, and the
reference's committed annotations (microsoft/RD-Agent at 471eb30d1ec03f35631c532c58a52ce75d684037).
"""

from __future__ import annotations

import json
import math
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import yaml

from rlbench.config import load_schema, validate
from rlbench.scoring.judges import JudgeError, Pair, judge_record, load_judge
from rlbench.scoring.judges.annotators import (
    ANNOTATORS,
    PAPER_FN,
    RANKING_DIR,
    REFERENCE_FN,
    WEIGHTED,
    WEIGHTED_LOCAL,
    is_switched,
    parse_ranking,
)
from rlbench.scoring.judges.compat import alpaca_eval_module
from rlbench.tasks import EvalContext
from rlbench.tasks.alpaca_eval import AlpacaEval, WinRateScorer
from rlbench.tasks.alpaca_eval.winrate import LC_OFFLINE
from support.settings import REPO

FIXTURES = REPO / "tests/fixtures/reference/alpaca_eval"
GOLDEN = json.loads((FIXTURES / "alpaca_eval_requests.json").read_text())["cases"]
REFERENCE_ROWS = json.loads((FIXTURES / "annotations_seed0_configs.sample.json").read_text())
REGISTRY = yaml.safe_load((REPO / "config/tasks/alpaca-eval.yaml").read_text())
WIN = "WIN!"


class StubEndpoint:
    """A loopback chat-completions endpoint: records each request body and answers `reply(body)`."""

    def __init__(self, reply):
        self.bodies: list[dict] = []
        self.paths: list[str] = []
        stub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                stub.bodies.append(body)
                stub.paths.append(self.path)
                data = json.dumps(reply(body)).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def chat_reply(message: dict, finish: str, logprobs: dict | None = None) -> dict:
    return {
        "id": "x",
        "object": "chat.completion",
        "created": 0,
        "model": "stub",
        "choices": [{"index": 0, "message": {"role": "assistant", "refusal": None, **message},
                     "finish_reason": finish, "logprobs": logprobs}],  # fmt: skip
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


def scripted_reply(spec: dict) -> dict:
    """The answers the golden run scripted: a tool call, a content-filtered answer, or plain text."""
    if spec["kind"] == "tool":
        call = {"id": "call_1", "type": "function",
                "function": {"name": "make_partial_leaderboard", "arguments": spec["arguments"]}}  # fmt: skip
        return chat_reply({"content": None, "tool_calls": [call]}, "tool_calls")
    if spec["kind"] == "content_filter":
        return chat_reply({"content": None}, "content_filter")
    return chat_reply({"content": spec["content"]}, "stop")


def instruction_of(body: dict) -> str:
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return re.search(r'"instruction": """(.*?)""",\n}', user, re.DOTALL).group(1)


def outputs_of(body: dict) -> list[str]:
    user = next(m["content"] for m in body["messages"] if m["role"] == "user")
    return re.findall(r'"output": """(.*?)"""\n    }', user, re.DOTALL)


def judge_settings(url: str, annotator: str | None, **extra) -> dict:
    settings = {"backend": "openai", "model": "gpt-5.2", "base_url": url, "api_key_var": None,
                "retry_backoff_s": 0, "max_retries": 2, **extra}  # fmt: skip
    return settings if annotator is None else {**settings, "annotator": annotator}


# -- the reference's files and requests, byte for byte ---------------------------------------------------


def test_shipped_annotator_files_are_the_references():
    for name in ("configs.yaml", "alpaca_eval_fn.txt"):
        assert (RANKING_DIR / name).read_bytes() == (FIXTURES / "annotators_gpt52_fn" / name).read_bytes()


def test_requests_equal_what_alpaca_eval_sends_with_the_references_config():
    """Our judge, for each golden instruction and pair: the same request bodies as alpaca_eval sent (messages,
    tool schema, tool_choice, decoding, model), in the same order of the two outputs, and the same preference."""
    replies = {case["instruction"]: case["reply"] for case in GOLDEN}
    with StubEndpoint(lambda body: scripted_reply(replies[instruction_of(body)])) as stub:
        judge = load_judge(judge_settings(stub.url, REFERENCE_FN))
        judgments = judge.compare([Pair(c["instruction"], c["output_1"], c["output_2"]) for c in GOLDEN])
    sent = {}
    for body in stub.bodies:
        sent.setdefault(instruction_of(body), []).append(body)
    assert set(stub.paths) == {"/v1/chat/completions"}
    assert {c["request_path"] for c in GOLDEN if c["requests"]} == {"/v1/chat/completions"}
    for case, judgment in zip(GOLDEN, judgments):
        ours = sent.get(case["instruction"], [])
        # One call per instruction, a refused or unparsable answer not asked again (alpaca_eval parses once).
        assert len(ours) == len(case["requests"]), case["instruction"]
        for mine, theirs in zip(ours, case["requests"]):
            assert json.dumps(mine, sort_keys=True, ensure_ascii=False) == json.dumps(
                theirs, sort_keys=True, ensure_ascii=False
            )
        assert judgment.preference == case["alpaca_eval_preference"], case["instruction"]
    kinds = {c["instruction"]: c["reply"]["kind"] for c in GOLDEN}
    assert any(c["alpaca_eval_preference"] is None for c in GOLDEN)  # the golden run holds failed calls
    failed = [j for c, j in zip(GOLDEN, judgments) if c["alpaca_eval_preference"] is None]
    assert {(j.forward.failure or j.swapped.failure) for j in failed} == {"refusal", "unparsable"}
    assert "content_filter" in kinds.values()


def test_request_body_has_the_configs_decoding_and_no_logprobs():
    body = GOLDEN[0]["requests"][0]
    assert (body["model"], body["max_tokens"], body["temperature"], body["top_p"]) == ("gpt-5.2", 100, 0, 1.0)
    assert body["tool_choice"] == {"type": "function", "function": {"name": "make_partial_leaderboard"}}
    assert "logprobs" not in body and [m["role"] for m in body["messages"]] == ["system", "user"]
    judge = load_judge(judge_settings("http://127.0.0.1:9/v1", REFERENCE_FN))
    assert judge._request_body(body["messages"]) == body


# -- alpaca_eval's per-instruction order ----------------------------------------------------------------


def test_order_reproduces_the_references_own_annotations():
    """The reference's committed gpt-5.2 annotations: m's rank in the raw function call, mapped back with 3 - x
    when alpaca_eval's hash showed the model first, is the preference alpaca_eval stored."""
    seen = set()
    for row in REFERENCE_ROWS:
        rank = parse_ranking(row["preference_raw_completion"])
        switched = is_switched(row["instruction"])
        seen.add(switched)
        assert (3 - rank if switched else rank) == float(row["preference"]), row["instruction"]
    assert seen == {True, False}


def test_order_equals_alpaca_evals_processor():
    alpaca_eval_module("alpaca_eval")
    import pandas as pd
    from alpaca_eval.processors import RandomSwitchTwoColumnsProcessor

    instructions = [r["instruction"] for r in REFERENCE_ROWS] + [c["instruction"] for c in GOLDEN]
    instructions += ["", "Écris un poème.", 'Quote "this" {and} that\n\nplease.', "x" * 5000]
    # As alpaca_eval's SinglePairwiseAnnotator builds it, with the annotator's seed (0).
    processor = RandomSwitchTwoColumnsProcessor(
        two_columns_to_switch=["output_1", "output_2"], random_seed_columns=("instruction",),
        _switch_column="is_switched_outputs", seed=0,
    )  # fmt: skip
    frame = pd.DataFrame({"instruction": instructions, "output_1": "a", "output_2": "b"})
    theirs = processor.preprocess(frame)["is_switched_outputs"].tolist()
    assert [is_switched(i) for i in instructions] == theirs
    assert set(theirs) == {True, False}


def test_single_order_annotator_shows_each_pair_once_in_alpaca_evals_order():
    def reply(body):
        first, second = outputs_of(body)
        winner = "m" if WIN in first else "M"
        args = json.dumps({"ordered_models": [{"model": winner, "rank": 1}, {"model": "Mm"[winner == "M"], "rank": 2}]})
        return scripted_reply({"kind": "tool", "arguments": args})

    instructions = [r["instruction"] for r in REFERENCE_ROWS]
    with StubEndpoint(reply) as stub:
        judge = load_judge(judge_settings(stub.url, REFERENCE_FN))
        judgments = judge.compare([Pair(i, "reference", f"{WIN} model") for i in instructions])
    assert len(stub.bodies) == len(instructions)
    body_of = {instruction_of(body): body for body in stub.bodies}  # the calls run concurrently
    for instruction, judgment in zip(instructions, judgments):
        shown_first = outputs_of(body_of[instruction])[0]
        assert (shown_first == f"{WIN} model") == is_switched(instruction)
        assert judgment.preference == 2.0  # the model won, whichever slot it had
        asked, other = (judgment.swapped, judgment.forward) if is_switched(instruction) else (judgment.forward, judgment.swapped)
        assert asked.parser == "ranking" and other.parser == "not_asked" and other.failure is None


# -- alpaca_eval's parser --------------------------------------------------------------------------------

COMPLETIONS = [
    '{"ordered_models":[{"model":"m","rank":1},{"model":"M","rank":2}]}',
    '{"ordered_models":[{"model":"M","rank":1},{"model":"m","rank":2}]}',
    '{"ordered_models":[{"model":"M","rank":1.0},{"model":"m","rank":2.0}]}',
    'Sure: ```json\n{"ordered_models": [{"model": "m", "rank": 2}, {"model": "M", "rank": 1}]}\n``` done',
    '{"ordered_models":[{"model":"m","rank":3},{"model":"M","rank":1}]}',
    '{"ordered_models":[{"model":"M","rank":1}]}',
    '{"ordered_models":"[{\'model\': \'m\', \'rank\': 1}]"}',
    '[{"ordered_models":[{"model":"m","rank":1}]},{"ordered_models":[{"model":"m","rank":2}]}]',
    '[{"ordered_models":[{"model":"m","rank":2}]}]',
    '{"ranking":[{"model":"m","rank":1}]}',
    "I cannot rank these.",
    "```json\nnot json```",
    "```json no closing fence",
    " ",
    "",
]


def test_ranking_parser_matches_alpaca_evals():
    parsers = alpaca_eval_module("alpaca_eval.completion_parsers")
    config = yaml.safe_load((FIXTURES / "annotators_gpt52_fn/configs.yaml").read_text())["alpaca_eval_gpt5_2_fn"]
    kwargs = config["completion_parser_kwargs"]

    def theirs(text):
        try:  # alpaca_eval's SingleAnnotator._parse_completions, batch_size 1
            found = list(parsers.pipeline_meta_parser(text, **kwargs))
        except Exception:
            return None
        if len(found) != 1 or found[0] is None or (isinstance(found[0], float) and math.isnan(found[0])):
            return None
        return float(found[0])

    for text in COMPLETIONS:
        assert parse_ranking(text) == theirs(text), text
    assert parse_ranking(None) is None  # a message without content or tool call


# -- what a failed call becomes under each annotator -----------------------------------------------------

ROWS = [
    {"id": f"eval-{i}", "index": i, "instruction": f"Instruction number {i}: say something useful.",
     "reference": "A reference answer " + "r" * (10 * i), "reference_generator": "reference"}
    for i in range(8)
]  # fmt: skip
REFUSED = ROWS[3]["instruction"]
ANSWERS = [f"{WIN} " + "a" * (15 * (8 - i)) for i in range(8)]


def winner_reply(body: dict) -> dict:
    """The model's answer wins every comparison; the REFUSED instruction is content-filtered."""
    if instruction_of(body) == REFUSED:
        return chat_reply({"content": None}, "content_filter")
    first, _ = outputs_of(body)
    winner, loser = ("m", "M") if WIN in first else ("M", "m")
    if "tools" in body:
        args = json.dumps({"ordered_models": [{"model": winner, "rank": 1}, {"model": loser, "rank": 2}]})
        return scripted_reply({"kind": "tool", "arguments": args})
    top = [{"token": winner, "logprob": math.log(0.9)}, {"token": loser, "logprob": math.log(0.1)}]
    return chat_reply({"content": winner}, "stop", {"content": [{"token": winner, "logprob": 0.0, "top_logprobs": top}]})


def score(tmp_path, annotator: str | None):
    with StubEndpoint(winner_reply) as stub:
        settings = {"name": "alpaca-eval", "judge": judge_settings(stub.url, annotator, max_retries=1)}
        ctx = EvalContext(settings=settings, model_dir=tmp_path, eval_dir=tmp_path, resources={}, backend=None)
        result = WinRateScorer(LC_OFFLINE).score(ROWS, ANSWERS, ctx)
    return result, len(stub.bodies)


def test_reference_annotator_keeps_a_refused_call_as_alpaca_evals_nan(tmp_path):
    result, requests = score(tmp_path, REFERENCE_FN)
    m = result.metrics
    assert requests == 8  # one call per instruction; the refusal is not asked again
    assert (m["annotator"], m["judge_model"], m["judge_failure_rule"]) == (REFERENCE_FN, "gpt-5.2", "alpaca_eval")
    assert (m["judge_failures"], m["judge_failures_by_kind"], m["judge_dropped"]) == (1, {"refusal": 1}, 1)
    assert m["judge_failures_as_losses"] == 0
    assert (m["n_total"], m["n_instructions"], m["win_rate"]) == (7, 8, 100.0)  # out of the win rate
    assert m["lc_method"] == LC_OFFLINE and result.items[3]["preference"] is None
    assert result.items[3]["failure"] == "refusal" and {i["parser"] for i in result.items} == {"ranking", None}


def test_paper_annotator_counts_a_refused_call_as_a_loss(tmp_path):
    result, requests = score(tmp_path, PAPER_FN)
    m = result.metrics
    assert requests == 8 and (m["annotator"], m["judge_failure_rule"]) == (PAPER_FN, "loss")
    assert (m["judge_failures"], m["judge_dropped"], m["judge_failures_as_losses"]) == (1, 0, 1)
    assert (m["n_total"], m["n_wins"], m["n_wins_base"]) == (8, 7, 1)
    assert m["win_rate"] == pytest.approx(100 * 7 / 8) and result.items[3]["preference"] == 1.0


def test_weighted_annotator_drops_a_refused_instruction(tmp_path):
    result, requests = score(tmp_path, WEIGHTED)
    m = result.metrics
    assert requests == 7 * 2 + 2 * 2  # both orders; the refused pair's two calls asked twice (max_retries 1)
    assert (m["annotator"], m["judge_failure_rule"]) == (WEIGHTED, "drop")
    assert (m["judge_failures"], m["judge_dropped"], m["judge_failures_as_losses"]) == (2, 1, 0)
    assert m["n_total"] == 7 and m["win_rate"] == pytest.approx(90.0)


def test_the_reference_keeps_failed_rows_in_the_lc_mean_as_alpaca_eval_does(tmp_path):
    """alpaca_eval's LC GLM predicts a NaN-preference instruction (the mean runs over all 8); dropping it is
    another number."""
    import random

    from rlbench.tasks.alpaca_eval.winrate import compute_metrics

    rng = random.Random(1)
    rows = []
    for i in range(60):  # longer answers win more often; six of the longest ones failed
        length = rng.randint(50, 800)
        won = rng.random() < (0.95 if length > 300 else 0.6)
        rows.append({"index": i, "instruction": f"q{i}", "output_1": "x" * 300, "output_2": "y" * length,
                     "preference": 2.0 if won else 1.0})  # fmt: skip
    for row in [r for r in rows if len(r["output_2"]) > 600][:6]:
        row["preference"] = None
    kept = compute_metrics(rows, lc_method=LC_OFFLINE, keep_failed=True)
    dropped = compute_metrics(rows, lc_method=LC_OFFLINE)
    assert kept["win_rate"] == dropped["win_rate"] and kept["n_total"] == dropped["n_total"] == 54
    assert kept["length_controlled_winrate"] != pytest.approx(dropped["length_controlled_winrate"])


# -- configuration ---------------------------------------------------------------------------------------


def test_registry_default_is_the_references_annotator_and_validates():
    assert (REGISTRY["judge"]["annotator"], REGISTRY["judge"]["model"]) == (REFERENCE_FN, "gpt-5.2")
    validate(REGISTRY, load_schema("task"), "config/tasks/alpaca-eval.yaml")
    with pytest.raises(Exception, match="annotator"):
        validate({**REGISTRY, "judge": {**REGISTRY["judge"], "annotator": "gpt4"}}, load_schema("task"), "x")
    assert ANNOTATORS[PAPER_FN].model == "gpt-4o" and ANNOTATORS[WEIGHTED].model == "gpt-4-1106-preview"


def test_local_judge_runs_the_weighted_prompt_and_says_so(tiny_model):
    # The embedded offline default merges {backend: local, model: ...} over the registry's block.
    settings = {**REGISTRY["judge"], "backend": "local", "model": "tiny"}
    record = judge_record(settings, model_dir=tiny_model)
    assert record["annotator"] == WEIGHTED_LOCAL and record["annotator_config"] == "weighted_alpaca_eval_gpt4_turbo"
    assert "annotator" not in record["settings"] or record["settings"]["annotator"] == REFERENCE_FN
    description = AlpacaEval().describe({**REGISTRY, "source": "offline", "judge": settings})
    assert "local model" in description and "both orders" in description


def test_annotator_settings_errors_name_the_fix():
    with pytest.raises(JudgeError, match="reference_gpt52_fn, paper_gpt4o, weighted_gpt4_turbo"):
        load_judge(judge_settings("http://127.0.0.1:9/v1", "gpt4"))
    with pytest.raises(JudgeError, match="local backend's"):
        load_judge(judge_settings("http://127.0.0.1:9/v1", WEIGHTED_LOCAL))
    record = judge_record(judge_settings("http://127.0.0.1:9/v1", PAPER_FN, model="gpt-4o"))
    assert (record["annotator"], record["model"], record["settings"]["annotator"]) == (PAPER_FN, "gpt-4o", PAPER_FN)
    description = AlpacaEval().describe({**REGISTRY, "source": "hub"})
    assert "seeded hash of the instruction" in description and "gpt-5.2" in description
