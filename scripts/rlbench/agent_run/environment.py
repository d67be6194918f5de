"""What the agent gets: its command, its environment, and what the sandbox hides from it or shows it."""

from __future__ import annotations

import os
import pwd
import shutil
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from rlbench.agent_run.attempts import RUN_MARKER
from rlbench.agent_run.spec import RunSpec
from rlbench.agent_run.workspace import TASKS_DIR
from rlbench.paths import AGENTS_DIR, REPO_ROOT

OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
# Where the host may keep downloaded data, held-out splits of hub tasks included (datasets caches the whole
# dataset, test split too). Hidden from the agent when set, and never passed on to it: its own caches live
# in its workspace.
HOST_CACHE_VARS = (
    "HF_HOME",
    "HF_DATASETS_CACHE",
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_ASSETS_CACHE",
    "HF_XET_CACHE",
    "TRANSFORMERS_CACHE",
    "TORCH_HOME",
    "XDG_CACHE_HOME",
    "XDG_DATA_HOME",
)
# What the agent's environment keeps of the host's (host_env_kept): locale, terminal, user names, the GPUs
# the scheduler gave the job and where CUDA and the certificates live. Nothing that can hold a secret.
HOST_ENV_KEPT = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_ALL",
    "LC_CTYPE",
    "LC_MESSAGES",
    "TERM",
    "COLORTERM",
    "TZ",
    "USER",
    "LOGNAME",
    "SHELL",
    "CUDA_VISIBLE_DEVICES",
    "CUDA_DEVICE_ORDER",  # how those ids are numbered: the agent's cuda:N must be the grader's and nvidia-smi's
    "NVIDIA_VISIBLE_DEVICES",
    "NVIDIA_DRIVER_CAPABILITIES",
    "CUDA_HOME",
    "LD_LIBRARY_PATH",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "REQUESTS_CA_BUNDLE",
)
PROXY_VARS = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
PRIVATE_HOME = ".home"  # the agent's HOME, inside its workspace


def visible_gpus() -> list[str]:
    """The GPUs this job may use, as the scheduler set CUDA_VISIBLE_DEVICES (empty on CPU)."""
    return [g.strip() for g in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if g.strip()]


def agent_command(agent: dict) -> list[str]:
    """The agent's argv with {python} and {agents_dir} filled in."""
    # Plain replacement, not str.format: shell snippets in commands carry JSON braces.
    return [
        part.replace("{python}", sys.executable).replace("{agents_dir}", str(AGENTS_DIR)) for part in agent["command"]
    ]


def readiness_problems(agent: dict) -> list[str]:
    """Why an agent cannot start here (missing binaries or key variables), if anything."""
    needs = agent.get("requires") or {}
    problems = [f"binary {b!r} not found on PATH" for b in needs.get("binaries", []) if shutil.which(b) is None]
    problems += [f"environment variable {v} is not set" for v in needs.get("env", []) if not os.environ.get(v)]
    return problems


def _host_homes(environ: Mapping[str, str]) -> list[str]:
    """The home in HOME and the user's home in the password database (they differ under sudo, or in tests)."""
    homes = [environ.get("HOME", "")]
    try:
        homes.append(pwd.getpwuid(os.getuid()).pw_dir)
    except KeyError:  # a uid without a passwd entry (some containers)
        pass
    return homes


def masked_paths(extra: Sequence[Path] = (), environ: Mapping[str, str] = os.environ) -> list[Path]:
    """What the sandbox hides behind empty tmpfs: the repository (`.snakemake/` metadata with eval sizes and data
    seeds, `config/`, the tasks' private code that generates held-out splits), `extra`, the host's home and every
    cache location set in the environment (a prepared hub task leaves its test split in the datasets cache)."""
    caches = [environ.get(v, "") for v in HOST_CACHE_VARS]
    # /var/tmp outlives reboots and is shared by every user and run: other runs' leftovers sit there.
    candidates = [str(REPO_ROOT), *map(str, extra), *_host_homes(environ), *caches, "/var/tmp"]
    return [Path(c) for c in candidates if c and os.path.isabs(c)]


def visible_paths() -> list[Path]:
    """What the agent's command needs from under the masks, bound back read-only: the interpreter prefixes (the
    venv may live in the repository, the base interpreter in the home) and the reference agents' code."""
    prefixes = (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
    return [*(Path(p) for p in prefixes), AGENTS_DIR]


def refuse_provider_key(env: Mapping[str, str], argv: Sequence[str], driver: dict | None) -> None:
    """Raise if the driver's real key would reach the sandbox (in an adapter's env or argv): only the gateway holds it."""
    key_env = (driver or {}).get("key_env")
    secret = os.environ.get(key_env, "") if key_env else ""
    if len(secret) >= 8 and (any(secret in v for v in env.values()) or any(secret in a for a in argv)):
        raise RuntimeError(f"the adapter would pass the provider key ({key_env}) into the sandbox; refused")


def key_variables(spec: RunSpec) -> set[str]:
    """Every variable the run's config names as holding a key (a driver's key_env; a judge's or a search
    provider's api_key_var, anywhere in the task's settings): never passed to the agent, whatever names it."""
    names = set()

    def walk(value) -> None:
        if isinstance(value, dict):
            for key, item in value.items():
                if key in ("api_key_var", "key_env") and isinstance(item, str) and item:
                    names.add(item)
                walk(item)
        elif isinstance(value, list):
            for item in value:
                walk(item)

    walk(spec.task_settings)
    walk(spec.agent.get("driver") or {})
    return names


def host_env_kept(spec: RunSpec, environ: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What the agent's environment keeps of the host's: an allow-list (HOST_ENV_KEPT; the proxies when the
    network is the host's) and the variables the agent entry names (pass_env, requires.env), never a
    variable the config names as a key. Everything else (tokens, cloud credentials, Snakemake's, the host's
    caches) stays out: a host secret the agent could copy into code/ would end up in the run's record."""
    names = set(HOST_ENV_KEPT) | set(spec.agent.get("pass_env") or ()) | set((spec.agent.get("requires") or {}).get("env") or ())
    if spec.network != "isolated":
        names |= set(PROXY_VARS) | {"NO_PROXY", "no_proxy"}
    names -= key_variables(spec)
    return {name: environ[name] for name in sorted(names) if name in environ}


def agent_env(spec: RunSpec, url: str, marker: str) -> dict:
    """The agent's environment: the contract's variables, the agent entry's `env`, and the little of the
    host's that host_env_kept allows. A multi-task run's agent (spec.tasks) gets TASK=multi, TASKS (its tasks,
    comma-separated, in run order) and DATA_PATH the workspace's tasks/ folder (each task's split in
    tasks/<task>/data/); a single-task run's gets no TASKS."""
    workspace = spec.workspace.resolve()
    tasks = getattr(spec, "tasks", None)
    env = host_env_kept(spec)
    env.update(OFFLINE_ENV)
    env.update({k: str(v) for k, v in (spec.agent.get("env") or {}).items()})
    cache = workspace / ".cache"
    env.update(
        TASK=spec.task_settings["name"],
        BASE_MODEL=spec.hf_id,
        WORKSPACE=str(workspace),
        MODEL_PATH=str(workspace / "models" / spec.hf_id),
        DATA_PATH=str(workspace / "data"),
        OUTPUT_DIR=str(workspace / "output"),
        GRADING_SERVER_URL=url,
        AGENT_SEED=str(spec.seed),
        OMP_NUM_THREADS=str(spec.threads),
        # A private home: the host's is hidden in the sandbox, and tools write dotfiles and caches there.
        HOME=str(workspace / PRIVATE_HOME),
        # Caches inside the workspace: the rest of the file system is read-only in the sandbox.
        HF_HOME=str(cache / "huggingface"),
        XDG_CACHE_HOME=str(cache),
        MPLCONFIGDIR=str(cache / "matplotlib"),
        TMPDIR="/tmp",
        PYTHONUNBUFFERED="1",
    )
    if tasks:
        env.update(TASK="multi", TASKS=",".join(tasks), DATA_PATH=str(workspace / TASKS_DIR))
    # Loopback never goes through a proxy (the grader, the gateway and bridged ports are all on 127.0.0.1); in an
    # isolated sandbox no proxy is reachable anyway, so none is passed on (host_env_kept).
    local = "127.0.0.1,localhost,::1"
    for var in ("NO_PROXY", "no_proxy"):
        env[var] = ",".join(filter(None, [env.get(var), local]))
    # The run's interpreter first: a bare `python` in an agent's shell gets the packages it was promised
    # (the host's own PATH may lead to shims under the now hidden home).
    env["PATH"] = os.pathsep.join(filter(None, [str(Path(sys.executable).parent), env.get("PATH")]))
    env[RUN_MARKER] = marker
    return env
