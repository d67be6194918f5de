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
if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs as many pytest-xdist workers as cores, and the background sweeps' jobs and the
    # graders the tests start share those cores too: one OpenMP thread per process, and threads that
    # sleep while they wait instead of spinning (torch's libgomp spins by default, burning the cores
    # the other processes need). Set before torch is loaded, inherited by every process a test starts;
    # a value set by the caller wins. On 2 cores the default tier took 12 min 53 s without them, 11 min
    # 19 s with the wait policy alone, 10 min 39 s with both.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from rlbench.grader.grading import Grader, GraderConfig  # noqa: E402
from rlbench.grader.fingerprint import fingerprint  # noqa: E402
from rlbench.grader.server import GradingServer, new_secret  # noqa: E402
from rlbench.models.materialise import prepare_model  # noqa: E402
from rlbench.tasks.gsm8k import GSM8K  # noqa: E402
from rlbench.evaluation.workers import WorkerPool  # noqa: E402
from rlbench.agent_run.workspace import prepare_workspace  # noqa: E402
from support.models import base_resources  # noqa: E402
from support.needs import required_skip  # noqa: E402
from support.settings import EVALUATION, GSM8K_SETTINGS, TEST_SALT, TINY_SPEC  # noqa: E402,F401
from support.workflow import default_config as read_default_config  # noqa: E402
from rlbench.config import Registries  # noqa: E402


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


@pytest.fixture(scope="session")
def evaluation_workers(tmp_path_factory):
    """One warm evaluation worker shared by the graders of the tests that are not about the workers:
    a pool per grader would pay a fresh torch import in each of them."""
    pool = WorkerPool.from_settings(tmp_path_factory.mktemp("workers"), {})
    yield pool
    pool.close()


@pytest.fixture
def start_grader(tmp_path, tiny_model, gsm8k_data, evaluation_workers):
    """Factory: a live grading server over a workspace; stopped at teardown. Its evaluations run in the
    session's shared worker unless own_workers (tests of the workers themselves, or that kill them)."""
    servers = []

    def start(
        workspace: Path,
        timeout_s: float = 600,
        start_time: float | None = None,
        gpus: list[str] = (),
        own_workers: bool = False,
        **config,
    ):
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
                resources=base_resources(tiny_model),
                **config,  # any other GraderConfig field
            ),
            workers=None if own_workers else evaluation_workers,
        )
        server = GradingServer(grader).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


# Sweeps that run in the background from the session's start while other tests run (the default tier
# leaves a core idle much of the time); a test reads one through the fixture of the same name, which
# waits for it. They run one after another: the slow tier's control sweep carries the session sweep
# on to seeds 1 and 2, so it starts once that one is done.
BACKGROUND_SWEEPS = ("session_sweep", "controls_sweep", "smollm2_gsm8k_sweep")


def background_sweeps_read(item: pytest.Item) -> set[str]:
    return set(BACKGROUND_SWEEPS) & set(getattr(item, "fixturenames", ()))


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's, which reads the xdist_group marks added here
def pytest_collection_modifyitems(session, config, items):
    """Tests that read a background sweep run last, in their own order: first those of the session
    sweep, then those of the slow tier's sweeps, so that the others fill the cores meanwhile.

    Under pytest-xdist (`make test` runs `-n 2 --dist loadgroup`), a test that uses a module- or
    class-scoped fixture goes with the other tests of its module that use one, to the same worker, so
    that such a fixture (a split of generated games, a grader) is built once, not once per worker."""
    def group(item: pytest.Item) -> int:
        read = background_sweeps_read(item)
        return 2 if read - {"session_sweep"} else 1 if read else 0

    items.sort(key=group)
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        definitions = getattr(item, "_fixtureinfo", None)
        scopes = {d.scope for defs in (definitions.name2fixturedefs.values() if definitions else ()) for d in defs}
        if scopes & {"module", "class", "package"}:
            # A sweep's readers apart from the module's others: they run last (the order above).
            suffix = " (after the sweeps)" if group(item) else ""
            item.add_marker(pytest.mark.xdist_group(item.module.__name__ + suffix))


def shared_temp(tmp_path_factory) -> Path:
    """The session's temporary directory that every pytest-xdist worker of the session sees (each has
    its own basetemp under it); the basetemp itself without xdist."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


INTERRUPTED = []  # set by pytest_keyboard_interrupt: the owner of the sweeps stops them at once


def pytest_keyboard_interrupt(excinfo):
    INTERRUPTED.append(True)


@pytest.fixture(scope="session", autouse=True)
def background_sweeps(request, tmp_path_factory):
    """Starts, as the session starts, each background sweep a selected test reads; stops them (their
    whole process groups) at the session's end. Under pytest-xdist one worker runs them (the first to
    claim them) and the others read their outcome (support.workflow.SharedSweep); that worker, at its
    end, waits for them to end before it stops them, since the tests reading them may be on another."""
    from support.workflow import (
        CONTROL_TASK,
        CONTROLS_PLAN,
        SESSION_PLAN,
        BackgroundSweep,
        SharedSweep,
        control_config,
        copy_sweep,
        make_workdir,
        session_config,
        smollm2_gsm8k_config,
    )

    read = set().union(*(background_sweeps_read(item) for item in request.session.items))
    # The session's base temporary directory, made here, before any sweep's thread asks for one: pytest creates
    # it on first use, and a thread racing the first test's tmp_path for it fails its mktemp ("is not a
    # normalized and relative path", seen on a fresh clone).
    shared = shared_temp(tmp_path_factory)
    names = [name for name in BACKGROUND_SWEEPS if name in read or (name == "session_sweep" and "controls_sweep" in read)]
    if not names:
        yield {}
        return
    try:
        os.close(os.open(shared / "background-sweeps.owner", os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:  # another worker of this session runs them
        yield {name: SharedSweep(name.replace("_", " "), shared / f"{name}.json") for name in names}
        return

    sweeps: dict[str, BackgroundSweep] = {}
    if "session_sweep" in names:
        sweeps["session_sweep"] = BackgroundSweep(
            "session sweep",
            lambda: make_workdir(tmp_path_factory.mktemp("session-sweep"), session_config()),
            SESSION_PLAN,
            # The tests in front come first; the sweep takes what they leave (it has minutes to spare
            # before its readers, and its timed agent runs have budgets far above their needs).
            nice=5,
            record=shared / "session_sweep.json",
        )
    if "controls_sweep" in names:
        session = sweeps["session_sweep"]
        sweeps["controls_sweep"] = BackgroundSweep(
            "control sweep",
            lambda: copy_sweep(session.result(), tmp_path_factory.mktemp("controls") / "sweep", [CONTROL_TASK], control_config()),
            CONTROLS_PLAN,
            after=session,
            record=shared / "controls_sweep.json",
        )
    if "smollm2_gsm8k_sweep" in names:
        # After the others: one background sweep at a time, so that the controls' agents keep their pace.
        sweeps["smollm2_gsm8k_sweep"] = BackgroundSweep(
            "SmolLM2 GSM8K sweep",
            lambda: make_workdir(tmp_path_factory.mktemp("smollm2-gsm8k"), smollm2_gsm8k_config()),
            {"run_agent": 1},
            after=list(sweeps.values())[-1] if sweeps else None,
            record=shared / "smollm2_gsm8k_sweep.json",
        )
    try:
        yield sweeps
    finally:
        if os.environ.get("PYTEST_XDIST_WORKER"):
            for sweep in sweeps.values():
                while not INTERRUPTED and not sweep.record.exists() and time.time() < sweep.deadline:
                    time.sleep(1)
        for sweep in sweeps.values():
            sweep.stop()


@pytest.fixture(scope="session")
def session_sweep(background_sweeps) -> Path:
    """The default tier's one real sweep: every level on the tiny model, GSM8K with copy and grpo, both
    controls on seed 0. Tests read it; a test that changes results works on a copy
    (support.workflow.copy_sweep)."""
    return background_sweeps["session_sweep"].result()


@pytest.fixture(scope="session")
def controls_sweep(session_sweep, background_sweeps) -> Path:
    """The slow tier's controls on three seeds: the session sweep's seed 0 carried on to seeds 1 and 2."""
    return background_sweeps["controls_sweep"].result()


@pytest.fixture(scope="session")
def smollm2_gsm8k_sweep(background_sweeps) -> Path:
    """The slow tier's real small model sweep (support.workflow.smollm2_gsm8k_config)."""
    return background_sweeps["smollm2_gsm8k_sweep"].result()


@pytest.fixture(scope="session")
def registries() -> Registries:
    """The checkout's task, model and agent registries (config/)."""
    return Registries.load()


@pytest.fixture
def default_config() -> dict:
    """The embedded default sweep's config (config/config.yaml), a fresh copy per test."""
    return read_default_config()

