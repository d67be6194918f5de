"""The sandbox's root is an allow-list, and the agent runs as an unprivileged uid (issue 26, items 2 and 3).

Before, the agent saw the whole host read-only, minus a deny-list of masks, as uid 0: /etc/shadow, /etc/ssh,
another checkout of the project, a hub task's data outside the home (ALFWorld's held-out valid_unseen games)
were readable, and Unix sockets under /run deeper than four levels, under /srv, or made after the agent
started answered. Through the real runner in the real sandbox; the canaries live outside every allow-listed
directory.
"""

from __future__ import annotations

import shutil
import socket
import tempfile
import threading
from pathlib import Path

import pytest

from rlbench.agent_run.runner import run_agent
from rlbench.sandbox.bubblewrap import AGENT_UID, bubblewrap_available, user_namespace_available
from support.runs import spec_for

BWRAP_OK, BWRAP_WHY = bubblewrap_available()
pytestmark = [pytest.mark.sandbox, pytest.mark.skipif(not BWRAP_OK, reason=f"bubblewrap cannot run here: {BWRAP_WHY}")]
CANARY = "host-canary-5d1e"


def read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def scratch(base: str) -> Path | None:
    """A fresh directory under `base` (a host directory outside the allow-list), or None if it cannot be made."""
    try:
        Path(base).mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix="rlbench-test-", dir=base))
    except OSError:
        return None


@pytest.fixture
def outside():
    """Scratch directories outside the allow-list: under /var/tmp, /srv and /run (as many as can be made)."""
    made = {base: scratch(base) for base in ("/var/tmp", "/srv", "/run")}
    if made["/var/tmp"] is None:
        pytest.skip("/var/tmp is not writable here")
    yield made
    for path in made.values():
        if path is not None:
            shutil.rmtree(path, ignore_errors=True)


def test_only_the_allow_list_is_visible_and_the_agent_is_unprivileged(workspace, tiny_model, gsm8k_data, outside):
    checkout = outside["/var/tmp"] / "other-checkout"  # another checkout of the project, its metadata and config
    (checkout / ".snakemake" / "metadata").mkdir(parents=True)
    (checkout / "config").mkdir()
    (checkout / "config" / "config.yaml").write_text(CANARY)
    hub = outside["/var/tmp"] / "alfworld-data" / "json_2.1.1" / "valid_unseen"  # a hub.path outside the home
    hub.mkdir(parents=True)
    (hub / "game.tw-pddl").write_text(CANARY)
    script = (
        f"cat /etc/shadow {checkout}/config/config.yaml {hub}/game.tw-pddl > code/stolen.txt 2>&1; "
        f"ls -A /etc/ssh {checkout} {hub} /root /home /srv /run > code/ls.txt 2>&1; "
        "id -u > code/uid.txt; id -un > code/user.txt 2>&1; ls / > code/root.txt; "
        "python3 -c 'import transformers' && echo libs-ok > code/libs.txt"
    )
    record = run_agent(spec_for(workspace, tiny_model, gsm8k_data, ["bash", "-c", script], sandbox_backend="bubblewrap"))
    code = workspace / "code"
    assert record.sandbox == "bubblewrap" and record.status == "completed", read(workspace / "agent.log")
    seen = read(code / "stolen.txt") + read(code / "ls.txt")
    assert CANARY not in seen and ".snakemake" not in seen and "config.yaml" not in read(code / "ls.txt"), seen
    assert read(code / "stolen.txt").count("No such file") == 3, read(code / "stolen.txt")
    assert read(code / "libs.txt").strip() == "libs-ok"  # the interpreter and its packages are there
    listed = set(read(code / "root.txt").split())
    # Only what the allow-list and the interpreter's prefixes bring (/root/.pyenv, say), and the masks' empty folders.
    assert not listed & {"home", "srv", "run", "opt", "mnt", "media", "boot"}, listed
    if user_namespace_available()[0]:
        assert read(code / "uid.txt").strip() == str(AGENT_UID)
        assert read(code / "user.txt").strip() == "agent"
    else:
        assert f"uid {AGENT_UID}" not in record.sandbox_note


class Canary:
    """A Unix socket that answers CANARY to whoever connects."""

    def __init__(self, path: Path):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.bind(str(path))
        self.sock.listen(8)
        self.answered = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.answered += 1
            conn.sendall(CANARY.encode())
            conn.close()

    def close(self) -> None:
        self.sock.close()


def test_no_host_unix_socket_answers_the_agent(workspace, tiny_model, gsm8k_data, outside):
    if outside["/run"] is None or outside["/srv"] is None:
        pytest.skip("needs writable /run and /srv for the canary sockets")
    deep = outside["/run"] / "a" / "b" / "c" / "d" / "canary.sock"  # depth 5 under /run
    at_srv = outside["/srv"] / "canary.sock"
    late = outside["/run"] / "late.sock"  # made once the agent runs
    canaries = [Canary(deep), Canary(at_srv)]
    timer = threading.Timer(1.5, lambda: canaries.append(Canary(late)))
    timer.start()
    probe = (
        "import socket, sys, time\n"
        "time.sleep(4)\n"
        "for path in sys.argv[1:]:\n"
        "    s = socket.socket(socket.AF_UNIX)\n"
        "    try:\n"
        "        s.connect(path); print(path, s.recv(64).decode())\n"
        "    except OSError as exc:\n"
        "        print(path, 'refused', type(exc).__name__)\n"
    )
    command = ["python3", "-c", probe, str(deep), str(at_srv), str(late)]
    try:
        record = run_agent(spec_for(workspace, tiny_model, gsm8k_data, ["bash", "-c", '"$@" > code/probe.txt 2>&1', "agent", *command], sandbox_backend="bubblewrap"))
    finally:
        timer.cancel()
        timer.join()
        for canary in canaries:
            canary.close()
    out = read(workspace / "code" / "probe.txt")
    assert record.status == "completed", read(workspace / "agent.log")
    assert late.exists() or len(canaries) == 3, "the late canary was never made: the test proves nothing"
    assert CANARY not in out and out.count("refused") == 3, out
    assert all(c.answered == 0 for c in canaries)
    # The canaries answer from outside the sandbox: the test's own connection gets CANARY.
    probe_sock = Canary(outside["/srv"] / "check.sock")
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(outside["/srv"] / "check.sock"))
        assert s.recv(64).decode() == CANARY
    probe_sock.close()
