"""DeepSearchQA (L3): multi-step search questions, answered by a ReAct policy with a search tool and
graded by an LLM judge.

Two sources:

- `hub` (the paper's): google/deepsearchqa's 900 questions, shuffled with seed 42 as the reference
  does; the first 100 are the training split, the next 200 held out, the rest unused. The model
  searches the web (SerpAPI or DuckDuckGo, `search.provider`).
- `offline`: a generated knowledge base of fictional entities (kb.py: people, companies, cities,
  countries, awards, works; `kb_size` pages from `data_seed`) with multi-hop single- and
  set-answer questions about it; the model searches the knowledge base with BM25 (the same
  prompt and actions as the hub source). Every workspace gets the knowledge base and the training
  questions (from data_seed); the held-out questions are drawn with the installation's secret
  salt and never ask what a training question asks about the same entity.

Questions are built by the workflow rule generate_games (rules/levels/online.smk) into
results/levels/online/<task>/{train,heldout} (`build_games`); prepare_train / prepare_eval copy
them into the splits. The protocol (public.py) is the reference's ReAct loop, its strings byte for
byte (≤ 6 steps, greedy, 256 tokens, the reference's stop strings; `prompt: hide_answer_type`
leaves out the answer type the reference shows); the grading (grading.py) its yes/no judge for
the headline accuracy (`judge_prompt: reference`), plus the official per-item F1 grading.
"""

from __future__ import annotations

import os
from pathlib import Path

from rlbench.fileio.jsonio import read_jsonl, sha256_file, write_json, write_jsonl
from rlbench.paths import ASSETS_DIR
from rlbench.tasks.base import EVAL_FILE, TRAIN_FILE, Task, require_salt, salt_fingerprint, salted_seed
from rlbench.tasks.capacity import SplitCapacity
from rlbench.tasks.deepsearchqa import public
from rlbench.tasks.deepsearchqa.grading import AnswerScorer, judge_prompt_variant
from rlbench.tasks.deepsearchqa.kb import build_kb, candidates, questions
from rlbench.tasks.deepsearchqa.rollout import KB_FILE, SearchRollout, prompt_variant
from rlbench.tasks.parts import built_split

PUBLIC = Path(__file__).with_name("public.py")
QUESTIONS = "questions.jsonl"
MANIFEST = "manifest.json"
HUB_PATH = "google/deepsearchqa"
HUB_SPLIT = "eval"
HUB_SHUFFLE_SEED = 42  # the reference's split: shuffle(seed=42), train [0, 100), eval [100, 300)
TRAIN_SIZE = 100
EVAL_SIZE = 200
DEFAULT_KB_SIZE = 400
ROW_KEYS = ("id", "problem", "problem_category", "answer", "answer_type", "gold_items")

DESCRIPTION = """\
# Task: DeepSearchQA (multi-step search questions)

Improve the base model's accuracy at answering questions that need several searches: the model
acts as a research assistant, looks facts up with a search tool, step by step, and answers.

- Training data: `data/train.jsonl`: {train_desc}.
  One JSON object per line: `id`, `problem` (the question), `problem_category`, `answer` (the gold answer; several items are joined by
  ", "; "None" when nothing qualifies), `answer_type` ("Single Answer" or "Set Answer") and
  `gold_items` (the answer's items as a list).
{tool_desc}- Evaluation: {eval_desc}.
  They are played with the protocol in `task.py` (`task.episode_start(problem, answer_type)`,
  `task.step`; `task.play` runs one whole episode):
  - Prompt (text completion, no chat template): `task.REACT_SYSTEM_PROMPT` (the ReAct format
    and rules), a blank line, `Question: <problem>`, {type_line}a blank line and `Thought:`
    (`task.first_prompt`; prompt variant "{prompt}").
  - Each step the model continues greedily (at most {max_new_tokens} new tokens) until one of the
    stop strings "\\nAction:", "\\nThought:", "\\nObservation:". The first
    `Action: search[query]` or `Action: answer[...]` in that step's text is its action; a search
    appends "\\nObservation: <results>\\nThought:" and the loop goes on.
  - Because "\\nAction:" is a stop string, an action written on a new line is cut off before the
    model writes it: that step has no action, and the answer is then forced (the prompt gets
    "\\nAction: answer[" and the model completes it up to "]"). To search, the model must write
    its action on the Thought's own line: `Thought: ... Action: search[...]`.
  - At most {max_steps} steps; then the last answer[...] written counts, else "I don't know".
  - Set questions: list every item, separated by commas; if nothing qualifies, answer "None".
- Metric: accuracy (0-100). Each answer is judged correct or incorrect by {judge_desc}
  (set answers need every gold item; extra items are not penalised). Reported beside it: the official
  DeepSearchQA grading (per-item precision, recall and F1, which do penalise extra items; fully
  correct / fully incorrect rates), accuracy per answer type, mean searches.
- An LLM judge is noisy (the paper saw about ±3 points): the base model is evaluated {repeats}
  times and the spread is reported with every improvement.
"""

OFFLINE_TOOL_DESC = """\
- Knowledge base: `data/kb.jsonl`, {pages} pages (`id`, `title`, `text`) about a fictional
  world: people, companies, cities, countries, awards and works. Every question is about this
  world, and its facts are found only there; held-out questions ask about the same world.
  `task.SearchTool(task.load_pages("data/kb.jsonl"))` is the grader's search tool: `search(query)`
  returns the top 3 pages (BM25) as "title: best-matching sentence" joined by " | ".
  (`open(title)` returns a page's text: a reading aid for you, not an action of the protocol.)
"""

HUB_TOOL_DESC = """\
- Search: the grader searches the web ({provider}): `search[query]` returns the top results'
  snippets joined by " | ". Your workspace has no network; `task.SearchTool` over pages of your
  own makes an offline stand-in for practice.
"""


def _hub(settings: dict) -> dict:
    return {"path": HUB_PATH, **(settings.get("hub") or {})}


def _sizes(settings: dict) -> tuple[int, int]:
    return int(settings.get("train_size") or TRAIN_SIZE), int(settings.get("eval_size") or EVAL_SIZE)


def _kb_size(settings: dict) -> int:
    return int(settings.get("kb_size") or DEFAULT_KB_SIZE)


def _hub_row(record: dict, index: int) -> dict:
    """A dataset row in the split's format; a missing gold answer (the HF loader's reading of the
    literal "None" of four set questions) becomes "None"."""
    answer = record.get("answer")
    answer = public.NONE_ANSWER if answer is None or not str(answer).strip() else str(answer)
    answer_type = record["answer_type"]
    return {
        "id": f"dsqa-{index:03d}",
        "problem": record["problem"],
        "problem_category": record.get("problem_category"),
        "answer": answer,
        "answer_type": answer_type,
        "gold_items": public.gold_items(answer, answer_type),
    }


def hub_questions(settings: dict) -> tuple[list[dict], list[dict]]:
    """(training rows, held-out rows) of google/deepsearchqa as the reference splits it: the
    `eval` split shuffled with seed 42, rows [0, 100) for training and [100, 300) held out
    (train_size and eval_size cut each short, never moving the held-out window)."""
    path = _hub(settings)["path"]
    try:
        from datasets import load_dataset

        data = load_dataset(path, split=HUB_SPLIT)
    except Exception as exc:
        raise RuntimeError(
            f"could not load the DeepSearchQA questions {path!r} (split {HUB_SPLIT!r}) from the Hugging Face "
            f"hub ({type(exc).__name__}: {exc}); run once with network so the HF cache "
            f"({os.environ.get('HF_HOME') or '~/.cache/huggingface'}) holds it, set tasks.deepsearchqa.hub.path "
            "to a local copy, or use source: offline"
        ) from exc
    data = data.add_column("source_row", list(range(len(data)))).shuffle(seed=HUB_SHUFFLE_SEED)
    train_size, eval_size = _sizes(settings)
    train = [_hub_row(data[i], data[i]["source_row"]) for i in range(min(train_size, TRAIN_SIZE, len(data)))]
    held_out = range(TRAIN_SIZE, min(TRAIN_SIZE + min(eval_size, EVAL_SIZE), len(data)))
    return train, [_hub_row(data[i], data[i]["source_row"]) for i in held_out]


class DeepSearchQA(Task):
    name = "deepsearchqa"
    public_module_path = PUBLIC

    # -- questions: built by the generate_games rule ---------------------------------------------
    def build_games(
        self, settings: dict, split: str, out_dir: Path, *, salt: str | None = None, workers: int = 1
    ) -> dict:
        """Write the questions of `split` ("train" or "heldout") to out_dir/questions.jsonl, the
        knowledge base (offline) to out_dir/kb.jsonl, and a manifest.json (with a "summary")."""
        if split not in ("train", "heldout"):
            raise ValueError(f"unknown DeepSearchQA split {split!r} (train or heldout)")
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        source = settings.get("source", "offline")
        extra: dict = {}
        if source == "hub":
            train, held_out = hub_questions(settings)
            rows = train if split == "train" else held_out
            extra = {"hub_path": _hub(settings)["path"], "shuffle_seed": HUB_SHUFFLE_SEED}
        else:
            data_seed = int(settings.get("data_seed", 0))
            train_size, eval_size = _sizes(settings)
            kb = build_kb(data_seed, _kb_size(settings))
            train = questions(kb, data_seed, train_size, id_prefix="train")
            if split == "train":
                rows = train
            else:
                seed = salted_seed(require_salt(salt, self.name), self.name, data_seed)
                rows = questions(kb, seed, eval_size, exclude=train, id_prefix="heldout")
                extra = {"salt_sha256": salt_fingerprint(salt)}
            write_jsonl(out_dir / KB_FILE, kb.pages)
            extra.update(data_seed=data_seed, kb_pages=len(kb.pages))
        write_jsonl(out_dir / QUESTIONS, rows)
        summary = {
            "questions": len(rows),
            "answer_types": _count(rows, "answer_type"),
            "categories": _count(rows, "problem_category"),
            "empty_gold": sum(not row["gold_items"] for row in rows),
        }
        manifest = {"task": self.name, "split": split, "source": source, **extra, "summary": summary}
        write_json(out_dir / MANIFEST, manifest)
        return manifest

    # -- splits -----------------------------------------------------------------------------------
    def split_sizes(self, settings: dict) -> tuple[int, int]:
        return _sizes(settings)

    def split_capacity(self, settings: dict) -> SplitCapacity:
        """hub: the reference's split (TRAIN_SIZE training questions, the next EVAL_SIZE held out); offline:
        every question the knowledge base can ask, both splits drawn from them, disjoint."""
        if settings.get("source", "offline") == "hub":
            return SplitCapacity(
                source=f"the reference's split of {HUB_PATH} (shuffled with seed {HUB_SHUFFLE_SEED}: {TRAIN_SIZE} "
                f"training questions, the next {EVAL_SIZE} held out)",
                train=TRAIN_SIZE,
                eval=EVAL_SIZE,
            )
        data_seed, kb_size = int(settings.get("data_seed", 0)), _kb_size(settings)
        total = len(candidates(build_kb(data_seed, kb_size)))
        return SplitCapacity(
            source=f"the knowledge base of kb_size {kb_size} (data_seed {data_seed}: {total:,} questions)",
            total=total,
            grows_with="kb_size",
        )

    def prepare_train(self, settings: dict, train_dir: Path, *, sources: dict | None = None) -> dict:
        built = built_split(sources, "train_games", "DeepSearchQA")
        train_dir = Path(train_dir)
        rows = [{key: row[key] for key in ROW_KEYS} for row in read_jsonl(built / QUESTIONS)]
        write_jsonl(train_dir / TRAIN_FILE, rows)
        manifest = {
            "task": self.name,
            "source": settings.get("source", "offline"),
            "train_rows": len(rows),
            "train_sha256": sha256_file(train_dir / TRAIN_FILE),
            "train_answer_types": _count(rows, "answer_type"),
        }
        if (built / KB_FILE).is_file():
            _copy(built / KB_FILE, train_dir / KB_FILE)
            manifest["kb_sha256"] = sha256_file(train_dir / KB_FILE)
        return manifest

    def prepare_eval(
        self, settings: dict, train_dir: Path, eval_dir: Path, *, salt: str | None = None, sources: dict | None = None
    ) -> dict:
        built = built_split(sources, "heldout_games", "DeepSearchQA")
        eval_dir = Path(eval_dir)
        source = settings.get("source", "offline")
        rows = [{key: row[key] for key in ROW_KEYS} for row in read_jsonl(built / QUESTIONS)]
        train_problems = {public.normalize(row["problem"]) for row in read_jsonl(Path(train_dir) / TRAIN_FILE)}
        overlap = sum(public.normalize(row["problem"]) in train_problems for row in rows)
        if overlap and source != "hub":
            raise RuntimeError(f"{overlap} held-out DeepSearchQA questions are also training questions")
        write_jsonl(eval_dir / EVAL_FILE, rows)
        manifest = {
            "eval_rows": len(rows),
            "eval_sha256": sha256_file(eval_dir / EVAL_FILE),
            "eval_answer_types": _count(rows, "answer_type"),
            "eval_empty_gold": sum(not row["gold_items"] for row in rows),
            "train_eval_overlap": overlap,  # hub: the real data as they are, overlap only recorded
        }
        if source != "hub":
            _copy(built / KB_FILE, eval_dir / KB_FILE)
            manifest["salt_sha256"] = salt_fingerprint(require_salt(salt, self.name))
        return manifest

    def describe(self, settings: dict) -> str:
        judge = settings.get("judge") or {}
        environment = settings.get("environment") or {}
        train_size, eval_size = _sizes(settings)
        if settings.get("source") == "hub":
            train_desc = f"{min(train_size, TRAIN_SIZE)} questions of google/deepsearchqa"
            eval_desc = f"{min(eval_size, EVAL_SIZE)} other DeepSearchQA questions that you never see"
            provider = (settings.get("search") or {}).get("provider") or "auto"
            if provider == "auto":
                provider = "SerpAPI when the grader has a SerpAPI key, else DuckDuckGo"
            tool_desc = HUB_TOOL_DESC.format(provider=provider)
        else:
            train_desc = f"{train_size} questions about the knowledge base"
            eval_desc = (
                f"{eval_size} held-out questions about the same knowledge base that you never see; they never "
                "ask what a training question asks about the same entity"
            )
            tool_desc = OFFLINE_TOOL_DESC.format(pages=_kb_size(settings))
        prompt = prompt_variant(settings)
        judge_prompt_variant(settings)  # a bad variant is caught when the workspace is described
        if prompt == public.HIDE_ANSWER_TYPE:
            type_line = ""
        else:
            type_line = '`Answer type: <answer_type>` ("Single Answer" or "Set Answer"), '
        if judge.get("backend") == "match":
            judge_desc = "a string-matching rule (task.string_match)"
        else:
            judge_desc = f"an LLM judge ({judge.get('model', '?')})"
        return DESCRIPTION.format(
            train_desc=train_desc,
            eval_desc=eval_desc,
            tool_desc=tool_desc,
            type_line=type_line,
            prompt=prompt,
            max_new_tokens=settings.get("max_new_tokens") or public.MAX_NEW_TOKENS,
            max_steps=environment.get("max_steps") or public.MAX_STEPS,
            judge_desc=judge_desc,
            repeats=self.noise_repeats(settings),
        )

    def exposed_files(self, settings: dict) -> dict:
        # task.py carries RD-Agent's prompt strings: its MIT notice goes with them.
        return {"task.py": PUBLIC, "LICENSE-RD-Agent-prompts": ASSETS_DIR / "LICENSE-RD-Agent"}

    # -- evaluation -------------------------------------------------------------------------------
    def rollout(self, settings: dict) -> SearchRollout:
        return SearchRollout(settings)

    def scorer(self, settings: dict) -> AnswerScorer:
        return AnswerScorer(settings)


def _copy(source: Path, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_bytes(source.read_bytes())


def _count(rows: list[dict], key: str) -> dict:
    counts: dict = {}
    for row in rows:
        counts[row[key]] = counts.get(row[key], 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: str(kv[0])))


TASK_CLASS = DeepSearchQA
