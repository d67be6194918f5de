"""Headless Chromium over the DevTools protocol (a pipe, no port, no extra package).

Used to check the HTML report as a reader sees it: a page is opened, its JavaScript runs, and we
collect every uncaught exception, console error and failed resource load, evaluate expressions in
the page (clicking through the report) and take screenshots. `chromium` is Debian's package
(`apt-get install chromium`); `find_chromium()` says where it is, or None.

Chromium started with --remote-debugging-pipe reads protocol commands from file descriptor 3 and
writes responses and events to descriptor 4, each message a JSON object followed by a NUL byte.
"""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "chrome")


class BrowserError(RuntimeError):
    pass


def find_chromium() -> str | None:
    """The Chromium executable ($RLBENCH_CHROMIUM, else the first of BROWSERS on PATH), or None."""
    explicit = os.environ.get("RLBENCH_CHROMIUM")
    if explicit:
        return explicit if Path(explicit).exists() else None
    return next((path for path in map(shutil.which, BROWSERS) if path), None)


class Page:
    """One headless Chromium with one page. Use as a context manager; `errors` lists what went wrong
    in the page (exceptions, console.error/assert, failed loads), each as a short string."""

    def __init__(self, executable: str | None = None, *, width: int = 1280, height: int = 1024, timeout_s: float = 60):
        self.executable = executable or find_chromium()
        if not self.executable:
            raise BrowserError("Chromium was not found: install Debian's `chromium` (apt-get install chromium)")
        self.timeout_s = timeout_s
        self.errors: list[str] = []
        self.console: list[str] = []
        self._events: list[dict] = []
        self._next_id = 0
        self._buffer = b""
        self._profile = tempfile.TemporaryDirectory(prefix="rlbench-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def child_fds() -> None:  # the protocol's fixed descriptors 3 (commands) and 4 (replies)
            high_r, high_w = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)

        args = [
            self.executable,
            "--headless",
            "--no-sandbox",  # CI runs as root; the page is our own report
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--no-default-browser-check",
            "--allow-file-access-from-files",
            "--remote-debugging-pipe",
            f"--user-data-dir={self._profile.name}",
            f"--window-size={width},{height}",
            "about:blank",
        ]
        self._proc = subprocess.Popen(
            args, preexec_fn=child_fds, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        target = self._call("Target.createTarget", {"url": "about:blank"})["targetId"]
        self._session = self._call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False})

    # -- protocol ---------------------------------------------------------------------------------
    def _send(self, method: str, params: dict | None, session: str | None) -> int:
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        return self._next_id

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrowserError(f"Chromium did not answer within {self.timeout_s:g} s")
            ready, _, _ = select.select([self._from_browser], [], [], min(remaining, 1.0))
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise BrowserError(f"Chromium exited (code {self._proc.poll()})")
                self._buffer += chunk
        raw, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(raw)

    def _handle_event(self, message: dict) -> None:
        method, params = message.get("method"), message.get("params", {})
        if method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            text = (details.get("exception") or {}).get("description") or details.get("text")
            self.errors.append(f"exception: {text}")
        elif method == "Runtime.consoleAPICalled":
            text = " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
            self.console.append(f"{params.get('type')}: {text}")
            if params.get("type") in ("error", "assert"):
                self.errors.append(f"console.{params['type']}: {text}")
        elif method == "Log.entryAdded":
            entry = params.get("entry", {})
            if entry.get("level") == "error":
                self.errors.append(f"{entry.get('source')}: {entry.get('text')} {entry.get('url') or ''}".strip())
        self._events.append(message)

    def _call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        wanted = self._send(method, params, session)
        deadline = time.monotonic() + self.timeout_s
        while True:
            message = self._read_message(deadline)
            if message.get("id") == wanted:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error'].get('message')}")
                return message.get("result", {})
            if "method" in message:
                self._handle_event(message)

    def call(self, method: str, params: dict | None = None) -> dict:
        """A protocol command on the page's session."""
        return self._call(method, params, self._session)

    def _wait_event(self, method: str, deadline: float) -> None:
        if any(e.get("method") == method for e in self._events):
            return
        while True:
            message = self._read_message(deadline)
            if "method" in message:
                self._handle_event(message)
                if message["method"] == method:
                    return

    # -- use --------------------------------------------------------------------------------------
    def open(self, url: str) -> None:
        """Navigate and wait for the load event."""
        self._events.clear()
        result = self.call("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise BrowserError(f"cannot open {url}: {result['errorText']}")
        self._wait_event("Page.loadEventFired", time.monotonic() + self.timeout_s)

    def evaluate(self, expression: str):
        """The value of a JavaScript expression in the page (promises awaited)."""
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(f"{expression[:80]!r} raised: {(details.get('exception') or {}).get('description') or details.get('text')}")
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout_s: float = 30, interval_s: float = 0.2):
        """Poll until the expression is truthy; its value, or BrowserError on timeout."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise BrowserError(f"timed out waiting for {expression[:120]!r}")
            time.sleep(interval_s)

    def screenshot(self, path: Path, full_page: bool = False) -> Path:
        params = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
            size = self.call("Page.getLayoutMetrics")["cssContentSize"]
            params["clip"] = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
        data = self.call("Page.captureScreenshot", params)["data"]
        Path(path).write_bytes(base64.b64decode(data))
        return Path(path)

    def close(self) -> None:
        try:
            self._call("Browser.close")
        except (BrowserError, OSError):
            pass
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        for fd in (self._to_browser, self._from_browser):
            try:
                os.close(fd)
            except OSError:
                pass
        self._profile.cleanup()

    def __enter__(self) -> "Page":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
