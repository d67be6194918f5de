"""Write a run's page (reports/run.html) and tell whether it is older than the records it shows.

`rlbench view` builds a page that is missing or stale before opening it; the workflow's run_page rule
writes it as a rule output (rebuilt by `make report`).
"""

from __future__ import annotations

from pathlib import Path

from rlbench.explorer.data import page_data
from rlbench.explorer.render import write_page
from rlbench.paths import RUN_PAGE

#: The records a page is built from (relative to the run directory); code.git changes with the ledger.
SOURCES = (
    "run.json", "workspace.json", "final.json", "summary.json", "summary.jsonl", "integrity.json",
    "grader/ledger.jsonl", "resources.jsonl", "gateway/transcript.jsonl", "gateway/usage.jsonl",
    "workspace/agent.log",
)  # fmt: skip


def page_path(run_dir: Path) -> Path:
    return Path(run_dir) / RUN_PAGE


def is_run_dir(path: Path) -> bool:
    """A directory holding a run's record (its run.json or its grader's ledger)."""
    path = Path(path)
    return (path / "run.json").is_file() or (path / "grader" / "ledger.jsonl").is_file()


def _renderer_mtime() -> int:
    """When the code that builds a page (this package: its modules and assets) last changed."""
    package = Path(__file__).parent
    return max(path.stat().st_mtime_ns for path in [*package.glob("*.py"), *package.glob("assets/*")])


def is_stale(run_dir: Path, page: Path | None = None) -> bool:
    """The page is missing, or older than one of the records it shows or than the code that builds it."""
    page = page or page_path(run_dir)
    try:
        built = page.stat().st_mtime_ns
    except OSError:
        return True
    if _renderer_mtime() > built:
        return True
    for name in SOURCES:
        try:
            if (Path(run_dir) / name).stat().st_mtime_ns > built:
                return True
        except OSError:
            continue
    return False


def build_page(run_dir: Path, page: Path | None = None) -> Path:
    """Write the run's page (default: <run_dir>/reports/run.html) from its records; returns its path."""
    run_dir = Path(run_dir)
    if not is_run_dir(run_dir):
        raise FileNotFoundError(f"{run_dir} is not a run's directory (no run.json, no grader/ledger.jsonl)")
    return write_page(page or page_path(run_dir), page_data(run_dir))
