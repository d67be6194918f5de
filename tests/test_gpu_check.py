"""The GPU check (tests/gpu/check.py) kept from rotting without a GPU: its dry run on the CPU with the tiny
model, its wheel list against the project's environment, and (slow tier, needs the package registry) the
wheels it names fetched and installed into an empty target directory, as on the GPU machine."""

from __future__ import annotations

import importlib.metadata as metadata
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
    # Exactly what the needed packages require beyond the GPU machine's own packages.
    assert set(pins) == closure(NEEDED) - closure(PREINSTALLED)


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
    # The wheels and the working tree fit one carry to the GPU machine.
    tree = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    tracked = sum((REPO / name).stat().st_size for name in tree.decode().split("\0") if name and (REPO / name).is_file())
    carried = tracked + sum(p.stat().st_size for p in wheels.glob("*.whl"))
    assert carried <= CARRY_LIMIT, f"{carried / 2**20:.1f} MiB to carry (limit {CARRY_LIMIT / 2**20:.0f} MiB)"


@pytest.mark.slow
def test_the_dry_run_passes_on_the_older_datasets_and_pyarrow_of_the_wheel_list(tmp_path):
    """The GPU machine gets datasets and pyarrow older than the environment's: the checks pass on them
    (wheels for this interpreter, ahead of the environment's packages on the path)."""
    wheels, site = tmp_path / "wheels", tmp_path / "site"
    pins = [f"{name}=={version}" for name, version in OLDER_FOR_THE_CARRY.items()]
    fetched = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:", "-d", str(wheels), *pins],
        capture_output=True, text=True, timeout=600,
    )
    if fetched.returncode != 0:
        pytest.skip(f"the package registry is unreachable from here: {fetched.stderr.strip()[-300:]}")
    installed = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps", "--find-links", str(wheels),
         "--target", str(site), *pins],
        capture_output=True, text=True, timeout=600,
    )
    assert installed.returncode == 0, installed.stderr[-3000:]
    out = tmp_path / "rows.json"
    probe = "import datasets, pyarrow; print(datasets.__version__, pyarrow.__version__)"
    env = {**os.environ, "PYTHONPATH": str(site)}
    versions = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert versions.stdout.split() == list(OLDER_FOR_THE_CARRY.values())
    done = subprocess.run(  # the checks that load data through datasets and pyarrow (the default tier runs all)
        [sys.executable, str(GPU / "check.py"), "--dry", "--only", "hf_eval,trl_sft,trl_grpo", "--work", str(tmp_path / "work"),
         "--json", str(out)],
        env=env, capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    rows = {row["check"]: row["result"] for row in json.loads(out.read_text())["rows"]}
    assert rows == {"model": "ok", "hf_eval": "ok", "trl_sft": "ok", "trl_grpo": "ok"}, rows
