"""The grading API (FastAPI): POST /submit, GET /time, GET /health under a per-run secret prefix.

The secret is the first path segment of GRADING_SERVER_URL, so agents written for the reference
harness (`curl -X POST "$GRADING_SERVER_URL/submit" -d '{"model_path": ...}'`) work unchanged.
Responses, scores.json, run_meta.json and timer.sh carry the reference harness's fields with the
reference's meanings (see rlbench.ledger); our own fields sit beside them.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import threading
import time
import traceback
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from rlbench.evaluation import EvaluationError, run_in_child
from rlbench.grader.checks import (
    SubmissionRefused,
    fingerprint,
    gpu_order,
    inspect_checkpoint,
    requested_gpus,
    resolve_submission,
    snapshot_checkpoint,
)
from rlbench.jsonio import append_jsonl, write_json
from rlbench.ledger import is_scored, is_submission, iso_timestamp, reference_best, reference_view

LEDGER = "ledger.jsonl"
CODE_SNAPSHOT_MAX_BYTES = 1 << 20
# Ledger fields the agent never gets back (they stay in grader/ledger.jsonl).
PRIVATE_FIELDS = ("fingerprint", "resolved_path", "provenance")

# bash and date only: it must run inside the sandbox. Output as the reference's CLI wrappers print it.
TIMER_SCRIPT = """\
#!/bin/bash
# Time left in this run; the deadline was fixed when the run started (unix seconds).
# Prints "Remaining: H:MM", or "Timer expired!" once the deadline has passed.
deadline={deadline}
left=$(( deadline - $(date +%s) ))
if (( left > 0 )); then
    printf 'Remaining: %d:%02d\\n' $(( left / 3600 )) $(( left % 3600 / 60 ))
else
    echo 'Timer expired!'
fi
"""


def _whole(seconds: float) -> int | float:
    """Seconds as an int when whole (the reference writes ints), else unchanged."""
    return int(seconds) if float(seconds).is_integer() else seconds


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
    gpus: list[str] = field(default_factory=list)  # CUDA_VISIBLE_DEVICES as the grader sees it
    provenance: dict = field(default_factory=dict)  # code, data, packages, hardware behind each score

    @property
    def deadline(self) -> float:
        """When the agent is stopped and submissions are refused (unix seconds)."""
        return self.start_time + self.timeout_s


class Grader:
    """Submission bookkeeping: ledger, cache by fingerprint, best snapshot, agent-visible files.

    Two bests: `best` is the grader's own, the best really scored submission (status scored or
    cached), whose snapshot becomes best_model/ and is evaluated at the end; the responses and
    scores.json carry the reference's best (ledger.reference_best), which a failure can be.
    """

    def __init__(self, config: GraderConfig):
        self.config = config
        self.ledger_path = config.grader_dir / LEDGER
        self.snapshots = config.grader_dir / "snapshots"
        self.best_model_dir = config.grader_dir / "best_model"
        self.available_gpus = sorted(config.gpus, key=gpu_order)
        self._state_lock = threading.Lock()
        self._idle = threading.Condition()
        self._inflight = 0
        self._gpu_locks = {gpu: threading.Lock() for gpu in self.available_gpus or ["cpu"]}
        self._cache: dict[str, float] = {config.baseline_fingerprint: config.baseline_score}
        if self.ledger_path.exists() and self.ledger_path.stat().st_size:
            raise RuntimeError(f"{self.ledger_path} holds an earlier attempt's submissions; archive it first")
        self.entries: list[dict] = []
        self.best: dict | None = None
        self.last_submit_time: int | None = None  # int unix seconds of the last recorded submission
        self.end_time: int | None = None  # set by finish() when the run is over
        config.grader_dir.mkdir(parents=True, exist_ok=True)
        self.ledger_path.touch()  # an empty ledger is a record too: no submission was made
        self._write_timer()
        self._write_agent_files()

    # -- agent-visible state -------------------------------------------------------------
    def run_meta(self) -> dict:
        """run_meta.json as the reference writes it (int unix seconds; end_time null while running)."""
        return {
            "start_time": int(self.config.start_time),
            "timeout_s": _whole(self.config.timeout_s),
            "last_submit_time": self.last_submit_time,
            "end_time": self.end_time,
            "deadline": self.config.deadline,  # ours: the exact deadline, unix seconds
        }

    def time_info(self) -> dict:
        now = time.time()
        return {
            **self.run_meta(),
            "now": int(now),
            # Whole seconds, rounded down: never more time than there is.
            "remaining": max(0, int(self.config.deadline - now)),
        }

    def finish(self, end_time: float) -> None:
        """Record the run's actual end (the agent has stopped) in run_meta.json."""
        with self._state_lock:
            self.end_time = int(end_time)
            self._write_agent_files()

    def _write_timer(self) -> None:
        timer = self.config.workspace / "timer.sh"
        timer.write_text(TIMER_SCRIPT.format(deadline=int(self.config.deadline)))
        timer.chmod(0o755)

    def _write_agent_files(self) -> None:
        write_json(self.config.workspace / "run_meta.json", self.run_meta())
        recorded = [e for e in self.entries if not e.get("pending")]
        view = reference_view(recorded)
        write_json(self.config.workspace / "scores.json", view)
        write_json(
            self.config.workspace / "submissions.json",
            {
                "baseline_score": self.config.baseline_score,
                "best": self._public(self.best) if self.best else None,
                "total_submissions": len(view),
                "requests": len(recorded),
                "submissions": [self._public(e, "best", "total_submissions") for e in recorded],
            },
        )

    @staticmethod
    def _public(entry: dict, *also: str) -> dict:
        return {k: v for k, v in entry.items() if k not in PRIVATE_FIELDS and k not in also}

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
        entry = {
            "submission_id": submission_id,
            "model_path": model_path,
            "submitted_at": received,
            "since_start_s": round(received - self.config.start_time, 3),
            "baseline_score": self.config.baseline_score,
            "score": 0.0,  # as the reference: 0.0 unless the weights were scored
            "cached": False,
            "fingerprint": None,
            "gpu": None,
        }
        status = 200
        try:
            if not isinstance(payload, dict):
                raise SubmissionRefused(400, "malformed_request", 'the body must be a JSON object: {"model_path": "output/v1"}')
            if received > self.config.deadline:
                raise SubmissionRefused(
                    403,
                    "deadline_passed",
                    f"the run's deadline passed {received - self.config.deadline:.0f} s ago: no more submissions are accepted",
                )
            gpus = self._gpus_for(payload.get("gpu"))
            entry["gpu"] = ",".join(gpus) or None
            model_dir = resolve_submission(self.config.workspace, model_path)
            inspect_checkpoint(model_dir)
            entry["resolved_path"] = str(model_dir.relative_to(os.path.realpath(self.config.workspace)))
            entry.update(self._score(submission_id, model_dir, gpus))
            entry["status"] = "cached" if entry["cached"] else "scored"
        except SubmissionRefused as refusal:
            status = refusal.status
            entry.update(status="refused", reason=refusal.reason, error=refusal.message)
            if refusal.reason == "invalid_gpu":
                entry["available_gpus"] = self.available_gpus  # as the reference's 400 answer
        except EvaluationError as failure:
            status = 422
            entry.update(status="failed", reason="evaluation_failed", error=str(failure))
        except Exception as exc:  # noqa: BLE001 - a grader fault must still leave a ledger entry
            traceback.print_exc(file=sys.stderr)
            status = 500
            entry.update(
                status="grader_error",
                reason="grader_error",
                error=f"the grader failed on this submission ({type(exc).__name__}: {exc}); "
                "this is not a problem with your model: submit it again",
            )
        finished = time.time()
        entry.update(
            timestamp=iso_timestamp(finished),  # the reference's: when the evaluation finished
            responded_at=finished,
            elapsed_seconds=round(finished - received, 2),  # this submission's evaluation time
            improvement=round(entry["score"] - self.config.baseline_score, 6),
        )
        return status, self._record(entry)

    def _gpus_for(self, requested: object) -> list[str]:
        """The GPUs an evaluation may use: those requested (checked), else the first available."""
        if requested is None:
            return self.available_gpus[:1]
        return requested_gpus(requested, self.available_gpus)

    def _locks_for(self, gpus: list[str]) -> list[threading.Lock]:
        """One lock per GPU, always taken in the same order, so multi-GPU requests never deadlock."""
        return [self._gpu_locks[g] for g in sorted(gpus, key=gpu_order)] or [self._gpu_locks["cpu"]]

    def _score(self, submission_id: int, model_dir: Path, gpus: list[str]) -> dict:
        pending = self.snapshots / f"{submission_id:04d}"
        # Score a private copy: the agent may overwrite its directory while we evaluate.
        snapshot_checkpoint(model_dir, pending / "model")
        self._snapshot_code(pending / "code")
        digest = fingerprint(pending / "model")
        result = {"fingerprint": digest, "cached": digest in self._cache}
        if result["cached"]:
            score = self._cache[digest]
        else:
            with ExitStack() as held:
                for lock in self._locks_for(gpus):
                    held.enter_context(lock)
                outcome = run_in_child(
                    self.config.task_settings,
                    pending / "model",
                    self.config.eval_dir,
                    self.config.evaluation,
                    pending / "eval",
                    gpu=",".join(gpus) or None,
                )
            score = outcome["score"]
            result.update(eval_seconds=outcome["eval_seconds"], n=outcome["n"], correct=outcome["correct"])
            self._cache[digest] = score  # only successes are cached; failures are retried
        result.update(
            score=float(score),
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
        """Ledger (fsync'd), best snapshot and the agent's files; returns the response body."""
        with self._state_lock:
            if entry.get("cached"):
                entry["repeat_of"] = self._earlier_result(entry)
            self.entries[entry["submission_id"] - 1] = entry
            pending = self.snapshots / f"{entry['submission_id']:04d}" / "model"
            # Only a real evaluation of the submitted weights can become the best model.
            if is_scored(entry) and (self.best is None or entry["score"] > self.best["score"]):
                self.best = {k: entry[k] for k in ("submission_id", "model_path", "score", "improvement", "fingerprint")}
                self._promote_best(pending)
            elif pending.exists():
                shutil.rmtree(pending)  # keep only the best checkpoint on disk
            if is_submission(entry):
                self.last_submit_time = max(self.last_submit_time or 0, int(entry["responded_at"]))
            recorded = [e for e in self.entries if not e.get("pending")]
            best = reference_best(recorded)
            if best is not None:  # the reference never answers "best": null
                entry["best"] = best
            entry["total_submissions"] = len(reference_view(recorded))
            append_jsonl(self.ledger_path, entry)
            self._write_agent_files()
        return self._public(entry)

    def _earlier_result(self, entry: dict) -> int | None:
        """The submission whose result a resubmission of the same path and weights repeats.

        The reference's cache answers those with the earlier result and records nothing, so they
        are not submissions in the paper's counts (ledger.is_submission)."""
        for earlier in self.entries:
            if (
                is_scored(earlier)
                and is_submission(earlier)
                and earlier.get("resolved_path") == entry.get("resolved_path")
                and earlier.get("fingerprint") == entry.get("fingerprint")
            ):
                return earlier["submission_id"]
        return None

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
        with self._state_lock:
            recorded = [e for e in self.entries if not e.get("pending")]
            return {
                "status": "ok",
                "task": self.config.task_settings["name"],
                "workspace": str(self.config.workspace),
                "available_gpus": self.available_gpus,
                "gpus": self.available_gpus,
                "total_submissions": len(reference_view(recorded)),
                "requests": len(self.entries),
            }


def parse_payload(body: bytes) -> object:
    """The request's JSON, whatever the content type says (`curl -d` sends form-encoded headers).

    The reference's CLI wrappers show the submit command with escaped quotes
    ('{\\"model_path\\": ...}'), which a shell passes on verbatim: that body is read as meant.
    None when the body is not JSON (refused as malformed, and recorded).
    """
    try:
        return json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError):
        pass
    try:
        text = body.decode()
        if '\\"' in text:
            payload = json.loads(text.replace('\\"', '"'))
            return payload if isinstance(payload, dict) else None
    except (json.JSONDecodeError, UnicodeDecodeError):
        pass
    return None


def create_app(grader: Grader) -> FastAPI:
    app = FastAPI(title="Agent² RL-Bench grading server", docs_url=None, redoc_url=None, openapi_url=None)
    secret = grader.config.secret

    def check(token: str) -> None:
        if token != secret:
            raise HTTPException(status_code=404, detail="unknown path: use GRADING_SERVER_URL as given")

    @app.post("/{token}/submit")
    async def submit(token: str, request: Request):
        check(token)
        payload = parse_payload(await request.body())
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
