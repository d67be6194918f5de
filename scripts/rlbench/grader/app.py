"""The grading API (FastAPI): POST /submit, GET /time, GET /health under a per-run secret prefix.

The secret is the first path segment of GRADING_SERVER_URL, so agents written for the reference
harness (`curl -X POST "$GRADING_SERVER_URL/submit" -d '{"model_path": ...}'`) work unchanged.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from rlbench.evaluation import EvaluationError, run_in_child
from rlbench.grader.checks import (
    SubmissionRefused,
    fingerprint,
    inspect_checkpoint,
    resolve_submission,
    snapshot_checkpoint,
)
from rlbench.jsonio import append_jsonl, write_json

LEDGER = "ledger.jsonl"
CODE_SNAPSHOT_MAX_BYTES = 1 << 20


@dataclass
class GraderConfig:
    """Everything one run's grader needs; nothing in it is visible to the agent."""

    workspace: Path
    grader_dir: Path
    task_settings: dict
    eval_dir: Path
    baseline_score: float
    baseline_fingerprint: str
    start_time: float
    timeout_s: float
    secret: str
    evaluation: dict = field(default_factory=dict)
    gpus: list[str] = field(default_factory=list)
    provenance: dict = field(default_factory=dict)  # code, data, packages, hardware behind each score

    @property
    def end_time(self) -> float:
        return self.start_time + self.timeout_s


class Grader:
    """Submission bookkeeping: ledger, cache by fingerprint, best snapshot, agent-visible files."""

    def __init__(self, config: GraderConfig):
        self.config = config
        self.ledger_path = config.grader_dir / LEDGER
        self.snapshots = config.grader_dir / "snapshots"
        self.best_model_dir = config.grader_dir / "best_model"
        self._state_lock = threading.Lock()
        self._idle = threading.Condition()
        self._inflight = 0
        self._gpu_locks = {gpu: threading.Lock() for gpu in (config.gpus or ["cpu"])}
        self._cache: dict[str, float] = {config.baseline_fingerprint: config.baseline_score}
        if self.ledger_path.exists() and self.ledger_path.stat().st_size:
            raise RuntimeError(f"{self.ledger_path} holds an earlier attempt's submissions; archive it first")
        self.entries: list[dict] = []
        self.best: dict | None = None
        self.last_submit_time: float | None = None
        config.grader_dir.mkdir(parents=True, exist_ok=True)
        self.ledger_path.touch()  # an empty ledger is a record too: no submission was made
        self._write_agent_files()

    # -- agent-visible state -------------------------------------------------------------
    def time_info(self) -> dict:
        now = time.time()
        return {
            "start_time": self.config.start_time,
            "timeout_s": self.config.timeout_s,
            "last_submit_time": self.last_submit_time,
            "end_time": self.config.end_time,
            "now": now,
            "remaining": max(0.0, self.config.end_time - now),
        }

    def _write_agent_files(self) -> None:
        info = self.time_info()
        meta = {k: info[k] for k in ("start_time", "timeout_s", "last_submit_time", "end_time")}
        write_json(self.config.workspace / "run_meta.json", meta)
        write_json(
            self.config.workspace / "scores.json",
            {
                "baseline_score": self.config.baseline_score,
                "best": self.best,
                "submissions": [
                    {k: e.get(k) for k in ("submission_id", "timestamp", "model_path", "score", "improvement", "error")}
                    for e in self.entries
                ],
            },
        )

    # -- submissions ---------------------------------------------------------------------
    def submit(self, payload: object) -> tuple[int, dict]:
        """Handle one submission; returns (HTTP status, response body). Always leaves a ledger entry."""
        with self._idle:
            self._inflight += 1
        try:
            return self._submit(payload)
        finally:
            with self._idle:
                self._inflight -= 1
                self._idle.notify_all()

    def _submit(self, payload: object) -> tuple[int, dict]:
        received = time.time()
        with self._state_lock:
            submission_id = len(self.entries) + 1
            # Reserve the id so concurrent submissions never share one.
            self.entries.append({"submission_id": submission_id, "pending": True})
        model_path = payload.get("model_path") if isinstance(payload, dict) else None
        gpu = str(payload.get("gpu")) if isinstance(payload, dict) and payload.get("gpu") is not None else None
        entry = {
            "submission_id": submission_id,
            "timestamp": received,
            "model_path": model_path,
            "elapsed_seconds": round(received - self.config.start_time, 3),
            "baseline_score": self.config.baseline_score,
            "score": None,
            "improvement": None,
            "cached": False,
            "fingerprint": None,
            "error": None,
        }
        status = 200
        try:
            if not isinstance(payload, dict):
                raise SubmissionRefused(400, "malformed_request", 'the body must be a JSON object: {"model_path": "output/v1"}')
            if received > self.config.end_time:
                raise SubmissionRefused(
                    403, "deadline_passed", f"the run's deadline passed {received - self.config.end_time:.0f} s ago"
                )
            model_dir = resolve_submission(self.config.workspace, model_path)
            inspect_checkpoint(model_dir)
            entry["resolved_path"] = str(model_dir.relative_to(os.path.realpath(self.config.workspace)))
            entry.update(self._score(submission_id, model_dir, gpu))
            entry["status"] = "cached" if entry["cached"] else "scored"
        except SubmissionRefused as refusal:
            status = refusal.status
            entry.update(status="refused", reason=refusal.reason, error=refusal.message)
        except EvaluationError as failure:
            status = 422
            entry.update(status="failed", reason="evaluation_failed", error=str(failure))
        entry["responded_at"] = time.time()
        return status, self._record(entry)

    def _score(self, submission_id: int, model_dir: Path, gpu: str | None) -> dict:
        pending = self.snapshots / f"{submission_id:04d}"
        # Score a private copy: the agent may overwrite its directory while we evaluate.
        snapshot_checkpoint(model_dir, pending / "model")
        self._snapshot_code(pending / "code")
        digest = fingerprint(pending / "model")
        result = {"fingerprint": digest, "cached": digest in self._cache}
        if result["cached"]:
            score = self._cache[digest]
        else:
            lock_key = gpu if gpu in self._gpu_locks else next(iter(self._gpu_locks))
            with self._gpu_locks[lock_key]:
                outcome = run_in_child(
                    self.config.task_settings,
                    pending / "model",
                    self.config.eval_dir,
                    self.config.evaluation,
                    pending / "eval",
                    gpu=None if lock_key == "cpu" else lock_key,
                )
            score = outcome["score"]
            result.update(eval_seconds=outcome["eval_seconds"], n=outcome["n"], correct=outcome["correct"])
            self._cache[digest] = score  # only successes are cached; failures are retried
        result.update(
            score=score,
            improvement=round(score - self.config.baseline_score, 4),
            provenance={**self.config.provenance, "models": {**self.config.provenance.get("models", {}), "submission": digest}},
        )
        return result

    def _snapshot_code(self, dest: Path) -> None:
        """The agent's code at submission time (small text files only)."""
        source = self.config.workspace / "code"
        if not source.is_dir():
            return
        for path in sorted(source.rglob("*")):
            if path.is_file() and not path.is_symlink() and path.stat().st_size <= CODE_SNAPSHOT_MAX_BYTES:
                target = dest / path.relative_to(source)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)

    def _record(self, entry: dict) -> dict:
        with self._state_lock:
            self.entries[entry["submission_id"] - 1] = entry
            pending = self.snapshots / f"{entry['submission_id']:04d}" / "model"
            if entry["score"] is not None and (self.best is None or entry["score"] > self.best["score"]):
                self.best = {k: entry[k] for k in ("submission_id", "model_path", "score", "improvement", "fingerprint")}
                self._promote_best(pending)
            elif pending.exists():
                shutil.rmtree(pending)  # keep only the best checkpoint on disk
            entry["best"] = self.best
            entry["total_submissions"] = len(self.entries)
            append_jsonl(self.ledger_path, entry)
            self.last_submit_time = entry["timestamp"]
            self._write_agent_files()
        return {k: v for k, v in entry.items() if k not in ("fingerprint", "resolved_path", "responded_at", "provenance")}

    def _promote_best(self, pending: Path) -> None:
        staging = self.config.grader_dir / "best_model.new"
        if staging.exists():
            shutil.rmtree(staging)
        pending.rename(staging)
        if self.best_model_dir.exists():
            shutil.rmtree(self.best_model_dir)
        staging.rename(self.best_model_dir)
        write_json(self.config.grader_dir / "best.json", self.best)

    def drain(self) -> None:
        """Wait until no evaluation is in flight (used before the run is closed)."""
        with self._idle:
            self._idle.wait_for(lambda: self._inflight == 0)

    def health(self) -> dict:
        return {
            "status": "ok",
            "task": self.config.task_settings["name"],
            "gpus": self.config.gpus,
            "total_submissions": len(self.entries),
        }


def create_app(grader: Grader) -> FastAPI:
    app = FastAPI(title="Agent² RL-Bench grading server", docs_url=None, redoc_url=None, openapi_url=None)
    secret = grader.config.secret

    def check(token: str) -> None:
        if token != secret:
            raise HTTPException(status_code=404, detail="unknown path: use GRADING_SERVER_URL as given")

    @app.post("/{token}/submit")
    async def submit(token: str, request: Request):
        check(token)
        body = await request.body()
        # Parse whatever the content type says: `curl -d` sends form-encoded headers with a JSON body.
        try:
            payload = json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError):
            payload = None  # refused as malformed, and recorded in the ledger
        status, response = await run_in_threadpool(grader.submit, payload)
        return JSONResponse(status_code=status, content=response)

    @app.get("/{token}/time")
    def time_endpoint(token: str):
        check(token)
        return grader.time_info()

    @app.get("/{token}/health")
    def health(token: str):
        check(token)
        return grader.health()

    return app
