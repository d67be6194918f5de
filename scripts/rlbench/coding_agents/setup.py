"""`rlbench setup-agents`: install the pinned coding-agent tools and the LLM gateway under .tools/.

Each registry entry of kind `cli` names its tool, pinned version and install recipe (an npm package spec, or
pip requirements with a minimum Python). Tools go to .tools/npm/<tool>-<version>/ (npm --prefix) or
.tools/venvs/<tool>-<version>/ (a venv of their own, so that their dependency pins never meet the harness's);
the LLM gateway (LiteLLM proxy) to .tools/venvs/gateway/. RLBENCH_TOOLS_DIR moves the whole tree. An install
is redone only when its recipe changed or it did not finish (the `.installed` marker holds the recipe).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rlbench.coding_agents.tools import SetupError, find_python, gateway_prefix, install_prefix

# The gateway's pin (../shared/GATEWAY.md: 1.108.7 is what `litellm[proxy]` resolves to from the registries
# here; later versions' [proxy] extras need companion packages the index lacks).
GATEWAY_REQUIREMENTS = ["litellm[proxy]==1.108.7"]
MARKER = ".installed"


def say(line: str) -> None:
    """One whole line (installs run in threads: their lines must not interleave)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _done(prefix: Path, recipe: dict) -> bool:
    try:
        return json.loads((prefix / MARKER).read_text()) == recipe
    except (OSError, ValueError):
        return False


def _run(argv: list[str], what: str) -> None:
    say(f"  $ {' '.join(argv)}")
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr).strip()[-2000:]
        raise SetupError(f"installing {what} failed (exit {done.returncode}):\n{tail}")


def install_venv(prefix: Path, requirements: list[str], python: str, what: str) -> None:
    recipe = {"pip": requirements, "python": python}
    if _done(prefix, recipe):
        say(f"{what}: already installed in {prefix}")
        return
    say(f"{what}: installing into {prefix}")
    shutil.rmtree(prefix, ignore_errors=True)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    _run([python, "-m", "venv", str(prefix)], what)
    _run([str(prefix / "bin" / "python"), "-m", "pip", "install", "--quiet", *requirements], what)
    (prefix / MARKER).write_text(json.dumps(recipe))


def install_npm(prefix: Path, package: str, what: str) -> None:
    recipe = {"npm": package}
    if _done(prefix, recipe):
        say(f"{what}: already installed in {prefix}")
        return
    npm = shutil.which("npm")
    if npm is None:
        raise SetupError(f"{what} needs npm (and Node.js >= 20): install the nodejs and npm packages")
    say(f"{what}: installing into {prefix}")
    shutil.rmtree(prefix, ignore_errors=True)
    prefix.mkdir(parents=True, exist_ok=True)
    _run([npm, "install", "--no-audit", "--no-fund", "--silent", "--prefix", str(prefix), package], what)
    (prefix / MARKER).write_text(json.dumps(recipe))


def install_tool(agent: dict) -> None:
    tool = agent["tool"]
    what = f"{tool['name']} {tool['version']}"
    recipe = tool["install"]
    if "npm" in recipe:
        install_npm(install_prefix(tool), recipe["npm"], what)
    else:
        install_venv(install_prefix(tool), list(recipe["pip"]), find_python(recipe.get("python")), what)


def setup_agents(
    agents: dict[str, dict], names: list[str] | None = None, gateway: bool = True, jobs: int = 3
) -> list[str]:
    """Install the tools of the named cli agents (all when names is empty) and the gateway, `jobs` at a time (the
    installs mostly wait on downloads and unpacking); returns the failures, one message each."""
    chosen = [a for a in agents.values() if a.get("kind") == "cli"]
    if names:
        unknown = [n for n in names if n not in agents]
        if unknown:
            raise SetupError(f"unknown agent(s) {', '.join(unknown)}; known: {', '.join(sorted(agents))}")
        chosen = [agents[n] for n in names if agents[n].get("kind") == "cli"]
    tasks = []
    if gateway:
        tasks.append(lambda: install_venv(gateway_prefix(), GATEWAY_REQUIREMENTS, sys.executable, "LLM gateway (LiteLLM proxy)"))
    seen = set()
    for agent in chosen:
        key = (agent["tool"]["name"], agent["tool"]["version"])
        if key not in seen:
            seen.add(key)
            tasks.append(lambda agent=agent: install_tool(agent))
    failures = []
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        for future in [pool.submit(task) for task in tasks]:
            try:  # one tool failing does not stop the others
                future.result()
            except SetupError as error:
                failures.append(str(error))
            except OSError as error:  # a full disk, a permission problem: say which, go on with the others
                failures.append(f"{type(error).__name__}: {error}")
    return failures
