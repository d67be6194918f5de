"""The per-run LLM gateway: a LiteLLM proxy subprocess on 127.0.0.1 between a coding-agent tool and its driver.

    with LLMGateway(driver, run_dir / "gateway", GatewayLimits(tokens=2_000_000)) as gw:
        ...  # the tool gets gw.url (no /v1), gw.key (a per-run key, never the provider's) and gw.model
        gw.limit_reached(), gw.endpoint_dead()   # polled while the tool runs
    gw.usage()                                   # totals from the records (also after exit)

The tool speaks its own wire format (Anthropic /v1/messages, OpenAI /v1/responses, /v1/chat/completions,
Gemini /v1beta/models/{m}:streamGenerateContent); the proxy translates and forwards to the driver:

    driver = {"model": "claude-sonnet-4-5",      # the name the tool sends (client-facing)
              "provider": "anthropic" | "openai" | "gemini" | "openai-compatible",
              "upstream_model": "...",           # the provider's name for it (default: model)
              "base_url": "http://host:8000/v1", # required for openai-compatible; optional otherwise
              "key_env": "ANTHROPIC_API_KEY",    # variable holding the provider key (absent: keyless server)
              "timeout_s": 600,                  # optional: per-request timeout in the proxy
              "input_cost_per_token": 3e-6, "output_cost_per_token": 1.5e-5}  # optional prices

Every model name the tool sends reaches the driver's model: one model_list entry for driver["model"] and a
wildcard "*" entry for the side calls tools make under other names (Claude Code's small/fast model, Gemini
CLI's flash-lite helpers); checked on LiteLLM 1.108.7. For openai-compatible the three settings of
shared/GATEWAY.md Gotcha 3 keep a chat-only upstream (vllm serve) on /v1/chat/completions.

Records (records_dir, outside the agent's workspace): config.yaml (no secrets), proxy.log (the proxy's
output, provider and gateway keys replaced by ***), usage.jsonl and transcript.jsonl (rlbench_gw_recorder.py,
a copy of recorder.py, writes them inside the proxy; see there for the fields).

Secrets: the provider key is read here from os.environ[driver["key_env"]] and reaches only the proxy, through
its environment (config.yaml says `os.environ/NAME`). The proxy's environment is built from scratch: PATH,
locale, the network proxy/CA variables, the provider key, the gateway's own settings; nothing else of the
harness's environment. The proxy gets SIGTERM should the thread that started it die (PR_SET_PDEATHSIG; start
the gateway from the thread that lives as long as the run, as the runner does).
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

import psutil
import yaml

from rlbench.coding_agents.gateway import recorder as _rec

from rlbench.coding_agents.tools import tools_dir


PROVIDERS = {"anthropic": "anthropic", "openai": "openai", "gemini": "gemini", "openai-compatible": "openai"}
RECORDER_MODULE = "rlbench_gw_recorder"
CONFIG_FILE = "config.yaml"
LOG_FILE = "proxy.log"
# Passed through to the proxy: what reaching a provider may need (an egress proxy, a CA bundle), no secrets.
PASS_ENV = (
    "PATH",
    "LANG",
    "LC_ALL",
    "TZ",
    "TMPDIR",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "no_proxy",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
)
# The variable that carries the provider key into the proxy (see __enter__).
PROXY_KEY_VAR = "RLBENCH_GW_PROVIDER_KEY"
# Set by the gateway itself; a driver's key_env must not name one of these.
OWN_ENV = {
    PROXY_KEY_VAR,
    "LITELLM_MASTER_KEY",
    "LITELLM_LOCAL_MODEL_COST_MAP",
    "LITELLM_MODE",
    "PYTHONPATH",
    "PYTHONDONTWRITEBYTECODE",
    "PYTHONUNBUFFERED",
    "HOME",
    "RLBENCH_GW_RECORDS",
    "RLBENCH_GW_LIMITS",
    "RLBENCH_GW_KEY_ENV",
    *PASS_ENV,
}
# Run in place of the proxy: arm PR_SET_PDEATHSIG, then exec it (argv: expected parent pid, program, args...).
_LIFELINE = (
    "import ctypes,os,signal,sys\n"
    "try: ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)\n"
    "except Exception: pass\n"
    "if os.getppid() != int(sys.argv[1]): os._exit(143)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


class GatewayError(RuntimeError):
    """The gateway could not be configured or did not come up."""


@dataclass
class GatewayLimits:
    calls: int | None = None
    tokens: int | None = None
    cost_usd: float | None = None


def litellm_binary() -> Path:
    """The installed LiteLLM proxy command (rlbench setup-agents puts it there)."""
    return tools_dir() / "venvs" / "gateway" / "bin" / "litellm"


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def proxy_config(driver: dict, key_env: str | None, timeout_s: float) -> dict:
    """The proxy's config.yaml as a dict. Secrets appear only as `os.environ/NAME` references."""
    provider = driver.get("provider")
    if provider not in PROVIDERS:
        raise GatewayError(f"driver.provider must be one of {sorted(PROVIDERS)}, not {provider!r}")
    model = driver.get("model")
    if not model or not isinstance(model, str):
        raise GatewayError("driver.model (the model name the tool sends) is required")
    upstream = driver.get("upstream_model") or model
    base_url = driver.get("base_url")
    if provider == "openai-compatible" and not base_url:
        raise GatewayError("driver.base_url is required for provider openai-compatible (e.g. http://127.0.0.1:8000/v1)")
    params: dict = {
        "model": f"{PROVIDERS[provider]}/{upstream}",
        # A keyless local server still needs some key for the OpenAI client; it is no secret.
        "api_key": f"os.environ/{key_env}" if key_env else "sk-none",
        "timeout": timeout_s,
        "stream_timeout": timeout_s,
        "max_retries": 0,
    }
    if base_url:
        params["api_base"] = base_url
    for price in ("input_cost_per_token", "output_cost_per_token"):
        if driver.get(price) is not None:
            params[price] = float(driver[price])
    model_info: dict = {}
    settings: dict = {
        "callbacks": f"{RECORDER_MODULE}.recorder",
        "drop_params": True,
        "num_retries": 0,
        "request_timeout": timeout_s,
    }
    if provider == "openai-compatible":  # shared/GATEWAY.md Gotcha 3: keep a chat-only upstream on chat completions
        params["use_chat_completions_api"] = True
        model_info["supports_reasoning"] = False
        settings["use_chat_completions_url_for_anthropic_messages"] = True
    entries = []
    for name in dict.fromkeys([model, "*"]):
        entry: dict = {"model_name": name, "litellm_params": dict(params)}
        if model_info:
            entry["model_info"] = dict(model_info)
        entries.append(entry)
    return {
        "model_list": entries,
        "litellm_settings": settings,
        "router_settings": {"num_retries": 0, "timeout": timeout_s, "disable_cooldowns": True},
        "general_settings": {"master_key": "os.environ/LITELLM_MASTER_KEY"},
    }


class LLMGateway:
    """A LiteLLM proxy for one run. See the module docstring."""

    def __init__(
        self,
        driver: dict,
        records_dir: Path,
        limits: GatewayLimits | None = None,
        litellm_bin: Path | None = None,
        dead_after_failures: int = 3,
        transient_grace_s: float = 300.0,
        start_timeout_s: float = 90,
    ):
        self.driver = dict(driver)
        # Absolute: the proxy runs with it as its working directory (Snakemake passes relative run paths).
        self.records_dir = Path(records_dir).resolve()
        self.limits = limits or GatewayLimits()
        self.litellm_bin = Path(litellm_bin) if litellm_bin else litellm_binary()
        self.dead_after_failures = max(1, int(dead_after_failures))
        self.transient_grace_s = float(transient_grace_s)
        self.start_timeout_s = float(start_timeout_s)
        self.model: str = str(self.driver.get("model") or "")
        self.key: str = "sk-gw-" + secrets.token_hex(24)
        self.port: int = 0
        self.url: str = ""
        self.proc: subprocess.Popen | None = None
        self.started_s: float | None = None  # how long the proxy took to come up
        self._log_thread: threading.Thread | None = None
        self._totals = _rec.new_totals()
        self._offset = 0
        self._read_lock = threading.Lock()
        self._exit_code: int | None = None
        self._stopping = False
        self._secrets: list[bytes] = []  # replaced by *** in proxy.log

    # -- paths -----------------------------------------------------------------------------------------

    @property
    def usage_path(self) -> Path:
        return self.records_dir / _rec.USAGE_FILE

    @property
    def transcript_path(self) -> Path:
        return self.records_dir / _rec.TRANSCRIPT_FILE

    @property
    def log_path(self) -> Path:
        return self.records_dir / LOG_FILE

    @property
    def config_path(self) -> Path:
        return self.records_dir / CONFIG_FILE

    # -- start / stop ------------------------------------------------------------------------------------

    def _key_env(self) -> tuple[str | None, str | None]:
        key_env = self.driver.get("key_env") or None
        if key_env is None:
            return None, None
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(key_env)) or key_env in OWN_ENV:
            raise GatewayError(f"driver.key_env {key_env!r} is not a usable variable name")
        value = os.environ.get(key_env)
        if not value:
            raise GatewayError(f"driver.key_env names {key_env}, which is not set: export the provider key there")
        return key_env, value

    def _environment(self, key_env: str | None, key: str | None) -> dict[str, str]:
        env = {name: os.environ[name] for name in PASS_ENV if os.environ.get(name)}
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        env.setdefault("LANG", "C.UTF-8")
        if any(name.lower().endswith("_proxy") and name.lower() != "no_proxy" for name in env):
            for name in ("NO_PROXY", "no_proxy"):  # the proxy's own health checks and a local upstream stay direct
                env[name] = ",".join(filter(None, [env.get(name), "127.0.0.1", "localhost"]))
        env.update(
            HOME=str(self.records_dir),
            PYTHONPATH=str(self.records_dir),
            PYTHONDONTWRITEBYTECODE="1",
            PYTHONUNBUFFERED="1",
            LITELLM_LOCAL_MODEL_COST_MAP="True",
            LITELLM_MODE="PRODUCTION",  # no .env loading
            LITELLM_MASTER_KEY=self.key,
            RLBENCH_GW_RECORDS=str(self.records_dir),
            RLBENCH_GW_LIMITS=json.dumps(asdict(self.limits)),
        )
        if key_env and key:
            env[key_env] = key
            env["RLBENCH_GW_KEY_ENV"] = key_env
        return env

    def __enter__(self) -> LLMGateway:
        if not self.litellm_bin.exists():
            raise GatewayError(
                f"the LLM gateway (LiteLLM proxy) is not installed: {self.litellm_bin} is missing "
                "(run `rlbench setup-agents`)"
            )
        key_env, key = self._key_env()
        # The proxy gets the key under a name of its own, never under the provider's usual variable: LiteLLM's
        # pass-through routes (/anthropic/..., /openai/..., /gemini/...) pick those up and would forward an agent's
        # request to the provider past the model routing, the limits and the records.
        if key_env:
            key_env = PROXY_KEY_VAR
        timeout_s = float(self.driver.get("timeout_s") or 600)
        config = proxy_config(self.driver, key_env, timeout_s)
        self.records_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(yaml.safe_dump(config, sort_keys=False))
        shutil.copyfile(Path(_rec.__file__), self.records_dir / f"{RECORDER_MODULE}.py")
        env = self._environment(key_env, key)
        self._secrets = [s.encode() for s in (key, self.key) if s]
        last_error = None
        for _attempt in range(3):  # a port taken between choosing it and the proxy's bind: choose another
            try:
                self._start(env)
                return self
            except _PortTaken as error:
                last_error = error
        raise GatewayError(f"the LLM gateway could not bind a port: {last_error}")

    def _start(self, env: dict[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [
            sys.executable,
            "-c",
            _LIFELINE,
            str(os.getpid()),
            str(self.litellm_bin),
            "--config",
            str(self.config_path),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--telemetry",
            "False",
        ]
        t0 = time.monotonic()
        with open(self.log_path, "ab") as log:
            log.write(f"--- {time.strftime('%Y-%m-%d %H:%M:%S')} starting the LiteLLM proxy on {self.url}\n".encode())
        self._exit_code = None
        self._stopping = False
        self.proc = subprocess.Popen(
            argv,
            cwd=self.records_dir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._log_thread = threading.Thread(target=self._copy_log, args=(self.proc,), daemon=True, name="gateway-log")
        self._log_thread.start()
        try:
            self._wait_ready(t0)
        except BaseException:
            self._stop_process()
            raise
        self.started_s = round(time.monotonic() - t0, 2)

    def _copy_log(self, proc: subprocess.Popen) -> None:
        """proxy stdout/stderr -> proxy.log, keys replaced by ***, line by line (flushed)."""
        with open(self.log_path, "ab", buffering=0) as log:
            for line in iter(proc.stdout.readline, b""):
                for secret in self._secrets:
                    line = line.replace(secret, b"***")
                try:
                    log.write(line)
                except OSError:  # a full disk: keep draining the pipe, or the proxy would block on its output
                    pass

    def _log_tail(self, lines: int = 40) -> str:
        if self._log_thread is not None:
            self._log_thread.join(timeout=2)
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return "(no proxy.log)"
        return "\n".join(text.splitlines()[-lines:])

    def _get(self, path: str, auth: bool = False, timeout: float = 2.0) -> int:
        request = urllib.request.Request(self.url + path)
        if auth:
            request.add_header("Authorization", f"Bearer {self.key}")
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never via an egress proxy
        try:
            with opener.open(request, timeout=timeout) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code
        except (urllib.error.URLError, OSError):
            return 0

    def _wait_ready(self, t0: float) -> None:
        deadline = t0 + self.start_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                self._exit_code = code
                tail = self._log_tail()
                if "address already in use" in tail.lower():
                    raise _PortTaken(f"port {self.port}")
                raise GatewayError(f"the LLM gateway exited during startup (code {code}); {self.log_path}:\n{tail}")
            if self._get("/health/liveliness") == 200:
                # Our proxy, not another process that took the port: only ours accepts our key.
                status = self._get("/v1/models", auth=True, timeout=10)
                if status == 200:
                    return
                if status in (401, 403):
                    raise _PortTaken(f"port {self.port} answers, but not to this gateway's key")
            if time.monotonic() > deadline:
                raise GatewayError(
                    f"the LLM gateway did not come up within {self.start_timeout_s:.0f} s; "
                    f"{self.log_path}:\n{self._log_tail()}"
                )
            time.sleep(0.1)

    def _stop_process(self, grace_s: float = 10) -> None:
        proc = self.proc
        if proc is None:
            return
        self._stopping = True
        members = []
        if proc.poll() is None:  # not reaped yet: the pid is still ours (once reaped it may be anyone's)
            try:
                members = psutil.Process(proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                pass
        if proc.poll() is None:
            try:
                proc.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        _gone, alive = psutil.wait_procs(members, timeout=2)
        for member in alive:
            try:
                member.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=5)
        self._exit_code = proc.returncode
        if self._log_thread is not None:
            self._log_thread.join(timeout=5)
        if proc.stdout is not None:
            proc.stdout.close()

    def __exit__(self, *exc) -> None:
        self._stop_process()

    # -- while it runs (and after) -------------------------------------------------------------------------

    def _refresh(self) -> dict:
        with self._read_lock:
            records, self._offset = _rec.read_records(str(self.usage_path), self._offset)
            for record in records:
                _rec.add_record(self._totals, record)
            return self._totals

    def usage(self) -> dict:
        """Totals from usage.jsonl: calls (sent to the upstream, ok or failed), failed_calls, refused_calls (a limit
        was reached), rejected_calls (wrong key, malformed request), input_tokens, output_tokens, cache_read_tokens,
        total_tokens, cost_usd, by_route {route: calls}."""
        totals = self._refresh()
        keys = (
            "calls",
            "failed_calls",
            "refused_calls",
            "rejected_calls",
            "input_tokens",
            "output_tokens",
            "cache_read_tokens",
            "total_tokens",
            "cost_usd",
        )
        out = {k: totals[k] for k in keys}
        out["cost_usd"] = round(out["cost_usd"], 8)
        out["by_route"] = dict(totals["by_route"])
        return out

    def limit_reached(self) -> str | None:
        """Why the run may make no further LLM call (e.g. "token limit 1000 reached (1040 tokens used)"), or None."""
        totals = self._refresh()
        return _rec.limit_message(totals, asdict(self.limits)) or totals["last_refusal"]

    def endpoint_dead(self) -> str | None:
        """Why the driver cannot be reached any more, or None: the proxy exited, or the last
        `dead_after_failures` calls all failed (connection errors, 5xx, 401/403/404) with no success since."""
        if self.proc is not None and not self._stopping:
            code = self.proc.poll()
            if code is not None:
                self._exit_code = code
                return f"the LLM gateway exited (code {code}); see {self.log_path}"
        totals = self._refresh()
        # No answer at all (connection refused, DNS, timeout) or an answer no retry can change (401/403/404: a wrong
        # key or model) ends the run after a few calls; a provider answering 5xx (500, 503, 529 overloaded) may be
        # passing trouble, so that streak must also last transient_grace_s before the run is given up.
        status = totals.get("last_status")
        lasting = time.time() - (totals.get("failing_since") or time.time())
        hopeless = (
            status is None or totals.get("last_no_answer") or status in (401, 403, 404) or lasting >= self.transient_grace_s
        )
        if totals["consecutive_failures"] >= self.dead_after_failures and hopeless:
            error = (totals["last_error"] or "").strip().splitlines()
            return (
                f"the last {totals['consecutive_failures']} LLM calls failed with no success since; "
                f"last error: {error[0][:300] if error else 'unknown'}"
            )
        return None


class _PortTaken(Exception):
    pass
