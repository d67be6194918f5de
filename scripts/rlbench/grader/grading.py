"""The grader: handles each submission (checks, snapshot, cache by fingerprint, evaluation) and records it.

Every request to /submit that reaches the grader gets a submission id and exactly one ledger line,
whatever fails where (a line the disk refuses is never acknowledged: that request is answered as a
grader error, whose line is written once the disk takes one; see grader.ledger_file): the statuses
an agent can get are 200 (scored or cached), 4xx (refused, or failed: its model's fault; the body
says what to change) and 503 (grader_error: the grader's own fault, `retryable: true`, a
Retry-After header, submit again; not counted against the agent).
Responses carry the reference harness's fields with the reference's meanings (see
rlbench.recording.ledger); our own fields sit beside them.

The agent is hostile by assumption. The checkpoint is copied (following no link) before anything
looks at it, and what is inspected, fingerprinted and evaluated is the copy (see grader.snapshot).
Nothing the agent gets back carries text the evaluation may have read from the held-out split:
errors after it was read keep their detail in the ledger's private `error_detail` (see
rlbench.evaluation.child). Weights whose evaluation keeps being killed (out of memory) stop being the
grader's fault after GRADER_FAULTS_RETRIED kills. The agent-visible files are derived from the
fsync'd ledger (see grader.visible).

In scoring.feedback split (GraderConfig.partition; rlbench.config.scoring_settings) every new content is
evaluated twice in the same request, before the answer: on the feedback part of the held-out split, which
is what the agent is told (score, metrics, n, improvement against the base model's feedback score), and on
the final part, whose numbers go only to the ledger's private `final` field (grader.visible.PRIVATE_FIELDS)
and the cache. Both run before the response so that nothing happens after it: the request takes about
what one full-split evaluation takes (the two parts together are the split), `elapsed_seconds` and
`eval_seconds` are that one total, the GPU is free when the answer comes, and a failure of either part
fails the submission as a failure anywhere on the split does in full mode (its message names no part).
Full mode is the reference's, unchanged: one evaluation of the whole split.

Every submission that reaches scoring also leaves its audit records (grader.audit): the grader's
copy of code/, committed to grader/code.git (the ledger's `code_revision`), and checkpoint.json.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
import time
import traceback
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from pathlib import Path

from rlbench.evaluation.request import EvaluationError, GraderFault
from rlbench.evaluation.workers import WorkerPool
from rlbench.fileio.jsonio import write_json
from rlbench.grader.audit import commit_code, copy_code, write_checkpoint_record
from rlbench.grader.fingerprint import checkpoint_manifest
from rlbench.grader.gpu_locks import GpuLocks
from rlbench.grader.ledger_file import LedgerFile
from rlbench.grader.snapshot import SnapshotLimits, take_snapshot
from rlbench.grader.submission import SubmissionRefused, inspect_checkpoint, resolve_submission
from rlbench.grader.targets import ALL, BestPerTask, TaskTarget, combined, requested_tasks, task_entry
from rlbench.grader.visible import AgentFiles, public, reference_run_meta, write_timer
from rlbench.recording.ledger import (
    GRADER_ERROR,
    is_scored,
    is_submission,
    iso_timestamp,
    json_safe,
    safe_text,
    stored_model_path,
)
from rlbench.recording.repository import CODE_GIT, CodeRepository
from rlbench.tasks.base import FEEDBACK, FINAL, public_metrics

LEDGER = "ledger.jsonl"
# Evaluations of the same weights killed by a signal while loading or generating (most likely out
# of memory) that are answered as the grader's fault (503, retryable); the next is the model's (422).
# (INSTRUCTIONS say "killed three times".)
GRADER_FAULTS_RETRIED = 2
ERROR_DETAIL_MAX_CHARS = 8000
# Seconds a client is told to wait before resubmitting after a grader error (Retry-After).
RETRY_AFTER_S = 5
# The HTTP status of a grader error: "unavailable, try again", not a fault of the request.
GRADER_ERROR_STATUS = 503
ERROR_MAX_CHARS = 4000


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
    # The base model's metrics (score, primary_metric, metrics, n: tasks.base.public_metrics): what a
    # submission of the untouched base model is answered with, from the cache.
    baseline_metrics: dict = field(default_factory=dict)
    # What the task's evaluation may use beyond the split (tasks.base.EvalContext: judge_model_dir,
    # judgment_cache, and base_chat_template, required: the protocol's chat template).
    resources: dict = field(default_factory=dict)
    gpus: list[str] = field(default_factory=list)  # CUDA_VISIBLE_DEVICES as the grader sees it
    # A submission's checkpoint files may total at most this (None: no bound), and its copy must leave
    # disk_reserve_bytes free on the grader's disk (grader.snapshot.SnapshotLimits; config `grader:`).
    max_checkpoint_bytes: int | None = None
    disk_reserve_bytes: int = 0
    provenance: dict = field(default_factory=dict)  # code, data, packages, hardware behind each score
    # scoring.feedback split: the held-out split's parts (partition.json: {"feedback": {"items": [...]},
    # "final": {"items": [...]}, "digest"}); None: full mode, the reference's (one evaluation of the split).
    partition: dict | None = None
    # split mode: the base model's numbers on the final part (baseline.json "final_split"), what a
    # resubmitted base model's private final record gets from the cache.
    baseline_final_metrics: dict = field(default_factory=dict)
    # A multi-task run: its tasks, in run order, each with its own split, baseline, resources and partition
    # (grader.targets). The single-task fields above then describe the run as a whole: task_settings its name
    # ({"name": "multi", "tasks": [...]}), baseline_score the mean of the tasks' baselines, baseline_fingerprint the
    # base model's; eval_dir, baseline_metrics, resources and partition are the tasks' own. None: one task, the above.
    tasks: dict[str, TaskTarget] | None = None

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

    def __init__(self, config: GraderConfig, workers: WorkerPool | None = None):
        """`workers`: a pool shared with other graders (tests, benchmarks); the grader then leaves it
        running when it closes. By default each grader starts and closes a pool of its own."""
        self.config = config
        self.multi = bool(config.tasks)
        if any("base_chat_template" not in target.resources for target in self.targets.values()):
            raise ValueError(
                "GraderConfig.resources needs base_chat_template: the base model's chat template text (None "
                "when it has none), which submissions' prompts are rendered with (evaluation.evaluate."
                "base_chat_template reads it from the baseline's result)"
            )
        self.ledger_path = config.grader_dir / LEDGER
        self.snapshots = config.grader_dir / "snapshots"
        self.best_model_dir = config.grader_dir / "best_model"
        # The agent's code at each submission that reaches scoring, one commit each (rlbench.recording.repository).
        self.code_repo = CodeRepository(config.grader_dir / CODE_GIT)
        self.gpu_locks = GpuLocks(config.gpus)  # evaluations on one GPU take turns
        self._state_lock = threading.Lock()
        self._idle = threading.Condition()
        self._inflight = 0
        # Where evaluations run: a warm worker per GPU set, or a fresh process each (rlbench.evaluation.workers).
        self._own_workers = workers is None
        self.workers = WorkerPool.from_settings(config.grader_dir / "workers", config.evaluation) if workers is None else workers
        self._content_locks: dict[str, threading.Lock] = {}  # fingerprint -> in-flight lock (_score)
        self._content_locks_guard = threading.Lock()
        # (task, fingerprint) -> the numbers of its evaluation on that task (score, primary_metric, metrics, n)
        self._cache: dict[tuple[str, str], dict] = {}
        self._kills: dict[str, int] = {}  # fingerprint -> evaluations killed while the model ran
        # split mode: (task, fingerprint) -> the numbers of its final-part evaluation (private: the ledger's `final`)
        self._final_cache: dict[tuple[str, str], dict] = {}
        for name, target in self.targets.items():
            self._cache[(name, target.baseline_fingerprint)] = {
                **public_metrics(target.baseline_metrics),
                "score": target.baseline_score,
            }
            if target.partition is not None:
                if not target.baseline_final_metrics:
                    raise ValueError(
                        "scoring.feedback split needs the base model's final-split score (baseline.json final_split): "
                        "rerun the baseline, e.g. snakemake --forcerun evaluate_baseline"
                    )
                self._final_cache[(name, target.baseline_fingerprint)] = self._final_numbers(
                    target.baseline_final_metrics, target.partition
                )
        # multi-task runs: each task's best really scored submission and its snapshot (grader/best_models/<task>/)
        self.best_by_task = BestPerTask(config.grader_dir)
        # The agent's view of the recorded entries and the files written from it (grader.visible).
        self.agent_files = AgentFiles(config.workspace, config.baseline_score)
        # The ledger, and the lines the disk refused, waiting to be written (_unrecorded).
        self.ledger = LedgerFile(self.ledger_path)
        self.entries: list[dict] = []
        self.best: dict | None = None
        self.last_submit_time: int | None = None  # int unix seconds of the last recorded submission
        self.end_time: int | None = None  # set by finish() when the run is over
        config.grader_dir.mkdir(parents=True, exist_ok=True)
        write_timer(config.workspace, config.deadline)
        self._write_agent_files()

    @property
    def targets(self) -> dict[str, TaskTarget]:
        """What submissions are evaluated on: each task of a multi-task run (GraderConfig.tasks), else the run's
        one task, read from the config's own fields (grader.targets)."""
        config = self.config
        if config.tasks:
            return config.tasks
        return {
            config.task_settings["name"]: TaskTarget(
                task_settings=config.task_settings,
                eval_dir=config.eval_dir,
                baseline_score=config.baseline_score,
                baseline_fingerprint=config.baseline_fingerprint,
                baseline_metrics=config.baseline_metrics,
                resources=config.resources,
                partition=config.partition,
                baseline_final_metrics=config.baseline_final_metrics,
            )
        }

    # -- agent-visible state -------------------------------------------------------------
    def run_meta(self) -> dict:
        """run_meta.json as the reference writes it (int unix seconds; end_time null while running)."""
        return reference_run_meta(
            self.config.start_time, self.config.timeout_s, self.config.deadline, self.last_submit_time, self.end_time
        )

    def time_info(self) -> dict:
        now = time.time()
        return {
            **self.run_meta(),
            "now": int(now),
            # Whole seconds, rounded down: never more time than there is.
            "remaining": max(0, int(self.config.deadline - now)),
        }

    def finish(self, end_time: float) -> None:
        """Record the run's actual end (the agent has stopped): the grader's own grader/run_meta.json
        (what the summaries read), then the agent's files, all rewritten. Never raises for what the
        agent did to its workspace (its files are best-effort copies); waiting ledger lines get a last try."""
        with self._state_lock:
            self.end_time = int(end_time)
            self.ledger.try_waiting(self.agent_files, self._after_record)
            try:
                write_json(self.config.grader_dir / "run_meta.json", self.run_meta())
                self.agent_files.changed()  # whatever the agent put in their place, the grader's again
                self._write_agent_files()
            except Exception:  # noqa: BLE001 - the run must still be recorded (run.json)
                traceback.print_exc(file=sys.stderr)

    def _write_agent_files(self) -> None:
        """run_meta.json, scores.json and submissions.json, each when it changed since last written
        (grader.visible.AgentFiles.write)."""
        self.agent_files.write(self.run_meta, self.best)

    # -- submissions ---------------------------------------------------------------------
    def submit(self, payload: object, refusal: SubmissionRefused | None = None) -> tuple[int, dict]:
        """Handle one submission; returns (HTTP status, response body). Always leaves a ledger entry.

        refusal: a verdict reached before the payload could be read (the body was too large)."""
        with self._idle:
            self._inflight += 1
        try:
            return self._submit(payload, refusal)
        finally:
            with self._idle:
                self._inflight -= 1
                self._idle.notify_all()

    def _submit(self, payload: object, refusal: SubmissionRefused | None) -> tuple[int, dict]:
        """Reserve an id, handle, record: the id ends up recorded whatever raises where, so the
        ledger, /health's `requests` and scores.json always agree and no entry stays pending."""
        received = time.time()
        with self._state_lock:
            submission_id = len(self.entries) + 1
            # Reserve the id so concurrent submissions never share one.
            self.entries.append({"submission_id": submission_id, "pending": True})
        # Holds the content's in-flight lock (see _score) until the entry is recorded, so a
        # concurrent submission of the same weights sees this one in the ledger when it gets in.
        with ExitStack() as held:
            try:
                status, entry = self._handle(submission_id, payload, refusal, received, held)
            except BaseException as exc:  # noqa: BLE001 - recorded, then re-raised if not an Exception
                status, entry = self._failure_entry(submission_id, received, exc)
                if not isinstance(exc, Exception):
                    self._record(status, entry)
                    raise
            return self._record(status, entry)

    def _base_entry(self, submission_id: int, model_path: object, received: float) -> dict:
        return {
            "submission_id": submission_id,
            "model_path": stored_model_path(model_path),  # bounded, valid UTF-8 (see ledger)
            "submitted_at": received,
            "since_start_s": round(received - self.config.start_time, 3),
            "baseline_score": self.config.baseline_score,
            "score": 0.0,  # as the reference: 0.0 unless the weights were scored
            "cached": False,
            "fingerprint": None,
            "gpu": None,
        }

    def _handle(
        self,
        submission_id: int,
        payload: object,
        refusal: SubmissionRefused | None,
        received: float,
        held: ExitStack,
    ) -> tuple[int, dict]:
        model_path = payload.get("model_path") if isinstance(payload, dict) else None
        entry = self._base_entry(submission_id, model_path, received)
        status = 200
        try:
            if refusal is not None:
                raise refusal
            if not isinstance(payload, dict):
                raise SubmissionRefused(400, "malformed_request", 'the body must be a JSON object: {"model_path": "output/v1"}')
            if received > self.config.deadline:
                raise SubmissionRefused(
                    403,
                    "deadline_passed",
                    f"the run's deadline passed {received - self.config.deadline:.0f} s ago: no more submissions are accepted",
                )
            gpus = self.gpu_locks.for_request(payload.get("gpu"))
            entry["gpu"] = ",".join(gpus) or None
            names = requested_tasks(payload, self.targets, self.multi)
            if self.multi:  # what it asked for, and what its improvement will be measured against
                entry["task"] = payload.get("task", ALL)
                targets = self.targets
                entry["baseline_score"] = round(sum(targets[n].baseline_score for n in names) / len(names), 6)
            model_dir = resolve_submission(self.config.workspace, model_path)
            # Copied first, following no link; from here on only the copy is read (grader.snapshot).
            copy = self.snapshots / f"{submission_id:04d}" / "model"
            # One read of the agent's files: copied (or cloned) and hashed in the same pass.
            started = time.perf_counter()
            limits = SnapshotLimits(self.config.max_checkpoint_bytes, self.config.disk_reserve_bytes)
            snapshot = take_snapshot(self.config.workspace, model_dir, copy, limits)
            inspect_checkpoint(copy, snapshot.names)
            # checkpoint.json also says how the copy was made and what it cost
            manifest = {**snapshot.manifest, "method": snapshot.method, "seconds": round(time.perf_counter() - started, 3)}
            entry["resolved_path"] = str(model_dir.relative_to(os.path.realpath(self.config.workspace)))
            entry.update(self._score(submission_id, copy, gpus, held, entry, manifest, names))
            entry["status"] = "cached" if entry["cached"] else "scored"
        except SubmissionRefused as refused:
            status = refused.status
            entry.update(status="refused", reason=refused.reason, error=refused.message)
            if refused.reason == "invalid_gpu":
                entry["available_gpus"] = self.gpu_locks.available  # as the reference's 400 answer
        except EvaluationError as failure:  # the submitted model's fault
            status = 422
            entry.update(status="failed", reason="evaluation_failed", error=str(failure))
            if failure.detail:
                entry["error_detail"] = failure.detail
        except Exception as exc:  # noqa: BLE001 - GraderFault or a bug: the grader's fault, not the model's
            status = self._grader_error(entry, exc)
        self._finish_times(entry, received)
        return status, entry

    def _grader_error(self, entry: dict, exc: BaseException) -> int:
        """Turn entry into a grader error (retryable, not counted against the agent); the HTTP status."""
        if isinstance(exc, GraderFault):
            print(f"grader: submission {entry['submission_id']}: {exc.detail or exc}", file=sys.stderr)
            if exc.detail:
                entry["error_detail"] = exc.detail
        else:
            traceback.print_exception(exc, file=sys.stderr)
        # An OSError's text names the grader's own files (a snapshot, the ledger): its strerror only.
        shown = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
        entry.update(
            status=GRADER_ERROR,
            reason=GRADER_ERROR,
            retryable=True,
            score=0.0,
            cached=False,
            error=f"the grader failed on this submission ({type(exc).__name__}: {shown}); "
            f"this is not a problem with your model and does not count as a submission: "
            f"submit it again (in {RETRY_AFTER_S} s or more)",
        )
        return GRADER_ERROR_STATUS

    def _finish_times(self, entry: dict, received: float) -> None:
        finished = time.time()
        entry.update(
            timestamp=iso_timestamp(finished),  # the reference's: when the evaluation finished
            responded_at=finished,
            elapsed_seconds=round(finished - received, 2),  # this submission's evaluation time
            improvement=round(entry["score"] - entry["baseline_score"], 6),
        )

    def _failure_entry(self, submission_id: int, received: float, exc: BaseException) -> tuple[int, dict]:
        """A minimal grader-error entry for a submission whose handling itself failed."""
        entry = self._base_entry(submission_id, None, received)
        status = self._grader_error(entry, exc)
        self._finish_times(entry, received)
        return status, entry

    def _content_lock(self, digest: str) -> threading.Lock:
        """The in-flight lock of one checkpoint content (kept: one small lock per distinct content)."""
        with self._content_locks_guard:
            return self._content_locks.setdefault(digest, threading.Lock())

    def _score(
        self,
        submission_id: int,
        model_copy: Path,
        gpus: list[str],
        held: ExitStack,
        entry: dict | None = None,
        manifest: dict | None = None,
        names: list[str] | None = None,
    ) -> dict:
        """Score a checkpoint on the tasks `names` (default: every task of the run), evaluating each distinct content
        once per task.

        Lock order: the content's in-flight lock, then the cache, then the GPU locks. Concurrent
        submissions of the same new weights thus wait for the first one's evaluation and are
        answered from the cache, instead of each running a full evaluation. The content lock is
        entered into `held`, released once the entry is recorded. Nobody takes a content lock
        while holding a GPU lock, so the two orders never cross. Failures are not cached: a
        waiter behind a failed evaluation evaluates again.

        model_copy: the grader's copy of the checkpoint (take_snapshot), in its submission's
        snapshot directory: the agent may overwrite its own directory while we evaluate. entry:
        the submission's ledger entry, given its `code_revision` here (whatever happens next).
        The code snapshot, its commit and checkpoint.json are audit records: they never fail the
        submission."""
        pending = model_copy.parent
        copy_code(self.config.workspace, pending / "code")
        revision = commit_code(self.code_repo, submission_id, pending / "code", (entry or {}).get("submitted_at"))
        if entry is not None:
            entry["code_revision"] = revision
        if manifest is None:  # take_snapshot's, from the copy's one read; else read the copy now
            manifest = checkpoint_manifest(model_copy)
        digest = manifest["fingerprint"]
        write_checkpoint_record(pending, model_copy, manifest)
        held.enter_context(self._content_lock(digest))
        targets = self.targets  # built from the config at each read in a single-task run: read once
        parts = {
            name: self._score_task(targets[name], digest, model_copy, pending, gpus) for name in (names or list(targets))
        }
        if self.multi:
            return self._multi_result(digest, parts)
        (part,) = parts.values()
        result = {"fingerprint": digest, "cached": part["cached"]}
        result.update({k: part[k] for k in ("eval_seconds", "eval_timing", FINAL) if k in part})
        result.update(part["numbers"])
        result.update(score=float(part["numbers"]["score"]), provenance=self._provenance(digest))
        return result

    def _provenance(self, digest: str) -> dict:
        return {**self.config.provenance, "models": {**self.config.provenance.get("models", {}), "submission": digest}}

    def _multi_result(self, digest: str, parts: dict[str, dict]) -> dict:
        """A multi-task submission's result: each task's numbers under `tasks`, the mean over them at the top level
        (grader.targets.combined); each task's private records (its final part, timings) under `task_records`."""
        targets = self.targets
        tasks = {
            name: task_entry(part["numbers"], targets[name].baseline_score, part["cached"]) for name, part in parts.items()
        }
        result = {"fingerprint": digest, "cached": all(part["cached"] for part in parts.values()), "tasks": tasks}
        result.update(combined(tasks))
        records = {
            name: {k: part[k] for k in ("eval_seconds", "eval_timing", FINAL) if k in part} for name, part in parts.items()
        }
        if any(records.values()):
            result["task_records"] = records
        evaluated = [part["eval_seconds"] for part in parts.values() if "eval_seconds" in part]
        if evaluated:
            result["eval_seconds"] = round(sum(evaluated), 3)
        result["provenance"] = self._provenance(digest)
        return result

    def _score_task(self, target: TaskTarget, digest: str, model_copy: Path, pending: Path, gpus: list[str]) -> dict:
        """One task's numbers for a checkpoint: from the cache (per task and fingerprint), else evaluated under the
        GPU locks (in split mode on both parts). {"numbers", "cached", and when evaluated "eval_seconds",
        "eval_timing"; in split mode FINAL}. In a multi-task run a failure names its task."""
        key = (target.name, digest)
        split = target.partition is not None
        if key in self._cache:
            part = {"numbers": self._cache[key], "cached": True}
            if split:
                part[FINAL] = self._final_cache[key]
            return part
        where = pending / "eval" / target.name if self.multi else pending / "eval"
        where_final = pending / "eval-final" / target.name if self.multi else pending / "eval-final"
        try:
            with ExitStack() as gpu_locks:
                for lock in self.gpu_locks.locks_for(gpus):
                    gpu_locks.enter_context(lock)
                outcome = self._evaluate(digest, model_copy, where, gpus, FEEDBACK if split else None, target)
                # split mode: the final part in the same request, before the answer (see the module's docstring)
                final = self._evaluate(digest, model_copy, where_final, gpus, FINAL, target) if split else None
        except (EvaluationError, GraderFault) as failure:
            if not self.multi:
                raise
            raise _on_task(failure, target.name) from None
        # Numbers only: the child's result also holds the items (completions), which may quote the split.
        numbers = public_metrics(outcome)
        if outcome.get("chat_template") is not None:  # which template its prompts were rendered with
            numbers["chat_template"] = outcome["chat_template"]
        part = {
            "numbers": numbers,
            "cached": False,
            "eval_seconds": float(outcome["eval_seconds"]),
            "eval_timing": {  # where the time went (private: the grader's own bookkeeping)
                "phase_seconds": outcome.get("phase_seconds"),
                "worker": outcome.get("worker") or {"mode": "fresh", "reused": False},
            },
        }
        if final is not None:
            # one duration for the two parts, as the agent would see for the whole split in full mode
            part["eval_seconds"] = round(part["eval_seconds"] + float(final["eval_seconds"]), 3)
            part["eval_timing"][FINAL] = {
                "eval_seconds": final.get("eval_seconds"),
                "phase_seconds": final.get("phase_seconds"),
                "worker": final.get("worker") or {"mode": "fresh", "reused": False},
            }
            part[FINAL] = self._final_cache[key] = self._final_numbers(final, target.partition)
        self._cache[key] = numbers  # only successes are cached; failures are retried
        return part

    def _final_numbers(self, result: dict, partition: dict) -> dict:
        """The ledger's private `final` record of a final-part evaluation: its numbers and the partition's digest."""
        return {**public_metrics(result), "score": float(result["score"]), "partition": partition.get("digest")}

    def _evaluate(
        self, digest: str, model_copy: Path, work_dir: Path, gpus: list[str], part: str | None, target: TaskTarget
    ) -> dict:
        """The evaluation (in a worker: rlbench.evaluation.workers), with a bound on the grader faults one content may cause.

        part: FEEDBACK or FINAL in split mode, the evaluation restricted to that part's items
        (resources["items"], tasks.base.EvalContext.rows); None: the whole split (full mode).

        A child killed by a signal while the model was loaded or run is a grader error (retryable):
        the machine may have been short of memory for other reasons. But the same weights killed
        again and again are most likely too big for it: after GRADER_FAULTS_RETRIED such kills the
        next one is answered as the model's failure (422), so that an agent cannot be told to
        retry it forever. Called with the content's lock held: the count is per content."""
        resources = target.resources
        if part is not None:
            resources = {**resources, "items": list(target.partition[part]["items"])}
        try:
            return self.workers.evaluate(
                target.task_settings,
                model_copy,
                target.eval_dir,
                self.config.evaluation,
                work_dir,
                gpu=",".join(gpus) or None,
                resources=resources,
            )
        except GraderFault as fault:
            if not fault.killed_with_model:
                raise
            kills = self._kills[digest] = self._kills.get(digest, 0) + 1
            if kills <= GRADER_FAULTS_RETRIED:
                left = GRADER_FAULTS_RETRIED - kills + 1
                raise GraderFault(
                    f"{fault}; if the evaluation of these weights is killed {left} more time(s), that will be "
                    "reported as a failure of the model (too big for the memory it is given?)",
                    fault.detail,
                    signal_name=fault.signal_name,
                    phase=fault.phase,
                ) from None
            raise EvaluationError(
                f"the evaluation of these weights was killed {kills} times ({fault.signal_name} while {fault.phase}), "
                "most likely because it ran out of memory; it is no longer retried as a grader error: make sure the "
                "model loads and generates within one evaluation GPU's memory (its size, dtype and configuration) "
                "and submit the new weights",
                fault.detail or str(fault),
            ) from None

    def _record(self, status: int, entry: dict) -> tuple[int, dict]:
        """Ledger (fsync'd), best snapshot and the agent's files; returns (status, response body).

        The entry replaces its pending placeholder and reaches the ledger whatever fails: if it
        cannot be completed it is recorded as a grader error instead, if its line cannot be
        written it is answered as one (_unrecorded), and the side effects after
        the ledger line (best model, agent files) only log their failures: the answer stays true,
        and the next submission rewrites the agent's files."""
        with self._state_lock:
            index = entry["submission_id"] - 1
            try:
                entry = self._completed(entry)
            except Exception as exc:  # noqa: BLE001 - the id must still be recorded
                status, entry = self._failure_entry(index + 1, entry.get("submitted_at") or time.time(), exc)
                self.entries[index] = entry
                with suppress(Exception):
                    self.agent_files.add(entry, best_too=False)
            try:
                self.ledger.write_waiting(self.agent_files, self._after_record)
                self.ledger.append(entry)
            except Exception as exc:  # noqa: BLE001 - not in the ledger: never acknowledged
                status, entry = self._unrecorded(entry, exc)
            else:
                self._after_record(entry)
        return status, public(entry)

    def _unrecorded(self, entry: dict, exc: Exception) -> tuple[int, dict]:
        """The entry's ledger line could not be written (a full disk): nothing of it counts. It
        leaves the agent's view and the cache, its snapshot is deleted, and the request is answered
        as a grader error (503, retryable) under the same id, whose own line is written as soon as
        the disk takes one, before any later line: every id answered has the line it was answered with."""
        sid = entry["submission_id"]
        self.agent_files.forget(sid)
        if entry.get("status") == "scored":  # this request's evaluation, cached by _score
            tasks = entry.get("tasks") or {name: {"cached": False} for name in self.targets}
            for name in (n for n, t in tasks.items() if not t.get("cached")):
                self._cache.pop((name, entry.get("fingerprint")), None)
                self._final_cache.pop((name, entry.get("fingerprint")), None)
        shutil.rmtree(self.snapshots / f"{sid:04d}", ignore_errors=True)
        status, failed = self._failure_entry(sid, entry.get("submitted_at") or time.time(), exc)
        failed.update(model_path=entry.get("model_path"), gpu=entry.get("gpu"))
        self.entries[sid - 1] = failed
        self.ledger.waiting.append(failed)
        self.ledger.try_waiting(self.agent_files, self._after_record)
        return status, failed

    def _completed(self, entry: dict) -> dict:
        """The entry as recorded (strict JSON, repeat_of, best, totals), in place of its placeholder."""
        entry = json_safe(entry)
        if isinstance(entry.get("error"), str):
            entry["error"] = safe_text(entry["error"], ERROR_MAX_CHARS)
        if isinstance(entry.get("error_detail"), str):
            entry["error_detail"] = safe_text(entry["error_detail"], ERROR_DETAIL_MAX_CHARS)
        if entry.get("cached"):
            entry["repeat_of"] = self._earlier_result(entry)
        self.entries[entry["submission_id"] - 1] = entry
        self.agent_files.add(entry)  # the agent's view, and the totals over all recorded
        return entry

    def _after_record(self, entry: dict) -> None:
        """Best snapshot, last_submit_time and the agent's files; failures are logged, not raised."""
        try:
            pending = self.snapshots / f"{entry['submission_id']:04d}" / "model"
            if self.multi:
                self._after_record_multi(entry, pending)
            # Only a real evaluation of the submitted weights can become the best model.
            elif is_scored(entry) and (self.best is None or entry["score"] > self.best["score"]):
                best = {k: entry[k] for k in ("submission_id", "model_path", "score", "improvement", "fingerprint")}
                self._promote_best(pending, best)
                self.best = best
            elif pending.exists():
                shutil.rmtree(pending)  # keep only the best checkpoint on disk
            with suppress(OSError):
                pending.parent.rmdir()  # a refusal's snapshot directory, left empty (no code snapshot)
            if is_submission(entry):
                self.last_submit_time = max(self.last_submit_time or 0, int(entry["responded_at"]))
                self.agent_files.changed("run_meta.json")
        except Exception:  # noqa: BLE001
            traceback.print_exc(file=sys.stderr)
        try:
            self._write_agent_files()
        except Exception:  # noqa: BLE001
            traceback.print_exc(file=sys.stderr)

    def _after_record_multi(self, entry: dict, pending: Path) -> None:
        """A multi-task run keeps each task's best snapshot (grader.targets.BestPerTask) and, as `best`, the best
        mean over all the run's tasks among submissions evaluated on all of them (one model for every task)."""
        self.best_by_task.update(entry, pending)
        if pending.exists():
            shutil.rmtree(pending)  # the tasks it is the best of have it under best_models/
        if is_scored(entry) and len(entry.get("tasks") or {}) == len(self.targets):
            if self.best is None or entry["score"] > self.best["score"]:
                self.best = {k: entry[k] for k in ("submission_id", "model_path", "score", "improvement", "fingerprint")}
                write_json(self.config.grader_dir / "best.json", self.best)

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

    def _promote_best(self, pending: Path, best: dict) -> None:
        staging = self.config.grader_dir / "best_model.new"
        if staging.exists():
            shutil.rmtree(staging)
        pending.rename(staging)
        if self.best_model_dir.exists():
            shutil.rmtree(self.best_model_dir)
        staging.rename(self.best_model_dir)
        write_json(self.config.grader_dir / "best.json", best)

    def warm_up(self) -> None:
        """Start the evaluation worker of the default GPU set now, so that the first submission
        finds torch and the task modules imported (the runner calls it as the run starts)."""
        self.workers.prestart(",".join(self.gpu_locks.available[:1]) or None)

    def close(self) -> None:
        """Stop the evaluation workers (the run is over; an evaluation still running is abandoned).
        A shared pool stays up for the graders that share it."""
        if self._own_workers:
            self.workers.close()

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until no evaluation is in flight (used before the run is closed), at most timeout_s
        seconds when given; True when none is left."""
        with self._idle:
            return self._idle.wait_for(lambda: self._inflight == 0, timeout=timeout_s)

    def health(self) -> dict:
        with self._state_lock:
            return {
                "status": "ok",
                "task": self.config.task_settings["name"],
                **({"tasks": list(self.targets)} if self.multi else {}),
                "workspace": str(self.config.workspace),
                "available_gpus": self.gpu_locks.available,
                "gpus": self.gpu_locks.available,
                "total_submissions": self.agent_files.submissions,
                "requests": len(self.entries) - len(self.ledger.waiting),  # those in the ledger, and in flight
            }


def _on_task(failure: EvaluationError | GraderFault, task: str) -> EvaluationError | GraderFault:
    """A multi-task submission's failure on one task, its message naming the task (names are no secret)."""
    if isinstance(failure, GraderFault):
        return GraderFault(
            f"task {task}: {failure}", failure.detail, signal_name=failure.signal_name, phase=failure.phase
        )
    return EvaluationError(f"task {task}: {failure}", failure.detail)
