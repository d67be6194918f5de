"""AlpacaEval 2.0's metrics, computed by the alpaca_eval package itself.

- `win_rate`, `standard_error`, `n_wins`, `n_wins_base`, `n_draws`, `n_total`, `discrete_win_rate`:
  `alpaca_eval.metrics.get_winrate` over the judged instructions.
- `length_controlled_winrate`, `lc_standard_error`: `alpaca_eval.metrics.get_length_controlled_winrate`
  with `save_weights_dir=None` (nothing is written into site-packages), by one of two GLMs, named
  in `lc_method`:
  - `length_controlled_v1` (the leaderboard's) for the real 805 instructions: it needs
    alpaca_eval's `df_gamed.csv` (instruction difficulties and the gamed baselines it regularises
    toward) from the HF dataset tatsu-lab/alpaca_eval, through the HF cache. A row's instruction is
    its DataFrame index (alpaca_eval reads it with reset_index()), so dropping a failed instruction
    never shifts another's difficulty.
  - `length_controlled_minimal` for an offline instruction set, which has no difficulties and no
    gamed baselines: the formula `tanh(std_delta_len) + model term`, no regularisation. alpaca_eval
    still downloads df_gamed.csv for it, though neither its rows (used only to regularise) nor its
    difficulties (not in the formula) enter this GLM, so it is handed a stand-in of zeros.
  - When no GLM can be fitted (fewer than 5 judged instructions for its 5-fold CV, or no length
    variation) the primary is the raw win rate and `lc_method` is `win_rate`.

An instruction the judge left without a preference is either dropped from every rate (`keep_failed=False`)
or kept as alpaca_eval keeps it (`keep_failed=True`: a NaN preference, which its win rate leaves out and its
LC GLM, fitted on the other rows, still predicts: the mean runs over every instruction).
"""

from __future__ import annotations

import math
import tempfile
import threading
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Sequence

from rlbench.scoring.judges.compat import alpaca_eval_module

LC_HUB = "length_controlled_v1"
LC_OFFLINE = "length_controlled_minimal"
WIN_RATE = "win_rate"
LC_METHODS = (LC_HUB, LC_OFFLINE)
MIN_ROWS_FOR_GLM = 5  # the GLM's GroupKFold(5)
HF_REPO = "tatsu-lab/alpaca_eval"
_PATCH_LOCK = threading.Lock()


class LengthControlUnavailable(RuntimeError):
    """The LC metric's data (alpaca_eval's df_gamed.csv) cannot be had; the message says how to get it."""


def alpaca_eval_metrics_module():
    """`alpaca_eval.metrics` (imported on first use: it takes a second and pulls in pandas and sklearn)."""
    return alpaca_eval_module("alpaca_eval.metrics")


def _plain(value):
    """numpy scalars -> Python numbers (JSON), NaN -> None."""
    if hasattr(value, "item"):
        value = value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value


def ensure_df_gamed() -> None:
    """Make sure alpaca_eval's df_gamed.csv is in the HF cache (downloading it when the hub is
    reachable); raise LengthControlUnavailable naming the fix otherwise. A readiness check for
    `length_controlled_v1`."""
    alpaca_eval_metrics_module()
    from alpaca_eval import constants
    from huggingface_hub import hf_hub_download

    try:
        hf_hub_download(
            repo_id=HF_REPO,
            filename="df_gamed.csv",
            repo_type="dataset",
            token=constants.DATASETS_TOKEN,
            cache_dir=constants.DEFAULT_CACHE_DIR,
        )
    except Exception as exc:  # offline, no cache entry, hub unreachable: all end the same way
        raise LengthControlUnavailable(
            f"the length-controlled win rate ({LC_HUB}) needs df_gamed.csv from the HF dataset {HF_REPO}, "
            f"which could not be had ({type(exc).__name__}: {exc}). Fetch it once with network "
            f"(`hf download {HF_REPO} df_gamed.csv --repo-type dataset`, or run without "
            "HF_HUB_OFFLINE=1), or copy an HF cache that holds it into HF_HUB_CACHE"
        ) from exc


@contextmanager
def _stand_in_df_gamed(glm_winrate, n_index: int) -> Iterator[None]:
    """alpaca_eval's downloader replaced by one handing over zeros (only for a GLM that provably ignores them)."""
    info = glm_winrate.GLM_INFO[LC_OFFLINE]
    if "instruction_difficulty" in info["formula"] or info["regularize_to_baseline_lambda"]:
        raise RuntimeError(f"this alpaca_eval's {LC_OFFLINE} uses df_gamed.csv; it cannot run offline")
    import pandas as pd

    with _PATCH_LOCK, tempfile.TemporaryDirectory(prefix="rlbench-df-gamed-") as tmp:
        path = Path(tmp) / "df_gamed.csv"
        pd.DataFrame(
            {
                "model": "none",
                "index": range(n_index),
                "preference": 0.5,
                "std_delta_len": 0.0,
                "instruction_difficulty": 0.0,
                "not_gamed_baseline": False,
            }
        ).to_csv(path, index=False)
        original = glm_winrate.hf_hub_download

        def stand_in(**kwargs):
            if kwargs.get("filename") != "df_gamed.csv":
                raise LengthControlUnavailable(
                    f"{LC_OFFLINE} asked for {kwargs.get('filename')}, which offline runs lack"
                )
            return str(path)

        glm_winrate.hf_hub_download = stand_in
        try:
            yield
        finally:
            glm_winrate.hf_hub_download = original


def compute_metrics(
    rows: Sequence[dict],
    *,
    lc_method: str,
    reference_name: str = "reference",
    model_name: str = "model",
    keep_failed: bool = False,
) -> dict:
    """AlpacaEval metrics of one model against the reference.

    rows: one per instruction, in the eval set's order: `index` (for `length_controlled_v1`, the
    instruction's position among AlpacaEval's 805), `output_1` (reference), `output_2` (model) and
    `preference` (in [1, 2]; None = the judge failed on it: left out of every rate, or with
    `keep_failed` kept as alpaca_eval keeps a NaN preference: out of the win rate, in the LC mean).
    Returns the metrics with `lc_method` naming the GLM that gave `length_controlled_winrate`
    (`win_rate` when none could run: then that key is None) and `avg_length` (model output, chars).
    """
    if lc_method not in LC_METHODS:
        raise ValueError(f"unknown lc_method {lc_method!r}; use one of {LC_METHODS}")
    metrics_module = alpaca_eval_metrics_module()
    import pandas as pd

    lengths = [len(r["output_2"]) for r in rows]
    judged = [r for r in rows if r.get("preference") is not None]
    n_judged = len(judged)
    base = {
        "avg_length": round(sum(lengths) / len(lengths), 2) if lengths else None,
        "n_instructions": len(rows),
    }
    if not judged:
        return {**base, "lc_method": WIN_RATE, "win_rate": None, "standard_error": None, "n_total": 0,
                "length_controlled_winrate": None, "lc_standard_error": None}  # fmt: skip
    # Reference against itself: alpaca_eval's own shortcut (same generator -> exactly 50).
    same = all(r["output_1"] == r["output_2"] for r in judged)
    if keep_failed and not same:
        judged = list(rows)  # in order: failed rows keep their place (and AlpacaEval index) as NaN
    frame = pd.DataFrame(
        {
            "instruction": [r.get("instruction", "") for r in judged],
            "output_1": [r["output_1"] for r in judged],
            "output_2": [r["output_2"] for r in judged],
            "generator_1": reference_name,
            "generator_2": reference_name if same else model_name,
            "preference": [math.nan if r.get("preference") is None else float(r["preference"]) for r in judged],
        },
        index=pd.Index([int(r["index"]) for r in judged]),
    )
    deltas = (frame["output_1"].str.len() - frame["output_2"].str.len())[frame["preference"].notna()]
    fittable = same or (n_judged >= MIN_ROWS_FOR_GLM and float(deltas.std()) > 0)
    if not fittable:
        result = {k: _plain(v) for k, v in metrics_module.get_winrate(frame).items()}
        reason = "too_few_judged" if n_judged < MIN_ROWS_FOR_GLM else "no_length_variation"
        return {**base, **result, "lc_method": WIN_RATE, "lc_unavailable": reason,
                "length_controlled_winrate": None, "lc_standard_error": None}  # fmt: skip
    from alpaca_eval.metrics import glm_winrate

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # sklearn 1.9 deprecations inside alpaca_eval's fit
        if lc_method == LC_HUB:
            if not same:
                ensure_df_gamed()
            result = glm_winrate.get_length_controlled_winrate(frame, glm_name=LC_HUB, save_weights_dir=None)
        else:
            with _stand_in_df_gamed(glm_winrate, int(frame.index.max()) + 1):
                result = glm_winrate.get_length_controlled_winrate(frame, glm_name=LC_OFFLINE, save_weights_dir=None)
    return {**base, **{k: _plain(v) for k, v in result.items()}, "lc_method": lc_method}


def primary_metric(metrics: dict) -> str:
    """The key of the metric a task reports as its score."""
    return WIN_RATE if metrics.get("lc_method") == WIN_RATE else "length_controlled_winrate"
