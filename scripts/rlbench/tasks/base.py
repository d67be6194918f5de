"""The task interface, one for all three levels: data + rollout + scorer, evaluated into metrics.

A task is one folder under rlbench/tasks/ (`__init__.py` with the Task subclass as TASK_CLASS, the
public part every workspace gets as task.py, its description, its data) plus one registry YAML
under config/tasks/; nothing else in the harness is edited for it. Like Inspect AI's
Task(dataset, solver, scorer), a task is composed of parts:

- data: `prepare_train` / `prepare_eval` write the splits from the `hub` or the `offline` source;
- a rollout (`rollout()`): how a model meets the held-out rows, single-turn generation
  (rlbench.tasks.parts.SingleTurn) or an environment loop (L3);
- a scorer (`scorer()`): a rule (RuleScorer), unit-test execution, an LLM judge, an environment
  reward; it turns the rollout's samples into an EvalResult.

Like MLE-bench's per-competition `grade`, scoring is a function of the samples and the held-out
rows only: it never sees the grader, the runner or Snakemake. `evaluate(ctx)` runs the two parts
through an EvalContext that builds what they ask for (the generation backend, the judge) on first
use. The code of the parts actually used is hashed into every score's provenance (code_files).
"""

from __future__ import annotations

import hashlib
import importlib.util
import inspect
import math
import os
import re
import secrets
import sys
import tempfile
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType

from rlbench.config import evaluation_settings
from rlbench.paths import LIBRARY_DIR
from rlbench.tasks.capacity import SplitCapacity

TRAIN_FILE = "train.jsonl"
EVAL_FILE = "eval.jsonl"
SALT_BYTES = 32  # 256 bits: the held-out split of an offline source is drawn with this, never guessed


def new_salt() -> str:
    """A fresh per-installation salt (hex). The offline sources' generators, seeds and sizes are
    all public; the salt is the one thing an agent cannot know, so it alone keeps the held-out
    split underivable."""
    return secrets.token_hex(SALT_BYTES)


def ensure_salt(path: Path) -> str:
    """The installation's salt: read from `path`, or drawn and written there when there is none
    (mode 0600, in a directory of its own that is made owner-only too). Never replaces one: a new
    salt means new held-out splits, so only deleting the file (or copying another in) changes it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return read_salt(path)
    salt = new_salt()
    with os.fdopen(fd, "w") as handle:
        handle.write(salt + "\n")
    return salt


def read_salt(path: Path) -> str:
    salt = Path(path).read_text().strip()
    if not salt:
        raise ValueError(f"the eval salt file {path} is empty; delete it to draw a new one, or copy in the original")
    return salt


def require_salt(salt: str | None, task: str) -> str:
    """The salt an offline held-out split is drawn with; without one it could be rebuilt from
    public facts, so there is no fallback."""
    if not isinstance(salt, str) or not salt:
        raise ValueError(
            f"{task}: an offline held-out split needs a secret salt (prepare_eval(..., salt=...)); "
            "the workflow reads it from results/secrets/eval_salt"
        )
    return salt


def salt_fingerprint(salt: str) -> str:
    """What a manifest records to tie a split to its salt: a hash, never the salt itself."""
    return hashlib.sha256(salt.encode()).hexdigest()


def salted_seed(salt: str, task: str, data_seed: int) -> int:
    """A 63-bit seed for a task's held-out split: unknowable without the salt, and different per
    task and data_seed so that no two splits share a stream."""
    digest = hashlib.sha256("\0".join(["rlbench-eval", salt, task, str(data_seed)]).encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


# The two parts of a held-out split in scoring.feedback: split (rlbench.config.scoring_settings).
FEEDBACK, FINAL = "feedback", "final"


def row_id(row: dict) -> str:
    """A held-out row's item id: `id`, or HumanEval's `task_id`."""
    value = row.get("id", row.get("task_id"))
    if value is None:
        raise ValueError("a held-out row has no id (id or task_id): the split cannot be partitioned by item")
    return str(value)


def partition_items(item_ids: list[str], salt: str, task: str, final_share: float) -> dict[str, list[str]]:
    """The held-out split's items in two parts: {"feedback": [...], "final": [...]}, each in split order.

    Every item is ranked by sha256 over (tag, the installation's salt, task, item id); the first
    round(final_share x N) of that order (at least 1, at most N - 1) are the final split, whose scores the
    agent never sees; the rest are the feedback split /submit reports on. Deterministic for one salt and
    share, unknowable without the salt (the agent knows the code, the config and, for a hub source, the
    held-out ids), and it is an exact share, so both halves of a small split stay meaningful."""
    ids = [str(i) for i in item_ids]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{task}: held-out item ids are not unique; the split cannot be partitioned by id")
    if len(ids) < 2:
        raise ValueError(f"{task}: scoring.feedback split needs a held-out split of at least 2 items, not {len(ids)}")
    if not 0 < final_share < 1:
        raise ValueError(f"{task}: scoring.final_share must lie strictly between 0 and 1, not {final_share}")
    salt = require_salt(salt, task)

    def rank(item: str) -> bytes:
        return hashlib.sha256("\0".join(["rlbench-final-split", salt, task, item]).encode()).digest()

    count = min(len(ids) - 1, max(1, round(final_share * len(ids))))
    final = set(sorted(ids, key=rank)[:count])
    return {FEEDBACK: [i for i in ids if i not in final], FINAL: [i for i in ids if i in final]}


def partition_digest(partition: dict) -> str:
    """A hash of a partition's final items: ties a recorded final-split score to the partition it was on."""
    return hashlib.sha256("\n".join(sorted(partition[FINAL])).encode()).hexdigest()


def partition_record(partition: dict) -> dict:
    """What a result says of the partition.json it was scored on: counts, share, the salt's sha256 and the
    digest, never the items (baseline.json and final.json `partition`)."""
    return {
        **{k: partition[k] for k in ("n", "final_share", "salt_sha256", "digest")},
        **{f"{part}_n": partition[part]["n"] for part in (FEEDBACK, FINAL)},
    }


PRIMARY_RANGE = (0.0, 100.0)

# The end of every description.md: what of a submission the grader uses to build prompts and decode
# (generation.chat_format, generation.backends.protocol_generation_config), the same for every task.
PROMPT_RENDERING = """\
## How prompts are rendered and decoded

- A chat prompt is rendered with the base model's chat template, unless your checkpoint ships a
  different one that shows each message's content exactly once, in order, with nothing computed
  from it: such a template is rendered with placeholders in place of the contents, which are put
  in afterwards, so it may change the role markers and add text of its own, never read or alter
  what a message says. A template that fails this is ignored and the base model's is used; each
  scored submission's answer says which (`chat_template`: `used` is `base` or `submitted`, and why).
  Text-completion prompts use no chat template at all.
- Decoding is the protocol's alone: greedy, the task's token limit and stop strings. Your
  `generation_config.json` is not read, except its end-of-sequence token ids (generation stops at
  the tokenizer's and the generation config's EOS tokens).
"""


@dataclass
class EvalResult:
    """One evaluation of a model on a task's held-out split: a metrics dict with one primary metric.

    `metrics` maps names to values: numbers on the paper's scales (0-100 for rates and scores, raw
    counts for counts), and a few strings that say how a number was computed (which LC variant).
    `primary` names the metric Δ is computed on; `score` is its value. The task's registry entry
    names it (`metric:`; checked at every evaluation: check_metric), and the grader, the ledger, the
    baseline, the final evaluation and the summaries carry the whole dict beside the score. `n` is how
    many held-out items were scored; `items` are per-item records (they may quote the held-out split:
    never shown to an agent). `stands_for`: the registry's metric that `primary` replaces when the task
    falls back to another one (AlpacaEval's win rate where no length-controlled GLM can be fitted)."""

    metrics: dict
    primary: str
    n: int
    items: list[dict] = field(default_factory=list)
    stands_for: str | None = None

    def __post_init__(self) -> None:
        if self.primary not in self.metrics:
            raise ValueError(f"the primary metric {self.primary!r} is not among the metrics {sorted(self.metrics)}")
        value = self.metrics[self.primary]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"the primary metric {self.primary!r} must be a finite number, not {value!r}")
        low, high = PRIMARY_RANGE
        if not low <= value <= high:
            raise ValueError(f"the primary metric {self.primary!r} = {value} is outside {low}-{high}")

    @property
    def score(self) -> float:
        return round(float(self.metrics[self.primary]), 4)

    def check_metric(self, settings: dict) -> None:
        """Raise ValueError unless the primary metric is the one the task's registry entry names."""
        declared = settings.get("metric")
        if declared is not None and declared not in (self.primary, self.stands_for):
            raise ValueError(
                f"task {settings.get('name')!r}: its registry entry says metric: {declared!r}, but its scorer's primary "
                f"metric is {self.primary!r} (metrics: {', '.join(sorted(self.metrics))}); set `metric: {self.primary}` "
                f"in config/tasks/{settings.get('name')}.yaml, or make the scorer report {declared!r}"
            )

    def to_dict(self, with_items: bool = True) -> dict:
        data = {"score": self.score, "primary_metric": self.primary, "metrics": dict(self.metrics), "n": self.n}
        if with_items:
            data["items"] = self.items
        return data


_LABEL = re.compile(r"[A-Za-z0-9_.@:/+-]{1,64}")


def _public_value(value: object, depth: int = 0) -> object:
    """A metric value as it may be told to an agent: numbers, labels (a short identifier such as
    an LC variant's name), and one level of {label: number} (counts by kind); anything else is
    dropped (None), because free text could quote the held-out split."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, (int, float)):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        return value if _LABEL.fullmatch(value) else None
    if isinstance(value, dict) and depth == 0:
        return {k: _public_value(v, 1) for k, v in value.items() if isinstance(k, str) and _LABEL.fullmatch(k)}
    return None


def public_metrics(result: dict) -> dict:
    """The numbers of an evaluation that may be told to an agent and kept in its ledger entry:
    score, primary_metric, metrics (numbers and labels only) and n; never the items, which quote
    the held-out split."""
    public = {key: result[key] for key in ("score", "primary_metric", "n") if key in result}
    if isinstance(result.get("metrics"), dict):
        public["metrics"] = {
            k: _public_value(v) for k, v in result["metrics"].items() if isinstance(k, str) and _LABEL.fullmatch(k)
        }
    return public


@dataclass
class EvalContext:
    """What one evaluation may use, each part built on first use.

    The task asks for what it needs: `generator()` (the submitted model behind a generation
    backend), `judge()` (the task's judge backend, L2 and DeepSearchQA), `work_dir` (a throw-away
    scratch directory: code execution, environment state). `phase(name)` tells the caller where the
    evaluation is: "loading" and "generating" are the submitted model's part (a failure there is
    the model's fault), "scoring" the harness's (judge, execution sandbox, environment reward).

    resources: what the evaluation may use beyond the split, set by whoever runs it:
    judge_model_dir (a local judge's weights), judgment_cache (the judgment cache directory),
    work_dir, base_chat_template (present for a submission: the base model's chat template text,
    or None, that its prompts are rendered with; see generation.chat_format), model_generation
    (the base model's registry `generation:`, Task.decoding), items (the held-out item ids this
    evaluation is restricted to: rows(); absent = the whole split). replicate: which repetition of a
    noisy grader this is (0 for the grader's own evaluations; the baseline's repeats count up),
    part of the judgment cache key and a sampled decoding's seed.
    """

    settings: dict
    model_dir: Path
    eval_dir: Path
    evaluation: dict = field(default_factory=dict)
    resources: dict = field(default_factory=dict)
    on_phase: Callable[[str], None] | None = None
    replicate: int = 0
    #: how the submitted model decodes (Task.decoding; None: greedy)
    decoding: dict | None = None
    #: a ready generation backend to use instead of loading model_dir (tests, benchmarks)
    backend: object = None
    _generator: object = field(default=None, init=False, repr=False)
    _text_generator: object = field(default=None, init=False, repr=False)
    _judge: object = field(default=None, init=False, repr=False)
    _scratch: object = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.evaluation = evaluation_settings(self.evaluation)  # the schema's defaults, nowhere else

    def phase(self, name: str) -> None:
        if self.on_phase is not None:
            self.on_phase(name)

    def rows(self, name: str = EVAL_FILE) -> list[dict]:
        """The held-out split's rows (eval.jsonl unless another file of the split is named), only those
        whose id is among resources["items"] when the evaluation is restricted to a part of the split
        (scoring.feedback split: the feedback or the final part, partition_items); so every metric, even
        one that is not a mean over items, is computed on that part as the task defines it."""
        from rlbench.fileio.jsonio import read_jsonl

        rows = list(read_jsonl(Path(self.eval_dir) / name))
        items = self.resources.get("items")
        if items is None or name != EVAL_FILE:
            return rows
        wanted = {str(i) for i in items}
        kept = [row for row in rows if row_id(row) in wanted]
        if len(kept) != len(wanted):
            raise ValueError("some of the held-out items this evaluation is restricted to are not in the split")
        return kept

    def generator(self):
        """The submitted model behind the configured generation backend (loaded once)."""
        if self._generator is None and self.backend is not None:
            self.phase("generating")
            self._generator = self.backend
        if self._generator is None:
            from rlbench.generation.backends import load_backend

            self.phase("loading")
            self._generator = load_backend(
                self.evaluation["backend"],
                Path(self.model_dir),
                self.evaluation["batch_size"],
                self.evaluation.get("gpu_memory_utilization"),
                **self._chat_protocol(),
                decoding=self.decoding,
                replicate=self.replicate,
            )
            self.phase("generating")
        return self._generator

    def text_generator(self):
        """The submitted model as a text-completion generator that keeps each episode's prompt
        cached between calls (rlbench.generation.textgen; L3 environment loops), loaded once."""
        if self._text_generator is None and self.backend is not None:
            self.phase("generating")
            self._text_generator = self.backend
        if self._text_generator is None:
            from rlbench.generation.textgen import load_text_generator

            self.phase("loading")
            self._text_generator = load_text_generator(
                self.evaluation["backend"],
                Path(self.model_dir),
                gpu_memory_utilization=self.evaluation.get("gpu_memory_utilization"),
                **self._chat_protocol(),
            )
            self.phase("generating")
        return self._text_generator

    def _chat_protocol(self) -> dict:
        """How the model's prompts are rendered (generation.chat_format): against the base model's
        chat template when the resources carry one (`base_chat_template`, None when the base model
        has none: a submission), else with the model's own (the base model itself)."""
        if "base_chat_template" in self.resources:
            return {"base_chat_template": self.resources["base_chat_template"], "protocol": True}
        return {}

    @property
    def backend_name(self) -> str | None:
        return getattr(self._generator or self._text_generator, "name", None)

    @property
    def chat_template(self) -> dict | None:
        """Which chat template the model's prompts were rendered with, and why (ChatFormat.record);
        None when the model was not loaded (a ready backend, or a task without chat prompts)."""
        chat_format = getattr(self._generator or self._text_generator, "chat_format", None)
        return chat_format.record() if chat_format is not None else None

    def judge(self):
        """The task's judge backend, from its `judge:` settings (loaded once)."""
        if self._judge is None:
            judge_settings = self.settings.get("judge")
            if not judge_settings:
                raise ValueError(f"task {self.settings.get('name')!r} has no judge: block in its registry entry")
            from rlbench.scoring.judges import load_judge

            self._judge = load_judge(
                judge_settings,
                model_dir=self.resources.get("judge_model_dir"),
                cache_dir=self.resources.get("judgment_cache"),
                replicate=self.replicate,
            )
        return self._judge

    @property
    def work_dir(self) -> Path:
        """A scratch directory for this evaluation (the caller's, or a temporary one)."""
        given = self.resources.get("work_dir")
        if given:
            Path(given).mkdir(parents=True, exist_ok=True)
            return Path(given)
        if self._scratch is None:
            self._scratch = tempfile.TemporaryDirectory(prefix="rlbench-eval-")
        return Path(self._scratch.name)

    def close(self) -> None:
        if self._scratch is not None:
            self._scratch.cleanup()
            self._scratch = None


def score_exact_match(rows: list[dict], completions: list[str], public: ModuleType) -> EvalResult:
    """Accuracy (0-100) of one completion per row, judged by a task's public module
    (extract_answer, reference_answer, is_correct): the rule-verified tasks' metric."""
    items = []
    for row, completion in zip(rows, completions, strict=True):  # a short backend must not shrink n
        items.append(
            {
                "id": row["id"],
                "predicted": public.extract_answer(completion),
                "reference": public.reference_answer(row),
                "correct": public.is_correct(completion, row),
                "completion": completion,
            }
        )
    correct = sum(bool(item["correct"]) for item in items)
    accuracy = 100.0 * correct / len(items) if items else 0.0
    return EvalResult(metrics={"accuracy": round(accuracy, 4), "correct": correct}, primary="accuracy", n=len(items), items=items)


class Task(ABC):
    """One benchmark task. Knows nothing of the grader, the runner or Snakemake."""

    name: str
    #: the file copied into every workspace as task.py (prompt format, reward)
    public_module_path: Path
    #: True: the model decodes as its registry entry's `generation:` says (the reference scores the
    #: task through OpenCompass, which reads its models.yaml); False: greedily, as the task's
    #: protocol says whatever the model (generation.decoding)
    takes_model_decoding: bool = False

    @abstractmethod
    def prepare_train(self, settings: dict, train_dir: Path) -> dict:
        """Write the training split (what agents get) to train_dir; returns its manifest."""

    @abstractmethod
    def prepare_eval(self, settings: dict, train_dir: Path, eval_dir: Path, *, salt: str | None = None) -> dict:
        """Write the held-out split to eval_dir, disjoint from the training split; returns its manifest.

        Separate from prepare_train so that changing an evaluation setting never rewrites the
        training split (and so never reruns finished agent runs). A generated (offline) split is
        drawn with `salt`, the installation's secret (see new_salt), and raises without one: the
        code, the settings and the training split are all known to agents. Its manifest records
        salt_fingerprint(salt). A public source (the hub's test split) ignores the salt."""

    def prepare(self, settings: dict, train_dir: Path, eval_dir: Path, *, salt: str | None = None) -> dict:
        """Both splits."""
        return {
            **self.prepare_train(settings, train_dir),
            **self.prepare_eval(settings, train_dir, eval_dir, salt=salt),
        }

    def split_sizes(self, settings: dict) -> tuple[int | None, int | None]:
        """How many training and held-out items the settings ask for: train_size and eval_size, with the
        task's own default where one is null (None: all the source gives)."""
        return settings.get("train_size"), settings.get("eval_size")

    def training_split_keys(self, settings: dict) -> tuple[str, ...]:
        """Settings beyond the usual ones (source, train_size, seeds) that the training split of
        an interactive task depends on: the workflow rebuilds the training games (and so reruns
        the agents) when one changes. Empty for most tasks: the held-out size never touches them."""
        return ()

    def split_capacity(self, settings: dict) -> SplitCapacity | None:
        """What the settings' data source can give the splits, known before any data are built
        (rlbench.tasks.capacity; checked when the config is validated); None: no bound known here."""
        return None

    @abstractmethod
    def describe(self, settings: dict) -> str:
        """The task's own description: what the agent gets and how it is evaluated."""

    def description(self, settings: dict) -> str:
        """description.md as the agent reads it: describe(), then PROMPT_RENDERING."""
        return self.describe(settings).rstrip("\n") + "\n\n" + PROMPT_RENDERING

    # -- evaluation: rollout + scorer ------------------------------------------------------
    def rollout(self, settings: dict):
        """The part that runs the model on held-out rows: an object with run(rows, ctx) -> samples."""
        raise NotImplementedError(f"{type(self).__name__} defines neither rollout()/scorer() nor evaluate()")

    def scorer(self, settings: dict):
        """The part that scores the samples: an object with score(rows, samples, ctx) -> EvalResult."""
        raise NotImplementedError(f"{type(self).__name__} defines neither rollout()/scorer() nor evaluate()")

    def parts(self, settings: dict) -> list:
        """The parts evaluate() uses (their code is part of every score's provenance)."""
        return [self.rollout(settings), self.scorer(settings)]

    def evaluate(self, ctx: EvalContext) -> EvalResult:
        """Score ctx.model_dir on the held-out split in ctx.eval_dir: the rollout, then the scorer."""
        rollout, scorer = self.rollout(ctx.settings), self.scorer(ctx.settings)
        # The model is loaded before the held-out split is read (a rollout's prepare(ctx)), as a
        # model's failure to load must never be told anything that came from the split.
        if hasattr(rollout, "prepare"):
            rollout.prepare(ctx)
        rows = ctx.rows()
        samples = rollout.run(rows, ctx)
        ctx.phase("scoring")
        return scorer.score(rows, samples, ctx)

    def noise_repeats(self, settings: dict, decoding: dict | None = None) -> int:
        """How many times the baseline is evaluated to measure the grader's noise: 1 for a
        deterministic grader; `grader_noise_repeats` (K >= 3) for a judge or a nondeterministic
        environment; at least SAMPLED_REPEATS when the model's decoding samples."""
        from rlbench.generation.decoding import SAMPLED_REPEATS, is_sampled

        repeats = int(settings.get("grader_noise_repeats") or 1)
        return max(repeats, SAMPLED_REPEATS) if is_sampled(decoding) else repeats

    def decoding(self, model_generation: dict | None) -> dict:
        """How this task decodes the model: its registry entry's `generation:` (`model_generation`)
        when the task takes it, else greedy; with `source` saying which."""
        from rlbench.generation.decoding import model_decoding

        if self.takes_model_decoding and model_generation:
            return {**model_decoding(model_generation), "source": "model registry"}
        return {**model_decoding(None), "source": "task protocol"}

    # -- what the agent gets --------------------------------------------------------------
    def exposed_files(self, settings: dict) -> dict[str, Path | bytes]:
        """Workspace-relative name -> what the agent gets there (a file to copy, or its bytes):
        reward code, prompt protocol, environment code."""
        return {"task.py": self.public_module_path}

    def public_module(self) -> ModuleType:
        spec = importlib.util.spec_from_file_location(f"rlbench_public_{self.name}", self.public_module_path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    # -- provenance -------------------------------------------------------------------------
    def folder(self) -> Path:
        """The task's own folder (its package directory)."""
        return Path(inspect.getfile(type(self))).resolve().parent

    def code_files(self, settings: dict) -> list[Path]:
        """Every source file a score of this task rests on: the task's folder (code and shipped
        data), this interface, and the modules of the parts its evaluation uses."""
        files = {path for path in self.folder().rglob("*") if path.is_file() and "__pycache__" not in path.parts}
        files.add(Path(__file__).resolve())
        for part in self.parts(settings):
            files.update(part_code_files(part))
        return sorted(files)


def part_code_files(part: object) -> set[Path]:
    """The source files of one part: the module of its class (and of its base classes inside the
    library), plus whatever it names in a `code_files()` method (a judge, an execution sandbox)."""
    files: set[Path] = set()
    library = LIBRARY_DIR
    for cls in type(part).__mro__:
        module = sys.modules.get(cls.__module__)
        path = getattr(module, "__file__", None)
        if path and Path(path).resolve().is_relative_to(library):
            files.add(Path(path).resolve())
    extra = getattr(part, "code_files", None)
    if callable(extra):
        files.update(Path(p).resolve() for p in extra())
    return files
