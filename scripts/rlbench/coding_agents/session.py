"""One run of a CLI coding agent: readiness, prompt, LLM gateway, the adapter's launch, and what to record.

The runner uses it for registry entries of kind `cli`:

    session = CliSession(spec.agent, workspace, run_dir, time_limit_s)
    problems = session.readiness()            # before anything starts; the run stops with these
    with session:                              # prompt written, gateway up, launch planned, files written
        ...start session.launch.argv in the sandbox, stdout to session.stdout_path, stderr to session.stderr_path,
           env += session.env, visible += session.visible, bridged ports += session.ports;
           poll session.stop_reason() while it runs...
    run_json.update(session.record())          # after exit: tool version, driver, usage (gateway + tool), logs

The provider's key (driver.key_env) is read here and reaches only the gateway process; the agent's
environment never carries it nor any other provider key variable (PROVIDER_KEY_VARS).
"""

from __future__ import annotations

import traceback
from dataclasses import asdict
from pathlib import Path

from rlbench.coding_agents.adapters import build_prompt, get_adapter
from rlbench.coding_agents.adapters.base import Collected, GatewayEndpoint, Launch, LaunchContext

# Never passed into a sandbox: an agent holding a real provider key could bypass the gateway's records and
# limits (the network is closed too, but a key must not even be readable).
PROVIDER_KEY_VARS = (
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "CLAUDE_CODE_OAUTH_TOKEN",
    "OPENAI_API_KEY",
    "CODEX_API_KEY",
    "AZURE_OPENAI_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_API_KEY",
    "GOOGLE_APPLICATION_CREDENTIALS",
    "OPENROUTER_API_KEY",
    "TOGETHER_API_KEY",
    "DEEPSEEK_API_KEY",
    "MISTRAL_API_KEY",
    "GROQ_API_KEY",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "LITELLM_API_KEY",
    "LITELLM_MASTER_KEY",
)
LOG_DIR = "agent"  # <run_dir>/agent: prompt, the tool's logs, stderr
GATEWAY_DIR = "gateway"  # <run_dir>/gateway: config, transcript, usage


class CliSession:
    def __init__(self, agent: dict, workspace: Path, run_dir: Path, time_limit_s: float, home: Path):
        self.agent = agent
        # Absolute paths only: Snakemake passes relative run paths, and the tool runs with the workspace as its
        # working directory (a relative HOME or log path would point elsewhere there).
        self.workspace = workspace.resolve()
        self.run_dir = run_dir.resolve()
        self.time_limit_s = time_limit_s
        self.home = home.resolve()
        self.adapter = get_adapter(agent["tool"]["name"])
        self.log_dir = self.run_dir / LOG_DIR
        self.gateway = None
        self.ctx: LaunchContext | None = None
        self.launch: Launch | None = None
        self.tool_version: str | None = None
        self.collected: Collected | None = None
        self.collect_error: str | None = None

    # -- before the run ------------------------------------------------------------------------------------

    def readiness(self) -> list[str]:
        """Binary present, version as pinned, key variable set; each problem says what to do. Never logs a key."""
        problems = list(self.adapter.readiness(self.agent))
        from rlbench.coding_agents.gateway.gateway import litellm_binary

        if not litellm_binary().exists():
            problems.append(f"the LLM gateway (LiteLLM proxy) is not installed ({litellm_binary()}): run `make setup-agents`")
        driver = self.agent.get("driver") or {}
        if driver.get("provider") == "openai-compatible" and not driver.get("base_url"):
            problems.append("driver.base_url is required for provider openai-compatible (e.g. http://127.0.0.1:8000/v1)")
        if not problems:
            self.tool_version = self.adapter.version(self.agent)
        return problems

    def __enter__(self) -> CliSession:
        from rlbench.coding_agents.gateway.gateway import GatewayLimits, LLMGateway

        self.log_dir.mkdir(parents=True, exist_ok=True)
        limits = self.agent.get("limits") or {}
        prompt = build_prompt(self.workspace, self.time_limit_s, limits)
        (self.log_dir / "prompt.md").write_text(prompt)
        self.gateway = LLMGateway(
            self.agent["driver"],
            self.run_dir / GATEWAY_DIR,
            GatewayLimits(calls=limits.get("turns"), tokens=limits.get("tokens"), cost_usd=limits.get("cost_usd")),
        )
        self.gateway.__enter__()
        try:
            self.ctx = LaunchContext(
                agent=self.agent,
                workspace=self.workspace,
                home=self.home,
                log_dir=self.log_dir,
                prompt=prompt,
                gateway=GatewayEndpoint(url=self.gateway.url, key=self.gateway.key, model=self.gateway.model),
                time_limit_s=self.time_limit_s,
            )
            self.home.mkdir(parents=True, exist_ok=True)
            self.launch = self.adapter.plan(self.ctx)
            for path, text in self.launch.files.items():
                path = Path(path)
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
        except BaseException:
            self.gateway.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.gateway is not None:
            self.gateway.__exit__(*exc)
        if self.ctx is not None:
            try:
                self.collected = self.adapter.collect(self.ctx)
            except Exception as error:  # noqa: BLE001 - a parse failure must not lose the run's record
                traceback.print_exc()
                self.collect_error = f"{type(error).__name__}: {error}"

    # -- while it runs -------------------------------------------------------------------------------------

    @property
    def argv(self) -> list[str]:
        return self.launch.argv

    @property
    def env(self) -> dict[str, str]:
        return dict(self.launch.env)

    @property
    def visible(self) -> list[Path]:
        return list(self.launch.visible)  # the adapter's plan includes its install (Adapter.visible_paths)

    @property
    def ports(self) -> dict[int, str]:
        return {self.gateway.port: "LLM gateway"}

    @property
    def stdout_path(self) -> Path:
        return self.log_dir / self.launch.stdout

    @property
    def stderr_path(self) -> Path:
        return self.log_dir / "stderr.log"

    def stop_reason(self) -> tuple[str, str] | None:
        """(kind, detail) when the run must end now: the driver endpoint is dead, or an LLM limit is reached."""
        dead = self.gateway.endpoint_dead()
        if dead:
            return "llm_endpoint_dead", dead
        limit = self.gateway.limit_reached()
        if limit:
            return "llm_limit", limit
        return None

    # -- after ---------------------------------------------------------------------------------------------

    def record(self) -> dict:
        """run.json fields: the tool and its version, the driver (no key), usage from the gateway and the tool."""
        driver = {k: v for k, v in (self.agent.get("driver") or {}).items()}
        gateway_usage = None
        if self.gateway is not None:
            try:
                gateway_usage = self.gateway.usage()
            except Exception as error:  # noqa: BLE001
                gateway_usage = {"error": f"{type(error).__name__}: {error}"}
        tool = asdict(self.collected) if self.collected is not None else None
        if self.collect_error:
            tool = {"error": f"could not parse the tool's log: {self.collect_error}"}
        return {
            "agent_tool": {"name": self.agent["tool"]["name"], "version": self.tool_version, "pinned": self.agent["tool"]["version"]},
            "driver": driver,
            "limits": self.agent.get("limits") or {},
            # Token totals of the run: the gateway's (it sees every model call); the tool's own counts beside them.
            "tokens": {
                k: (gateway_usage or {}).get(k)
                for k in ("calls", "input_tokens", "output_tokens", "total_tokens", "cost_usd")
            },
            "usage": {"gateway": gateway_usage, "tool": tool},
            "agent_logs": {
                "dir": LOG_DIR,
                "prompt": f"{LOG_DIR}/prompt.md",
                "stdout": f"{LOG_DIR}/{self.launch.stdout}" if self.launch else None,
                "transcript": f"{GATEWAY_DIR}/transcript.jsonl",
            },
        }


def scrub_provider_keys(env: dict[str, str], driver: dict | None) -> dict[str, str]:
    """The agent's environment without any provider key (the driver's key_env included)."""
    drop = set(PROVIDER_KEY_VARS)
    if driver and driver.get("key_env"):
        drop.add(driver["key_env"])
    return {k: v for k, v in env.items() if k not in drop}
