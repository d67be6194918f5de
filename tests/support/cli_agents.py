"""Run a REAL coding-agent tool through the real runner, sandbox and LLM gateway, against a scripted LLM.

The scripted endpoint (tests/fixtures/scripted_llm.py) plays a fixed script whatever the tool: train, submit
output/v1 with curl, then finish. The training is real (the sft reference agent, one TRL step on the tiny model;
it submits output/v1 itself) or cheap (a script that writes the base model with one weight nudged as output/v1:
no TRL, for the tests of accounting and recording). The default tier runs one tool (REAL_TRAINING_TOOL) with
real training and the others with the cheap step; the slow tier runs the others with real training too. Each adapter test checks what the issue asks: a ledger entry, a code
snapshot commit, parsed token usage equal to the scripted usage, the transcript, and a bounded end on a
dead endpoint.
"""

from __future__ import annotations

import base64
import copy
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from rlbench.coding_agents.adapters import get_adapter
from rlbench.coding_agents.adapters.base import GatewayEndpoint, LaunchContext
from rlbench.config import Registries
from rlbench.fileio.jsonio import read_json, read_jsonl
from rlbench.agent_run.runner import run_agent
from rlbench.paths import AGENTS_DIR
from support.runs import spec_for
from support.settings import REPO

FIXTURES = REPO / "tests" / "fixtures"
sys.path.insert(0, str(FIXTURES))
from scripted_llm import ScriptedLLM, dead_port, read_log, summed_usage  # noqa: E402,F401
SCRIPTED_KEY_ENV = "RLBENCH_TEST_SCRIPTED_KEY"  # a fake provider key, set by the tests

TRAIN = (
    f"mkdir -p code && cp {AGENTS_DIR}/sft_agent.py {AGENTS_DIR}/agent_env.py code/ && "
    "SFT_ROUNDS=1 SFT_STEPS_PER_ROUND=1 SFT_BATCH_SIZE=2 python code/sft_agent.py"
)
SUBMIT = (
    "curl -s -X POST \"$GRADING_SERVER_URL/submit\" -H 'Content-Type: application/json' "
    "-d '{\"model_path\": \"output/v1\"}'"
)
# The cheap step, written into code/ (the sandbox shows the agent no test file) through base64, which
# every tool's shell passes unchanged.
CHEAP_STEP = """\"\"\"One cheap training step: the base model with one weight nudged, saved as output/v1.\"\"\"
import os
import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file

out = Path(os.environ.get("OUTPUT_DIR", "output")) / "v1"
shutil.copytree(os.environ["MODEL_PATH"], out, dirs_exist_ok=True)
for path in [out, *out.rglob("*")]:
    path.chmod(0o755 if path.is_dir() else 0o644)
weights = load_file(out / "model.safetensors")
name = sorted(weights)[0]
weights[name] = weights[name] + 0.01
(out / "model.safetensors").unlink()
save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
print("wrote", out)
"""
CHEAP_TRAIN = (
    f"mkdir -p code && echo {base64.b64encode(CHEAP_STEP.encode()).decode()} | base64 -d > code/perturb_step.py && "
    "python code/perturb_step.py"
)
TRAININGS = {"real": TRAIN, "cheap": CHEAP_TRAIN}
# The script each training runs (what a tool that returns before a command ends must wait for).
TRAINING_SCRIPT = {"real": "code/sft_agent.py", "cheap": "code/perturb_step.py"}
# The one tool whose default-tier run trains for real; the others take the cheap step there.
REAL_TRAINING_TOOL = "mini-swe-agent"


def _trainings(tool: str) -> list[tuple[str, tuple]]:
    if tool == REAL_TRAINING_TOOL:
        return [("real", ())]
    return [("cheap", ()), ("real", (pytest.mark.slow,))]


def training_params(tool: str) -> list:
    """The `training` parameters of one tool's end-to-end test (see tool_trainings)."""
    return [pytest.param(training, marks=marks, id=training) for training, marks in _trainings(tool)]


def tool_trainings(tools: list[str]) -> list:
    """(tool, training) parameters of the end-to-end tests: real training for REAL_TRAINING_TOOL in the
    default tier and for every other tool in the slow tier; the cheap step for the others in the default tier."""
    return [
        pytest.param(tool, training, marks=marks, id=f"{tool}-{training}")
        for tool in tools
        for training, marks in _trainings(tool)
    ]


# The tool whose dead-endpoint run is in the default tier: the bound is the runner's (it stops a run
# whose gateway sees the endpoint dead), the same for every tool; the others run in the slow tier.
DEAD_ENDPOINT_TOOL = "claude-code"


def dead_endpoint_params(tools: list[str]) -> list:
    """The `tool` parameters of a dead-endpoint test: DEAD_ENDPOINT_TOOL in the default tier (where it is
    among `tools`), every other tool in the slow tier."""
    return [pytest.param(tool, id=tool, marks=() if tool == DEAD_ENDPOINT_TOOL else (pytest.mark.slow,)) for tool in tools]


def train_and_submit(training: str = "real") -> list[dict]:
    """The scripted run: train, submit, finish (mini-swe-agent ends on its marker command)."""
    return [
        {"command": TRAININGS[training]},
        {"command": SUBMIT},
        {"finish": "Trained and submitted output/v1.", "command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"},
    ]



def cli_entry(name: str, base_url: str, **overrides) -> dict:
    """The registry entry `name`, its driver pointed at the scripted endpoint (an OpenAI-compatible chat server)."""
    entry = copy.deepcopy(Registries.load().agents[name])
    entry["driver"] = {
        "model": entry["driver"]["model"],  # the tool asks for its usual model name; the gateway maps it
        "provider": "openai-compatible",
        "upstream_model": "scripted",
        "base_url": base_url,
        "key_env": SCRIPTED_KEY_ENV,
    }
    entry.update(overrides)
    return entry


def require_tool(name: str) -> None:
    """Skip (with what to run) when the tool or the gateway is not installed here."""
    entry = Registries.load().agents[name]
    problems = [p for p in get_adapter(entry["tool"]["name"]).readiness(entry) if "API key" not in p]
    from rlbench.coding_agents.gateway.gateway import litellm_binary

    if not litellm_binary().exists():
        problems.append(f"the LLM gateway is not installed ({litellm_binary()}): run `make setup-agents`")
    if problems:
        pytest.skip("; ".join(problems))


@dataclass
class CliRun:
    record: object
    run_dir: Path
    run: dict
    ledger: list[dict]
    upstream_log: list[dict]
    seconds: float


def run_cli(
    workspace: Path,
    tiny_model: Path,
    gsm8k_data,
    agent: dict,
    upstream_log: Path,
    time_limit_s: float = 300,
    sandbox_backend: str = "auto",
    monkeypatch=None,
) -> CliRun:
    """run_agent on the test workspace with `agent` (a cli entry), as run_agent.py would."""
    if monkeypatch is not None:
        monkeypatch.setenv(SCRIPTED_KEY_ENV, "sk-scripted-provider-key-never-in-the-sandbox")
    spec = spec_for(workspace, tiny_model, gsm8k_data, agent=agent, time_limit_s=time_limit_s, kill_grace_s=3,
                    sandbox_backend=sandbox_backend)
    started = time.time()
    record = run_agent(spec)
    run_dir = workspace.parent
    ledger_path = run_dir / "grader" / "ledger.jsonl"
    return CliRun(
        record=record,
        run_dir=run_dir,
        run=read_json(run_dir / "run.json"),
        ledger=list(read_jsonl(ledger_path)) if ledger_path.exists() else [],
        upstream_log=list(read_jsonl(upstream_log)) if upstream_log.exists() else [],
        seconds=time.time() - started,
    )


def scripted_usage(upstream_log: list[dict]) -> dict:
    """What the scripted endpoint returned in all: the figures the gateway must report."""
    return summed_usage(upstream_log)


# -- plan() and collect() without running the tool ---------------------------------------------------------------

LOGS = FIXTURES / "agent_logs"  # captured from real runs of each pinned tool (gateway + scripted endpoint)
PROVIDER_KEY = "sk-provider-key-must-never-be-planned-0123456789"
GATEWAY_KEY = "sk-gw-0123456789abcdef0123456789abcdef0123456789ab"
GATEWAY_URL = "http://127.0.0.1:45678"
STDOUT = {
    "claude-code": "stdout.jsonl",
    "codex": "stdout.jsonl",
    "gemini-cli": "stdout.jsonl",
    "opencode": "opencode.jsonl",
    "openhands": "openhands.jsonl",
    "mini-swe-agent": "mini.log",
}


def context(tmp_path: Path, name: str, turns: int | None = 40, time_limit_s: float = 7200, **limits) -> LaunchContext:
    """A launch context for the registry entry `name`, as the runner builds it, with a fixed gateway."""
    agent = dict(Registries.load().agents[name])
    agent["limits"] = {"turns": turns, "tokens": None, "cost_usd": None, **limits}
    workspace = tmp_path / "run" / "workspace"
    (workspace / ".home").mkdir(parents=True, exist_ok=True)
    (tmp_path / "run" / "agent").mkdir(parents=True, exist_ok=True)
    return LaunchContext(
        agent=agent,
        workspace=workspace,
        home=workspace / ".home",
        log_dir=tmp_path / "run" / "agent",
        prompt="Train the model, then submit output/v1.\n",
        gateway=GatewayEndpoint(url=GATEWAY_URL, key=GATEWAY_KEY, model=agent["driver"]["model"]),
        time_limit_s=time_limit_s,
    )


def with_logs(tmp_path: Path, tool: str, case: str, **kw) -> LaunchContext:
    """A context whose log_dir and home hold the captured logs of one case, as the runner leaves them."""
    ctx = context(tmp_path, tool, **kw)
    source = LOGS / tool / case
    shutil.copyfile(source / STDOUT[tool], ctx.log_dir / STDOUT[tool])
    if (source / "home").is_dir():
        shutil.copytree(source / "home", ctx.home, dirs_exist_ok=True)
    return ctx


def option(argv: list[str], flag: str) -> str:
    """The value after `flag` in argv."""
    return argv[argv.index(flag) + 1]
