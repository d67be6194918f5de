"""The annotators a pairwise judge can run (`judge.annotator`): which prompt it asks, in which order, how it
reads the answer, and what a failed call means for the win rate. Each name is the label an evaluation
records in its metrics (`annotator`).

- `reference_gpt52_fn`: the reference harness's (RD-Agent's `annotators_gpt52_fn`, shipped beside this
  file with its citation): alpaca_eval's function-calling ranking prompt on gpt-5.2, temperature 0,
  max_tokens 100, the `make_partial_leaderboard` tool forced; the preference is m's rank (discrete: 1 or
  2). One call per instruction, in alpaca_eval's order: the outputs are swapped when
  `random.Random("is_switched_outputs" + instruction + "0").choices([False, True])[0]` (alpaca_eval's
  RandomSwitchTwoColumnsProcessor, seed 0), and a swapped answer is mapped back with 3 - x. A failed
  call is what alpaca_eval makes of it: no preference (out of the win rate; the LC GLM still predicts
  that instruction, as alpaca_eval's does for a NaN preference).
- `paper_gpt4o`: the paper's variant: the same prompt, tool, decoding, parser and order on gpt-4o (the
  paper: GPT-4o on Azure); a failed call (a content-filter refusal, an unparsable answer, any error left
  after the retries) counts as a loss.
- `weighted_gpt4_turbo`: this project's earlier protocol: AlpacaEval 2.0's default annotator prompt
  (`weighted_alpaca_eval_gpt4_turbo`: one token, m or M, weighted by its logprobs) on gpt-4-1106-preview,
  asked in both orders (the mean of the two cancels position bias); a failed call drops its instruction
  from every rate.
- `weighted_local`: what a local (transformers) judge runs, whatever is configured: the weighted prompt,
  both orders, the preference from the model's next-token probabilities of m and M, failures dropped. A
  small local model cannot make function calls.

The model each annotator names is the one it was defined with; `judge.model` is what is asked (an Azure
deployment may carry another name), recorded beside the label as `judge_model`.
"""

from __future__ import annotations

import ast
import hashlib
import json
import random
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from rlbench.scoring.judges.prompt import (
    ANNOTATOR as WEIGHTED_CONFIG,
    PromptTemplateError,
    fill_messages,
    render_messages,
    split_chatml_template,
    template_sha256,
)

REFERENCE_FN = "reference_gpt52_fn"
PAPER_FN = "paper_gpt4o"
WEIGHTED = "weighted_gpt4_turbo"
WEIGHTED_LOCAL = "weighted_local"

#: What a failed call becomes: left out of every rate; alpaca_eval's NaN preference; a loss (preference 1).
DROP, ALPACA_EVAL_NAN, LOSS = "drop", "alpaca_eval", "loss"

RANKING_DIR = Path(__file__).with_name("annotators_gpt52_fn")  # the reference's files, byte for byte
RANKING_CONFIG = "alpaca_eval_gpt5_2_fn"  # the annotator's name in its configs.yaml
SWITCH_SEED = 0  # alpaca_eval's annotator seed (BaseAnnotator default), handed to its processors
_SWITCH_COLUMN = "is_switched_outputs"


class AnnotatorError(ValueError):
    """An unknown annotator, or its shipped files are missing or changed."""


@dataclass(frozen=True)
class Annotator:
    name: str  # the label recorded in the metrics
    kind: str  # "weighted": one token m/M; "ranking": the make_partial_leaderboard function call
    model: str | None  # the judge model the protocol names (None: a local model)
    single_order: bool  # True: one call per pair in alpaca_eval's seeded order; False: both orders
    on_failure: str  # DROP, ALPACA_EVAL_NAN or LOSS
    config: str  # the alpaca_eval annotator config it follows (part of the judge's identity)
    summary: str  # one line for task descriptions

    @property
    def ranking(self) -> bool:
        return self.kind == "ranking"

    def render(self, instruction: str, first: str, second: str) -> list[dict]:
        """The chat messages showing `first` as model "m" and `second` as "M"."""
        if self.ranking:
            return fill_messages(ranking_template_messages(), instruction, first, second)
        return render_messages(instruction, first, second)

    def template_sha256(self) -> str:
        return ranking_template_sha256() if self.ranking else template_sha256()


_RANKING_SUMMARY = (
    "alpaca_eval's function-calling ranking prompt (make_partial_leaderboard), temperature 0, one call per "
    "instruction with the order of the two answers drawn by alpaca_eval's seeded hash of the instruction, "
    "a discrete preference"
)
ANNOTATORS = {
    REFERENCE_FN: Annotator(
        REFERENCE_FN, "ranking", "gpt-5.2", True, ALPACA_EVAL_NAN, RANKING_CONFIG,
        f"the reference harness's annotator: {_RANKING_SUMMARY}; a failed call has no preference",
    ),
    PAPER_FN: Annotator(
        PAPER_FN, "ranking", "gpt-4o", True, LOSS, RANKING_CONFIG,
        f"the paper's annotator: {_RANKING_SUMMARY}; a failed or refused call counts as a loss",
    ),
    WEIGHTED: Annotator(
        WEIGHTED, "weighted", "gpt-4-1106-preview", False, DROP, WEIGHTED_CONFIG,
        "AlpacaEval 2.0's default prompt (one token, m or M, weighted by its probability), asked in both "
        "orders; a failed call drops its instruction",
    ),
    WEIGHTED_LOCAL: Annotator(
        WEIGHTED_LOCAL, "weighted", None, False, DROP, WEIGHTED_CONFIG,
        "AlpacaEval 2.0's default prompt read by a local model (its next-token probabilities of m and M), "
        "asked in both orders; a failed call drops its instruction",
    ),
}  # fmt: skip
#: The names `judge.annotator` takes for an OpenAI-compatible judge (a local judge runs WEIGHTED_LOCAL).
CONFIGURABLE = (REFERENCE_FN, PAPER_FN, WEIGHTED)


def get_annotator(name: str | None) -> Annotator:
    """The annotator of that name (None: WEIGHTED, the judges' default), or AnnotatorError naming the choices."""
    name = WEIGHTED if name is None else name
    if name not in ANNOTATORS:
        raise AnnotatorError(f"unknown judge annotator {name!r}; use one of {', '.join(ANNOTATORS)}")
    return ANNOTATORS[name]


def is_switched(instruction: str, seed: int = SWITCH_SEED) -> bool:
    """alpaca_eval's per-instruction order: True when output_2 (the model) is shown first, as "m"."""
    return random.Random(_SWITCH_COLUMN + instruction + str(seed)).choices([False, True], k=1)[0]


# --- the ranking annotator's files (the reference's configs.yaml and alpaca_eval_fn.txt) ---


@lru_cache(maxsize=None)
def ranking_config() -> dict:
    """The reference's annotator config (configs.yaml: prompt_template, completions_kwargs, parser)."""
    import yaml

    path = RANKING_DIR / "configs.yaml"
    try:
        configs = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as exc:
        raise AnnotatorError(f"cannot read the ranking annotator's config {path} ({exc}); restore it from git") from exc
    if not isinstance(configs, dict) or list(configs) != [RANKING_CONFIG]:
        raise AnnotatorError(f"{path} should define the one annotator {RANKING_CONFIG}; restore it from git")
    return configs[RANKING_CONFIG]


@lru_cache(maxsize=None)
def ranking_template_text() -> str:
    config = ranking_config()
    path = RANKING_DIR.parent / config["prompt_template"]  # alpaca_eval resolves it from the config dir's parent
    try:
        return path.read_text()
    except OSError as exc:
        raise AnnotatorError(f"cannot read the ranking annotator's prompt {path} ({exc}); restore it from git") from exc


@lru_cache(maxsize=None)
def ranking_template_messages() -> tuple[tuple[str, str], ...]:
    try:
        return split_chatml_template(ranking_template_text(), ranking_config()["prompt_template"])
    except PromptTemplateError as exc:
        raise AnnotatorError(str(exc)) from exc


def ranking_template_sha256() -> str:
    return hashlib.sha256(ranking_template_text().encode()).hexdigest()


def ranking_decoding() -> dict:
    """The request's parameters besides model and messages, as alpaca_eval's openai_completions sends them:
    the config's completions_kwargs (max_tokens, temperature, tool_choice, tools) and top_p 1.0."""
    kwargs = {k: v for k, v in ranking_config()["completions_kwargs"].items() if k != "model_name"}
    return {**kwargs, "top_p": 1.0}


def ranking_answer_text(message: dict) -> Any:
    """The text alpaca_eval parses from a chat message: the first tool call's arguments, else a legacy
    function call's, else the content ("" read as " "; None stays None)."""
    tool_calls = message.get("tool_calls") or []
    if tool_calls and isinstance(tool_calls[0], dict):
        return (tool_calls[0].get("function") or {}).get("arguments")
    function_call = message.get("function_call")
    if isinstance(function_call, dict):
        return function_call.get("arguments")
    content = message.get("content")
    return " " if content == "" else content


def parse_ranking(text: Any) -> float | None:
    """m's rank (1.0 or 2.0) from a ranking answer, read with the config's parser as alpaca_eval reads it
    (pipeline_meta_parser: json_parser(annotation_key="ordered_models"), then ranking_parser(model_1_name="m");
    one annotation expected); None when alpaca_eval would have no preference."""
    config = ranking_config()
    steps = config["completion_parser_kwargs"]["parsers_to_kwargs"]
    if config["fn_completion_parser"] != "pipeline_meta_parser" or list(steps) != ["json_parser", "ranking_parser"]:
        raise AnnotatorError(f"unexpected parser in {RANKING_DIR / 'configs.yaml'}; restore it from git")
    try:
        found = _json_parser(text, **steps["json_parser"])
        ranks = [_ranking_parser(item, **steps["ranking_parser"]) for item in found]
    except Exception:  # alpaca_eval's _parse_completions: any parse error = no annotation
        return None
    if len(ranks) != 1 or ranks[0] is None:  # batch_size 1
        return None
    return float(ranks[0])


def _json_parser(completion: Any, annotation_key: str | None) -> list:
    """alpaca_eval's completion_parsers.json_parser (0.6.6), for one completion."""
    if completion == "":
        raise ValueError("The completion is empty.")
    if "```json" in completion:
        completion = re.search(r"```json(.*?)```", completion, re.DOTALL).group(1)
    loaded = json.loads(completion)
    if isinstance(loaded, dict):
        return [loaded[annotation_key] if annotation_key is not None else loaded]
    return [d[annotation_key] if annotation_key is not None else d for d in loaded]


def _ranking_parser(completion: Any, model_1_name: str = "model_1") -> Any:
    """alpaca_eval's completion_parsers.ranking_parser (0.6.6), squeezed: the rank, or None for its NaN."""
    if completion == "":
        raise ValueError("The completion is empty.")
    try:
        ordered = ast.literal_eval(completion) if isinstance(completion, str) else completion
        rank = [c for c in ordered if c["model"] == model_1_name][0]["rank"]
        assert rank in [1, 2]
        return rank
    except Exception:
        return None


def annotator_files() -> list[Path]:
    """The shipped files an annotator reads (provenance, beside the judge's code)."""
    return sorted(p for p in RANKING_DIR.resolve().iterdir() if p.is_file())
