"""The GSM8K protocol is OpenCompass's gsm8k_gen_1d7fe4, as the pinned wheel renders and scores it."""

from __future__ import annotations

import json

import pytest

from rlbench.fileio.jsonio import read_jsonl
from rlbench.tasks.gsm8k import GSM8K, OPENCOMPASS_CONFIG, opencompass_protocol, public
from rlbench.tasks.opencompass_config import VERSION, config_file
from support import opencompass_upstream
from support.settings import GSM8K_SETTINGS


@pytest.fixture(scope="module")
def upstream():
    return opencompass_upstream.load()


@pytest.fixture(scope="module")
def upstream_config(upstream):
    return opencompass_upstream.execute_config(config_file(OPENCOMPASS_CONFIG), upstream)


def test_protocol_is_read_from_the_pinned_wheel(upstream_config):
    protocol = opencompass_protocol()
    assert protocol["source"]["version"] == VERSION == "0.5.1"
    infer = upstream_config["gsm8k_infer_cfg"]
    assert protocol["rounds"] == infer["prompt_template"]["template"]["round"]
    assert protocol["max_out_len"] == infer["inferencer"]["max_out_len"] == 512
    assert sum(turn["role"] == "BOT" for turn in protocol["rounds"]) == 4


@pytest.mark.parametrize("source_rows", ["offline", "hand"])
def test_prompt_equals_the_upstream_rendering(upstream, upstream_config, gsm8k_data, source_rows):
    rows = list(read_jsonl(gsm8k_data[1] / "eval.jsonl"))
    if source_rows == "hand":  # braces and an {answer} placeholder inside the question itself
        rows = [{"question": "Sam has {x} apples and 3 {answer} pears. How many?", "answer": "x\n#### 3"}]
    template = upstream_config["gsm8k_infer_cfg"]["prompt_template"]["template"]
    output_column = upstream_config["gsm8k_reader_cfg"]["output_column"]
    for row in rows:
        upstream_row = {"question": row["question"], "answer": row["answer"]}
        expected = opencompass_upstream.render_chat(upstream, template, upstream_row, output_column)
        assert public.format_prompt(row, opencompass_protocol()) == expected
        assert expected[-1] == {
            "role": "user",
            "content": f"Question: {row['question']}\nLet's think step by step\nAnswer:\n".replace("{answer}", ""),
        }


COMPLETIONS = [
    "So 3 + 4 = 7.\nThe answer is 7\n",
    "The answer is 1,234\n",
    "We get 12 apples.\nThe answer is 12\nQuestion: Tom has 3 pears. How many?\nAnswer: 3",
    "<think>first 5, then 6</think>It is 6",
    "reasoning</think> final 9",
    "-3.50 dollars",
    "no number at all",
    "",
    "1e5 is big, 2.0",
    "Question: 4 at the start",
]
GOLDS = ["work\n#### 7", "work\n#### 1,234", "work\n#### 12", "w\n#### 6", "w\n#### 9", "w\n#### -3",
         "w\n#### 7", "w\n#### 0", "w\n#### 2", "w\n#### 4"]


def test_extraction_and_matching_equal_the_upstream_postprocessors(upstream):
    evaluator = upstream.Gsm8kEvaluator()
    for completion in COMPLETIONS:
        upstream_pred = upstream.gsm8k_postprocess(upstream.extract_non_reasoning_content(completion))
        ours = public.extract_answer(completion)
        assert (ours if ours is not None else "NULL") == upstream_pred, completion
        for gold in GOLDS:
            upstream_gold = upstream.gsm8k_dataset_postprocess(gold)
            assert public.reference_answer({"answer": gold}) == upstream_gold
            assert public.is_correct(completion, {"answer": gold}) == evaluator.is_equal(upstream_pred, upstream_gold)


def test_workspace_gets_the_same_protocol_and_description_says_how_it_is_scored(workspace):
    exposed = json.loads((workspace / "task_protocol.json").read_text())
    assert exposed["rounds"] == opencompass_protocol()["rounds"]
    assert exposed["max_new_tokens"] == GSM8K_SETTINGS["max_new_tokens"]
    description = (workspace / "description.md").read_text()
    for fact in ("gsm8k_gen_1d7fe4", "4 worked examples", f"at most {GSM8K_SETTINGS['max_new_tokens']} new tokens",
                 "Question:", "last number", "task_protocol.json"):
        assert fact in description
    # The workspace's task.py reads its protocol from the file beside it, as an agent would load it.
    import importlib.util

    spec = importlib.util.spec_from_file_location("workspace_task", workspace / "task.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    row = {"question": "What is 2 + 2?", "answer": "#### 4"}
    assert module.format_prompt(row) == public.format_prompt(row, opencompass_protocol())


def test_hub_settings_use_the_protocol_length_unless_the_sweep_shortens_it():
    from rlbench.tasks.gsm8k import max_new_tokens

    assert max_new_tokens({**GSM8K_SETTINGS, "max_new_tokens": None}) == 512
    assert max_new_tokens(GSM8K_SETTINGS) == GSM8K_SETTINGS["max_new_tokens"]
    assert "at most 512 new tokens" in GSM8K().describe({**GSM8K_SETTINGS, "max_new_tokens": None})
