"""A judge behind any OpenAI-compatible chat-completions endpoint (OpenAI, Azure OpenAI's v1 API,
a local `vllm serve`, ...), asked exactly as AlpacaEval 2.0's default annotator asks:
max_tokens 1, temperature 1, top_p 1, logprobs with the top 5 alternatives.

Parsing follows alpaca_eval's `logprob_parser(numerator_token="m", denominator_tokens=["m", "M"],
is_binarize=False)`: from the first token's top_logprobs keep "m" and "M" (an absent one has
probability 0; neither present = unparsable), P(m) = exp(lp_m - logsumexp(lp_m, lp_M)),
preference = 2 - P(m). An endpoint that returns no logprobs is read from its text instead
("m" -> 1, "M" -> 2, anything else unparsable); each verdict records which parser gave it.
`logprobs: false` asks for the text only (endpoints that refuse the logprobs parameters).

Failures (timeout, connection, HTTP error, refusal or content filter, unparsable answer) are
retried up to max_retries times with exponential backoff (retry_backoff_s, doubling, at most
30 s, longer when the server sends Retry-After); the last one is returned as the call's verdict.
"""

from __future__ import annotations

import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import requests

from rlbench.judges.base import Call, Judge, JudgeError, Verdict, preference_from_logprobs
from rlbench.judges.prompt import FIRST_TOKEN, SECOND_TOKEN

DEFAULT_BASE_URL = "https://api.openai.com/v1"
MAX_BACKOFF_S = 30.0


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


def parse_completion(body: Any) -> Verdict:
    """A chat-completions response body -> a verdict (preference with its parser, or refusal/unparsable)."""
    try:
        choice = body["choices"][0]
        message = choice.get("message") or {}
    except (KeyError, IndexError, TypeError, AttributeError):
        return Verdict(failure="unparsable", detail=f"no choices in the response: {str(body)[:200]}")
    content = message.get("content")
    if choice.get("finish_reason") == "content_filter" or message.get("refusal"):
        return Verdict(failure="refusal", detail=str(message.get("refusal") or "finish_reason content_filter")[:200])
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


def _error_verdict(response: requests.Response) -> Verdict:
    text = response.text[:300]
    # Content filters answer 400 with code content_filter (Azure) or content_policy_violation (OpenAI).
    if response.status_code == 400 and ("content_filter" in text or "content_policy" in text):
        return Verdict(failure="refusal", detail=f"HTTP 400: {text}")
    return Verdict(failure="http_error", detail=f"HTTP {response.status_code}: {text}")


class OpenAIJudge(Judge):
    backend = "openai"
    deterministic = False  # sampled at temperature 1, and hosted models drift: repeats are re-asked

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
        temperature: float = 1.0,
        max_tokens: int = 1,
        top_logprobs: int = 5,
        logprobs: bool = True,
        cache_dir: Path | None = None,
        replicate: int = 0,
    ):
        super().__init__(cache_dir, replicate)
        if not model:
            raise JudgeError("the openai judge needs judge.model: the model name its endpoint serves")
        self._model = model
        self.base_url = (base_url or DEFAULT_BASE_URL).rstrip("/")
        self.api_key_var = api_key_var
        self.timeout_s = float(timeout_s)
        self.max_retries = int(max_retries)
        self.retry_backoff_s = float(retry_backoff_s)
        self.concurrency = max(1, int(concurrency))
        self.temperature = temperature
        self.max_tokens = int(max_tokens)
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

    def _request_body(self, messages: list[dict]) -> dict:
        body = {
            "model": self._model,
            "messages": messages,
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "top_p": 1.0,
        }
        if self.logprobs:
            body.update(logprobs=True, top_logprobs=self.top_logprobs)
        return body

    def check_ready(self) -> None:
        """Raise JudgeError when a call could not even be made (the key's variable is unset)."""
        self._headers()

    def _ask_once(self, messages: list[dict], headers: dict) -> tuple[Verdict, float | None]:
        """One request -> (verdict, the server's Retry-After in seconds when it gave one)."""
        self.stats.add(requests=1)
        try:
            response = self._session().post(
                f"{self.base_url}/chat/completions",
                json=self._request_body(messages),
                headers=headers,
                timeout=self.timeout_s,
            )
        except requests.Timeout as exc:
            return Verdict(failure="timeout", detail=f"no answer within {self.timeout_s:g} s: {exc}"), None
        except requests.RequestException as exc:
            return Verdict(failure="connection", detail=f"{type(exc).__name__}: {exc}"[:300]), None
        if response.status_code != 200:
            retry_after = response.headers.get("Retry-After")
            try:
                wait = float(retry_after) if retry_after else None
            except ValueError:
                wait = None
            return _error_verdict(response), wait
        try:
            body = response.json()
        except ValueError:
            return Verdict(failure="unparsable", detail=f"not JSON: {response.text[:200]!r}"), None
        return parse_completion(body), None

    def _ask(self, messages: list[dict], headers: dict) -> Verdict:
        """Ask until an answer parses, at most 1 + max_retries times, backing off exponentially."""
        attempts = 0
        while True:
            verdict, retry_after = self._ask_once(messages, headers)
            attempts += 1
            if verdict.ok or attempts > self.max_retries:
                verdict.attempts = attempts
                return verdict
            delay = self.retry_backoff_s * 2 ** (attempts - 1)
            if retry_after is not None:
                delay = max(delay, retry_after)
            time.sleep(min(delay, MAX_BACKOFF_S))

    def _judge_calls(self, calls: list[Call]) -> list[Verdict]:
        headers = self._headers()  # a missing key stops the evaluation here, before any request
        with ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="judge") as pool:
            return list(pool.map(lambda call: self._ask(call.messages, headers), calls))
