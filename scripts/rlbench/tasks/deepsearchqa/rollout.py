"""DeepSearchQA episodes: the ReAct loop of public.py, many questions played in lockstep.

`play_questions` keeps up to `max_live` episodes live (continuous batching: when one ends the next
question starts). Each round, the live episodes are grouped by what they ask for (a normal step:
256 tokens and the ReAct stops; a forced answer: 128 tokens and "]"), and each group is one
generator.generate call (a TextGenerator from rlbench.generation.textgen keeps every episode's prompt cached
between calls). Then every episode takes its step, calling the search tool.

Search tools: offline, public.SearchTool over the held-out split's kb.jsonl (the same knowledge
base as the training split's); hub, the web as the reference searches it (`WebSearch`): SerpAPI
when its key is set, else DuckDuckGo (`search.provider: auto`, the default), or the provider named.
The provider used is recorded (the rollout's `search_provider`, the scorer's metric).
"""

from __future__ import annotations

import contextlib
import json
import os
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlbench.tasks.deepsearchqa import public
from rlbench.tasks.deepsearchqa.grading import judge_prompt_variant
from rlbench.tasks.parts import PhasedGenerator

KB_FILE = "kb.jsonl"
SERPAPI_URL = "https://serpapi.com/search"
DUCKDUCKGO_URL = "https://api.duckduckgo.com/"


class WebSearch:
    """The reference's web search: SerpAPI (the top organic results' snippets) or the DuckDuckGo
    Instant Answer API (AbstractText, else the first two RelatedTopics); any error becomes an
    observation "Search error: ..."."""

    def __init__(
        self, provider: str, api_key: str | None = None, max_results: int = public.MAX_RESULTS, timeout_s: float = 10.0
    ):
        if provider not in ("serpapi", "duckduckgo"):
            raise ValueError(f"unknown web search provider {provider!r} (serpapi or duckduckgo)")
        self.provider = provider
        self.api_key = api_key
        self.max_results = max_results
        self.timeout_s = timeout_s

    def _get(self, url: str, params: dict) -> dict:
        with urllib.request.urlopen(f"{url}?{urllib.parse.urlencode(params)}", timeout=self.timeout_s) as response:
            return json.loads(response.read().decode("utf-8"))

    def search(self, query: str) -> str:
        try:
            if self.provider == "serpapi":
                data = self._get(SERPAPI_URL, {"q": query, "api_key": self.api_key, "num": self.max_results})
                snippets = [r.get("snippet", "") for r in data.get("organic_results", [])[: self.max_results]]
                return " | ".join(snippets) if snippets else public.NO_RESULTS
            data = self._get(DUCKDUCKGO_URL, {"q": query, "format": "json", "no_html": 1})
            if data.get("AbstractText"):
                return data["AbstractText"]
            topics = [
                t.get("Text", "") for t in data.get("RelatedTopics", [])[:2] if isinstance(t, dict) and t.get("Text")
            ]
            return " | ".join(topics) if topics else public.NO_RESULTS
        except Exception as exc:  # the reference shows the model any failure as an observation
            return f"Search error: {exc}"


PROVIDERS = ("auto", "serpapi", "duckduckgo", "offline")


def web_provider(search: dict) -> str:
    """The web search an evaluation uses: `search.provider`, where `auto` is the reference's rule
    (SerpAPI when the key's variable, SERPAPI_KEY by default, is set; else DuckDuckGo)."""
    provider = search["provider"]
    if provider not in PROVIDERS:
        raise ValueError(f"tasks.deepsearchqa: unknown search.provider {provider!r}; use one of {', '.join(PROVIDERS)}")
    if provider == "auto":
        return "serpapi" if os.environ.get(search.get("api_key_var") or "SERPAPI_KEY") else "duckduckgo"
    return provider


def search_tool(settings: dict, eval_dir: Path):
    """The evaluation's search tool and the provider's name: offline, BM25 over the split's
    knowledge base ("offline"); hub, the web provider `web_provider` picks."""
    search = settings["search"]  # the registry's block (every key required by the task schema)
    max_results = int(search["max_results"])
    if settings.get("source", "offline") != "hub":
        return public.SearchTool(public.load_pages(Path(eval_dir) / KB_FILE), max_results=max_results), "offline"
    provider = web_provider(search)
    if provider == "offline":
        raise ValueError(
            "tasks.deepsearchqa: source hub asks real questions, which the offline knowledge base cannot "
            "answer; set search.provider to auto, serpapi or duckduckgo (or use source: offline)"
        )
    key = None
    if provider == "serpapi":
        variable = search["api_key_var"] or "SERPAPI_KEY"
        key = os.environ.get(variable)
        if not key:
            raise ValueError(
                f"search.provider serpapi needs an API key in the environment variable {variable}: export it, "
                "or use search.provider auto (DuckDuckGo without a key, as the reference)"
            )
    return WebSearch(provider, key, max_results, float(search["timeout_s"])), provider


def play_questions(
    questions: dict,
    generator,
    tool,
    *,
    prompt: str = public.REFERENCE_PROMPT,
    max_steps: int = public.MAX_STEPS,
    max_new_tokens: int = public.MAX_NEW_TOKENS,
    max_live: int | None = None,
    workers: int = 1,
) -> dict:
    """Play every question (key -> (problem, answer type)); key -> episode record {answer, end
    ("answer", "forced", "max_steps", "context"), steps, searches, actions}. `workers` threads take
    the episodes' steps (their tool calls) at once: a web search waits on the network."""
    public.check_prompt(prompt)
    keys = list(questions)
    width = max(1, min(len(keys), int(max_live or len(keys)))) if keys else 0
    pending = list(keys)
    live: dict = {}
    results: dict = {}

    def start() -> None:
        while pending and len(live) < width:
            key = pending.pop(0)
            problem, answer_type = questions[key]
            live[key] = public.episode_start(
                problem, answer_type, prompt=prompt, max_steps=max_steps, max_new_tokens=max_new_tokens
            )

    def advance(item):
        key, completion = item
        return key, public.step(live[key], completion, tool)

    start()
    with ThreadPoolExecutor(max_workers=workers) if workers > 1 else contextlib.nullcontext() as pool:
        while live:
            groups: dict = {}
            for key, episode in live.items():
                request = episode.request
                groups.setdefault((request.max_tokens, tuple(request.stop)), []).append(key)
            completions = {}
            for (max_tokens, stop), group in groups.items():
                answered = generator.generate({key: live[key].request.prompt for key in group}, max_tokens, list(stop))
                completions.update({key: answered.get(key) for key in group})
            stepped = list((pool.map if pool is not None else map)(advance, completions.items()))
            for key, request in stepped:
                if request.kind == "done":
                    episode = live.pop(key)
                    results[key] = {
                        "answer": request.answer,
                        "end": request.end,
                        "steps": episode.steps,
                        "searches": episode.searches,
                        "actions": episode.actions,
                    }
                    release = getattr(generator, "release", None)
                    if release is not None:
                        release(key)
            start()
    return {key: results[key] for key in keys}


def prompt_variant(settings: dict) -> str:
    """The task's `prompt` setting (default: the reference's), checked."""
    return public.check_prompt(settings.get("prompt") or public.REFERENCE_PROMPT)


class SearchRollout:
    """The evaluation's rollout: every held-out question played with the submitted model in
    lockstep, the search tool answering between steps."""

    def __init__(self, settings: dict):
        self.settings = settings

    def prepare(self, ctx) -> None:
        prompt_variant(self.settings)  # a bad variant stops the evaluation before the model loads
        judge_prompt_variant(self.settings)
        ctx.text_generator()  # the model loads before the held-out split is read

    def run(self, rows: list[dict], ctx) -> dict:
        environment = self.settings.get("environment") or {}
        generator = ctx.text_generator()

        ctx.phase("environment")
        tool, provider = search_tool(self.settings, ctx.eval_dir)
        web = provider != "offline"
        episodes = play_questions(
            {row["id"]: (row["problem"], row["answer_type"]) for row in rows},
            PhasedGenerator(generator, ctx.phase),
            tool,
            prompt=prompt_variant(self.settings),
            max_steps=environment.get("max_steps") or public.MAX_STEPS,
            max_new_tokens=self.settings.get("max_new_tokens") or public.MAX_NEW_TOKENS,
            max_live=environment.get("max_live") or ctx.evaluation["batch_size"],
            workers=environment.get("workers") or (8 if web else 1),  # BM25 answers in microseconds
        )
        return {"episodes": episodes, "generator": getattr(generator, "stats", None), "search_provider": provider}

    def code_files(self) -> list[Path]:
        from rlbench.generation import full_prompt, kv_buffer, prefix_cache, textgen, textgen_base, vllm_text

        generation = (textgen, textgen_base, full_prompt, prefix_cache, kv_buffer, vllm_text)
        return [Path(public.__file__), *(Path(module.__file__) for module in generation)]
