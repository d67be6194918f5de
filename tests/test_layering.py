"""The library's import contract (docs/architecture.md): one-way layers, no cycles, no private names
imported across modules, reference agents independent of the library. Each check is shown to fail on a
violation planted in a copy of the library."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from support.layering import problems

REPO = Path(__file__).resolve().parents[1]
LIBRARY = REPO / "scripts" / "rlbench"
AGENTS = REPO / "scripts" / "agents"


def test_the_library_keeps_its_import_contract():
    assert problems(LIBRARY, AGENTS) == []


@pytest.fixture
def library(tmp_path) -> Path:
    """A copy of the library's Python files, to plant violations in."""
    copy = tmp_path / "rlbench"
    shutil.copytree(LIBRARY, copy, ignore=lambda d, names: [n for n in names if n == "__pycache__" or (
        not n.endswith(".py") and not (Path(d) / n).is_dir())])
    return copy


def plant(library: Path, rel: str, text: str) -> None:
    path = library / rel
    path.write_text((path.read_text() if path.exists() else "") + "\n" + text + "\n")


def test_the_copy_is_clean(library):
    assert problems(library) == []


def test_an_import_against_the_layers_fails(library):
    plant(library, "fileio/jsonio.py", "def later():\n    from rlbench.grader.grading import Grader")
    found = problems(library)
    assert any("rlbench.fileio.jsonio imports rlbench.grader.grading: fileio does not build on grader" in p for p in found), found


def test_an_import_beside_the_layers_fails(library):
    # coding_agents and grader sit side by side: neither builds on the other.
    plant(library, "coding_agents/tools.py", "from rlbench.grader.submission import shown")
    found = problems(library)
    assert any("coding_agents does not build on grader" in p for p in found), found


def test_an_import_cycle_inside_a_unit_fails(library):
    plant(library, "fileio/jsonio.py", "from rlbench.fileio import nofollow")
    plant(library, "fileio/nofollow.py", "from rlbench.fileio.jsonio import read_json")
    found = problems(library)
    assert any(p.startswith("import cycle:") and "rlbench.fileio.jsonio" in p and "rlbench.fileio.nofollow" in p
               for p in found), found


def test_a_cycle_between_sibling_packages_fails(library):
    plant(library, "coding_agents/gateway/recorder.py", "from rlbench.coding_agents.adapters import claude_code")
    plant(library, "coding_agents/adapters/claude_code.py", "from rlbench.coding_agents.gateway import recorder")
    found = problems(library)
    assert any("import cycle: rlbench.coding_agents.adapters -> rlbench.coding_agents.gateway" in p for p in found), found


def test_a_private_name_from_another_module_fails(library):
    plant(library, "grader/server.py", "from rlbench.evaluation.request import _TYPE_NAME")
    plant(library, "grader/http.py", "from rlbench.evaluation import request\nPATTERN = request._TYPE_NAME")
    found = [p for p in problems(library) if "_TYPE_NAME" in p]
    assert len(found) == 2, found


def test_a_stated_layer_cycle_and_a_missing_statement_fail(library):
    init = library / "proc" / "__init__.py"
    init.write_text(init.read_text().replace("Builds on: nothing in the library.", "Builds on: agent_run."))
    (library / "sandbox" / "__init__.py").write_text('"""No statement."""\n')
    found = problems(library)
    assert any(p.startswith("the stated layers form a cycle:") and "proc" in p for p in found), found
    assert any("sandbox/__init__.py: its docstring states no `Builds on:` line" in p for p in found), found


def test_a_reference_agent_importing_the_library_fails(library, tmp_path):
    agents = tmp_path / "agents"
    agents.mkdir()
    (agents / "sneaky_agent.py").write_text("from rlbench.tasks import get_task\n")
    found = problems(library, agents)
    assert any("sneaky_agent.py: the reference agent imports rlbench.tasks" in p for p in found), found
