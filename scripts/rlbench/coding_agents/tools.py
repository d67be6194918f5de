"""Where the pinned coding-agent tools live and what they run on.

`rlbench setup-agents` (rlbench.coding_agents.setup) installs each tool under tools_dir(): npm packages in
.tools/npm/<name>-<version>/, pip tools in their own venvs .tools/venvs/<name>-<version>/, the LLM gateway in
.tools/venvs/gateway/. The adapters and the gateway find them here, and check the interpreter a venv needs.
"""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import sys
from pathlib import Path

from rlbench.paths import REPO_ROOT


class SetupError(RuntimeError):
    pass


def tools_dir() -> Path:
    """Where `rlbench setup-agents` installs the pinned tools and the gateway (RLBENCH_TOOLS_DIR, else .tools/)."""
    return Path(os.environ.get("RLBENCH_TOOLS_DIR") or REPO_ROOT / ".tools").resolve()


def install_prefix(tool: dict) -> Path:
    """The directory one pinned tool is installed in: .tools/npm/<name>-<version> or .tools/venvs/<name>-<version>."""
    kind = "npm" if "npm" in tool["install"] else "venvs"
    return tools_dir() / kind / f"{tool['name']}-{tool['version']}"


def gateway_prefix() -> Path:
    return tools_dir() / "venvs" / "gateway"


def find_python(minimum: str | None) -> str:
    """An interpreter of at least `minimum` (e.g. "3.12"): this one, python3.N on PATH, or a pyenv version."""
    if not minimum:
        return sys.executable
    want = tuple(int(x) for x in minimum.split("."))
    if sys.version_info[: len(want)] >= want:
        return sys.executable
    candidates = [shutil.which(f"python3.{minor}") for minor in range(want[1], 20)]
    pyenv_root = os.environ.get("PYENV_ROOT") or str(Path.home() / ".pyenv")
    candidates += sorted(glob.glob(f"{pyenv_root}/versions/3.*/bin/python3"), reverse=True)
    for candidate in filter(None, candidates):
        try:
            out = subprocess.run(
                [candidate, "-c", "import sys, venv; print('%d.%d' % sys.version_info[:2])"],
                capture_output=True,
                text=True,
                timeout=30,
            )
        except (OSError, subprocess.TimeoutExpired):
            continue
        if out.returncode == 0 and tuple(int(x) for x in out.stdout.strip().split(".")) >= want:
            return candidate
    raise SetupError(
        f"no Python >= {minimum} found (looked for python3.{want[1]}+ on PATH and under {pyenv_root}/versions): "
        f"install one (e.g. Debian 13's python3.13 + python3.13-venv, or `pyenv install {minimum}`) and rerun"
    )
