"""Run the grading app with uvicorn on 127.0.0.1 and an ephemeral port, in a background thread.

One asyncio event loop serves every connection (GuardedH11Protocol: each bounded in time); the
submissions themselves run in its thread pool, so that a slow evaluation or a stalled client never
holds up the others' /time and /health."""

from __future__ import annotations

import secrets
import socket
import threading
import time
from functools import partial

import uvicorn

from rlbench.grader.grading import Grader
from rlbench.grader.http import ConnectionTimeouts, GuardedH11Protocol, connection_timeouts, create_app


def new_secret() -> str:
    return secrets.token_urlsafe(24)


class GradingServer:
    """A started server; `url` (secret included) is what the agent gets as GRADING_SERVER_URL."""

    def __init__(self, grader: Grader, host: str = "127.0.0.1", timeouts: ConnectionTimeouts | None = None):
        """timeouts: how long a connection may take (default: rlbench.grader.http's constants)."""
        self.grader = grader
        self.timeouts = timeouts or connection_timeouts()
        self.socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.socket.bind((host, 0))  # port 0: the kernel picks a free port, so runs never collide
        self.host, self.port = self.socket.getsockname()
        config = uvicorn.Config(
            create_app(grader),
            http=partial(GuardedH11Protocol, timeouts=self.timeouts),
            timeout_keep_alive=self.timeouts.idle_s,
            log_level="warning",
            access_log=False,
            lifespan="off",
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)
        # None: stop() waits for every evaluation in flight. An interrupted run sets a bound, so that a
        # cancelled job (Ctrl-C, a dead Snakemake, scancel) does not hang on a long evaluation.
        self.drain_timeout_s: float | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/{self.grader.config.secret}"

    def start(self, timeout: float = 30.0) -> "GradingServer":
        self.thread.start()
        deadline = time.time() + timeout
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("the grading server did not start")
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        """Finish in-flight submissions (for at most drain_timeout_s, when set), then shut down.

        An evaluation still running after that is abandoned: its request gets no answer and no
        ledger line, and its child process dies with this one (rlbench.proc.lifeline)."""
        drained = self.grader.drain(self.drain_timeout_s)
        self.server.should_exit = True
        self.grader.close()  # the evaluation workers; one still evaluating is killed
        self.thread.join(timeout=30 if drained else 5)
        self.socket.close()

    def __enter__(self) -> "GradingServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
