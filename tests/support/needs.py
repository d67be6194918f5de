"""What a test needs from the machine, and what CI requires of it.

A test marked `sandbox`, `browser`, `tools`, `cluster` or `reflink` (pyproject.toml) skips, saying what to
install, where its need is missing. Where the environment variable below is set (CI sets each one
once it has installed that need), such a skip is a failure instead: a test that CI's installs
enable can never pass unseen as skipped.
"""

from __future__ import annotations

import os

import pytest

REQUIRED_BY = {
    "sandbox": "RLBENCH_REQUIRE_SANDBOX",
    "browser": "RLBENCH_REQUIRE_CHROMIUM",
    "tools": "RLBENCH_REQUIRE_TOOLS",
    "cluster": "RLBENCH_REQUIRE_SLURM",
    "reflink": "RLBENCH_REQUIRE_REFLINK",
}


def required(need: str) -> bool:
    return bool(os.environ.get(REQUIRED_BY[need]))


def unavailable(need: str, reason: str) -> None:
    """Skip for want of `need` (fail where CI requires it)."""
    if required(need):
        pytest.fail(f"{REQUIRED_BY[need]} is set, but {reason}")
    pytest.skip(reason)


def required_skip(item: pytest.Item, report: pytest.TestReport) -> str | None:
    """The failure message for a skip of a test whose need is required here, or None."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return None
    for need, variable in REQUIRED_BY.items():
        if item.get_closest_marker(need) is not None and required(need):
            longrepr = report.longrepr
            reason = longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else str(longrepr)
            return f"{variable} is set, but this {need} test was skipped: {reason}"
    return None
