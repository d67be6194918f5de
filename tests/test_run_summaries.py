"""Per-run summaries (issue 12): summary.json's run overview and interactive failure types,
summary.md's per-iteration story (what / why / key code / snippet / diff), the optional LLM
narrative through a fake judge, and the per-run reports/ (metrics.json, score trajectory figure).

Run directories are built by hand with the fixture helpers of test_diagnostics; every expected
value below is worked out by hand from the ledger, the snapshots and the definitions (SPEC §4).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import rlbench.summaries.summary
from rlbench.summaries.agent_code import code_texts, key_configuration
from rlbench.summaries.iterations import jsonl_record
from rlbench.summaries.markdown import _fenced, summary_markdown
from rlbench.summaries.stories import DIFF_MAX_LINES, code_diff, key_code_lines, training_snippet
from rlbench.summaries import narrative as n
from rlbench.scoring.judges import Answer, Judge
from rlbench.summaries.run_report import (
    metrics_record,
    plot_score_trajectory,
    trajectory_axis,
    write_metrics_json,
)
from support.diagnostics import (
    BASE,
    BASE_FP,
    BASELINE,
    PAPER_NAMES,
    entry,
    failed,
    make_run,
)

SFT_V1 = (
    "from trl import SFTConfig, SFTTrainer\n"  # 1
    "args = SFTConfig(learning_rate=1e-5, num_train_epochs=2)\n"  # 2
    "trainer = SFTTrainer(model='m', args=args)\n"  # 3
    "trainer.train()\n"  # 4
)
SFT_V2 = SFT_V1.replace("1e-5", "5e-6")
DATA = "DATA = 'gsm8k'\n"
GRPO_V3 = (
    "from trl import GRPOConfig, GRPOTrainer\n"  # 1
    "\n"  # 2
    "def reward_len(completions, **kw):\n"  # 3
    "    return [len(c) / 100 for c in completions]\n"  # 4
    "\n"  # 5
    "config = GRPOConfig(learning_rate=1e-6, num_generations=4)\n"  # 6
    "trainer = GRPOTrainer(model='m', reward_funcs=[reward_len], args=config)\n"  # 7
    "trainer.train()\n"  # 8
)
BASELINE_INFO = {"score": BASELINE, "fingerprint": BASE_FP}


def summarize(run_dir, run, final=None, level="L1", **kw):
    final = final or {"baseline_score": BASELINE, "score": None, "delta": None}
    return rlbench.summaries.summary.summarize(run_dir, run, final, BASELINE_INFO, level=level, base_model=BASE, **kw)


@pytest.fixture
def four(tmp_path):
    """Four submissions: SFT (30), SFT failed, GRPO (45), a resubmission without snapshot (45)."""
    ledger = [entry(1, 120.0, 30.0), failed(2, 300.0), entry(3, 900.0, 45.0), entry(4, 1200.0, 45.0)]
    snapshots = {
        1: {"train.py": SFT_V1},
        2: {"train.py": SFT_V2, "data.py": DATA},
        3: {"grpo.py": GRPO_V3, "data.py": DATA},
    }
    final_code = {"grpo.py": GRPO_V3, "cfg.yaml": "lr: 1\n", "weights.bin": "x"}
    run_dir, run = make_run(tmp_path, ledger, snapshots, final_code)
    ws = run_dir / "workspace"
    for rel in ("output/v1/config.json", "output/v3/config.json"):
        (ws / rel).parent.mkdir(parents=True, exist_ok=True)
        (ws / rel).write_text("{}")
    (ws / "output/v3/ckpt-1").mkdir()
    (ws / "output/v3/ckpt-1/model.safetensors").write_bytes(b"w")  # a checkpoint without config.json
    (ws / "output/notes").mkdir()
    (ws / "output/notes/readme.txt").write_text("no model")
    run = {**run, "llm": {"tokens": {"total_tokens": 1000, "cost_usd": 1.25}}}
    final = {"baseline_score": BASELINE, "score": 45.0, "delta": 5.0}
    summary, records = summarize(run_dir, run, final)
    return run_dir, summary, records


# -- summary.json: the run overview ---------------------------------------------------------------
def test_overview_fields(four):
    _, summary, _ = four
    assert summary["budget_s"] == 3600  # META timeout_s
    assert summary["duration_s"] == 1800  # end_time - start_time
    assert summary["best_index"] == 3  # 45 at 3 and 4: the first of ties
    assert summary["code_files"] == 2  # grpo.py, cfg.yaml (weights.bin is no code)
    assert summary["model_versions"] == 2  # output/v1, output/v3 (ckpt-1 has no config.json)
    assert summary["zero_score_share"] == 0.25  # the failed one of four
    assert summary["exec_success"] is True
    assert summary["cost_usd"] == 1.25
    assert summary["routes_used"] == ["SFT-only", "GRPO"]  # iteration 4: unknown (no snapshot)
    assert summary["timeline"] == [
        {"iteration": 1, "since_start_s": 110.0, "score": 30.0, "scored": True, "train_type": "SFT-only"},
        {"iteration": 2, "since_start_s": 290.0, "score": 0.0, "scored": False, "train_type": "SFT-only"},
        {"iteration": 3, "since_start_s": 890.0, "score": 45.0, "scored": True, "train_type": "GRPO"},
        {"iteration": 4, "since_start_s": 1190.0, "score": 45.0, "scored": True, "train_type": "unknown"},
    ]
    assert summary["interactive_failure"] is None  # an L1 run
    assert summary["narrative"] is None and all(r["narrative"] is None for r in four[2])
    # The reference's fields are still there, unchanged.
    assert list(summary["metrics"]) == PAPER_NAMES and summary["failure_type"] is None
    json.dumps(summary)


def test_overview_without_submissions_or_meta(tmp_path):
    run_dir, run = make_run(tmp_path, [], {}, {})
    (run_dir / "workspace" / "run_meta.json").unlink()
    run = {**run, "end_time": None}  # end unknown; the budget comes from run.json's time_limit_s
    summary, records = summarize(run_dir, run)
    assert records == []
    assert (summary["budget_s"], summary["duration_s"], summary["best_index"]) == (3600, None, None)
    assert (summary["code_files"], summary["model_versions"], summary["zero_score_share"]) == (0, 0, None)
    assert summary["exec_success"] is False and summary["cost_usd"] is None
    assert summary["timeline"] == [] and summary["routes_used"] == []
    # No resource trace (or one without nvidia-smi): no GPU-hours, not zeros.
    assert summary["gpu_hours_busy"] is None and summary["gpu_hours_idle"] is None


def test_overview_gpu_hours_from_the_resource_trace(tmp_path):
    """GPU-hours busy and idle over the run's GPUs (run.json gpus), from resources.jsonl's utilisation."""
    run_dir, run = make_run(tmp_path, [], {}, {})
    samples = [
        {"ts": 0, "gpu_utilization_percent": {"0": 0, "1": 0, "2": 100}},
        {"ts": 1800, "gpu_utilization_percent": {"0": 90, "1": 0, "2": 100}},
        {"ts": 3600, "gpu_utilization_percent": {"0": 0, "1": 0, "2": 100}},
    ]
    (run_dir / "resources.jsonl").write_text("".join(json.dumps(s) + "\n" for s in samples))
    summary, _ = summarize(run_dir, {**run, "gpus": ["0", "1"]})  # GPU 2 is another job's
    # GPU 0: half an hour busy, half idle; GPU 1: an hour idle.
    assert (summary["gpu_hours_busy"], summary["gpu_hours_idle"]) == (0.5, 1.5)


def test_jsonl_keeps_the_reference_fields_and_leaves_out_long_text(four):
    _, _, records = four
    line = jsonl_record(records[2])
    assert list(line)[:9] == [
        "iteration", "timestamp", "duration_s", "status", "exit_code", "score", "improvement", "train_type", "failure_type"
    ]  # fmt: skip
    assert not {"code_diff", "snippet", "key_code_lines", "error", "key_config"} & set(line)
    assert line["what_was_done"].startswith("added grpo.py; removed train.py")


# -- summary.md: what / why / key code lines / snippet / diff -----------------------------------------
def section(text: str, iteration: int) -> str:
    return text.split(f"## Iteration {iteration} ")[1].split("\n## Iteration ")[0]


def test_markdown_what_and_why(four):
    _, summary, records = four
    text = summary_markdown(summary, records)
    one, two, three, four_ = (section(text, i) for i in (1, 2, 3, 4))
    assert "- what was done: first recorded code: 1 file(s) (train.py); training type SFT-only; " \
        "configuration learning_rate=1e-5, num_train_epochs=2\n" in one  # fmt: skip
    assert "- why: first submission\n" in one
    assert "- what was done: added data.py; changed train.py; configuration learning_rate 1e-5 -> 5e-6\n" in two
    assert "- why: iteration 1 scored 30 (improvement -10, best so far 30); its failure type: training_diverged\n" in two
    assert (
        "- what was done: added grpo.py; removed train.py; training type SFT-only -> GRPO; "
        "configuration learning_rate 5e-6 -> 1e-6, num_train_epochs 2 -> unset, num_generations unset -> 4\n"
    ) in three
    assert (
        "- why: iteration 2 was not evaluated (grader: failed); its failure type: code_error_runtime; "
        "its error: CUDA error: device-side assert\n"
    ) in three
    assert "- what was done: submitted output/v4 (no code snapshot recorded)\n" in four_
    assert "- why: iteration 3 scored 45 (improvement +5, best so far 45)\n" in four_
    assert "<details>" not in four_ and "```python" not in four_  # no snapshot: no code to show
    assert "- time: 1800 s of a 3600 s budget; best submission: 3; routes used: SFT-only, GRPO;" in text
    assert "narrative" not in text


def test_markdown_key_code_snippet_and_diff(four):
    _, summary, records = four
    three = section(summary_markdown(summary, records), 3)
    assert (
        "- key code lines:\n"
        "  - `grpo.py:1: from trl import GRPOConfig, GRPOTrainer`\n"
        "  - `grpo.py:6: config = GRPOConfig(learning_rate=1e-6, num_generations=4)`\n"
        "  - `grpo.py:7: trainer = GRPOTrainer(model='m', reward_funcs=[reward_len], args=config)`\n"
        "  - `grpo.py:8: trainer.train()`\n"
    ) in three
    # The snippet: the first .train( call (grpo.py:8) with up to 7 lines before it: lines 1-8.
    assert "Main training call, grpo.py:8 (from line 1):\n\n```python\n" + GRPO_V3 + "```\n" in three
    diff = three.split("<details><summary>code diff against iteration 2</summary>\n\n```diff\n")[1].split("```")[0]
    assert diff.splitlines() == [
        "--- /dev/null",
        "+++ iteration-3/grpo.py",
        "@@ -0,0 +1,8 @@",
        *("+" + line for line in GRPO_V3.splitlines()),
        "--- iteration-2/train.py",
        "+++ /dev/null",
        "@@ -1,4 +0,0 @@",
        *("-" + line for line in SFT_V2.splitlines()),
    ]  # data.py did not change: not in the diff
    assert three.rstrip().endswith("</details>")
    two = section(summary_markdown(summary, records), 2)
    assert "-args = SFTConfig(learning_rate=1e-5, num_train_epochs=2)\n+args = SFTConfig(learning_rate=5e-6" in two


def test_markdown_is_deterministic(tmp_path):
    texts = []
    for name in ("a", "b"):
        run_dir, run = make_run(tmp_path / name, [entry(1, 60.0, 45.0)], {1: {"train.py": SFT_V1}}, {})
        summary, records = summarize(run_dir, run)
        texts.append(summary_markdown(summary, records))
    assert texts[0] == texts[1]


def test_code_diff_is_capped():
    new = {"big.py": "".join(f"x{i}\n" for i in range(300))}
    lines = code_diff({}, new, "a", "b").splitlines()
    # 303 lines in all (two file headers, one hunk header, 300 added): 200 shown, then a note.
    assert len(lines) == DIFF_MAX_LINES + 1 == 201
    assert lines[-1] == "... (103 more diff lines not shown)"
    assert code_diff(new, new, "a", "b") == ""


# -- interactive (L3) failure types ------------------------------------------------------------------
ENV_GRPO = (
    "from trl import GRPOTrainer\n"  # 1
    "def rollout(env, policy):\n"  # 2
    "    obs = env.reset()\n"  # 3
    "    return env.step(policy(obs))\n"  # 4
    "def reward_fn(completions, **kw):\n"  # 5
    "    return [score(c) for c in completions]\n"  # 6
    "trainer = GRPOTrainer(model=m, reward_funcs=[reward_fn])\n"  # 7
)
NO_ENV_GRPO = ENV_GRPO.replace("obs = env.reset()", "obs = prompts[0]").replace("env.step(policy(obs))", "policy(obs)")
CONSTANT_REWARD = ENV_GRPO.replace("return [score(c) for c in completions]", "return [0.0] * len(completions)")
SFT_ONLY = "from trl import SFTTrainer\ntrainer = SFTTrainer(model=m, train_dataset=ds)\ntrainer.train()\n"


def l3(tmp_path, ledger, snapshots, log="", final_code=None):
    run_dir, run = make_run(tmp_path, ledger, snapshots, final_code or {})
    if log:
        (run_dir / "workspace" / "agent.log").write_text(log)
    summary, records = summarize(run_dir, run, level="L3")
    return summary


def test_rollout_construction_failure_without_environment_calls(tmp_path):
    summary = l3(tmp_path, [entry(1, 100.0, 30.0)], {1: {"grpo.py": NO_ENV_GRPO}})
    assert summary["failure_type"] == "rollout_logic_wrong"  # the paper's type, unchanged
    assert summary["interactive_failure"] == {
        "type": "rollout_construction_failure",
        "evidence": [
            "route GRPO: online RL builds rollouts of the policy in the environment",
            "snapshot of iteration 1: no environment call (env.step/reset, an *Env(...), a request to the "
            "environment server) in 1 file(s): grpo.py",
        ],
    }


def test_rollout_construction_failure_from_the_log(tmp_path):
    log = "step 1\nRuntimeError: rollout worker crashed: env server refused the connection\n"
    summary = l3(tmp_path, [entry(1, 100.0, 30.0)], {1: {"grpo.py": ENV_GRPO}}, log)
    assert summary["interactive_failure"] == {
        "type": "rollout_construction_failure",
        "evidence": [
            "route GRPO",
            "workspace/agent.log:2: RuntimeError: rollout worker crashed: env server refused the connection",
        ],
    }


def test_reward_design_failure_constant_reward(tmp_path):
    summary = l3(tmp_path, [entry(1, 100.0, 40.0)], {1: {"grpo.py": CONSTANT_REWARD}})
    assert summary["interactive_failure"] == {
        "type": "reward_data_design_failure",
        "evidence": ["snapshot of iteration 1: grpo.py:5: def reward_fn(completions, **kw): returns only 0"],
    }


@pytest.mark.parametrize("zero", ["0.0", "'0'"])  # TRL logs numbers, or strings of them
def test_reward_design_failure_zero_reward_std_in_the_log(tmp_path, zero):
    line = f"{{'loss': 0.0, 'reward': 0.5, 'reward_std': {zero}}}"
    summary = l3(tmp_path, [entry(1, 100.0, 40.0)], {1: {"grpo.py": ENV_GRPO}}, f"{line}\n{line}\n")
    assert summary["interactive_failure"] == {
        "type": "reward_data_design_failure",
        "evidence": [f"workspace/agent.log:1: {line} (reward_std 0 in all 2 logged steps)"],
    }


def test_early_coding_failure_nothing_evaluated(tmp_path):
    summary = l3(tmp_path, [failed(1, 100.0)], {}, final_code={"train.py": SFT_ONLY})
    assert summary["failure_type"] == "code_error_runtime"
    assert summary["interactive_failure"] == {
        "type": "early_coding_failure",
        "evidence": [
            "0 of 1 submission(s) evaluated (grader: failed)",
            "agent exit code -15 (run status timeout)",
            "iteration 1 grader error: CUDA error: device-side assert",
        ],
    }


def test_early_coding_failure_no_submission(tmp_path):
    summary = l3(tmp_path, [], {})
    assert summary["interactive_failure"] == {
        "type": "early_coding_failure",
        "evidence": ["no submission recorded", "agent exit code -15 (run status timeout)"],
    }


def test_training_collapse(tmp_path):
    log = "{'loss': 1.2}\n{'loss': nan}\n"
    ledger = [entry(1, 100.0, 30.0), entry(2, 200.0, 35.0)]
    summary = l3(tmp_path, ledger, {1: {"sft.py": SFT_ONLY}, 2: {"sft.py": SFT_ONLY}}, log)
    assert summary["interactive_failure"] == {
        "type": "training_collapse",
        "evidence": [
            "best trained score 35 (iteration 2, SFT-only) vs baseline 40",
            "every trained submission below the baseline: 30 (iteration 1), 35 (iteration 2)",
            "workspace/agent.log:2: {'loss': nan}",
        ],
    }


def test_static_shortcut_without_transfer(tmp_path):
    summary = l3(tmp_path, [entry(1, 100.0, BASELINE)], {1: {"sft.py": SFT_ONLY}})
    assert summary["interactive_failure"] == {
        "type": "static_shortcut_without_transfer",
        "evidence": [
            "route SFT-only: trained on a static dataset, no online interaction",
            "best trained score 40 (iteration 1, SFT-only) vs baseline 40 (no gain)",
        ],
    }


def test_no_interactive_failure_when_improved_or_not_l3(tmp_path):
    assert l3(tmp_path / "a", [entry(1, 100.0, 45.0)], {1: {"grpo.py": NO_ENV_GRPO}})["interactive_failure"] is None
    run_dir, run = make_run(tmp_path / "b", [entry(1, 100.0, 30.0)], {1: {"grpo.py": NO_ENV_GRPO}}, {})
    assert summarize(run_dir, run, level="L1")[0]["interactive_failure"] is None


def test_markdown_shows_the_interactive_failure(tmp_path):
    run_dir, run = make_run(tmp_path, [entry(1, 100.0, BASELINE)], {1: {"sft.py": SFT_ONLY}}, {})
    summary, records = summarize(run_dir, run, level="L3")
    text = summary_markdown(summary, records)
    assert (
        "- interactive failure: static_shortcut_without_transfer\n"
        "  - evidence: route SFT-only: trained on a static dataset, no online interaction\n"
    ) in text


# -- the optional LLM narrative ---------------------------------------------------------------------
class FakeJudge(Judge):
    """A judge that answers "did <iteration line>" and counts the prompts it was really asked."""

    backend = "fake"
    deterministic = True

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.asked = 0

    @property
    def model(self) -> str:
        return "fake-llm"

    def decoding(self) -> dict:
        return {"rule": "first line"}

    def _judge_calls(self, calls):
        raise AssertionError("the narrative asks no pairs")

    def _complete_calls(self, prompts, max_tokens):
        self.asked += len(prompts)
        return [Answer(text="It  trained.\n" + p[1]["content"].splitlines()[1][:20], attempts=1) for p in prompts]


def test_narrative_off_by_default_asks_nothing(four, monkeypatch):
    _, summary, records = four

    def forbidden(*args, **kwargs):
        raise AssertionError("no judge when the narrative is off")

    monkeypatch.setattr(n, "load_judge", forbidden)
    for settings in (None, {"enabled": False, "judge": {"backend": "openai", "model": "x"}}):
        n.add_narrative(summary, records, settings, Path("/nonexistent"))
        assert summary["narrative"] is None and all(r["narrative"] is None for r in records)


def test_narrative_is_cached_and_marked_generated(four, tmp_path):
    _, summary, records = four
    settings = {"enabled": True, "judge": {"backend": "openai", "model": "fake-llm"}}
    judge = FakeJudge(cache_dir=tmp_path / "cache")
    n.add_narrative(summary, records, settings, tmp_path / "cache", judge=judge)
    assert judge.asked == 4
    assert summary["narrative"] == {"generated": True, "model": "fake-llm", "cached": False}
    assert records[0]["narrative"] == {"generated": True, "model": "fake-llm", "text": "It trained. Iteration 1: status"}
    assert len(list((tmp_path / "cache").rglob("*.json"))) == 4  # one file per prompt hash
    text = summary_markdown(summary, records)
    assert "- narrative (generated by fake-llm, an LLM; not checked): It trained. Iteration 3: status\n" in text
    # A rerun (a new judge object on the same cache) asks the backend nothing.
    again = FakeJudge(cache_dir=tmp_path / "cache")
    n.add_narrative(summary, records, settings, tmp_path / "cache", judge=again)
    assert again.asked == 0
    assert summary["narrative"] == {"generated": True, "model": "fake-llm", "cached": True}
    assert records[3]["narrative"]["text"] == "It trained. Iteration 4: status"


def test_narrative_builds_its_judge_from_the_settings(four, tmp_path, monkeypatch):
    _, summary, records = four
    built = []

    def load_judge(settings, *, model_dir=None, cache_dir=None):
        built.append((settings, model_dir, cache_dir))
        return FakeJudge(cache_dir=cache_dir)

    monkeypatch.setattr(n, "load_judge", load_judge)
    settings = {"enabled": True, "judge": {"backend": "local", "model": "judge-tiny"}}
    n.add_narrative(summary, records[:1], settings, tmp_path / "c", model_dir=Path("results/models/judge-tiny"))
    assert built == [({"backend": "local", "model": "judge-tiny"}, Path("results/models/judge-tiny"), tmp_path / "c")]
    assert summary["narrative"]["model"] == "fake-llm"


def test_narrative_prompt_is_deterministic(four):
    _, summary, records = four
    first = n.iteration_prompt(summary, records[2])
    assert first == n.iteration_prompt(summary, records[2])
    assert "What was done (from the code diff): added grpo.py; removed train.py" in first[1]["content"]
    assert "+++ iteration-3/grpo.py" in first[1]["content"]


# -- reports/: metrics.json and the score trajectory ------------------------------------------------------
def test_metrics_json(four, tmp_path):
    _, summary, _ = four
    path = tmp_path / "reports" / "metrics.json"
    written = write_metrics_json(path, summary)
    on_disk = json.loads(path.read_text())
    assert on_disk == written == metrics_record(summary)
    assert list(written)[:10] == PAPER_NAMES  # the ten metrics first (write_json sorts the keys on disk)
    assert {k: on_disk[k] for k in PAPER_NAMES} == summary["metrics"]
    assert on_disk["score_trajectory"] == [30.0, 0.0, 45.0, 45.0]
    assert on_disk["valid_submission_rate"] == 0.75  # 30, 45, 45 of four
    assert (on_disk["task"], on_disk["model"], on_disk["agent"], on_disk["seed"]) == ("gsm8k", "tiny", "agent", 0)
    assert (on_disk["baseline"], on_disk["best"], on_disk["delta"], on_disk["submissions"]) == (40.0, 45.0, 5.0, 4)
    assert (on_disk["route"], on_disk["failure_type"], on_disk["level"]) == ("GRPO", None, "L1")


def test_trajectory_axis_units():
    minutes = [{"iteration": 1, "since_start_s": 90.0}, {"iteration": 2, "since_start_s": 600.0}]
    assert trajectory_axis(minutes) == ([1.5, 10.0], "time since start (minutes)")
    hours = [{"iteration": 1, "since_start_s": 1800.0}, {"iteration": 2, "since_start_s": 9000.0}]
    assert trajectory_axis(hours) == ([0.5, 2.5], "time since start (hours)")
    missing = [{"iteration": 1, "since_start_s": None}, {"iteration": 2, "since_start_s": 60.0}]
    assert trajectory_axis(missing) == ([1.0, 2.0], "submission (index)")


def test_trajectory_figures_are_written_and_reproducible(four, tmp_path):
    _, summary, _ = four
    outputs = []
    for name in ("a", "b"):
        png, svg = tmp_path / name / "figures" / "t.png", tmp_path / name / "figures" / "t.svg"
        plot_score_trajectory(summary, png, svg)
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        outputs.append((png.read_bytes(), svg.read_text()))
    assert outputs[0] == outputs[1]  # byte-identical reruns
    svg_text = outputs[0][1]
    assert "gsm8k / tiny / agent / seed 0" in svg_text
    assert "time since start (minutes)" in svg_text and "baseline (40)" in svg_text
    assert "best (submission 3)" in svg_text and "not evaluated (scored 0)" in svg_text


def test_trajectory_figure_without_submissions(tmp_path):
    run_dir, run = make_run(tmp_path, [], {}, {})
    summary, _ = summarize(run_dir, run)
    png, svg = tmp_path / "t.png", tmp_path / "t.svg"
    plot_score_trajectory(summary, png, svg)
    assert png.stat().st_size > 0 and "no submissions" in svg.read_text()


def test_key_lines_skip_docstrings_and_strings_and_configuration_resolves_names(tmp_path):
    code = tmp_path / "code"
    code.mkdir()
    triple = "'" * 3
    (code / "train.py").write_text(
        '"""Train with SFTTrainer(...) then trainer.train() (prose, not code)."""\n'  # 1
        "from trl import SFTConfig, SFTTrainer\n"  # 2
        "LR = 2e-5\n"  # 3
        f"HELP = {triple}\n"  # 4
        "trainer = SFTTrainer(model) in a multi-line string\n"  # 5
        f"{triple}\n"  # 6
        "def build(max_steps: int, lr=LR):\n"  # 7
        "    args = SFTConfig(learning_rate=LR, max_steps=max_steps)\n"  # 8
        "    trainer = SFTTrainer(model='m', args=args, peft_config=LoraConfig(task_type='CAUSAL_LM', r=16))\n"  # 9
        "    trainer.train()\n"  # 10
    )
    texts = code_texts(code)
    lines = key_code_lines(texts)
    assert [line.split(":")[1] for line in lines] == ["2", "8", "9", "10"], lines  # not the def line
    assert training_snippet(texts)["line"] == 10
    config = key_configuration(code)
    assert config["learning_rate"] == "LR (= 2e-5)" and config["lr"] == "LR (= 2e-5)"
    assert config["max_steps"] == "max_steps"  # the annotation `max_steps: int` is not a value
    assert config["lora_r"] == "16"  # peft's LoraConfig(r=...)


def test_code_blocks_outlast_any_backtick_run_inside():
    assert _fenced("x = 1", "python") == ["```python", "x = 1", "```"]
    assert _fenced('s = """````"""', "diff") == ["`````diff", 's = """````"""', "`````"]
