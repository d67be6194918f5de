"""The GPU check (tests/gpu/check.py) kept from rotting without a GPU: its dry run on the CPU with the tiny
model, its wheel list against the project's environment, its committed GSM8K rows against the task's
offline source, its memory-release verdict on made-up readings, and (slow tier, needs the package
registry) the wheels it names fetched and installed into an empty target directory, and its dry run on
a bare machine's packages plus those wheels, as on the GPU machine."""

from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GPU = REPO / "tests" / "gpu"
CHECKS = [
    "model", "hf_eval", "memory_release", "gpu_locks", "prefix_cache_bfloat16", "prefix_cache_float32", "trl_sft",
    "trl_grpo",
]
# What the GPU machine has: these and what they require.
PREINSTALLED = ["torch", "transformers", "accelerate", "peft", "safetensors"]
# What the check imports beyond them: TRL (and its datasets stack), jsonschema (rlbench.config), requests.
NEEDED = ["trl", "jsonschema", "requests"]
# Installed without their requirements and never imported: opencompass, for the GSM8K protocol's config file.
DATA_ONLY = {"opencompass"}
# Older than the environment's, to fit the carry (wheels.txt says why); the slow test runs the dry check on them.
OLDER_FOR_THE_CARRY = {"datasets": "4.7.0", "pyarrow": "21.0.0"}
CARRY_LIMIT = 64 * 2**20  # the GPU machine's carry: the working tree and the wheels together


def listed() -> dict[str, str]:
    pins = {}
    for line in (GPU / "wheels.txt").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.strip()] = version.strip()
    return pins


def requirements(dist: str) -> list[str]:
    """dist's unconditional requirements on Linux, CPython 3.12 (names, normalised)."""
    names = []
    for requirement in metadata.requires(dist) or []:
        marker = requirement.split(";", 1)[1] if ";" in requirement else ""
        if "extra ==" in marker or re.search(r"sys_platform\s*==\s*['\"](win32|darwin)", marker):
            continue
        if re.search(r"python_version\s*<\s*['\"]3\.(\d+)", marker):
            continue  # backports for older Pythons
        names.append(re.split(r"[\s;<>=!~\[(]", requirement.strip())[0].lower().replace("_", "-"))
    return names


def closure(roots: list[str]) -> set[str]:
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            todo += requirements(name)
        except metadata.PackageNotFoundError:
            pass  # a requirement for another platform (colorama on Windows)
    return seen


def test_the_dry_run_passes_every_check_on_the_cpu(tmp_path):
    out = tmp_path / "rows.json"
    done = subprocess.run(
        [sys.executable, str(GPU / "check.py"), "--dry", "--work", str(tmp_path / "work"), "--json", str(out)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {row["check"]: row for row in report["rows"]}
    assert list(rows) == CHECKS and report["device"] == "cpu" and report["gpus"] == []
    assert all(row["result"] == "ok" for name, row in rows.items() if name != "memory_release"), rows
    assert rows["memory_release"]["result"] == "skipped"  # no device memory on the CPU
    assert "serialised expected" in rows["gpu_locks"]["figure"]  # no GPU: one lock, both take turns
    assert rows["prefix_cache_float32"]["figure"].startswith("6/6 identical")
    # The printed table: a header and one row per check.
    table = [line for line in done.stdout.splitlines() if line.split(" ")[0] in ["check", *CHECKS]]
    assert len(table) == 1 + len(CHECKS)


def test_the_wheel_list_is_what_the_check_needs_at_the_environments_versions():
    pins = listed()
    # Pinned to the project's environment, but for the two the carry needs older.
    assert {name: OLDER_FOR_THE_CARRY.get(name) or metadata.version(name) for name in pins} == pins
    # Exactly what the needed packages require beyond the GPU machine's own packages, and the data-only ones.
    assert set(pins) == (closure(NEEDED) - closure(PREINSTALLED)) | DATA_ONLY


def load_check():
    spec = importlib.util.spec_from_file_location("gpu_check", GPU / "check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_committed_rows_are_what_the_offline_source_draws():
    """reasoning_gym, which draws GSM8K's offline rows, is too large to carry: the check's rows are
    committed, and must stay what the task's offline source draws with the check's settings."""
    check = load_check()
    committed = json.loads(check.ROWS.read_text())
    assert [len(committed["train"]), len(committed["eval"])] == [16, 8]
    assert committed == check.draw_rows(), "the task's offline rows changed: run tests/gpu/check.py --write-rows"


class FakeDevice:
    """One GPU whose memory readings (MiB in use) come from a list; 500 at the start."""

    gpus = ["0"]

    def __init__(self, readings: list[int]):
        self.readings, self.baseline = list(readings), {"0": 500}

    def used_mib(self, gpu):
        return self.readings.pop(0)


class FakePool:
    def __init__(self, pids: list, ready: list[bool]):
        self.pids, self.ready, self.evaluated = list(pids), list(ready), 0

    def prestart(self, gpu=None):
        pass

    def wait_ready(self, gpu=None, timeout=None):
        return self.ready.pop(0)

    def worker_pid(self, gpu=None):
        return self.pids.pop(0)

    def evaluate(self, *args, **kwargs):
        self.evaluated += 1
        return {}


@pytest.mark.parametrize(
    "readings, pids, ready, verdict",
    [
        ([1000, 510], [11, 12], [True, True], "ok"),  # warm worker seen (+500), back to the start after idling
        ([1000, 1000], [11, 12], [True, True], "FAIL"),  # the new worker took a CUDA context: memory not back
        ([510, 510], [11, 12], [True, True], "FAIL"),  # the warm worker was never seen: the readings prove nothing
        ([1000, 510], [11, 11], [True, True], "FAIL"),  # the worker was not replaced
        ([1000, 510], [11, None], [True, False], "FAIL"),  # no new worker came up (was: replaced, since None != 11)
        ([], [], [False], "FAIL"),  # the first worker never got ready (was: a 600 s wait, then on regardless)
    ],
)
def test_memory_release_fails_unless_the_memory_comes_back_to_the_start(readings, pids, ready, verdict, monkeypatch):
    check = load_check()
    monkeypatch.setattr(check, "evaluate", lambda pool, *a: pool.evaluate())
    monkeypatch.setattr(check.time, "sleep", lambda seconds: None)
    result, figure = check.check_memory_release(FakeDevice(readings), FakePool(pids, ready), None, None, None)
    assert result == verdict, figure


@pytest.mark.slow
def test_the_wheels_fetch_and_install_into_an_empty_target(tmp_path):
    probe = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d",
         str(tmp_path / "probe"), f"attrs=={listed()['attrs']}"],
        capture_output=True, text=True, timeout=120,
    )
    if probe.returncode != 0:
        pytest.skip(f"the package registry is unreachable from here: {probe.stderr.strip()[-300:]}")
    wheels, target = tmp_path / "wheels", tmp_path / "site"
    fetched = subprocess.run(
        ["sh", str(GPU / "fetch_wheels.sh"), str(wheels)], capture_output=True, text=True, timeout=600,
        env={"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHON": sys.executable},
    )
    assert fetched.returncode == 0, fetched.stderr[-3000:]
    assert len(list(wheels.glob("*.whl"))) == len(listed())
    target.mkdir()
    installed = subprocess.run(
        # As on the GPU machine (tests/gpu/check.py's command); here for CPython 3.12 whatever runs the test.
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--find-links", str(wheels),
         "--target", str(target), "-r", str(GPU / "wheels.txt"), "--only-binary=:all:", "--python-version", "3.12",
         "--implementation", "cp", "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
         "--platform", "manylinux_2_28_x86_64"],
        capture_output=True, text=True, timeout=600,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    found = {p.name.split("-")[0].lower().replace("_", "-") for p in target.glob("*.dist-info")}
    assert found == set(listed())
    # opencompass's wheel, cut down to the GSM8K protocol's config file: that file byte for byte.
    from rlbench.tasks.gsm8k import OPENCOMPASS_CONFIG

    environment = Path(metadata.distribution("opencompass").locate_file("opencompass")) / OPENCOMPASS_CONFIG
    assert (target / "opencompass" / OPENCOMPASS_CONFIG).read_bytes() == environment.read_bytes()
    assert next(wheels.glob("opencompass-*.whl")).stat().st_size < 2**16
    # The wheels and the working tree fit one carry to the GPU machine.
    tree = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    tracked = sum((REPO / name).stat().st_size for name in tree.decode().split("\0") if name and (REPO / name).is_file())
    carried = tracked + sum(p.stat().st_size for p in wheels.glob("*.whl"))
    assert carried <= CARRY_LIMIT, f"{carried / 2**20:.1f} MiB to carry (limit {CARRY_LIMIT / 2**20:.0f} MiB)"


def link_distributions(names: set[str], site: Path) -> None:
    """Make the installed distributions `names` (and their metadata) importable from `site`, by links."""
    for dist in metadata.distributions():
        if dist.metadata["Name"].lower().replace("_", "-") not in names:
            continue
        base = Path(dist.locate_file(""))
        for top in {Path(f).parts[0] for f in dist.files or [] if Path(f).parts[0] not in ("..", "__pycache__")}:
            if (base / top).exists() and not (site / top).exists():
                (site / top).symlink_to(base / top)


@pytest.mark.slow
def test_the_dry_run_passes_on_a_bare_machines_packages_and_the_wheels(tmp_path):
    """As on the GPU machine: a Python with torch, transformers, accelerate, peft and safetensors (and
    what they require) and nothing else, the wheel list installed with --no-index --no-deps into a
    target named site-packages, the check run from the repository. Every check passes (memory_release
    is skipped on the CPU), on the wheel list's older datasets and pyarrow."""
    wheels, target = tmp_path / "wheels", tmp_path / "rlbench" / "site-packages"
    fetched = subprocess.run(  # for this interpreter, which runs the check here
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", str(wheels),
         "-r", str(GPU / "wheels.txt")],
        capture_output=True, text=True, timeout=600,
    )
    if fetched.returncode != 0:
        pytest.skip(f"the package registry is unreachable from here: {fetched.stderr.strip()[-300:]}")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--find-links", str(wheels),
         "--target", str(target), "-r", str(GPU / "wheels.txt")],
        capture_output=True, text=True, timeout=600,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    bare = tmp_path / "bare"
    subprocess.run([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", str(bare)],
                   check=True, timeout=120)
    python = bare / "bin" / "python"
    site = Path(subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    link_distributions(closure(PREINSTALLED), site)
    env = {**os.environ, "PYTHONPATH": str(target)}
    probe = ("import importlib.util as u, datasets, pyarrow, trl; "
             "print(datasets.__version__, pyarrow.__version__, u.find_spec('reasoning_gym') is None)")
    versions = subprocess.run([str(python), "-c", probe], env=env, capture_output=True, text=True, timeout=300)
    assert versions.returncode == 0, versions.stderr[-3000:]
    # The bare machine's versions, and no reasoning_gym (the offline GSM8K source): the rows come committed.
    assert versions.stdout.split() == [*OLDER_FOR_THE_CARRY.values(), "True"]
    out = tmp_path / "rows.json"
    done = subprocess.run(
        [str(python), str(GPU / "check.py"), "--dry", "--work", str(tmp_path / "work"), "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    report = json.loads(out.read_text())
    rows = {row["check"]: row["result"] for row in report["rows"]}
    assert rows == {name: "skipped" if name == "memory_release" else "ok" for name in CHECKS}, report["rows"]
    assert report["versions"]["datasets"] == OLDER_FOR_THE_CARRY["datasets"]
