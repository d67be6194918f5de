"""A judge behind any OpenAI-compatible chat-completions endpoint (OpenAI, Azure OpenAI's v1 API,
a local `vllm serve`, ...), asked exactly as AlpacaEval 2.0's default annotator asks:
max_tokens 1, temperature 1, top_p 1, logprobs with the top 5 alternatives.

Parsing follows alpaca_eval's `logprob_parser(numerator_token="m", denominator_tokens=["m", "M"],
is_binarize=False)`: from the first token's top_logprobs keep "m" and "M" (an absent one has
probability 0; neither present = unparsable), P(m) = exp(lp_m - logsumexp(lp_m, lp_M)),
preference = 2 - P(m). An endpoint that returns no logprobs is read from its text instead
("m" -> 1, "M" -> 2, anything else unparsable); each verdict records which parser gave it.
`logprobs: false` asks for the text only (endpoints that refuse the logprobs parameters).

A ranking annotator (`judge.annotator: reference_gpt52_fn` or `paper_gpt4o`,
rlbench.scoring.judges.annotators) is asked as alpaca_eval's openai_completions asks with the reference's
configs.yaml: max_tokens 100, temperature 0, top_p 1, the make_partial_leaderboard tool forced; its answer
(the tool call's arguments) is read with alpaca_eval's parser, and a refused or unparsable answer is not
asked again (alpaca_eval parses each answer once).

Free-text prompts (Judge.ask, for grading tasks) are sent as they are, with the max_tokens the task
asks for, the judge's temperature, top_p 1 and no logprobs; the answer is the message's content
(a response without a content string is unparsable).

Failures (timeout, connection, HTTP error, refusal or content filter, unparsable answer) are
retried up to max_retries times with exponential backoff (retry_backoff_s, doubling, at most
30 s, longer when the server sends Retry-After); the last one is returned as the call's verdict
(or answer).
"""

from __future__ import annotations

import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, TypeVar

import requests

from rlbench.scoring.judges.annotators import Annotator, parse_ranking, ranking_answer_text, ranking_decoding
from rlbench.scoring.judges.base import Answer, Call, Judge, JudgeError, Verdict, preference_from_logprobs
from rlbench.scoring.judges.prompt import FIRST_TOKEN, SECOND_TOKEN

DEFAULT_BASE_URL = "https://api.openai.com/v1"
MAX_BACKOFF_S = 30.0

#: A call's result: a Verdict (pairwise) or an Answer (free text); both take failure= and detail=.
Result = TypeVar("Result", Verdict, Answer)


def logprob_preference(top_logprobs: list[dict]) -> float | None:
    """alpaca_eval's logprob rule: 2 - P(m) over {m, M}; None when neither token is listed."""
    found = {t.get("token"): t.get("logprob") for t in top_logprobs if t.get("token") in (FIRST_TOKEN, SECOND_TOKEN)}
    found = {token: lp for token, lp in found.items() if isinstance(lp, (int, float))}
    if not found:
        return None
    return preference_from_logprobs(found.get(FIRST_TOKEN, -math.inf), found.get(SECOND_TOKEN, -math.inf))


def text_preference(text: str | None) -> float | None:
    """The answer read as text: "m" -> 1 (output_1 better), "M" -> 2; None otherwise."""
    answer = (text or "").strip()
    return {FIRST_TOKEN: 1.0, SECOND_TOKEN: 2.0}.get(answer)


def _first_choice(body: Any) -> tuple[dict, dict] | tuple[str, str]:
    """(choice, message) of a chat-completions response body, or (failure kind, detail) when it
    has no choice or its answer was refused (a refusal or a content filter)."""
    try:
        choice = body["choices"][0]
        message = choice.get("message") or {}
        if not isinstance(message, dict):
            raise TypeError(message)
    except (KeyError, IndexError, TypeError, AttributeError):
        return "unparsable", f"no choices in the response: {str(body)[:200]}"
    if choice.get("finish_reason") == "content_filter" or message.get("refusal"):
        return "refusal", str(message.get("refusal") or "finish_reason content_filter")[:200]
    return choice, message


def parse_completion(body: Any) -> Verdict:
    """A chat-completions response body -> a verdict (preference with its parser, or refusal/unparsable)."""
    choice, message = _first_choice(body)
    if isinstance(choice, str):
        return Verdict(failure=choice, detail=message)
    content = message.get("content")
    logprobs = choice.get("logprobs") or {}
    tokens = logprobs.get("content") if isinstance(logprobs, dict) else None
    top = (tokens[0].get("top_logprobs") if tokens and isinstance(tokens[0], dict) else None) or []
    if top:
        preference = logprob_preference(top)
        if preference is None:  # alpaca_eval's NaN: neither m nor M among the alternatives
            listed = [t.get("token") for t in top]
            return Verdict(failure="unparsable", detail=f"neither m nor M in top_logprobs {listed}")
        return Verdict(preference=preference, parser="logprobs")
    preference = text_preference(content)
    if preference is None:
        return Verdict(failure="unparsable", detail=f"answer {str(content)[:200]!r} is neither m nor M")
    return Verdict(preference=preference, parser="text")


def parse_ranking_completion(body: Any) -> Verdict:
    """A chat-completions response body to a ranking prompt -> m's rank as the verdict's preference (1 or 2,
    parser "ranking"), or refusal / unparsable (alpaca_eval's NaN)."""
    choice, message = _first_choice(body)
    if isinstance(choice, str):
        return Verdict(failure=choice, detail=message)
    text = ranking_answer_text(message)
    preference = parse_ranking(text)
    if preference is None:
        return Verdict(failure="unparsable", detail=f"no rank of m in {str(text)[:200]!r}")
    return Verdict(preference=preference, parser="ranking")


def parse_text_completion(body: Any) -> Answer:
    """A chat-completions response body -> the answer's text (a string, possibly empty), or a
    refusal, or unparsable when there is no content string. A reply cut at max_tokens says so in
    its detail."""
    choice, message = _first_choice(body)
    if isinstance(choice, str):
        return Answer(failure=choice, detail=message)
    content = message.get("content")
    if not isinstance(content, str):
        return Answer(failure="unparsable", detail=f"no content string in the answer: {str(message)[:200]}")
    truncated = choice.get("finish_reason") == "length"
    return Answer(text=content, detail="finish_reason length: cut at max_tokens" if truncated else None)


def _error_failure(response: requests.Response) -> tuple[str, str]:
    """(failure kind, detail) of a non-200 response."""
    text = response.text[:300]
    # Content filters answer 400 with code content_filter (Azure) or content_policy_violation (OpenAI).
    if response.status_code == 400 and ("content_filter" in text or "content_policy" in text):
        return "refusal", f"HTTP 400: {text}"
    return "http_error", f"HTTP {response.status_code}: {text}"


class OpenAIJudge(Judge):
    backend = "openai"
    deterministic = False  # sampled (the weighted prompt at temperature 1), and hosted models drift even at 0: re-asked

    def __init__(
        self,
        model: str | None,
        base_url: str | None = DEFAULT_BASE_URL,
        api_key_var: str | None = None,
        *,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        retry_backoff_s: float = 1.0,
        concurrency: int = 8,
        temperature: float | None = None,
        max_tokens: int | None = None,
        top_logprobs: int = 5,
        logprobs: bool = True,
        cache_dir: Path | None = None,
        replicate: int = 0,
        annotator: Annotator | None = None,
    ):
        super().__init__(cache_dir, replicate, annotator)
        if not model:
            raise JudgeError("the openai judge needs judge.model: the model name its endpoint serves")
        self._model = model
        self.base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self.api_key_var = api_key_var
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.retry_backoff_s = float(retry_backoff_s)
        self.concurrency = max(1, int(concurrency))
        # None = the annotator's: the weighted prompt's 1 and 1 token, a ranking config's 0 and 100 tokens.
        own = ranking_decoding() if self.annotator.ranking else {"temperature": 1.0, "max_tokens": 1}
        self.temperature = own["temperature"] if temperature is None else temperature
        self.max_tokens = int(own["max_tokens"] if max_tokens is None else max_tokens)
        self.top_logprobs = int(top_logprobs)
        self.logprobs = bool(logprobs)
        self._local = threading.local()

    @property
    def model(self) -> str:
        return self._model

    def decoding(self) -> dict:
        return {
            "base_url": self.base_url,
            **{k: v for k, v in self._request_body([]).items() if k not in ("model", "messages")},
        }

    def _headers(self) -> dict:
        headers = {"Content-Type": "application/json"}
        if self.api_key_var:
            key = os.environ.get(self.api_key_var)
            if not key:
                raise JudgeError(
                    f"the judge's API key is read from ${self.api_key_var}, which is not set: export it, "
                    "or set judge.api_key_var: null for an endpoint without a key (a local vllm serve)"
                )
            headers["Authorization"] = f"Bearer {key}"
        return headers

    def _session(self) -> requests.Session:
        session = getattr(self._local, "session", None)
        if session is None:
            session = self._local.session = requests.Session()
        return session

    def text_decoding(self) -> dict:
        """What changes a free-text answer: the endpoint, temperature and top_p (max_tokens is the
        prompt's own, in its cache key; the pairwise max_tokens and logprobs settings do not apply)."""
        return {
            "base_url": self.base_url,
            **{k: v for k, v in self._text_request_body([], 1).items() if k not in ("model", "messages", "max_tokens")},
        }

    def _text_request_body(self, messages: list[dict], max_tokens: int) -> dict:
        return {
            "model": self._model,
            "messages": messages,
            "max_tokens": int(max_tokens),
            "temperature": self.temperature,
            "top_p": 1.0,
        }

    def _request_body(self, messages: list[dict]) -> dict:
        body = {
            "model": self._model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": 1.0,
        }
        if self.annotator.ranking:  # the config's tool, forced; no logprobs
            decoding = ranking_decoding()
            return {**body, "tool_choice": decoding["tool_choice"], "tools": decoding["tools"]}
        if self.logprobs:
            body.update(logprobs=True, top_logprobs=self.top_logprobs)
        return body

    def check_ready(self) -> None:
        """Raise JudgeError when a call could not even be made (the key's variable is unset)."""
        self._headers()

    def _post_once(
        self, body: dict, headers: dict, parse: Callable[[Any], Result], result: type[Result]
    ) -> tuple[Result, float | None]:
        """One request -> (its parsed result, or a `result` carrying the failure; the server's
        Retry-After in seconds when it gave one)."""
        self.stats.add(requests=1)
        try:
            response = self._session().post(
                f"{self.base_url}/chat/completions", json=body, headers=headers, timeout=self.timeout_s
            )
        except requests.Timeout as exc:
            return result(failure="timeout", detail=f"no answer within {self.timeout_s:g} s: {exc}"), None
        except requests.RequestException as exc:
            return result(failure="connection", detail=f"{type(exc).__name__}: {exc}"[:300]), None
        if response.status_code != 200:
            retry_after = response.headers.get("Retry-After")
            try:
                wait = float(retry_after) if retry_after else None
            except ValueError:
                wait = None
            kind, detail = _error_failure(response)
            return result(failure=kind, detail=detail), wait
        try:
            parsed = response.json()
        except ValueError:
            return result(failure="unparsable", detail=f"not JSON: {response.text[:200]!r}"), None
        return parse(parsed), None

    def _post(
        self,
        body: dict,
        headers: dict,
        parse: Callable[[Any], Result],
        result: type[Result],
        final: tuple[str, ...] = (),
    ) -> Result:
        """Ask until an answer parses, at most 1 + max_retries times, backing off exponentially; a failure
        of a kind in `final` is not asked again."""
        attempts = 0
        while True:
            answer, retry_after = self._post_once(body, headers, parse, result)
            attempts += 1
            if answer.ok or attempts > self.max_retries or answer.failure in final:
                answer.attempts = attempts
                return answer
            delay = self.retry_backoff_s * 2 ** (attempts - 1)
            if retry_after is not None:
                delay = max(delay, retry_after)
            time.sleep(min(delay, MAX_BACKOFF_S))

    def _ask(self, messages: list[dict], headers: dict) -> Verdict:
        """One pairwise prompt -> its verdict (retried; a ranking answer is parsed once, as alpaca_eval does)."""
        if self.annotator.ranking:
            final = ("refusal", "unparsable")
            return self._post(self._request_body(messages), headers, parse_ranking_completion, Verdict, final)
        return self._post(self._request_body(messages), headers, parse_completion, Verdict)

    def _complete(self, messages: list[dict], max_tokens: int, headers: dict) -> Answer:
        """One free-text prompt -> its answer (retried)."""
        return self._post(self._text_request_body(messages, max_tokens), headers, parse_text_completion, Answer)

    def _in_pool(self, work: Callable[[Any], Result], items: list) -> list[Result]:
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="judge") as pool:
            return list(pool.map(work, items))

    def _judge_calls(self, calls: list[Call]) -> list[Verdict]:
        headers = self._headers()  # a missing key stops the evaluation here, before any request
        return self._in_pool(lambda call: self._ask(call.messages, headers), calls)

    def _complete_calls(self, prompts: list[list[dict]], max_tokens: int) -> list[Answer]:
        headers = self._headers()  # a missing key stops the evaluation here, before any request
        return self._in_pool(lambda messages: self._complete(messages, max_tokens, headers), prompts)
