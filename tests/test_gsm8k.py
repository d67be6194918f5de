"""GSM8K: answer extraction as in the reference, scoring, and a leak-free offline twin."""

from __future__ import annotations

import pytest

from rlbench.generation.backends import GenerationBackend
from rlbench.fileio.jsonio import read_jsonl
from rlbench.tasks.base import EvalContext
from rlbench.tasks.gsm8k import GSM8K, opencompass_protocol, public
from support.settings import GSM8K_SETTINGS, TEST_SALT


@pytest.mark.parametrize(
    "text,expected",
    [
        ("so 3+4=7\nThe answer is 7", "7"),
        ("The answer is 1,234", "234"),  # OpenCompass does not strip commas from predictions
        ("answer -5.0 and later 9", "9"),
        ("The answer is 12\nQuestion: Tom has 3 apples", "12"),  # cut at the next question
        ("<think>maybe 3</think>The answer is 8", "8"),
        ("nothing numeric", None),
    ],
)
def test_extract_answer_is_opencompass_gsm8k_postprocess(text, expected):
    assert public.extract_answer(text) == expected


def test_reward_is_exact_match_of_final_number():
    example = {"question": "q", "answer": "2+2=4\n#### 4"}
    assert public.reward("It is 4.00", example) == 1.0
    assert public.reward("The answer is 5", example) == 0.0


def test_reference_answer_is_the_number_after_the_marker_without_commas():
    assert public.reference_answer({"answer": "work\n#### 1,234"}) == "1234"


def test_offline_splits_are_disjoint_and_well_formed(gsm8k_data):
    train = list(read_jsonl(gsm8k_data[0] / "train.jsonl"))
    held_out = list(read_jsonl(gsm8k_data[1] / "eval.jsonl"))
    assert len(train) == GSM8K_SETTINGS["train_size"] and len(held_out) == GSM8K_SETTINGS["eval_size"]
    assert not {r["question"] for r in train} & {r["question"] for r in held_out}
    assert all(public.reference_answer(r) is not None and "####" in r["answer"] for r in train + held_out)


def test_offline_twin_is_reproducible(tmp_path, gsm8k_data):
    GSM8K().prepare(GSM8K_SETTINGS, tmp_path / "train", tmp_path / "eval", salt=TEST_SALT)
    assert (tmp_path / "eval" / "eval.jsonl").read_bytes() == (gsm8k_data[1] / "eval.jsonl").read_bytes()


class OracleBackend(GenerationBackend):
    """Answers the first half of the problems right, the rest wrong."""

    name = "oracle"

    def __init__(self, rows):
        protocol = opencompass_protocol()
        self.answers = {public.format_prompt(r, protocol)[-1]["content"]: public.reference_answer(r) for r in rows}

    def generate_chat(self, conversations, max_new_tokens, stop=None):
        out = []
        for i, conv in enumerate(conversations):
            gold = self.answers[conv[-1]["content"]]
            out.append(f"The answer is {gold}" if i < len(conversations) // 2 else "The answer is -1")
        return out


def test_evaluate_scores_exact_match_percentage(gsm8k_data):
    rows = list(read_jsonl(gsm8k_data[1] / "eval.jsonl"))
    ctx = EvalContext(GSM8K_SETTINGS, None, gsm8k_data[1], backend=OracleBackend(rows))
    result = GSM8K().evaluate(ctx)
    assert result.n == 4 and result.metrics["correct"] == 2 and result.score == 50.0
    assert result.primary == "accuracy" and result.metrics["accuracy"] == 50.0


def test_tiny_model_evaluates_through_the_hf_backend(tiny_model, gsm8k_data):
    from rlbench.evaluation.evaluate import evaluate_model

    result = evaluate_model(GSM8K_SETTINGS, tiny_model, gsm8k_data[1], {"backend": "hf", "batch_size": 2})
    assert result["backend"] == "hf" and result["n"] == 4 and len(result["items"]) == 4


def test_hub_source_without_network_says_to_use_the_offline_twin(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))  # no cached copy of the dataset
    settings = {**GSM8K_SETTINGS, "source": "hub", "hub": {"path": "openai/gsm8k", "name": "main"}}
    with pytest.raises(RuntimeError, match="source: offline"):
        GSM8K().prepare(settings, tmp_path / "train", tmp_path / "eval")
