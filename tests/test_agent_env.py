"""The reference agents' client follows the contract: a retryable 503 is submitted again."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_submit_retries_a_retryable_grader_error_and_nothing_else(tmp_path):
    answers = [
        (503, {"status": "grader_error", "retryable": True, "score": 0.0, "error": "grader failed"}),
        (200, {"status": "scored", "score": 12.5}),
        (422, {"status": "failed", "score": 0.0, "error": "model failed"}),
    ]
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 - http.server's name
            seen.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            status, body = answers[len(seen) - 1]
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if status == 503:
                self.send_header("Retry-After", "0")
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp_path / "output" / "v1").mkdir(parents=True)
    script = (
        "import json, agent_env\n"
        "first = agent_env.submit(agent_env.OUTPUT_DIR / 'v1')\n"
        "second = agent_env.submit(agent_env.OUTPUT_DIR / 'v1')\n"
        "print(json.dumps([first, second]))\n"
    )
    env = {
        **os.environ,
        "WORKSPACE": str(tmp_path),
        "MODEL_PATH": str(tmp_path / "models"),
        "OUTPUT_DIR": str(tmp_path / "output"),
        "GRADING_SERVER_URL": f"http://127.0.0.1:{server.server_address[1]}/secret",
        "PYTHONPATH": str(REPO / "scripts" / "agents"),
    }
    try:
        proc = subprocess.run([sys.executable, "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True)
    finally:
        server.shutdown()
    assert proc.returncode == 0, proc.stderr
    first, second = json.loads(proc.stdout.strip().splitlines()[-1])
    assert first == {"status": "scored", "score": 12.5}  # the 503 was retried once
    assert second is None  # a model failure (422) is not retried
    assert seen == [{"model_path": "output/v1"}] * 3
