"""Addition control: pair-disjoint seeded splits, prompt, extraction, reward, evaluation."""

from __future__ import annotations

import pytest
import yaml

from rlbench.config import Registries
from rlbench.generation.backends import GenerationBackend
from rlbench.fileio.jsonio import read_jsonl
from rlbench.tasks import get_task
from rlbench.tasks.addition_control import AdditionControl, public
from rlbench.tasks.base import EvalContext
from support.settings import REPO, TEST_SALT

SETTINGS = {
    "name": "addition-control",
    "level": "control",
    "module": "addition_control",
    "source": "offline",
    "train_size": 300,
    "eval_size": 20,
    "data_seed": 0,
    "max_new_tokens": 8,
}
N_PAIRS = 90 * 91 // 2  # unordered pairs of two-digit operands


def _pair(row):
    return frozenset((row["a"], row["b"]))


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("addition")
    manifest = AdditionControl().prepare(SETTINGS, root / "train", root / "eval", salt=TEST_SALT)
    return root / "train", root / "eval", manifest


def test_registry_entry_is_a_control_kept_out_of_paper_tables():
    entry = Registries.load().tasks["addition-control"]
    assert entry["level"] == "control" and entry["paper"] is False and entry["source"] == "offline"
    assert isinstance(get_task(entry), AdditionControl)
    assert "paper" not in yaml.safe_load((REPO / "config/tasks/gsm8k.yaml").read_text())  # absent = true


def test_splits_are_disjoint_by_operand_pair_and_well_formed(data):
    train, held_out = list(read_jsonl(data[0] / "train.jsonl")), list(read_jsonl(data[1] / "eval.jsonl"))
    assert data[2]["train_rows"] == len(train) == 300 and data[2]["eval_rows"] == len(held_out) == 20
    assert not {_pair(r) for r in train} & {_pair(r) for r in held_out}  # neither a + b nor b + a
    assert len({_pair(r) for r in train}) == len(train)  # no pair twice, in either order
    for row in train + held_out:
        assert 10 <= row["a"] <= 99 and 10 <= row["b"] <= 99
        assert row["question"] == f"What is {row['a']} + {row['b']}?"
        assert public.reference_answer(row) == row["answer"] == str(row["a"] + row["b"])
    assert any(r["a"] > r["b"] for r in train) and any(r["a"] < r["b"] for r in train)  # both orders occur


def test_splits_are_seeded_and_grow_without_reordering(tmp_path, data):
    task = AdditionControl()
    task.prepare_train({**SETTINGS, "train_size": 50}, tmp_path / "a")
    first_train = list(read_jsonl(data[0] / "train.jsonl"))
    assert list(read_jsonl(tmp_path / "a" / "train.jsonl")) == first_train[:50]
    task.prepare_eval({**SETTINGS, "eval_size": 30}, data[0], tmp_path / "c", salt=TEST_SALT)
    assert list(read_jsonl(tmp_path / "c" / "eval.jsonl"))[:20] == list(read_jsonl(data[1] / "eval.jsonl"))
    task.prepare({**SETTINGS, "data_seed": 1}, tmp_path / "b" / "train", tmp_path / "b" / "eval", salt=TEST_SALT)
    assert list(read_jsonl(tmp_path / "b" / "train" / "train.jsonl")) != first_train


def test_too_large_splits_and_a_hub_source_are_refused(tmp_path):
    task = AdditionControl()
    with pytest.raises(RuntimeError, match="train_size \\+ eval_size"):
        task.prepare({**SETTINGS, "train_size": N_PAIRS - 5, "eval_size": 10}, tmp_path / "t", tmp_path / "e",
                     salt=TEST_SALT)
    with pytest.raises(ValueError, match="only an offline source"):
        task.prepare_train({**SETTINGS, "source": "hub"}, tmp_path / "t2")


def test_prompt_target_and_description():
    example = {"question": "What is 47 + 38?", "answer": "85", "a": 47, "b": 38}
    assert public.format_prompt(example) == [
        {"role": "user", "content": "What is 47 + 38? Answer with the number only."}
    ]
    assert public.format_target(example) == "85"
    text = " ".join(AdditionControl().describe(SETTINGS).split())
    assert "20 problems" in text and "at most 8 new tokens" in text and "first integer" in text


@pytest.mark.parametrize(
    "text,expected",
    [
        ("85", "85"),
        ("The answer is 85.", "85"),
        ("085", "85"),
        ("47 + 38 = 85", "47"),  # only the first number counts
        ("-3 then 4", "-3"),
        ("no number here", None),
        ("", None),
    ],
)
def test_extract_answer_takes_the_first_integer(text, expected):
    assert public.extract_answer(text) == expected


def test_reward_is_exact_match_of_the_first_number():
    example = {"question": "What is 47 + 38?", "answer": "85"}
    assert public.reward("85", example) == 1.0 and public.is_correct("85<|im_end|>", example)
    assert public.reward("84", example) == 0.0
    assert public.reward("47 + 38 = 85", example) == 0.0
    assert public.reward("I do not know", example) == 0.0


class OracleBackend(GenerationBackend):
    """Answers the first half of the problems right, the rest wrong."""

    name = "oracle"

    def generate_chat(self, conversations, max_new_tokens, stop=None):
        out = []
        for i, conversation in enumerate(conversations):
            a, b = (int(x) for x in conversation[0]["content"].split("?")[0].removeprefix("What is ").split(" + "))
            out.append(str(a + b) if i < len(conversations) // 2 else f"{a} + {b}")
        return out


def test_evaluate_scores_exact_match_percentage(data):
    result = AdditionControl().evaluate(EvalContext(SETTINGS, None, data[1], backend=OracleBackend()))
    assert result.n == 20 and result.metrics["correct"] == 10 and result.score == 50.0


def test_tiny_model_evaluates_through_the_hf_backend(tmp_path, tiny_model):
    from rlbench.evaluation.evaluate import evaluate_model

    settings = {**SETTINGS, "train_size": 4, "eval_size": 3}
    AdditionControl().prepare(settings, tmp_path / "train", tmp_path / "eval", salt=TEST_SALT)
    result = evaluate_model(settings, tiny_model, tmp_path / "eval", {"backend": "hf", "batch_size": 2})
    assert result["backend"] == "hf" and result["n"] == 3 and len(result["items"]) == 3
    assert all(item["reference"] is not None for item in result["items"])
