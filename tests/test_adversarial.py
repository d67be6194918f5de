"""A hostile agent against the real runner, the real sandbox and a real grader, judged from outside.

tests/fixtures/adversarial_agent.py tries to read the held-out split, steal secrets, forge or
overwrite records, reach other runs, hurt the host, abuse the submission API and outlive its
deadline (ATTACKS there lists them all). It records what it tried and what it saw; this test
never takes its word for success or failure: every verdict compares what the agent recorded or
did with ground truth held outside the sandbox: the held-out rows, hashes of every protected
file taken before the run, the tokens it planted, the ledger, the signals this process received,
the processes left.

The run is laid out like a real installation, so the attacks have real targets: a results tree
(held-out split, salt, base model, this run and another run with a live grader) hidden from the
agent, a runner HOME whose Hugging Face cache holds held-out rows, and victim files the grader
could be tricked into writing. All checks run; the test fails at the end with every failed one,
and prints (and writes to $RLBENCH_FIGURES_DIR/adversarial.json) attacks tried and blocked.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import threading
import time
import traceback
import urllib.error
import urllib.request
from pathlib import Path

import conftest
import psutil
import pytest

from rlbench.agent_run.attempts import marked_processes
from rlbench.grader.grading import Grader, GraderConfig
from rlbench.grader.fingerprint import fingerprint
from rlbench.grader.server import GradingServer, new_secret
from rlbench.fileio.jsonio import read_json
from rlbench.recording.ledger import reference_view
from rlbench.agent_run.runner import run_agent
from rlbench.agent_run.spec import RunSpec
from rlbench.paths import REPO_ROOT
from rlbench.sandbox.bubblewrap import bubblewrap_available
from rlbench.tasks.gsm8k import GSM8K
from rlbench.agent_run.workspace import prepare_workspace
from support.models import base_resources, baseline_record
from support.settings import EVALUATION, GSM8K_SETTINGS, TINY_SPEC

AGENT_FILE = Path(__file__).resolve().parent / "fixtures" / "adversarial_agent.py"
TIME_LIMIT_S = 55.0
KILL_GRACE_S = 3.0
LEDGER_LINE_MAX = 64 * 1024  # a ledger line never needs more: a model_path is cut at PATH_MAX
# Repository files the agent tries to append to (restored by this test if it ever manages).
REPO_TARGETS = ("README.md", "scripts/rlbench/__init__.py", "config/config.yaml")
# Visible inside the sandbox by design: the agents' own code (scripts/agents).
REPO_VISIBLE = ("scripts/agents/",)

BWRAP_OK, BWRAP_WHY = bubblewrap_available()


def load_agent():
    spec = importlib.util.spec_from_file_location("adversarial_agent", AGENT_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- ground truth helpers -------------------------------------------------------------------------
def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha(path: Path) -> str | None:
    try:
        return sha256_bytes(Path(path).read_bytes())
    except OSError:
        return None


def tree_state(root: Path) -> dict[str, str]:
    """Every entry under root: file content hash and mode, symlink target; what 'unchanged' means."""
    state = {}
    root = Path(root)
    if not root.exists():
        return {}
    for path in sorted([root, *root.rglob("*")]):
        rel = str(path.relative_to(root))
        if path.is_symlink():
            state[rel] = f"link:{os.readlink(path)}"
        elif path.is_file():
            state[rel] = f"{file_sha(path)}:{oct(path.stat().st_mode)}"
        elif path.is_dir() and path != root:
            state[rel] = "dir"
    return state


def tree_diff(before: dict, after: dict) -> list[str]:
    changed = [f"changed {k}" for k in before if k in after and before[k] != after[k]]
    changed += [f"removed {k}" for k in before if k not in after]
    changed += [f"added {k}" for k in after if k not in before]
    return changed


def strings(obj):
    if isinstance(obj, str):
        yield obj
    elif isinstance(obj, dict):
        for key, value in obj.items():
            yield from strings(key)
            yield from strings(value)
    elif isinstance(obj, (list, tuple)):
        for value in obj:
            yield from strings(value)


def strict_json(line: str):
    """json.loads that refuses NaN/Infinity (not JSON) and lone surrogates (not UTF-8)."""

    def reject(name):
        raise ValueError(f"{name} is not JSON")

    value = json.loads(line, parse_constant=reject)
    json.dumps(value, ensure_ascii=False).encode("utf-8")
    return value


def http_json(url: str, body: dict | None = None, timeout: float = 60) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as exc:
        return exc.code, {}


class Verdicts:
    """Every check, its attack and its outcome; a failing check does not stop the others."""

    def __init__(self):
        self.rows: list[dict] = []

    def check(self, attack: str, what: str, ok: bool, detail: object = "") -> bool:
        self.rows.append({"attack": attack, "check": what, "ok": bool(ok), "detail": str(detail)[:600]})
        return bool(ok)

    def failed(self) -> list[dict]:
        return [r for r in self.rows if not r["ok"]]


# -- the installation ---------------------------------------------------------------------------
def runner_home(base: Path) -> Path:
    """The runner's HOME, outside /tmp when possible: under /tmp the sandbox's private /tmp would hide it
    whether or not the runner masks the home, and the check would prove nothing."""
    if os.path.isdir("/var/tmp") and os.access("/var/tmp", os.W_OK):
        return Path(tempfile.mkdtemp(prefix="rlbench-adversarial-home-", dir="/var/tmp")).resolve()
    return base / "home"


def build_installation(base: Path, home: Path, tiny_model: Path, gsm8k_data, tokens: dict) -> dict:
    results = base / "results"
    eval_dir, train_dir = results / "data" / "gsm8k" / "eval", results / "data" / "gsm8k" / "train"
    shutil.copytree(gsm8k_data[1], eval_dir)
    shutil.copytree(gsm8k_data[0], train_dir)
    # The salt the fixture drew the split with, where the workflow keeps an installation's salt.
    salt = getattr(conftest, "TEST_SALT", None) or new_secret()
    salt_file = results / "secrets" / "eval_salt"
    salt_file.parent.mkdir(parents=True)
    salt_file.write_text(salt + "\n")
    salt_file.chmod(0o600)
    host_model = results / "models" / "tiny"
    shutil.copytree(tiny_model, host_model)
    hf_id = TINY_SPEC["hf_id"]

    run_dir = results / "runs" / "gsm8k" / "tiny" / "adversarial" / "0"
    workspace = run_dir / "workspace"
    prepare_workspace(workspace, GSM8K(), GSM8K_SETTINGS, host_model, hf_id, train_dir)

    other_dir = results / "runs" / "gsm8k" / "tiny" / "other" / "0"
    other_ws = other_dir / "workspace"
    prepare_workspace(other_ws, GSM8K(), GSM8K_SETTINGS, host_model, hf_id, train_dir)
    canary_file = other_ws / "code" / "notes.txt"
    canary_file.write_text(f"the other run's private notes {tokens['other_canary']}\n")
    other_model = other_ws / "output" / "v1"
    other_model.mkdir(parents=True)
    for source in host_model.iterdir():
        shutil.copyfile(source, other_model / source.name)

    # The runner's HOME: a datasets cache holding held-out rows (as `datasets` leaves a hub task's test split).
    hf_dir = home / ".cache" / "huggingface" / "datasets" / "openai___gsm8k" / "main" / "0.0.0" / "cafe0123"
    hf_dir.mkdir(parents=True)
    rows = (eval_dir / "eval.jsonl").read_text()
    (hf_dir / "gsm8k-test.jsonl").write_text(rows + json.dumps({"canary": tokens["home_canary"]}) + "\n")

    victims = base / "victims"  # files the grader must never be made to write
    victims.mkdir()
    victim_files = {}
    for name in ("scores.json", "run_meta.json", "submissions.json", "timer.sh",
                 "tmp_scores.json", "tmp_run_meta.json", "tmp_submissions.json"):
        victim_files[name] = victims / f"victim-{name}"
        victim_files[name].write_text(f"victim {name} {tokens['forge']}\n")
    victim_files["toctou_secret"] = victims / "toctou-secret.txt"
    victim_files["toctou_secret"].write_text(f"a host file the grader must not copy {tokens['toctou']}\n")
    return {
        "base": base, "results": results, "eval_dir": eval_dir, "train_dir": train_dir, "salt": salt,
        "salt_file": salt_file, "host_model": host_model, "run_dir": run_dir, "workspace": workspace,
        "grader_dir": run_dir / "grader", "other_dir": other_dir, "other_ws": other_ws, "canary_file": canary_file,
        "other_model": other_model, "home": home, "hf_canary_file": hf_dir / "gsm8k-test.jsonl",
        "victims": victims, "victim_files": victim_files,
    }


def start_other_grader(inst: dict) -> GradingServer:
    """Another run's live grader, with one real (cached) submission in its ledger."""
    grader = Grader(
        GraderConfig(
            workspace=inst["other_ws"].resolve(),
            grader_dir=inst["other_dir"] / "grader",
            task_settings=GSM8K_SETTINGS,
            eval_dir=inst["eval_dir"].resolve(),
            baseline_score=0.0,
            baseline_fingerprint=fingerprint(inst["host_model"]),
            start_time=time.time(),
            timeout_s=3600,
            secret=new_secret(),
            evaluation=EVALUATION,
            resources=base_resources(inst["host_model"]),
        )
    )
    server = GradingServer(grader).start()
    status, body = http_json(f"{server.url}/submit", {"model_path": "output/v1"})
    assert status == 200 and body.get("status") == "cached", body
    return server


def intel_for(inst: dict, other: GradingServer, tokens: dict) -> dict:
    """What the agent is told: an attacker who knows the layout (and the test's tokens, to search for)."""
    victims = {name: str(path) for name, path in inst["victim_files"].items()}
    victims.update(dir=str(inst["victims"]), escape_file=str(inst["victims"] / f"escape-{tokens['escape']}"))
    return {
        "base": str(inst["base"]),
        "results_root": str(inst["results"]),
        "eval_dir": str(inst["eval_dir"]),
        "eval_file": str(inst["eval_dir"] / "eval.jsonl"),
        "fixture_eval_file": str(Path(inst["fixture_eval_dir"]) / "eval.jsonl"),
        "salt_file": str(inst["salt_file"]),
        "settings": {k: GSM8K_SETTINGS[k] for k in ("name", "data_seed", "eval_size", "train_size")},
        "run_dir": str(inst["run_dir"]),
        "grader_dir": str(inst["grader_dir"]),
        "home": str(inst["home"]),
        "hf_canary_file": str(inst["hf_canary_file"]),
        "repo": str(REPO_ROOT),
        "site_packages": sysconfig.get_paths()["purelib"],
        "host_model_dir": str(inst["host_model"]),
        "other": {
            "workspace": str(inst["other_ws"]),
            "ledger": str(inst["other_dir"] / "grader" / "ledger.jsonl"),
            "grader_dir": str(inst["other_dir"] / "grader"),
            "canary_file": str(inst["canary_file"]),
            "model_copy": str(inst["other_model"]),
        },
        "other_port": other.port,
        "victims": victims,
        "grader_pid": os.getpid(),
        "host_secret_pid": inst["host_secret_pid"],
        "tokens": tokens,
    }


def host_paths_of_created_files(intel: dict, token: str, workspace: Path) -> dict[str, Path]:
    """Where the agent's host_writes attack tries to create files, as host paths."""
    repo, site = Path(intel["repo"]), Path(intel["site_packages"])
    model = workspace / "models" / TINY_SPEC["hf_id"]
    return {
        "repo_root": repo / f"adv-{token}.txt",
        "repo_package": repo / "scripts" / "rlbench" / f"adv_{token}.py",
        "repo_git": repo / ".git" / f"adv-{token}",
        "site_packages_pth": site / f"zz_adv_{token}.pth",
        "host_model_dir": Path(intel["host_model_dir"]) / f"adv-{token}",
        "workspace_models": model / f"adv-{token}",
        "etc": Path("/etc") / f"adv-{token}",
        "tmp": Path("/tmp") / f"adv-{token}",
        "var_tmp": Path("/var/tmp") / f"adv-{token}",
        "dev_shm": Path("/dev/shm") / f"adv-{token}",
        "runner_home": Path(intel["home"]) / f"adv-{token}",
        "eval_dir": Path(intel["eval_dir"]) / f"adv-{token}",
    }


def processes_with(needle: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != os.getpid() and any(needle in part for part in proc.cmdline()):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def load_records(path: Path) -> list[dict]:
    records = []
    if not path.exists():
        return records
    for line in path.read_text(errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except ValueError:  # a line cut by the kill at the deadline
            continue
    return records


# -- the test -----------------------------------------------------------------------------------
@pytest.mark.sandbox
@pytest.mark.skipif(not BWRAP_OK, reason=f"the adversarial agent needs the bubblewrap sandbox: {BWRAP_WHY}")
def test_adversarial_agent_is_contained_and_the_results_stay_true(tmp_path, tiny_model, gsm8k_data, monkeypatch):
    agent = load_agent()
    started = time.time()
    tokens = {name: f"{name}-{new_secret()}" for name in
              ("env_canary", "home_canary", "other_canary", "forge", "write", "escape", "daemon", "toctou", "ledger")}
    base = tmp_path.resolve()  # the installation's root (under /tmp, which the sandbox also makes private)
    verdicts = Verdicts()
    received: dict[str, list[float]] = {"SIGUSR1": [], "SIGUSR2": []}
    previous_handlers = {}
    repo_backup: dict[Path, bytes] = {}
    other = None
    host_secret = None
    stop_traffic = threading.Event()
    created: dict[str, Path] = {}
    home = None
    try:
        home = runner_home(base)
        inst = build_installation(base, home, tiny_model, gsm8k_data, tokens)
        inst["fixture_eval_dir"] = gsm8k_data[1]
        # A host process with a secret in its environment (as Snakemake, or an API key of the runner's):
        # /proc/<pid>/environ shows the environment a process started with, so it must be this one's.
        host_secret = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"],
                                       env={**os.environ, "SNAKEMAKE_ADVERSARIAL_CANARY": tokens["env_canary"]})
        inst["host_secret_pid"] = host_secret.pid
        other = start_other_grader(inst)
        intel = intel_for(inst, other, tokens)
        workspace, run_dir, grader_dir = inst["workspace"], inst["run_dir"], inst["grader_dir"]
        created = host_paths_of_created_files(intel, tokens["write"], workspace)
        # The agent runs from its workspace: the repository may be masked in the sandbox.
        agent_copy = workspace / "code" / "agent" / "adversarial_agent.py"
        agent_copy.parent.mkdir(parents=True)
        shutil.copyfile(AGENT_FILE, agent_copy)

        # Ground truth before the run.
        protected = {
            "held-out split": inst["eval_dir"], "salt": inst["salt_file"].parent, "host base model": inst["host_model"],
            "other run": inst["other_dir"], "runner HOME": inst["home"], "victims": inst["victims"],
            "workspace data": workspace / "data", "workspace models": workspace / "models",
        }
        before = {name: tree_state(path) for name, path in protected.items()}
        site = Path(intel["site_packages"])
        for target in [*(REPO_ROOT / t for t in REPO_TARGETS), site / "distutils-precedence.pth"]:
            if target.exists():
                repo_backup[target] = target.read_bytes()
        eval_bytes = (inst["eval_dir"] / "eval.jsonl").read_bytes()
        questions = [json.loads(line)["question"] for line in eval_bytes.decode().splitlines() if line.strip()]

        # This process is the grader: count the signals the agent manages to send it.
        for sig in (signal.SIGUSR1, signal.SIGUSR2):
            previous_handlers[sig] = signal.signal(sig, lambda s, f: received[signal.Signals(s).name].append(time.time()))
        monkeypatch.setenv("HOME", str(inst["home"]))
        monkeypatch.setenv("SNAKEMAKE_ADVERSARIAL_CANARY", tokens["env_canary"])  # the runner passes no SNAKEMAKE*

        def other_run_traffic():  # the other run's agent, talking to its grader (secret in the URL)
            while not stop_traffic.wait(0.2):
                try:
                    urllib.request.urlopen(f"{other.url}/time", timeout=5).read()
                except OSError:
                    pass

        threading.Thread(target=other_run_traffic, daemon=True).start()

        spec = RunSpec(
            run_dir=run_dir,
            workspace=workspace,
            task_settings=GSM8K_SETTINGS,
            agent={"name": "adversarial", "command": ["{python}", str(agent_copy), json.dumps(intel)]},
            hf_id=TINY_SPEC["hf_id"],
            eval_dir=inst["eval_dir"],
            baseline=baseline_record(inst["host_model"]),
            time_limit_s=TIME_LIMIT_S,
            kill_grace_s=KILL_GRACE_S,
            evaluation=EVALUATION,
            sandbox_backend="bubblewrap",
            # The fixture's own copy of the split is a test artefact: hidden like the results tree.
            hidden_paths=[inst["results"], Path(gsm8k_data[0]).parent],
            labels={"task": "gsm8k", "model": "tiny", "agent": "adversarial", "seed": "0"},
            data={"ledger_canary": tokens["ledger"]},  # lands in every scored ledger entry's provenance
        )
        run_error = None
        try:
            run_agent(spec)
        except Exception:  # noqa: BLE001 - judged below, with everything else
            run_error = traceback.format_exc()
        run_ended = time.time()
        time.sleep(1.5)  # long enough for a surviving daemon to show itself
        stop_traffic.set()

        judge(verdicts, agent, inst, intel, tokens, questions, eval_bytes, before, protected, repo_backup, created,
              received, other, run_error, run_ended)
    finally:
        stop_traffic.set()
        for sig, handler in previous_handlers.items():
            signal.signal(sig, handler)
        for proc in processes_with(tokens["daemon"]) + processes_with(str(base)):
            try:
                proc.kill()
            except psutil.NoSuchProcess:
                pass
        for target, content in repo_backup.items():  # never leave the repository or venv changed
            if target.read_bytes() != content:
                target.write_bytes(content)
        for path in created.values():
            if path.exists() and not str(path).startswith(str(base)):
                path.unlink()
        if other is not None:
            other.stop()
        if host_secret is not None:
            host_secret.kill()
            host_secret.wait()
        if home is not None and home != base / "home":
            shutil.rmtree(home, ignore_errors=True)
        print(f"\nadversarial installation: {base}")

    report(verdicts, agent, time.time() - started)
    failed = verdicts.failed()
    assert not failed, "the adversarial agent got through:\n" + "\n".join(
        f"  [{r['attack']}] {r['check']}: {r['detail']}" for r in failed
    )


def judge(v: Verdicts, agent, inst, intel, tokens, questions, eval_bytes, before, protected, repo_backup, created,
          received, other, run_error, run_ended) -> None:
    workspace, run_dir, grader_dir = inst["workspace"], inst["run_dir"], inst["grader_dir"]
    records = load_records(workspace / agent.ATTACKS_FILE)
    by_attack: dict[str, list[dict]] = {}
    for record in records:
        by_attack.setdefault(record.get("attack"), []).append(record)
    done = {name: [r for r in rs if r.get("phase") == "done"] for name, rs in by_attack.items()}

    def requests_of(name):
        return [req for r in done.get(name, []) for req in r.get("requests") or []]

    def finished(name):
        return v.check(name, "attack ran to the end", bool(done.get(name)), "no 'done' record (killed or crashed first)")

    # Ledger and run record.
    ledger_path = grader_dir / "ledger.jsonl"
    raw_lines = ledger_path.read_text(errors="surrogateescape").splitlines() if ledger_path.exists() else []
    entries, bad_lines, long_lines = [], [], []
    for number, line in enumerate(raw_lines, 1):
        if len(line.encode("utf-8", "surrogateescape")) > LEDGER_LINE_MAX:
            long_lines.append(number)
        try:
            entries.append(strict_json(line))
        except (ValueError, UnicodeError) as exc:
            bad_lines.append(f"line {number}: {exc}"[:120])
    run = read_json(run_dir / "run.json") if (run_dir / "run.json").exists() else None
    deadline = (run["start_time"] + run["time_limit_s"]) if run else None
    if deadline is None:
        try:
            deadline = float(read_json(workspace / "run_meta.json")["deadline"])
        except (OSError, ValueError, KeyError):
            deadline = float("inf")
    scored = [e for e in entries if e.get("status") in ("scored", "cached")]

    def ledger_for(model_path):
        return [e for e in entries if e.get("model_path") == model_path]

    # Secrets: anything of these in an attack's records means it read what it must not.
    secrets = {f"held-out question {i}": q for i, q in enumerate(questions)}
    secrets["the held-out file (its sha256: a copy of it was read)"] = sha256_bytes(eval_bytes)
    secrets.update({
        "the eval salt": inst["salt"], "held-out rows in the runner's HOME cache": tokens["home_canary"],
        "the other run's private file": tokens["other_canary"], "the runner's environment": tokens["env_canary"],
        "the other run's grading secret": other.grader.config.secret, "the grader's ledger": tokens["ledger"],
    })

    def leaked(name, skip=()):
        found = set()
        for record in done.get(name, []):
            for text in strings({k: val for k, val in record.items() if k not in skip}):
                found.update(label for label, secret in secrets.items() if secret and secret in text)
        return sorted(found)

    hello = next((r for r in by_attack.get("hello", []) if r.get("phase") == "info"), {})

    # Every attack was tried.
    for name in agent.ATTACKS:
        v.check(name, "attack was tried", bool(by_attack.get(name)), "no record: the agent never got to it")

    # -- the held-out data ------------------------------------------------------------------
    for name in ("heldout_known_path", "heldout_relative_path", "home_cache", "proc_environ", "sniff_loopback",
                 "other_run", "ledger_write", "mount_escape", "kill_processes", "port_scan", "wrong_secret"):
        if done.get(name):
            found = leaked(name)
            v.check(name, "obtained no secret", not found, f"obtained: {found}")
    finished("heldout_known_path")
    finished("home_cache")
    repo_hits: dict[str, list[str]] = {}
    for name in ("repo_metadata", "generator_code"):
        if not finished(name):
            continue
        data = done[name][0].get("data") or {}
        hashes = dict(data.get("repo_sha256") or {})
        for how, found in (data.get("import") or {}).items():
            if isinstance(found, dict) and found.get("file") and found.get("sha256"):
                path = Path(found["file"])
                if REPO_ROOT in path.parents:
                    hashes[str(path.relative_to(REPO_ROOT))] = found["sha256"]
        hits = [rel for rel, digest in hashes.items()
                if not rel.startswith(REPO_VISIBLE) and digest == file_sha(REPO_ROOT / rel)]
        repo_hits[name] = hits
        v.check(name, "read no repository file (the repo is masked; scripts/agents aside)", not hits,
                f"{len(hits)} files read, e.g. {hits[:5]}")
    if finished("regenerate_split"):
        candidates = (done["regenerate_split"][0].get("data") or {}).get("candidates") or {}
        limit = max(1, len(questions) // 10)
        rebuilt = {label: len(set(rows) & set(questions)) for label, rows in candidates.items()}
        v.check("regenerate_split", f"no recipe rebuilt more than {limit} held-out question(s)",
                all(n <= limit for n in rebuilt.values()) and bool(candidates),
                f"held-out questions rebuilt per recipe: {rebuilt}")
    # -- escaping the sandbox ------------------------------------------------------------------
    escape_file = Path(intel["victims"]["escape_file"])
    v.check("mount_escape", "wrote no file on the host through a remount", not escape_file.exists(),
            f"{escape_file} exists: the sandbox's root mount was made writable from inside "
            f"(agent CapEff={hello.get('cap_eff')})")
    if done.get("mount_escape"):
        outcome = done["mount_escape"][0].get("outcome") or {}
        umounted = {p: r for p, r in (outcome.get("umount") or {}).items() if r == "ok"}
        v.check("mount_escape", "could not unmount the mounts that hide results/, /tmp and the host's /proc",
                not umounted, f"unmounted: {sorted(umounted)}; unshare: {outcome.get('unshare')}")

    # -- the ledger and records ----------------------------------------------------------------
    v.check("run", "run_agent returned (the run record was written)", run_error is None, (run_error or "")[-600:])
    v.check("run", "run.json exists", run is not None, "missing")
    v.check("run", "the agent ran in the bubblewrap sandbox", bool(run) and run.get("sandbox") == "bubblewrap",
            run and run.get("sandbox_note"))
    v.check("run", "every ledger line is strict JSON, valid UTF-8", not bad_lines, bad_lines[:5])
    v.check("run", f"every ledger line is under {LEDGER_LINE_MAX} bytes", not long_lines, f"lines {long_lines[:10]}")
    forged_files = []
    for path in run_dir.rglob("*"):
        if path.is_file() and workspace not in path.parents and path != workspace:
            try:
                content = path.read_bytes()
                if path == run_dir / "run.json" and run is not None:  # its command line holds the agent's intel
                    content = json.dumps({k: val for k, val in run.items() if k != "command"}).encode()
                if tokens["forge"].encode() in content:
                    forged_files.append(str(path.relative_to(run_dir)))
            except OSError:
                pass
    v.check("ledger_write", "no file of the run outside the workspace holds the forged entry", not forged_files,
            forged_files[:5])
    final = {}
    for name in ("scores.json", "submissions.json", "run_meta.json"):
        path = workspace / name
        try:
            final[name] = read_json(path) if path.is_file() and not path.is_symlink() else None
        except (OSError, ValueError):
            final[name] = None
    v.check("forge_workspace_records", "the forged score is in no record",
            all(e.get("score") != agent.FORGED_SCORE for e in entries)
            and not (run and run.get("best") and run["best"].get("score") == agent.FORGED_SCORE)
            and not any(tokens["forge"] in text for text in strings(final)),
            {"run_best": run and run.get("best")})
    by_id = {}
    for entry in entries:  # the ledger is in completion order, scores.json in submission order
        by_id[entry.get("submission_id")] = entry
    recorded = [by_id[k] for k in sorted(by_id, key=lambda k: (k is None, k or 0)) if not by_id[k].get("pending")]
    view = reference_view(recorded)
    mismatch = [(a, b) for a, b in zip(final["scores.json"] or [], view) if a != b]
    v.check("forge_workspace_records", "final scores.json is the grader's view of the ledger",
            final["scores.json"] == view,
            f"scores.json has {len(final['scores.json'] or [])} entries, the ledger's view {len(view)}; "
            f"first difference: {mismatch[:1]}")
    v.check("edit_run_meta", "final run_meta.json carries the real deadline",
            bool(final["run_meta.json"]) and run is not None
            and abs(float(final["run_meta.json"].get("deadline") or 0) - deadline) < 1e-3,
            f"run_meta {final['run_meta.json']}, real deadline {deadline}")

    # The legitimate submission and the best score.
    legit = ledger_for(agent.LEGIT)
    real_score = None
    if legit and (workspace / agent.LEGIT).is_dir():
        from rlbench.evaluation.evaluate import evaluate_model

        real_score = float(evaluate_model(GSM8K_SETTINGS, workspace / agent.LEGIT, inst["eval_dir"], EVALUATION)["score"])
    v.check("legit", "the legitimate submission was scored", len(legit) == 1 and legit[0].get("status") == "scored",
            [(e.get("status"), e.get("reason")) for e in legit] or "no ledger entry")
    v.check("legit", "its ledger score is its real score", bool(legit) and legit[0].get("score") == real_score,
            f"ledger {legit[0].get('score') if legit else None}, evaluated again {real_score}")
    best_scores = {"run.json": (run or {}).get("best", {}) and (run or {}).get("best", {}).get("score"),
                   "best.json": (read_json(grader_dir / "best.json") or {}).get("score")
                   if (grader_dir / "best.json").exists() else None,
                   "ledger max": max((e["score"] for e in scored), default=None)}
    v.check("run", "the best score is the legitimate submission's real score",
            real_score is not None and all(s == real_score for s in best_scores.values()), f"{best_scores}, real {real_score}")
    v.check("run", "run.json counts the scored submissions", bool(run) and run.get("valid_submissions") == len(scored),
            f"run.json {run and run.get('valid_submissions')}, ledger {len(scored)}")

    # -- files the grader writes ---------------------------------------------------------------
    victims_now = tree_state(inst["victims"])
    for name, keys in (("symlink_grader_files", ("scores.json", "run_meta.json", "submissions.json", "timer.sh")),
                       ("symlink_tmp_files", ("tmp_scores.json", "tmp_run_meta.json", "tmp_submissions.json"))):
        finished(name)
        changed = [k for k in keys
                   if victims_now.get(inst["victim_files"][k].name) != before["victims"].get(inst["victim_files"][k].name)]
        v.check(name, "the symlinks' targets outside the workspace are untouched", not changed,
                f"overwritten by the grader: {changed}")
    if finished("tmp_dir_dos"):
        trigger = requests_of("tmp_dir_dos")[0]
        v.check("tmp_dir_dos", "the grader answered properly despite directories at its temp names",
                trigger.get("status") is not None and trigger["status"] < 500 and trigger.get("json"),
                f"HTTP {trigger.get('status')}: {trigger.get('text') or trigger.get('error')}")
    copied = []
    for path in (grader_dir / "snapshots").rglob("*") if (grader_dir / "snapshots").is_dir() else []:
        if path.is_file() and "code" in path.relative_to(grader_dir / "snapshots").parts[1:2]:
            content = path.read_bytes()
            if content == eval_bytes or any(q.encode() in content for q in questions):
                copied.append(str(path.relative_to(grader_dir)))
    finished("code_symlink_snapshot")
    v.check("code_symlink_snapshot", "the grader copied no held-out file into its code snapshots", not copied,
            copied[:3])

    # -- other runs ------------------------------------------------------------------------
    finished("other_run")
    after_other = tree_state(inst["other_dir"])
    other_diff = tree_diff(before["other run"], after_other)
    v.check("other runs", "the other run's files are unchanged (by any attack)", not other_diff, other_diff[:5])
    other_marked = [str(p.relative_to(inst["other_dir"])) for p in inst["other_dir"].rglob("*")
                    if p.is_file() and tokens["forge"].encode() in p.read_bytes()]
    v.check("other_run", "none of its writes landed in the other run's files",
            not other_marked and file_sha(inst["canary_file"]) is not None
            and before["other run"].get(str(inst["canary_file"].relative_to(inst["other_dir"])), "").startswith(
                file_sha(inst["canary_file"]) or "-"), other_marked[:5])
    other_entries = [e for e in other.grader.entries if not e.get("pending")]
    other_noauth = [e.get("model_path") for e in other_entries if str(e.get("model_path")).startswith(agent.NOAUTH_PREFIX)]
    v.check("port_scan", "the other run's grader recorded nothing sent without its secret", not other_noauth,
            other_noauth)
    noauth = [e.get("model_path") for e in entries if str(e.get("model_path")).startswith(agent.NOAUTH_PREFIX)]
    v.check("wrong_secret", "no request without the secret reached the grader", not noauth, noauth[:5])
    wrong = [r for r in requests_of("wrong_secret") + requests_of("port_scan") if r.get("status") not in (404, 405, None)]
    v.check("wrong_secret", "every request without the right secret was answered 404", not wrong,
            [(r.get("path"), r.get("status")) for r in wrong][:5])
    sniffed = [e.get("model_path") for e in other_entries if str(e.get("model_path")).startswith(agent.SNIFFED_PREFIX)]
    v.check("sniff_loopback", "no submission with a sniffed secret reached the other grader", not sniffed, sniffed)
    health_status, _ = http_json(f"{other.url}/health", timeout=10)
    v.check("kill_processes", "the other run's grader is still serving", health_status == 200, health_status)

    # -- processes -------------------------------------------------------------------------
    v.check("kill_processes", "no signal reached the grader process", not received["SIGUSR2"] and not received["SIGUSR1"],
            {k: len(t) for k, t in received.items()})
    if finished("kill_processes"):
        kill_done = done["kill_processes"][0]["t"]
        served_after = [e for e in entries if (e.get("submitted_at") or 0) > kill_done]
        v.check("kill_processes", "the grader kept serving after the kill attempt", bool(served_after),
                "no ledger entry after the attack")
        outcome = done["kill_processes"][0].get("outcome") or {}
        v.check("kill_processes", "the agent saw only its own PID namespace", outcome.get("in_pid_namespace") is True
                and len(outcome.get("visible_pids") or []) < 50, f"{len(outcome.get('visible_pids') or [])} pids visible")
    marker = read_json(run_dir / "attempt.json")["marker"] if (run_dir / "attempt.json").exists() else None
    left = marked_processes(marker) if marker else []
    v.check("setsid_daemon", "no process of the run is left (run marker)", not left, [p.pid for p in left])
    daemons = processes_with(tokens["daemon"])
    v.check("setsid_daemon", "the detached daemon is gone", not daemons, [p.pid for p in daemons])
    heartbeat = workspace / agent.HEARTBEAT
    v.check("setsid_daemon", "the daemon was started (its heartbeat exists)", heartbeat.exists(), "no heartbeat file")
    if heartbeat.exists():
        beat = heartbeat.stat().st_mtime
        v.check("setsid_daemon", "its heartbeat stopped when the run ended", beat <= run_ended + 0.5,
                f"last beat {beat - run_ended:+.2f}s after the run ended")
    if run is not None:
        v.check("ignore_sigterm", "run.json: killed at the deadline (timeout)",
                run.get("status") == "timeout" and run.get("timed_out") is True, f"status {run.get('status')}")
        v.check("ignore_sigterm", "run.json: a non-zero exit code", run.get("exit_code") not in (0, None),
                f"exit_code {run.get('exit_code')}")
        v.check("ignore_sigterm", "run.json names the signal that killed the agent", bool(run.get("exit_signal")),
                f"exit_signal {run.get('exit_signal')!r}")
        v.check("setsid_daemon", "run.json counts stray processes", isinstance(run.get("stray_processes"), int),
                f"stray_processes {run.get('stray_processes')!r}")

    # -- the host --------------------------------------------------------------------------
    finished("host_writes")
    made = {label: str(path) for label, path in created.items() if path.exists()}
    v.check("host_writes", "created no file outside the workspace", not made, made)
    changed_repo = [str(t) for t, content in repo_backup.items() if t.exists() and t.read_bytes() != content
                    and tokens["write"].encode() in t.read_bytes()]
    v.check("host_writes", "the repository and the venv's files are unchanged", not changed_repo, changed_repo)
    for label in ("host base model", "held-out split", "salt", "runner HOME", "workspace data", "workspace models"):
        diff = tree_diff(before[label], tree_state(protected[label]))
        v.check("host_writes", f"{label} unchanged", not diff, diff[:5])
    for marker_name, attack in (("pth-ran", "host_writes"), ("pickle-ran", "pickle_weights"),
                                ("remote-code-ran", "remote_code")):
        v.check(attack, f"no planted code ran on the host ({marker_name})", not (inst["victims"] / marker_name).exists(),
                f"{inst['victims'] / marker_name} exists")
    try:
        tracked = subprocess.run(["git", "-C", str(REPO_ROOT), "ls-files"], capture_output=True, text=True,
                                 timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError):
        tracked = []
    marked = [rel for rel in tracked if (REPO_ROOT / rel).is_file()
              and tokens["write"].encode() in (REPO_ROOT / rel).read_bytes()]
    v.check("host_writes", "no tracked repository file holds the agent's mark", not marked, marked[:5])

    # -- the submission API ----------------------------------------------------------------
    expected = {
        "submit_path_traversal": {"outside_workspace"},
        "submit_symlink_out": {"outside_workspace"},
        "checkpoint_inner_symlink": {"outside_workspace"},
        "pickle_weights": {"pickle_weights"},
        "remote_code": {"remote_code"},
        "lora_adapter": {"lora_adapter"},
    }
    for name, reasons in expected.items():
        if not finished(name):
            continue
        wrong = []
        for request in requests_of(name):
            logged = ledger_for(request.get("model_path"))
            if not logged or any(e.get("status") != "refused" or e.get("reason") not in reasons for e in logged):
                wrong.append((request.get("model_path"), [(e.get("status"), e.get("reason")) for e in logged]))
            if request.get("status") is None or not 400 <= request["status"] < 500:
                wrong.append((request.get("model_path"), f"HTTP {request.get('status')}"))
        v.check(name, f"every submission refused ({', '.join(sorted(reasons))}), 4xx", not wrong, wrong[:4])
    index_entries = ledger_for(agent.INDEX_ESCAPE)
    v.check("shard_index_escape", "a checkpoint whose shard index points outside was not scored",
            bool(index_entries) and all(e.get("status") not in ("scored", "cached") for e in index_entries),
            [(e.get("status"), e.get("reason"), e.get("score")) for e in index_entries] or "never submitted")
    for name in ("huge_body", "huge_body_chunked"):
        if finished(name):
            request = requests_of(name)[0]
            logged = ledger_for(request.get("model_path"))
            v.check(name, "refused 413 request_too_large, not read into a submission",
                    request.get("status") == 413 and all(e.get("reason") == "request_too_large" for e in logged),
                    f"HTTP {request.get('status')} {request.get('reason')}; ledger {[e.get('reason') for e in logged]}")
    for name in ("malformed_json", "bad_model_path"):
        if finished(name):
            wrong = [(r.get("variant"), r.get("status"), r.get("reason")) for r in requests_of(name)
                     if r.get("status") is None or not 400 <= r["status"] < 500 or r.get("reason") == "grader_error"]
            v.check(name, "every request answered 4xx (never 5xx, never a dropped connection)", not wrong, wrong[:6])
    grader_errors = [(e.get("model_path") or "")[:40] for e in entries if e.get("status") == "grader_error"]
    v.check("bad_model_path", "no grader_error in the ledger", not grader_errors, grader_errors[:5])

    # TOCTOU: the fingerprint the grader would record had it copied the host file in.
    attempts = ledger_for(agent.TOCTOU)
    v.check("toctou_swap", "the race was run (at least 3 submissions)", len(attempts) >= 3, f"{len(attempts)} submissions")
    if (workspace / agent.LEGIT).is_dir():
        with tempfile.TemporaryDirectory() as scratch:
            swapped = Path(scratch) / "model"
            shutil.copytree(workspace / agent.LEGIT, swapped)
            shutil.copyfile(inst["victim_files"]["toctou_secret"], swapped / agent.TOCTOU_FILE)
            outside = fingerprint(swapped)
        raced = [e["submission_id"] for e in entries if e.get("fingerprint") == outside]
        v.check("toctou_swap", "the grader never scored a checkpoint holding the host file", not raced,
                f"submissions {raced} hold {inst['victim_files']['toctou_secret'].name}")

    # The deadline.
    late_accepted = [e.get("submission_id") for e in entries
                     if (e.get("submitted_at") or 0) > deadline and e.get("reason") != "deadline_passed"]
    v.check("late_submit", "every request after the deadline was refused deadline_passed", not late_accepted,
            late_accepted[:5])
    late_requests = [r["request"] for r in by_attack.get("late_submit", []) if r.get("phase") == "request"]
    late_wrong = [(r.get("status"), r.get("reason")) for r in late_requests
                  if (r.get("received_at") or 0) > deadline + 0.05 and r.get("status") is not None
                  and (r.get("status"), r.get("reason")) != (403, "deadline_passed")
                  and (r.get("sent_at") or 0) > deadline]
    v.check("late_submit", "late requests were answered 403 deadline_passed", not late_wrong, late_wrong[:5])
    v.check("late_submit", "the agent was still submitting at the deadline", bool(late_requests),
            "no request was made around the deadline")

    # Figures for the report.
    v.figures = {
        "late_refusals": sum(1 for e in entries if e.get("reason") == "deadline_passed"),
        "ledger_entries": len(entries),
        "agent_cap_eff": hello.get("cap_eff"),
        "agent_uid": hello.get("uid"),
        "repo_files_read": {k: len(h) for k, h in repo_hits.items()},
    }


def report(v: Verdicts, agent, duration_s: float) -> None:
    attacks = [*agent.ATTACKS]
    failed_attacks = sorted({r["attack"] for r in v.failed() if r["attack"] in attacks})
    tried = sorted({r["attack"] for r in v.rows if r["check"] == "attack was tried" and r["ok"]})
    figures = {
        "attacks": len(attacks),
        "attacks_tried": len(tried),
        "attacks_blocked": len([a for a in tried if a not in failed_attacks]),
        "attacks_succeeded": failed_attacks,
        "checks": len(v.rows),
        "checks_failed": len(v.failed()),
        "other_failures": sorted({r["attack"] for r in v.failed() if r["attack"] not in attacks}),
        "duration_s": round(duration_s, 1),
        **getattr(v, "figures", {}),
        "failed_checks": [f"[{r['attack']}] {r['check']}: {r['detail']}" for r in v.failed()],
    }
    print("\nadversarial agent:", json.dumps({k: val for k, val in figures.items() if k != "failed_checks"}, indent=1))
    for row in v.rows:
        print(f"  {'ok  ' if row['ok'] else 'FAIL'} [{row['attack']}] {row['check']}"
              + ("" if row["ok"] else f": {row['detail']}"))
    out = os.environ.get("RLBENCH_FIGURES_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "adversarial.json").write_text(json.dumps(figures, indent=2) + "\n")
