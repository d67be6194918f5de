"""AlpacaEval 2.0 (L2): offline data, alpaca_eval's metrics, and the task evaluated end to end
against the scripted judge endpoint (and the local judge on the tiny model)."""

from __future__ import annotations

import ast
import math
import re
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).parent / "fixtures"))

from rlbench.fileio.jsonio import read_jsonl  # noqa: E402
from rlbench.tasks import EvalContext, get_task  # noqa: E402
from rlbench.tasks.alpaca_eval import DATA, AlpacaEval  # noqa: E402
from rlbench.tasks.alpaca_eval.winrate import (  # noqa: E402
    LC_HUB,
    LC_OFFLINE,
    LengthControlUnavailable,
    compute_metrics,
)
from rlbench.tasks.base import salt_fingerprint  # noqa: E402
from scripted_judge import ScriptedJudge  # noqa: E402
from support.settings import REPO, TEST_SALT  # noqa: E402

REGISTRY = yaml.safe_load((REPO / "config/tasks/alpaca-eval.yaml").read_text())
SETTINGS = {**REGISTRY, "source": "offline", "train_size": 30, "eval_size": 6, "max_new_tokens": 8}
CATEGORIES = {"writing", "advice", "explanation", "lists", "coding", "math", "rewriting", "brainstorming"}


def normalized(text: str) -> str:
    return " ".join(re.findall(r"[a-z0-9]+", text.lower()))


def shingles(text: str, k: int = 3) -> set:
    words = normalized(text).split()
    return {tuple(words[i : i + k]) for i in range(max(1, len(words) - k + 1))}


@pytest.fixture(scope="module")
def alpaca_data(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("alpaca")
    AlpacaEval().prepare(SETTINGS, root / "train", root / "eval", salt=TEST_SALT)
    return root / "train", root / "eval"


class CannedModel:
    """A generation backend that answers each instruction from a table (default: "ok")."""

    name = "canned"

    def __init__(self, answers: dict[str, str]):
        self.answers = answers
        self.calls = []

    def generate_chat(self, conversations, max_new_tokens, stop=None):
        self.calls.append(max_new_tokens)
        return [self.answers.get(c[0]["content"], "ok") + "  \n" for c in conversations]  # the scorer strips


def context(settings, eval_dir, backend, tmp_path, replicate=0, **resources) -> EvalContext:
    return EvalContext(
        settings=settings,
        model_dir=tmp_path,
        eval_dir=eval_dir,
        resources={"judgment_cache": str(tmp_path / "judgments"), **resources},
        replicate=replicate,
        backend=backend,
    )


def scripted_settings(server: ScriptedJudge, **judge) -> dict:
    return {**SETTINGS, "judge": {"backend": "openai", "model": "scripted", "base_url": server.url,
                                  "retry_backoff_s": 0, "max_retries": 1, **judge}}  # fmt: skip


# -- the offline data -----------------------------------------------------------------------------


def test_offline_data_is_varied_and_disjoint():
    held_out = list(read_jsonl(DATA / "instructions.jsonl"))
    train = list(read_jsonl(DATA / "train.jsonl"))
    assert 55 <= len(held_out) <= 70 and 280 <= len(train) <= 320
    assert {row["category"] for row in held_out} == CATEGORIES
    assert all(row["instruction"].strip() and len(row["output"].split()) >= 10 for row in held_out)
    assert all(set(row) == {"instruction", "input", "output"} and row["output"].strip() for row in train)
    assert len({normalized(r["instruction"]) for r in held_out}) == len(held_out)
    train_texts = [r["instruction"] for r in train] + [f"{r['instruction']} {r['input']}" for r in train]
    assert not {normalized(r["instruction"]) for r in held_out} & {normalized(t) for t in train_texts}
    train_shingles = [shingles(t) for t in train_texts]
    for row in held_out:  # no near-duplicates: word-trigram Jaccard similarity below 0.6
        mine = shingles(row["instruction"])
        closest = max(len(mine & other) / len(mine | other) for other in train_shingles)
        assert closest < 0.6, row["instruction"]


def test_offline_split_is_salted_and_disjoint(alpaca_data, tmp_path):
    train_dir, eval_dir = alpaca_data
    rows = list(read_jsonl(eval_dir / "eval.jsonl"))
    assert [r["index"] for r in rows] == list(range(6)) and all(r["reference"] for r in rows)
    other = AlpacaEval().prepare_eval(SETTINGS, train_dir, tmp_path, salt="another-salt")
    assert other["salt_sha256"] == salt_fingerprint("another-salt") != salt_fingerprint(TEST_SALT)
    assert [r["instruction"] for r in read_jsonl(tmp_path / "eval.jsonl")] != [r["instruction"] for r in rows]
    with pytest.raises(ValueError, match="salt"):
        AlpacaEval().prepare_eval(SETTINGS, train_dir, tmp_path)
    assert len(list(read_jsonl(train_dir / "train.jsonl"))) == 30


def test_registry_entry_and_description():
    import jsonschema
    from rlbench.config import load_schema

    jsonschema.validate(REGISTRY, load_schema("task"))
    task = get_task(REGISTRY)
    assert isinstance(task, AlpacaEval) and task.noise_repeats(REGISTRY) == 3
    text = task.describe(SETTINGS)
    assert "NOT the grader's reward" in text and "length_controlled_minimal" in text and "3 times" in text


def test_public_module_is_stdlib_only_and_formats_prompts():
    public = AlpacaEval().public_module()
    assert public.format_prompt({"instruction": " Do X. ", "input": ""}) == [{"role": "user", "content": "Do X."}]
    assert public.format_prompt({"instruction": "Do X.", "input": "data"})[0]["content"] == "Do X.\n\ndata"
    assert public.format_target({"output": " Done. \n"}) == "Done."
    example = {"instruction": "Name two colours.", "output": "Red and blue are two colours."}
    good = public.proxy_reward("Red and blue are two colours, often used in flags and paintings.", example)
    assert 0 < public.proxy_reward("colours " * 200, example) < good <= 1
    assert public.proxy_reward("", example) == 0 and public.proxy_reward("hi<|im_end|>", example) == 0
    tree = ast.parse((DATA.parent / "public.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert imported <= set(sys.stdlib_module_names) | {"__future__"}


# -- the metric -----------------------------------------------------------------------------------


def test_reference_against_itself_gives_lc_50():
    rows = [{"index": i, "output_1": f"answer {i} " * (i + 1), "output_2": f"answer {i} " * (i + 1), "preference": 1.5}
            for i in range(8)]  # fmt: skip
    for method in (LC_OFFLINE, LC_HUB):  # hub: alpaca_eval's same-generator shortcut needs no df_gamed.csv
        metrics = compute_metrics(rows, lc_method=method)
        assert metrics["length_controlled_winrate"] == 50.0 and metrics["lc_standard_error"] == 0.0
        assert metrics["win_rate"] == 50.0 and metrics["n_draws"] == 8 and metrics["lc_method"] == method


def test_lc_removes_a_pure_length_preference():
    rows = []
    for i in range(40):
        longer = i % 4 != 0
        reference = "r" * (200 + 5 * i)
        output = "m" * (len(reference) + (150 if longer else -100) + i)
        rows.append({"index": i, "output_1": reference, "output_2": output, "preference": 1.85 if longer else 1.15})
    metrics = compute_metrics(rows, lc_method=LC_OFFLINE)
    assert metrics["win_rate"] == pytest.approx(67.5)
    assert metrics["lc_method"] == LC_OFFLINE and metrics["length_controlled_winrate"] < 55


def test_too_few_instructions_fall_back_to_the_win_rate():
    rows = [{"index": i, "output_1": "a" * (i + 1), "output_2": "b", "preference": 2.0} for i in range(3)]
    metrics = compute_metrics(rows, lc_method=LC_OFFLINE)
    assert metrics["lc_method"] == "win_rate" and metrics["win_rate"] == 100.0
    assert metrics["length_controlled_winrate"] is None and metrics["lc_unavailable"] == "too_few_judged"


def difficulty(i: int) -> float:
    return ((i * 7) % 10) / 2.5 - 2


def seed_hf_cache(cache: Path, n: int = 60) -> None:
    """A private HF cache holding a SYNTHETIC df_gamed.csv (values invented; only the shape is real):
    the gamed baselines' preferences follow the instruction difficulty, so the GLM weighs it."""
    import pandas as pd

    repo = cache / "datasets--tatsu-lab--alpaca_eval"
    snapshot = repo / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("0" * 40)
    columns = {
        "index": range(n),
        "preference": [1 / (1 + math.exp(difficulty(i))) for i in range(n)],
        "std_delta_len": [((i * 13) % 11 - 5) / 5 for i in range(n)],
        "instruction_difficulty": [difficulty(i) for i in range(n)],
        "not_gamed_baseline": False,
    }
    frames = [
        pd.DataFrame({"model": model, **columns})
        for model in ("gpt4_1106_preview_verbose", "gpt4_1106_preview_concise")
    ]
    pd.concat(frames, ignore_index=True).to_csv(snapshot / "df_gamed.csv", index=False)


def test_hub_lc_reads_df_gamed_and_keeps_alpaca_eval_indices(tmp_path, monkeypatch):
    import huggingface_hub.constants

    seed_hf_cache(tmp_path / "hf")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hf"))
    indices = [i for i in range(60) if i % 3]  # every third instruction dropped (judge failures)
    rows = [{"index": i, "output_1": "r" * (100 + 9 * i), "output_2": "m" * (80 + 13 * (i % 6)),
             "preference": 1 + 1 / (1 + math.exp(difficulty(i) - 1))} for i in indices]  # fmt: skip
    metrics = compute_metrics(rows, lc_method=LC_HUB, reference_name="gpt4_1106_preview")
    assert metrics["lc_method"] == LC_HUB and 0 <= metrics["length_controlled_winrate"] <= 100

    import pandas as pd
    from alpaca_eval.metrics import glm_winrate

    def direct(index):
        frame = pd.DataFrame({"output_1": [r["output_1"] for r in rows], "output_2": [r["output_2"] for r in rows],
                              "generator_1": "gpt4_1106_preview", "generator_2": "model",
                              "preference": [r["preference"] for r in rows]}, index=index)  # fmt: skip
        return glm_winrate.get_length_controlled_winrate(frame, save_weights_dir=None)["length_controlled_winrate"]

    assert metrics["length_controlled_winrate"] == pytest.approx(direct(pd.Index(indices)))
    # Row positions instead of AlpacaEval indices would give other instructions' difficulties.
    assert abs(metrics["length_controlled_winrate"] - direct(None)) > 1


def test_hub_lc_without_df_gamed_names_the_fix(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    rows = [{"index": i, "output_1": "r" * (10 + i), "output_2": "m" * (30 - i), "preference": 1.7} for i in range(6)]
    with pytest.raises(LengthControlUnavailable, match="hf download tatsu-lab/alpaca_eval df_gamed.csv"):
        compute_metrics(rows, lc_method=LC_HUB)


def test_hub_split_without_df_gamed_fails_at_data_preparation(tmp_path, monkeypatch):
    """Before any agent runs (prepare_eval_data), not at the first evaluation hours later."""
    import huggingface_hub.constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "empty"))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "train.jsonl").write_text('{"instruction": "Say hi.", "input": "", "output": "Hi."}\n')
    settings = {**SETTINGS, "source": "hub", "hub": {"path": "tatsu-lab/alpaca_eval"}}
    with pytest.raises(LengthControlUnavailable, match="df_gamed.csv"):
        AlpacaEval().prepare_eval(settings, tmp_path / "train", tmp_path)
    assert not (tmp_path / "eval.jsonl").exists()


# -- the task, end to end -------------------------------------------------------------------------

WIN = "WIN!"


def rigged(rows):
    """Answers and a judge script giving preferences 1.9, 1.6, 1.2, 1.1, 1.5 (same as the reference), 2.0."""
    plan = [("win", 0.9), ("win", 0.6), ("lose", 0.8), ("lose", 0.9), ("same", None), ("win", 1.0)]
    answers, rules = {}, []
    for row, (kind, p) in zip(rows, plan):
        if kind == "same":
            answers[row["instruction"]] = row["reference"]
            continue
        answers[row["instruction"]] = f"{WIN} yes" if kind == "win" else "no"
        rules.append(
            {"instruction": row["instruction"], "prefer": WIN if kind == "win" else "longer", "p": p, "fail": None}
        )
    return answers, {"default": {"fail": "http_500"}, "rules": rules}  # an instruction no rule names fails loudly


def test_win_rate_equals_hand_computed_values(alpaca_data, tmp_path):
    _, eval_dir = alpaca_data
    rows = list(read_jsonl(eval_dir / "eval.jsonl"))
    answers, script = rigged(rows)
    with ScriptedJudge(script) as server:
        model = CannedModel(answers)
        result = AlpacaEval().evaluate(context(scripted_settings(server), eval_dir, model, tmp_path))
        assert server.count == 10  # 5 differing answers x 2 orders; the one equal to the reference is a tie
    assert model.calls == [8]  # the settings' max_new_tokens
    m = result.metrics
    p = [0.9, 0.6, 0.2, 0.1, 0.5, 1.0]
    mean = sum(p) / 6
    sem = (sum((x - mean) ** 2 for x in p) / 5) ** 0.5 / 6**0.5
    assert m["win_rate"] == pytest.approx(55.0) and m["standard_error"] == pytest.approx(100 * sem)
    assert (m["n_wins"], m["n_wins_base"], m["n_draws"], m["n_total"]) == (3, 2, 1, 6)
    assert m["discrete_win_rate"] == pytest.approx(100 * 3.5 / 6)
    assert m["lc_method"] == LC_OFFLINE and result.primary == "length_controlled_winrate"
    assert 0 <= result.score <= 100 and m["judge_failures"] == 0 and m["judge_dropped"] == 0
    outputs = [answers[r["instruction"]] for r in rows]
    assert m["avg_length"] == pytest.approx(sum(map(len, outputs)) / 6, abs=0.005)
    assert [i["preference"] for i in result.items] == pytest.approx([1.9, 1.6, 1.2, 1.1, 1.5, 2.0])


def test_cached_rerun_asks_the_judge_nothing_and_repeats_ask_again(alpaca_data, tmp_path):
    _, eval_dir = alpaca_data
    answers, script = rigged(list(read_jsonl(eval_dir / "eval.jsonl")))
    with ScriptedJudge(script) as server:
        settings = scripted_settings(server)
        first = AlpacaEval().evaluate(context(settings, eval_dir, CannedModel(answers), tmp_path))
        again = AlpacaEval().evaluate(context(settings, eval_dir, CannedModel(answers), tmp_path))
        assert server.count == 10 and again.metrics["judge_requests"] == 0 and again.metrics["judge_cache_hits"] == 10
        assert again.metrics == {**first.metrics, "judge_requests": 0, "judge_cache_hits": 10}
        AlpacaEval().evaluate(context(settings, eval_dir, CannedModel(answers), tmp_path, replicate=1))
        assert server.count == 20  # the grader-noise repeat re-asks the (temperature 1) judge


def test_judge_failures_drop_instructions_and_are_reported(alpaca_data, tmp_path):
    _, eval_dir = alpaca_data
    rows = list(read_jsonl(eval_dir / "eval.jsonl"))
    answers, script = rigged(rows)
    script["rules"][0] = {**script["rules"][0], "fail": "refusal"}  # the 1.9 instruction: refused twice over
    script["rules"][2] = {**script["rules"][2], "fail": "http_500", "times": 1}  # 1.1: recovers on retry
    with ScriptedJudge(script) as server:
        result = AlpacaEval().evaluate(context(scripted_settings(server), eval_dir, CannedModel(answers), tmp_path))
    m = result.metrics
    assert (m["judge_failures"], m["judge_failures_by_kind"], m["judge_dropped"]) == (2, {"refusal": 2}, 1)
    assert m["n_total"] == 5 and m["n_instructions"] == 6
    assert m["win_rate"] == pytest.approx(100 * (0.6 + 0.2 + 0.1 + 0.5 + 1.0) / 5)  # not counted as a loss
    assert result.items[0]["preference"] is None and result.items[0]["failure"] == "refusal"
    from rlbench.tasks.base import public_metrics

    shown = public_metrics(result.to_dict())["metrics"]
    assert shown["judge_failures_by_kind"] == {"refusal": 2} and shown["lc_method"] == LC_OFFLINE


def test_a_judge_that_answers_nothing_fails_the_evaluation(alpaca_data, tmp_path):
    _, eval_dir = alpaca_data
    with ScriptedJudge({"default": {"fail": "http_500"}}) as server:
        with pytest.raises(RuntimeError, match=r"answered none of the 6 instructions.*http_error"):
            AlpacaEval().evaluate(
                context(scripted_settings(server, max_retries=0), eval_dir, CannedModel({}), tmp_path)
            )


def test_reference_answers_score_lc_50_without_judge_calls(alpaca_data, tmp_path):
    _, eval_dir = alpaca_data
    answers = {r["instruction"]: r["reference"] for r in read_jsonl(eval_dir / "eval.jsonl")}
    with ScriptedJudge({"default": {"fail": "http_500"}}) as server:
        result = AlpacaEval().evaluate(context(scripted_settings(server), eval_dir, CannedModel(answers), tmp_path))
        assert server.count == 0
    assert result.score == 50.0 and result.metrics["win_rate"] == 50.0 and result.metrics["n_draws"] == 6


def test_offline_default_local_judge_on_tiny_model(alpaca_data, tiny_model, tmp_path):
    _, eval_dir = alpaca_data
    settings = {**SETTINGS, "judge": {"backend": "local", "model": "tiny", "batch_size": 4}}
    ctx = EvalContext(
        settings=settings,
        model_dir=tiny_model,
        eval_dir=eval_dir,
        evaluation={"backend": "hf", "batch_size": 8},
        resources={"judge_model_dir": str(tiny_model), "judgment_cache": str(tmp_path / "judgments")},
    )
    result = get_task(settings).evaluate(ctx)
    assert result.n == 6 and 0 <= result.score <= 100 and result.metrics["judge_backend"] == "local"
    assert result.metrics["judge_failures"] == 0 and result.metrics["n_total"] == 6
    assert {i["parser"] for i in result.items} <= {"next_token", "identical"}
