"""DeepSearchQA (Level 3): the search tool, the ReAct protocol and the answer checks, as the grader
uses them.

This file is the workspace's task.py (standard library, numpy and bm25s only). The grader plays
every held-out question with exactly these functions; an agent may use them to play its training
questions against the knowledge base in data/kb.jsonl, collect trajectories and compute rewards.

Protocol: RD-Agent's DeepSearchQA harness (benchmarks/deepsearchqa/eval.py at commit 471eb30d),
its strings byte for byte, so that scores mean what the paper's mean:
- raw text completion, no chat template, greedy decoding; the prompt is REACT_SYSTEM_PROMPT (which
  ends with a newline), a blank line, "Question: {problem}", "Answer type: {answer_type}", a blank
  line and "Thought:" (`first_prompt`). The prompt variant `hide_answer_type` leaves out the
  "Answer type: ..." line (the dataset card asks not to show it; the reference shows it);
- each step the model continues the text (at most 256 new tokens, stop strings STOP); the stripped
  text is appended to the prompt after a space; the first `Action: search[...]` or
  `Action: answer[...]` of *this step's* text (ACTION, the argument may span lines) is the action:
  - answer[x] ends the episode with x, except the placeholder "your final answer", which is
    refused: "\\nThat is not a valid answer. Please think again.\\nThought:" is appended and the
    loop goes on;
  - search[q] appends "\\nObservation: {result}\\nThought:" and the loop goes on;
  - no action: "\\nAction: answer[" is appended and the model completes it (at most 128 tokens,
    stop "]"); that text, stripped, is the answer, unless it is the placeholder: then the loop
    goes on from that prompt (it still ends with "Action: answer[");
- after 6 steps without an answer: the last `Action: answer[...]` in the model's texts (joined by
  newlines, the placeholder skipped), else "I don't know";
- a prompt that no longer fits the model's context ends the episode with "I don't know".

Important: the stop strings include "\\nAction:", so an action on a line of its own is cut off
before the model writes it; the step then has no action and the answer is forced at once. A
model only gets to search when it writes its action on the Thought's own line:
`Thought: I need X's founder. Action: search[X founder]`. This is the reference's behaviour.

Tool: `search[query]` returns the top 3 pages of a BM25 index over the knowledge base (each as
"title: best-matching sentence", joined by " | ", as the reference's web search returns three
snippets). With the hub source the grader searches the web instead (SerpAPI or DuckDuckGo).
`SearchTool.open(title)` returns a whole page: a reading aid for your own tooling, not an action
of the protocol (the reference has none, and the knowledge base's facts each fit in one snippet).

Answers: "Single Answer" questions have one gold value; "Set Answer" questions a list (comma
separated, every item needed), or "None" when nothing qualifies. `string_match` is the reference's
fallback rule; `official_metrics` the official per-question precision/recall/F1 grading.

    import task
    pages = task.load_pages("data/kb.jsonl")
    tool = task.SearchTool(pages)
    episode = task.episode_start(row["problem"], row["answer_type"])
    request = episode.request
    while request.kind == "generate":
        completion = my_model(request.prompt, request.max_tokens, request.stop)  # greedy, cut before a stop
        request = task.step(episode, completion, tool)
    print(request.answer, request.end)
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

MAX_STEPS = 6
MAX_NEW_TOKENS = 256
FORCED_ANSWER_TOKENS = 128
STOP = ["\nAction:", "\nThought:", "\nObservation:"]
FORCED_STOP = ["]"]
MAX_RESULTS = 3
SNIPPET_CHARS = 200
PAGE_CHARS = 1500
NO_RESULTS = "No results found."
SINGLE = "Single Answer"
SET = "Set Answer"
NONE_ANSWER = "None"  # the gold answer of a set question that nothing meets

#: The prompt variants: `reference` shows the answer type as the reference does (the default);
#: `hide_answer_type` leaves that line out, as the dataset card asks.
REFERENCE_PROMPT = "reference"
HIDE_ANSWER_TYPE = "hide_answer_type"
PROMPTS = (REFERENCE_PROMPT, HIDE_ANSWER_TYPE)

# The reference's strings, byte for byte: RD-Agent (MIT; the notice is LICENSE-RD-Agent-prompts
# beside this file), rdagent/scenarios/rl/autorl_bench/benchmarks/deepsearchqa/eval.py at commit
# 471eb30d1ec03f35631c532c58a52ce75d684037 (REACT_SYSTEM_PROMPT and DeepSearchQAEvaluator._react_loop).
REACT_SYSTEM_PROMPT = """You are a research assistant that answers questions by searching the web.

You must follow this format strictly:
Thought: [your reasoning]
Action: search[your search query]   <- to search the web
  OR
Action: answer[Paris]   <- to give final answer

Rules:
- Always start with a Thought
- Use search[] to find information
- Use answer[] ONLY when you have enough information
- For Set Answer questions, list all items separated by commas
- Be concise and factual
"""
FORCED_ANSWER = "\nAction: answer["
PLACEHOLDER_ANSWER = "your final answer"
INVALID_ANSWER = "That is not a valid answer. Please think again."
NO_ANSWER = "I don't know"
#: The action of a step: the first `Action: search[...]` or `Action: answer[...]` (the argument
#: may span lines, as the reference's re.DOTALL allows).
ACTION = re.compile(r"Action:\s*(search|answer)\[(.+?)\]", re.DOTALL)
ANSWER_ACTION = re.compile(r"Action:\s*answer\[(.+?)\]", re.DOTALL)


def check_prompt(prompt: str) -> str:
    """`prompt` if it names a prompt variant, else ValueError saying which exist."""
    if prompt not in PROMPTS:
        raise ValueError(f"unknown DeepSearchQA prompt variant {prompt!r}: use one of {', '.join(PROMPTS)}")
    return prompt


def first_prompt(problem: str, answer_type: str | None = None, prompt: str = REFERENCE_PROMPT) -> str:
    """An episode's prompt before the first step: the reference's (the answer type shown), or
    without the "Answer type:" line (`hide_answer_type`)."""
    if check_prompt(prompt) == HIDE_ANSWER_TYPE:
        return f"{REACT_SYSTEM_PROMPT}\n\nQuestion: {problem}\n\nThought:"
    if answer_type is None:
        raise ValueError(
            "the reference prompt shows the question's answer type: pass answer_type=row['answer_type'] "
            f'("{SINGLE}" or "{SET}"), or prompt="{HIDE_ANSWER_TYPE}"'
        )
    return f"{REACT_SYSTEM_PROMPT}\n\nQuestion: {problem}\nAnswer type: {answer_type}\n\nThought:"


# -- the search tool -------------------------------------------------------------------------


def load_pages(path: str | Path) -> list[dict]:
    """The knowledge base's pages ({id, title, text} per line of kb.jsonl)."""
    with open(path, encoding="utf-8") as handle:
        return [json.loads(line) for line in handle if line.strip()]


def _words(text: str) -> set[str]:
    return set(re.findall(r"\w\w+", text.lower()))


_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


class SearchTool:
    """BM25 (bm25s, English stopwords) over the pages' title and text: what search[] returns
    offline (open() reads a whole page: a reading aid, not an action of the protocol)."""

    def __init__(self, pages: list[dict], max_results: int = MAX_RESULTS):
        import bm25s

        self.pages = list(pages)
        self.max_results = max_results
        self.by_title = {page["title"].lower(): page for page in self.pages}
        self._bm25s = bm25s
        self.index = bm25s.BM25()
        corpus = [f"{page['title']}. {page['text']}" for page in self.pages]
        self.index.index(bm25s.tokenize(corpus, stopwords="en", show_progress=False), show_progress=False)

    def search(self, query: str) -> str:
        """The top pages for `query` as "title: snippet" joined by " | "; NO_RESULTS when no page
        shares a word with it."""
        tokens = self._bm25s.tokenize([query], stopwords="en", show_progress=False, return_ids=False)
        if not self.pages or not tokens[0]:
            return NO_RESULTS
        k = min(self.max_results, len(self.pages))
        found, scores = self.index.retrieve(tokens, k=k, show_progress=False)
        hits = [self.pages[int(i)] for i, score in zip(found[0], scores[0]) if score > 0]
        if not hits:
            return NO_RESULTS
        return " | ".join(f"{page['title']}: {self.snippet(page, query)}" for page in hits)

    @staticmethod
    def snippet(page: dict, query: str) -> str:
        """The page's sentence sharing most words with the query (the first on ties), at most
        SNIPPET_CHARS characters. Words of the page's title count only when the query has no
        others: the title is shown anyway, the rest of the query says what is asked about it."""
        sentences = _SENTENCE.split(page["text"]) or [page["text"]]
        wanted = (_words(query) - _words(page["title"])) or _words(query)
        best = max(sentences, key=lambda sentence: len(wanted & _words(sentence)))
        return best if len(best) <= SNIPPET_CHARS else best[: SNIPPET_CHARS - 3] + "..."

    def open(self, title: str) -> str:
        """The text of the page titled `title` (case-insensitive), at most PAGE_CHARS characters."""
        page = self.by_title.get(title.strip().strip("\"'").lower())
        if page is None:
            return f'No page titled "{title}". Use search[...] to find page titles.'
        text = page["text"]
        return text if len(text) <= PAGE_CHARS else text[: PAGE_CHARS - 3] + "..."


# -- the ReAct loop, as pure steps on an episode ------------------------------------------------


@dataclass
class Request:
    """What an episode needs next: "generate" (a completion of `prompt`, at most `max_tokens`
    tokens, cut before the first of `stop`) or "done" (its final `answer` and how it ended:
    "answer", "forced", "max_steps", "context")."""

    kind: str
    prompt: str = ""
    max_tokens: int = 0
    stop: list[str] = field(default_factory=list)
    answer: str | None = None
    end: str | None = None


@dataclass
class Episode:
    """One question being played: the growing prompt and what happened so far. `trace` is the
    model's texts as the reference joins them (the step limit's answer is read from it)."""

    problem: str
    answer_type: str | None
    prompt: str
    max_steps: int = MAX_STEPS
    max_new_tokens: int = MAX_NEW_TOKENS
    steps: int = 0
    outputs: list[str] = field(default_factory=list)
    trace: str = ""
    actions: list[list[str]] = field(default_factory=list)
    searches: int = 0
    forcing: bool = False
    request: Request | None = None

    @property
    def done(self) -> bool:
        return self.request is not None and self.request.kind == "done"


def _generate(episode: Episode, max_tokens: int, stop: list[str]) -> Request:
    episode.request = Request("generate", prompt=episode.prompt, max_tokens=max_tokens, stop=list(stop))
    return episode.request


def _finish(episode: Episode, answer: str, end: str) -> Request:
    episode.request = Request("done", answer=answer, end=end)
    return episode.request


def episode_start(
    problem: str, answer_type: str | None = None, *, prompt: str = REFERENCE_PROMPT, max_steps: int = MAX_STEPS,
    max_new_tokens: int = MAX_NEW_TOKENS,
) -> Episode:  # fmt: skip
    """A new episode of a question (its `answer_type` is shown by the reference prompt); its first
    request (`episode.request`) asks for the first step."""
    episode = Episode(problem, answer_type, first_prompt(problem, answer_type, prompt), max_steps, max_new_tokens)
    _generate(episode, max_new_tokens, STOP)
    return episode


def last_answer(trace: str) -> str | None:
    """The last `Action: answer[...]` in the model's texts (the placeholder skipped), or None."""
    found = [a.strip() for a in ANSWER_ACTION.findall(trace)]
    found = [a for a in found if a.lower() != PLACEHOLDER_ANSWER]
    return found[-1] if found else None


def _next_step(episode: Episode) -> Request:
    if episode.steps >= episode.max_steps:
        return _finish(episode, last_answer(episode.trace) or NO_ANSWER, "max_steps")
    return _generate(episode, episode.max_new_tokens, STOP)


def step(episode: Episode, completion: str | None, tool) -> Request:
    """Advance `episode` with the model's completion of its last request (None: the prompt no
    longer fits the model's context); `tool.search(query)` answers a search. Returns the next
    request (also kept as episode.request)."""
    if episode.done:
        raise ValueError("the episode has ended")
    if completion is None:
        return _finish(episode, NO_ANSWER, "context")
    text = completion.strip()
    if episode.forcing:  # the completion of "...Action: answer["
        episode.forcing = False
        episode.trace += ("\n" + text) if text else ""
        if text.lower() == PLACEHOLDER_ANSWER:  # refused: the loop goes on from the same prompt
            return _next_step(episode)
        return _finish(episode, text, "forced")
    episode.steps += 1
    episode.outputs.append(text)
    episode.trace += ("\n" + text) if episode.trace else text
    episode.prompt += " " + text
    match = ACTION.search(text)
    if match is None:
        episode.forcing = True
        episode.prompt += FORCED_ANSWER
        return _generate(episode, FORCED_ANSWER_TOKENS, FORCED_STOP)
    action, argument = match.group(1), match.group(2).strip()
    episode.actions.append([action, argument])
    if action == "answer":
        if argument.lower() != PLACEHOLDER_ANSWER:
            return _finish(episode, argument, "answer")
        episode.prompt += f"\n{INVALID_ANSWER}\nThought:"
    else:
        episode.searches += 1
        episode.prompt += f"\nObservation: {tool.search(argument)}\nThought:"
    return _next_step(episode)


def play(
    problem: str, complete, tool, answer_type: str | None = None, *, prompt: str = REFERENCE_PROMPT
) -> tuple[str, Episode]:
    """One whole episode with `complete(prompt, max_tokens, stop) -> str | None` (greedy, cut
    before the first stop string); returns (answer, episode)."""
    episode = episode_start(problem, answer_type, prompt=prompt)
    request = episode.request
    while request.kind == "generate":
        request = step(episode, complete(request.prompt, request.max_tokens, request.stop), tool)
    return request.answer, episode


# -- answers ------------------------------------------------------------------------------------

_NONE_START = re.compile(r"^\W*(none|no|nothing|nobody|no one|n/?a|empty|zero|0)\b", re.IGNORECASE)


def gold_items(gold: str | None, answer_type: str) -> list[str]:
    """The gold items of a question: [] for "None" (or a missing answer), the comma-split items of
    a set answer, the whole answer of a single one."""
    if gold is None or gold.strip().lower() in ("", "none"):
        return []
    if answer_type == SET:
        return [item.strip() for item in gold.split(",") if item.strip()]
    return [gold.strip()]


def says_none(predicted: str | None) -> bool:
    """Whether an answer says that nothing qualifies ("None", "No one", "n/a", "none of them",
    "No such companies", ...). An empty answer says nothing, so it is not one."""
    return bool(predicted and _NONE_START.search(predicted.strip()))


def normalize(text: str) -> str:
    """Lower-case words and numbers separated by single spaces (punctuation dropped)."""
    return " ".join(re.findall(r"\w+", (text or "").lower()))


def contains_words(text: str, part: str) -> bool:
    """Whether `part` (normalised, non-empty) occurs in `text` as whole words."""
    part = normalize(part)
    return bool(part) and f" {part} " in f" {normalize(text)} "


def string_match(predicted: str | None, gold: str | None, answer_type: str) -> bool:
    """The reference's fallback verdict. Single: the gold answer occurs in the prediction, or the
    prediction in the gold (case-insensitive); Set: every comma-split gold item occurs in the
    prediction (extras are not penalised).

    Beyond the reference: an empty gold ("None", which the reference would crash on) is correct
    iff the prediction says there are none (`says_none`); an empty prediction is never correct;
    and "prediction inside the gold" must be whole words ("Varo" for "Tel Varo", not "a"), as a
    plain substring would credit any one-letter answer."""
    items = gold_items(gold, answer_type)
    if not items:
        return says_none(predicted)
    pred = (predicted or "").strip().lower()
    if not pred:
        return False
    if answer_type == SET:
        return all(item.lower() in pred for item in items)
    return items[0].lower() in pred or contains_words(items[0], pred)


def official_metrics(correctness_details: dict, excessive_answers: list) -> dict:
    """One question's official grading from the autorater's output: TP = gold items found, FN =
    gold items missed, FP = excessive answers; precision, recall and F1 (0 when undefined), and the
    four outcomes (fully correct: every gold item found, or none to find, and no extras; fully
    incorrect: gold items exist and none was found; correct with excessive answers: every gold
    item found (or none to find) but extras given; partially correct: the rest)."""
    tp = sum(1 for found in correctness_details.values() if found is True)
    fn = len(correctness_details) - tp
    fp = len(excessive_answers)
    precision = tp / (tp + fp) if tp + fp else 0.0
    recall = tp / (tp + fn) if tp + fn else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    all_found = fn == 0  # also true with no gold items
    fully_correct = all_found and fp == 0
    fully_incorrect = bool(correctness_details) and tp == 0
    with_extras = fp > 0 and all_found
    return {
        "tp": tp,
        "fn": fn,
        "fp": fp,
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "fully_correct": fully_correct,
        "fully_incorrect": fully_incorrect,
        "correct_with_excessive_answers": with_extras,
        "partially_correct": not (fully_correct or fully_incorrect or with_extras),
    }
