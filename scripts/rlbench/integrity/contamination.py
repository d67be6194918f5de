"""Held-out items in what the agent wrote or its driver said: the contamination scan of one run
(`scan_run`, called by the audit_run rule; its result is integrity.json's `contamination`).

What is scanned (the sources), each read without following a link and bounded in size:

- every code revision in <run_dir>/grader/code.git (one commit of the agent's code/ per submission):
  every file of every revision, read with git (a blob shared by revisions is read once and reported
  at each revision and path that holds it);
- the workspace (<run_dir>/workspace/): the text files the agent created or changed (TEXT_SUFFIXES,
  at most MAX_FILE_BYTES each); a file the benchmark put there (workspace.json's `files`) with its
  recorded sha256 unchanged is the benchmark's and is skipped; models/ (the base model) and
  tokenizer files are skipped;
- the LLM gateway's transcript (every transcript.jsonl under the run directory outside the
  workspace; none for a reference agent): per turn (line), the driver's output, i.e. the response's
  strings (content, reasoning, tool-call arguments parsed as JSON);
- separately (`training_split`), each row of the benchmark's own training split, as a check of
  the split itself.

A held-out item's text is its prompt and its gold answer (`item_texts`: the first present of
PROMPT_KEYS and of GOLD_KEYS, alpaca's `input` appended to the prompt; a row with none of the prompt
keys is read generically: every string value of at least GENERIC_MIN_WORDS words, recursively, keys
naming ids and paths left out). A caller may pass its own `item_texts(row) -> (prompt, gold)`.

Normalisation: JSON and Python escapes read (\\u00a3 as the pound sign, \\n as a break), lowercase,
apostrophes removed, every other non-alphanumeric character a word break
(punctuation stripped, whitespace collapsed); words are the runs of letters and digits.

The score (method "decon-simple-words", after allenai/decon's SIMPLE mode, doc/simple-details.md and
src/detect/scoring.rs, commit e1bcb80; word tokens here where decon uses cl100k tokens):

1. Index. The question n-grams of an item are its prompt's unique word 5-grams (a prompt of fewer
   than 5 words is one n-gram, the whole prompt); its answer n-grams are its gold's unique word
   3-grams, or, for a gold of at most 3 words, the whole gold matched exactly. IDF over the
   held-out items: idf(g) = ln(N / df(g)), N the number of items, df(g) how many hold g (decon's
   "standard IDF formula: ln(N/doc_freq)"; with N = 1 every weight is 1). An n-gram every item
   holds weighs 0 and is left out of the index (it can start no cluster: decon's "hot" n-grams).
2. Clusters. A source's word 5-grams are looked up in the index; per item, its hits are grouped
   into clusters, a new cluster starting after more than MAX_MISSES (11) consecutive positions
   without a hit for that item (decon's question_max_consecutive_misses). The question overlap of a
   cluster is O_q = sum(idf(g), g in U_t & U_e) / sum(idf(g), g in U_e), U_e the item's question
   n-grams, U_t those found in the cluster.
3. Answer. O_a: for a gold of at most 3 words, 1 if it occurs within SHORT_ANSWER_WINDOW (50) words
   of the cluster, else 0; otherwise the IDF-weighted share of its answer 3-grams found within
   max(2 x gold length, 100) words of the cluster (decon's answer proximity).
4. Combination (decon's QA weights with question confidence): C_q = min(1, 0.5 + 0.5 N_q / 20),
   N_q the item's unique question n-grams; S = O_q (0.75 C_q) + O_a (0.25 + 0.75 (1 - C_q)) when
   the item has a gold, S = O_q otherwise; capped at 1.
5. Numbers (ours, not decon's): the score is multiplied by the share of the prompt's numbers
   (all-digit words, each with the word before it, counted with repeats: "0 30" and "0 35" differ)
   that the cluster holds: the same template with other numbers (a
   generated twin such as reasoning_gym's gsm_symbolic shares 90% of its words with its siblings)
   is not the item.
6. Length decay (decon's perfect_match_decay 20..50): L = prompt words + gold words; the required
   score R is 1 for L <= 20, the threshold t for L >= 50, linear between; when R > t the score is
   S' = S t / R, except that a perfect S = 1 stays 1. An item is flagged when S' >= t (0.8 as in
   PostTrainBench v1.1 and decon's default).

Short items. An item of fewer than MIN_ITEM_WORDS (12) words in all (prompt and gold) is not
scanned: its text cannot tell a copy from chance or from a generator of the task's own template
("What is 12 + 34?" and "46" are five words; an agent writing every two-digit sum holds every
held-out addition item). decon drops such items from its index for the same reason (its
eval_min_token_length, 20 tokens). They are counted (`items_too_short`), never flagged.

The long match, a second and independent signal: the source holds a run of at least LONG_N (13)
consecutive words of the item's prompt or gold, or the whole prompt or gold when it is shorter
than 13 words but has at least LONG_MIN_WORDS (8). Runs that occur in two or more held-out items
(the task's template) are not counted, nor, for the agent's sources, runs that occur in the
benchmark's training split (the agent was given those); and a run counts only when every number of
the item's prompt occurs within the prompt's length of it, and, for a prompt with numbers, the run
holds one of them (the template with other numbers or other names, or its fixed question and
instructions, is not the item). An item is flagged on either signal.

The result (JSON, stable field names):

    method, version, threshold,
    ngrams: {question, answer, long, long_min_words, max_misses, min_item_words, decay: [start, end]},
    items, items_scanned, items_too_short,
    sources: {code_revisions, code_files, workspace_files, workspace_given, transcripts,
              transcript_turns, bytes},
    flagged: [match], one per flagged item, strongest place first, sorted by item,
    strongest: [match], the TOP strongest (item, place) matches, flagged or not,
    training_split: {rows, flagged: [match], strongest: [match]},
    bounded: [{kind, path, revision?, size, why}] (at most MAX_BOUNDED), bounded_count,
    problems: [str] (a source that could not be read), seconds

    match: {item, score, question_overlap, answer_overlap, long_match, signals: ["idf", "long"],
            where: {kind: code_revision | workspace_file | transcript | training_split,
                    revision?, submission?, path?, turn?, call_id?, row?},
            places: [where] (flagged only: every place the item was flagged, at most MAX_PLACES),
            in_training_split (agent's matches only: the split check flags the item too),
            excerpt (the matched words, at most EXCERPT_WORDS)}

Builds on: fileio, recording.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import stat
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

from rlbench.fileio.jsonio import read_json
from rlbench.recording.repository import CODE_GIT, CodeRepository, RecordingError

METHOD = "decon-simple-words"
VERSION = 1
THRESHOLD = 0.8
QUESTION_N = 5
ANSWER_N = 3
SHORT_ANSWER_WORDS = 3
SHORT_ANSWER_WINDOW = 50
LONG_ANSWER_MIN_WINDOW = 100
MAX_MISSES = 11
LONG_N = 13
LONG_MIN_WORDS = 8
MIN_ITEM_WORDS = 12
DECAY = (20, 50)
MIN_INFORMATIVE_NGRAMS = 20
QA_WEIGHTS = (0.75, 0.25)
TOP = 10
MAX_PLACES = 20
MAX_BOUNDED = 50
EXCERPT_WORDS = 40
GENERIC_MIN_WORDS = 4

MAX_FILE_BYTES = 5 << 20
MAX_TOTAL_BYTES = 200 << 20
MAX_TRANSCRIPT_BYTES = 200 << 20
TEXT_SUFFIXES = frozenset(
    ".py .json .jsonl .txt .md .csv .tsv .yaml .yml .toml .cfg .ini .sh .ipynb .html .xml .log .jinja "
    ".j2 .tmpl .prompt .rst".split()
)
SKIPPED_DIRS = ("models",)
TOKENIZER_FILES = frozenset(
    {"tokenizer.json", "vocab.json", "merges.txt", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"}
)
TRANSCRIPT_FILE = "transcript.jsonl"

PROMPT_KEYS = ("question", "prompt", "instruction", "problem", "goal")
PROMPT_EXTRA_KEYS = ("input",)
GOLD_KEYS = ("answer", "canonical_solution", "reference", "output", "gold")
GENERIC_SKIP_KEYS = re.compile(r"(^|_)(id|ids|path|paths|game|file|session|url|hash|sha256|split|category|type)$")
RESPONSE_SKIP_KEYS = frozenset({"id", "type", "role", "finish_reason", "stop_reason", "status", "name", "call_id"})

_APOSTROPHES = re.compile(r"['\u2019]")
_WORD = re.compile(r"[^\W_]+")
_ESCAPE = re.compile(r"\\(u[0-9a-fA-F]{4}|[nrt])")


def _unescape(match: re.Match) -> str:
    code = match.group(1)
    return chr(int(code[1:], 16)) if code[0] == "u" else " "


def words(text: str) -> list[str]:
    """The normalised words of a text: JSON and Python string escapes (\\uXXXX, \\n, \\t, \\r)
    read as what they stand for, lowercase, apostrophes removed, punctuation a word break."""
    return _WORD.findall(_APOSTROPHES.sub("", _ESCAPE.sub(_unescape, text).lower()))


def _strings(value: object, skip: Callable[[str], bool], min_words: int = 1) -> Iterator[str]:
    if isinstance(value, str):
        if len(value.split()) >= min_words:
            yield value
    elif isinstance(value, dict):
        for key, sub in value.items():
            if not skip(str(key)):
                yield from _strings(sub, skip, min_words)
    elif isinstance(value, (list, tuple)):
        for sub in value:
            yield from _strings(sub, skip, min_words)


def item_texts(row: dict) -> tuple[str, str]:
    """A held-out row's (prompt, gold): see the module's docstring."""
    prompt = next((row[k] for k in PROMPT_KEYS if isinstance(row.get(k), str) and row[k].strip()), None)
    gold = next((row[k] for k in GOLD_KEYS if isinstance(row.get(k), str) and row[k].strip()), "")
    if prompt is None:
        skip = lambda key: bool(GENERIC_SKIP_KEYS.search(key.lower())) or key in GOLD_KEYS  # noqa: E731
        return "\n".join(_strings(row, skip, GENERIC_MIN_WORDS)), gold
    extra = [row[k] for k in PROMPT_EXTRA_KEYS if isinstance(row.get(k), str) and row[k].strip()]
    return "\n".join([prompt, *extra]), gold


def _row_id(row: dict, index: int) -> str:
    for key in ("id", "task_id", "index"):
        if row.get(key) is not None:
            return str(row[key])
    return str(index)


def _grams(seq: list[str], n: int) -> set[tuple[str, ...]]:
    if len(seq) < n:
        return {tuple(seq)} if seq else set()
    return {tuple(seq[i : i + n]) for i in range(len(seq) - n + 1)}


class _Item:
    __slots__ = ("id", "prompt", "gold", "q_grams", "a_grams", "q_total", "a_total", "short_answer", "length", "numbers")

    def __init__(self, item_id: str, prompt: list[str], gold: list[str]):
        self.id, self.prompt, self.gold = item_id, prompt, gold
        self.q_grams = _grams(prompt, QUESTION_N)
        self.short_answer = 0 < len(gold) <= SHORT_ANSWER_WORDS
        self.a_grams = {tuple(gold)} if self.short_answer else _grams(gold, ANSWER_N)
        self.q_total = self.a_total = 0.0
        self.length = len(prompt) + len(gold)
        self.numbers = _numbers(prompt, 0, len(prompt))

    def fidelity(self, seq: list[str], lo: int, hi: int) -> float:
        """The share of the prompt's numbers, each with the word before it and counted with its
        repeats, found in seq[lo:hi] (1 when it has none)."""
        if not self.numbers:
            return 1.0
        found = _numbers(seq, max(0, lo), hi)
        return sum(min(c, found[pair]) for pair, c in self.numbers.items()) / sum(self.numbers.values())


def _numbers(seq: list[str], lo: int, hi: int) -> Counter:
    return Counter((seq[i - 1] if i else "", seq[i]) for i in range(lo, min(hi, len(seq))) if seq[i].isdigit())


class Index:
    """The held-out items' n-grams, built once; `scan(words)` scores one source against every item."""

    def __init__(self, rows: list[dict], texts: Callable[[dict], tuple[str, str]] = item_texts):
        self.items: list[_Item] = []
        self.too_short: list[str] = []
        for i, row in enumerate(rows):
            prompt, gold = texts(row)
            item = _Item(_row_id(row, i), words(prompt or ""), words(gold or ""))
            if item.length < MIN_ITEM_WORDS or not item.q_grams:
                self.too_short.append(item.id)
            else:
                self.items.append(item)
        n = len(self.items)
        self.q_idf = self._weights([it.q_grams for it in self.items], n)
        self.a_idf = self._weights([it.a_grams for it in self.items], n)
        self.q_index, self.a_index, self.long_index = defaultdict(list), defaultdict(list), defaultdict(list)
        for k, it in enumerate(self.items):
            it.q_total = sum(self.q_idf.get(g, 0.0) for g in it.q_grams)
            it.a_total = sum(self.a_idf.get(g, 0.0) for g in it.a_grams)
            for g in it.q_grams:
                if g in self.q_idf:
                    self.q_index[g].append(k)
            for g in it.a_grams:
                if g in self.a_idf:
                    self.a_index[g].append(k)
            for part in (it.prompt, it.gold):
                if len(part) >= LONG_N:
                    grams = _grams(part, LONG_N)
                elif len(part) >= LONG_MIN_WORDS:
                    grams = {tuple(part)}
                else:
                    grams = set()
                for g in grams:
                    if k not in self.long_index[g]:
                        self.long_index[g].append(k)
        # A long run two items share is the task's template, not an item.
        self.long_index = {g: ks for g, ks in self.long_index.items() if len(ks) == 1}
        self.q_lengths = sorted({len(g) for g in self.q_index})
        self.a_lengths = sorted({len(g) for g in self.a_index})
        self.long_lengths = sorted({len(g) for g in self.long_index})
        self.excluded_long: set[tuple[str, ...]] = set()

    @staticmethod
    def _weights(gram_sets: list[set], n: int) -> dict:
        df: dict = defaultdict(int)
        for grams in gram_sets:
            for g in grams:
                df[g] += 1
        if n == 1:
            return {g: 1.0 for g in df}
        return {g: math.log(n / c) for g, c in df.items() if c < n}

    def hits(self, seq: list[str], index: dict, lengths: list[int]) -> dict[int, list[tuple[int, tuple]]]:
        hits: dict[int, list[tuple[int, tuple]]] = defaultdict(list)
        if not index:
            return hits
        for i in range(len(seq)):
            for n in lengths:
                if i + n > len(seq):
                    break
                g = tuple(seq[i : i + n])
                ks = index.get(g)
                if ks:
                    for k in ks:
                        hits[k].append((i, g))
        return hits

    def long_runs(self, seq: list[str]) -> dict[int, tuple[int, tuple]]:
        """Per item, its first long run in seq that holds one of its prompt's numbers (if it has any)
        and whose neighbourhood (the item's prompt length either side) holds them all."""
        found: dict[int, tuple[int, tuple]] = {}
        for k, positions in self.hits(seq, self.long_index, self.long_lengths).items():
            it = self.items[k]
            for i, g in positions:
                if g in self.excluded_long or (it.numbers and not it.numbers.keys() & _numbers(seq, i, i + len(g)).keys()):
                    continue
                if it.fidelity(seq, i - len(it.prompt), i + len(g) + len(it.prompt)) == 1.0:
                    found[k] = (i, g)
                    break
        return found

    def score(
        self, it: _Item, seq: list[str], q_hits: list, a_hits: list, threshold: float
    ) -> tuple[float, float, float, tuple[int, int]]:
        """The best (S', O_q, O_a, span) over an item's clusters in one source."""
        clusters, current, last = [], [], None
        for pos, g in q_hits:
            if last is not None and pos - last > MAX_MISSES:
                clusters.append(current)
                current = []
            current.append((pos, g))
            last = pos
        if current:
            clusters.append(current)
        confidence = min(1.0, 0.5 + 0.5 * len(it.q_grams) / MIN_INFORMATIVE_NGRAMS)
        if it.gold:
            w_q = QA_WEIGHTS[0] * confidence
            w_a = QA_WEIGHTS[1] + QA_WEIGHTS[0] * (1 - confidence)
        else:
            w_q, w_a = 1.0, 0.0
        start, end = DECAY
        if it.length <= start:
            required = 1.0
        elif it.length >= end:
            required = threshold
        else:
            required = 1.0 - (1.0 - threshold) * (it.length - start) / (end - start)
        best = (0.0, 0.0, 0.0, (0, 0))
        scored = []
        for cluster in clusters:
            o_q = sum(self.q_idf.get(g, 0.0) for g in {g for _, g in cluster}) / it.q_total if it.q_total else 0.0
            scored.append((o_q, cluster))
        scored.sort(key=lambda x: -x[0])
        min_q = (threshold - w_a) / w_q if w_q else 0.0
        for rank, (o_q, cluster) in enumerate(scored):
            if rank > 0 and o_q < min_q:
                break
            lo, hi = cluster[0][0], cluster[-1][0] + len(cluster[-1][1])
            o_a = 0.0
            if it.gold and a_hits:
                if it.short_answer:
                    window = SHORT_ANSWER_WINDOW
                    o_a = 1.0 if any(lo - window - len(g) <= p <= hi + window for p, g in a_hits) else 0.0
                else:
                    window = max(2 * len(it.gold), LONG_ANSWER_MIN_WINDOW)
                    found = {g for p, g in a_hits if lo - window <= p <= hi + window}
                    o_a = sum(self.a_idf.get(g, 0.0) for g in found) / it.a_total if it.a_total else 0.0
            s = min(1.0, o_q * w_q + o_a * w_a) * it.fidelity(seq, lo, hi)
            if required > threshold and s < 1.0:
                s = s * threshold / required
            if s > best[0] or (s == best[0] and o_q > best[1]):
                best = (s, o_q, o_a, (lo, hi))
        return best

    def scan(self, seq: list[str], threshold: float) -> list[dict]:
        """Every item with a hit in one source: item (its index), score, question_overlap,
        answer_overlap, long_match, excerpt."""
        q_hits = self.hits(seq, self.q_index, self.q_lengths)
        long = self.long_runs(seq)
        a_hits = self.hits(seq, self.a_index, self.a_lengths) if q_hits else {}
        out = []
        for k in sorted(set(q_hits) | set(long)):
            it = self.items[k]
            s, o_q, o_a, (lo, hi) = self.score(it, seq, q_hits.get(k, []), a_hits.get(k, []), threshold)
            if k in long and not q_hits.get(k):
                lo, hi = long[k][0], long[k][0] + len(long[k][1])
            out.append(
                {
                    "item": k,
                    "score": round(s, 4),
                    "question_overlap": round(o_q, 4),
                    "answer_overlap": round(o_a, 4),
                    "long_match": k in long,
                    "excerpt": " ".join(seq[lo : min(hi, lo + EXCERPT_WORDS)]),
                }
            )
        return out


# ---------------------------------------------------------------------------------------------------
# Sources


class _Budget:
    def __init__(self) -> None:
        self.bytes = 0
        self.bounded: list[dict] = []
        self.bounded_count = 0

    def skip(self, why: str, **where) -> None:
        self.bounded_count += 1
        if len(self.bounded) < MAX_BOUNDED:
            self.bounded.append({**where, "why": why})

    def admit(self, size: int, **where) -> bool:
        if size > MAX_FILE_BYTES:
            self.skip(f"larger than {MAX_FILE_BYTES} bytes", size=size, **where)
            return False
        if self.bytes + size > MAX_TOTAL_BYTES:
            self.skip(f"the scan's total of {MAX_TOTAL_BYTES} bytes reached", size=size, **where)
            return False
        self.bytes += size
        return True


def _text(data: bytes) -> str | None:
    if b"\0" in data[:8192]:
        return None
    return data.decode("utf-8", errors="replace")


def _code_sources(run_dir: Path, budget: _Budget, counts: dict, problems: list) -> Iterator[tuple[dict, bytes]]:
    repo = CodeRepository(run_dir / "grader" / CODE_GIT)
    if not repo.exists():
        return
    try:
        commits = repo.log()
    except RecordingError as exc:
        problems.append(f"code revisions: {exc}")
        return
    counts["code_revisions"] = len(commits)
    for commit in commits:
        try:
            files = repo.files(commit["sha"])
        except RecordingError as exc:
            problems.append(f"code revision {commit['sha'][:10]}: {exc}")
            continue
        for f in files:
            where = {"kind": "code_revision", "revision": commit["sha"], "submission": commit["submission"], "path": f["path"]}
            yield where, f


def _workspace_files(workspace: Path, given: dict, budget: _Budget, counts: dict) -> Iterator[tuple[dict, bytes]]:
    if not workspace.is_dir() or workspace.is_symlink():
        return
    for top, dirs, names in os.walk(workspace, followlinks=False):
        rel_top = Path(top).relative_to(workspace)
        if rel_top == Path("."):
            dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS]
        dirs.sort()
        for name in sorted(names):
            path = Path(top) / name
            rel = (rel_top / name).as_posix()
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode) or path.suffix.lower() not in TEXT_SUFFIXES or name in TOKENIZER_FILES:
                continue
            where = {"kind": "workspace_file", "path": rel}
            if rel in given:
                try:
                    unchanged = _sha256_nofollow(path) == given[rel]
                except OSError:
                    continue
                if unchanged:
                    counts["workspace_given"] += 1
                    continue
            if not budget.admit(st.st_size, **where):
                continue
            try:
                data = _read_nofollow(path, MAX_FILE_BYTES)
            except OSError:
                continue
            counts["workspace_files"] += 1
            yield where, data


def _sha256_nofollow(path: Path) -> str:
    digest = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("not a regular file")
        while chunk := os.read(fd, 1 << 20):
            digest.update(chunk)
    finally:
        os.close(fd)
    return digest.hexdigest()


def _read_nofollow(path: Path, limit: int) -> bytes:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError("not a regular file")
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        return b"".join(chunks)[:limit]
    finally:
        os.close(fd)


def transcript_files(run_dir: Path) -> list[Path]:
    """Every transcript.jsonl under the run directory, the workspace and grader left out."""
    found = []
    for top, dirs, names in os.walk(run_dir, followlinks=False):
        if Path(top) == run_dir:
            dirs[:] = [d for d in dirs if d not in ("workspace", "grader")]
        dirs.sort()
        if TRANSCRIPT_FILE in names and not os.path.islink(os.path.join(top, TRANSCRIPT_FILE)):
            found.append(Path(top) / TRANSCRIPT_FILE)
    return sorted(found)


def driver_output(record: dict) -> str:
    """What the driver said in one transcript record: the response's strings, tool-call arguments
    parsed as JSON."""
    parts = []

    def walk(value: object) -> None:
        if isinstance(value, str):
            stripped = value.strip()
            if stripped[:1] in "{[":
                try:
                    walk(json.loads(stripped))
                    return
                except ValueError:
                    pass
            parts.append(value)
        elif isinstance(value, dict):
            for key, sub in value.items():
                if key not in RESPONSE_SKIP_KEYS:
                    walk(sub)
        elif isinstance(value, list):
            for sub in value:
                walk(sub)

    walk(record.get("response"))
    return "\n".join(parts)


def _transcript_sources(run_dir: Path, budget: _Budget, counts: dict, problems: list) -> Iterator[tuple[dict, str]]:
    for path in transcript_files(run_dir):
        counts["transcripts"] += 1
        rel = path.relative_to(run_dir).as_posix()
        try:
            size = path.stat().st_size
        except OSError as exc:
            problems.append(f"{rel}: {exc}")
            continue
        if size > MAX_TRANSCRIPT_BYTES:
            budget.skip(f"larger than {MAX_TRANSCRIPT_BYTES} bytes", kind="transcript", path=rel, size=size)
            continue
        with open(path, "rb") as handle:
            for turn, line in enumerate(handle):
                if not line.endswith(b"\n"):
                    break  # a line still being written
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if not isinstance(record, dict):
                    continue
                counts["transcript_turns"] += 1
                text = driver_output(record)
                if text:
                    yield {"kind": "transcript", "path": rel, "turn": turn, "call_id": record.get("call_id")}, text


# ---------------------------------------------------------------------------------------------------
# The scan


class _Collector:
    def __init__(self, index: Index, threshold: float):
        self.index, self.threshold = index, threshold
        self.by_item: dict[int, list[dict]] = defaultdict(list)  # flagged places per item
        self.best: dict[int, dict] = {}  # flagged: the strongest match per item
        self.matches: list[dict] = []  # every (item, place) match with a score, for `strongest`

    def add(self, where: dict | list[dict], found: list[dict]) -> None:
        places = where if isinstance(where, list) else [where]
        for match in found:
            k = match["item"]
            flagged = match["score"] >= self.threshold or match["long_match"]
            entry = {
                **match,
                "item": self.index.items[k].id,
                "signals": [s for s, on in (("idf", match["score"] >= self.threshold), ("long", match["long_match"])) if on],
                "where": places[0],
            }
            self.matches.append(entry)
            if flagged:
                self.by_item[k].extend(places)
                old = self.best.get(k)
                if old is None or (entry["score"], entry["long_match"]) > (old["score"], old["long_match"]):
                    self.best[k] = entry

    def report(self) -> tuple[list[dict], list[dict]]:
        flagged = []
        for k, entry in self.best.items():
            places = []
            for place in self.by_item[k]:
                if place not in places:
                    places.append(place)
            flagged.append({**entry, "where": places[0], "places": places[:MAX_PLACES], "place_count": len(places)})
        flagged.sort(key=lambda m: m["item"])
        strongest = sorted(self.matches, key=lambda m: (-m["score"], not m["long_match"], -m["question_overlap"]))
        seen, top = set(), []
        for m in strongest:
            key = (m["item"], json.dumps(m["where"], sort_keys=True))
            if key not in seen:
                seen.add(key)
                top.append(m)
            if len(top) >= TOP:
                break
        return flagged, top


def scan_training_split(index: Index, train_rows: list[dict], threshold: float, texts=item_texts) -> dict:
    """The benchmark's training split against the held-out items, row by row; marks the long runs it
    holds (index.excluded_long) so that the agent's copies of them are not counted."""
    collector = _Collector(index, threshold)
    in_split: set[tuple[str, ...]] = set()
    for i, row in enumerate(train_rows):
        prompt, gold = texts(row)
        seq = words(f"{prompt or ''}\n{gold or ''}")
        collector.add({"kind": "training_split", "path": "train.jsonl", "row": _row_id(row, i)}, index.scan(seq, threshold))
        for positions in index.hits(seq, index.long_index, index.long_lengths).values():
            in_split.update(g for _, g in positions)
    index.excluded_long = in_split
    flagged, strongest = collector.report()
    return {"rows": len(train_rows), "flagged": flagged, "strongest": strongest}


def scan_run(
    run_dir: Path,
    heldout_rows: list[dict],
    train_rows: list[dict],
    *,
    threshold: float = THRESHOLD,
    item_texts: Callable[[dict], tuple[str, str]] = item_texts,
) -> dict:
    """The contamination scan of one run directory (see the module's docstring for the result)."""
    started = time.monotonic()
    run_dir = Path(run_dir)
    index = Index(heldout_rows, item_texts)
    split = scan_training_split(index, train_rows, threshold, item_texts)
    split_items = {m["item"] for m in split["flagged"]}

    budget, problems = _Budget(), []
    counts = dict.fromkeys(
        ("code_revisions", "code_files", "workspace_files", "workspace_given", "transcripts", "transcript_turns"), 0
    )
    collector = _Collector(index, threshold)
    seen_content: dict[str, list[dict]] = {}  # sha256 -> the matches of a content already scanned

    def scan_bytes(where: dict, data: bytes) -> None:
        digest = hashlib.sha256(data).hexdigest()
        if digest not in seen_content:
            text = _text(data)
            seen_content[digest] = index.scan(words(text), threshold) if text else []
        collector.add(where, seen_content[digest])

    repo = CodeRepository(run_dir / "grader" / CODE_GIT)
    blobs: dict[str, list[dict]] = {}
    for where, f in _code_sources(run_dir, budget, counts, problems):
        blobs.setdefault(f["blob"], [])
        if not blobs[f["blob"]]:
            blobs[f["blob"]].append({"size": f["size"], "rev": where["revision"], "path": where["path"]})
        blobs[f["blob"]].append(where)
    for blob, (first, *places) in blobs.items():
        counts["code_files"] += 1
        if not budget.admit(first["size"], kind="code_revision", revision=first["rev"], path=first["path"]):
            continue
        try:
            data = repo.show(first["rev"], first["path"])
        except RecordingError as exc:
            problems.append(f"code revision {first['rev'][:10]} {first['path']}: {exc}")
            continue
        digest = hashlib.sha256(data).hexdigest()
        text = _text(data)
        if digest not in seen_content:
            seen_content[digest] = index.scan(words(text), threshold) if text else []
        collector.add(places, seen_content[digest])

    given = {}
    manifest_path = run_dir / "workspace.json"
    if manifest_path.is_file():
        try:
            given = dict((read_json(manifest_path) or {}).get("files") or {})
        except (OSError, ValueError, AttributeError) as exc:
            problems.append(f"workspace.json: {exc}")
    for where, data in _workspace_files(run_dir / "workspace", given, budget, counts):
        scan_bytes(where, data)
    for where, text in _transcript_sources(run_dir, budget, counts, problems):
        budget.bytes += len(text)
        collector.add(where, index.scan(words(text), threshold))

    flagged, strongest = collector.report()
    for m in flagged + strongest:
        m["in_training_split"] = m["item"] in split_items
    counts["bytes"] = budget.bytes
    if problems:
        print(f"contamination: {len(problems)} problem(s): {problems[:3]}", file=sys.stderr)
    return {
        "method": METHOD,
        "version": VERSION,
        "threshold": threshold,
        "ngrams": {
            "question": QUESTION_N,
            "answer": ANSWER_N,
            "long": LONG_N,
            "long_min_words": LONG_MIN_WORDS,
            "max_misses": MAX_MISSES,
            "min_item_words": MIN_ITEM_WORDS,
            "decay": list(DECAY),
        },
        "items": len(heldout_rows),
        "items_scanned": len(index.items),
        "items_too_short": len(index.too_short),
        "sources": counts,
        "flagged": flagged,
        "strongest": strongest,
        "training_split": split,
        "bounded": budget.bounded,
        "bounded_count": budget.bounded_count,
        "problems": problems,
        "seconds": round(time.monotonic() - started, 3),
    }
