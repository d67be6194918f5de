"""Shared fixtures: a tiny model, a small offline GSM8K split, workspaces and live grading servers."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))
os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1")

from rlbench.grader.app import Grader, GraderConfig  # noqa: E402
from rlbench.grader.checks import fingerprint  # noqa: E402
from rlbench.grader.server import GradingServer, new_secret  # noqa: E402
from rlbench.models import prepare_model  # noqa: E402
from rlbench.tasks.gsm8k import GSM8K  # noqa: E402
from rlbench.workspace import prepare_workspace  # noqa: E402
from support.needs import required_skip  # noqa: E402
from support.settings import EVALUATION, GSM8K_SETTINGS, TEST_SALT, TINY_SPEC  # noqa: E402,F401


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A skip of a test whose need CI installed and requires is a failure (tests/support/needs.py)."""
    outcome = yield
    report = outcome.get_result()
    message = required_skip(item, report)
    if message is not None:
        report.outcome, report.longrepr = "failed", message


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("models") / "tiny"
    prepare_model(TINY_SPEC, out)
    return out


@pytest.fixture(scope="session")
def gsm8k_data(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("data")
    GSM8K().prepare(GSM8K_SETTINGS, root / "train", root / "eval", salt=TEST_SALT)
    return root / "train", root / "eval"


@pytest.fixture
def workspace(tmp_path, tiny_model, gsm8k_data) -> Path:
    ws = tmp_path / "run" / "workspace"
    prepare_workspace(ws, GSM8K(), GSM8K_SETTINGS, tiny_model, TINY_SPEC["hf_id"], gsm8k_data[0])
    return ws


@pytest.fixture
def start_grader(tmp_path, tiny_model, gsm8k_data):
    """Factory: a live grading server over a workspace; stopped at teardown."""
    servers = []

    def start(workspace: Path, timeout_s: float = 600, start_time: float | None = None, gpus: list[str] = ()):
        grader = Grader(
            GraderConfig(
                workspace=workspace,
                grader_dir=workspace.parent / "grader",
                task_settings=GSM8K_SETTINGS,
                eval_dir=gsm8k_data[1],
                baseline_score=0.0,
                baseline_fingerprint=fingerprint(tiny_model),
                start_time=time.time() if start_time is None else start_time,
                timeout_s=timeout_s,
                secret=new_secret(),
                evaluation=EVALUATION,
                gpus=list(gpus),  # a fake CUDA_VISIBLE_DEVICES, as the runner passes it
            )
        )
        server = GradingServer(grader).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="session")
def session_sweep(tmp_path_factory) -> Path:
    """The default tier's one real sweep (support.workflow.session_config): every level on the tiny
    model, GSM8K with the three reference agents, both controls on seed 0. Tests read it; a test that
    changes results works on a copy (support.workflow.copy_sweep)."""
    from support.workflow import make_workdir, planned_jobs, session_config, snakemake

    workdir = make_workdir(tmp_path_factory.mktemp("session-sweep"), session_config())
    plan = planned_jobs(workdir)
    assert plan["run_agent"] == 3 + 5 + 2 and plan["evaluate_baseline"] == 1 + 5 + 1, plan
    snakemake(workdir, "--cores", "2")
    return workdir
