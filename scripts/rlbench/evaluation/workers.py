"""Warm evaluation workers: one long-lived evaluation process per GPU set (or the CPU).

A fresh interpreter per submission (rlbench.evaluation.child.run_in_child) pays Python's start, the
imports of torch and transformers and the task modules before the first token: seconds that the
agent waits for at every /submit. A worker pays them once, before the first submission when the
grader is told to warm up, and then evaluates request after request, each exactly as run_in_child
would: the same request file, the same phase file, the same result or error file, its own
eval.log, and the same classification of failures by fault (rlbench.evaluation.request.read_outcome).

Crash containment is unchanged: the evaluation runs in another process, never in the grader. A
worker that dies while evaluating (a crash, an out-of-memory kill) fails only that submission
(GraderFault, or EvaluationError when it ran past the timeout, as before) and is replaced. A
worker is reused only after a clean success: after any failure, and after every vLLM evaluation
(vLLM does not give its GPU memory back inside a process), it exits and a fresh one is started
right away, which has imported what it needs but holds no GPU memory until it evaluates. A worker
that dies while idle is noticed (its replies reach EOF) and replaced before a submission needs it;
a submission handed to a worker in the instant it dies, before the worker has accepted it (its
first reply to a request, written before anything is done with it), goes to a fresh worker
instead, once: it costs no submission.
While it evaluates, a worker keeps the memory generation frees for its next steps; between
evaluations it frees the model (garbage collection, CUDA's cached blocks, malloc's free pages:
rlbench.evaluation.memory). A worker that evaluated on a GPU and then sat idle for `worker_idle_s`
seconds is replaced by a fresh one, so that the agent's own training gets back the CUDA context too.
Workers die with the grader (rlbench.proc.lifeline; each is started from its own long-lived thread,
the thread the kernel ties the lifeline to).

Settings (the config's `evaluation` block, defaults in its schema): `worker` (`warm` or `fresh`: one
process per evaluation) and `worker_idle_s`.
"""

from __future__ import annotations

import importlib
import json
import os
import queue
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path

from rlbench.config import evaluation_settings
from rlbench.evaluation.child import run_in_child
from rlbench.evaluation.memory import keep_freed_memory, release_memory
from rlbench.evaluation.request import EvaluationError, GraderFault, read_outcome, write_request
from rlbench.paths import SCRIPTS_DIR
from rlbench.fileio.jsonio import read_json
from rlbench.proc.lifeline import die_with_parent

WARM_MODEL_FAMILIES = ("qwen2", "qwen3", "llama")
# How long close() waits for a worker to leave on its own before killing it.
STOP_GRACE_S = 5.0
# How long a new worker may take to import what it needs before it is given up on.
STARTUP_TIMEOUT_S = 600.0
# How often an idle slot looks at its worker (did it die?): a bound on the queue wait, no delay to jobs.
WATCH_S = 0.25
# Workers that die idle one after another are replaced this many times; then the next job starts one.
IDLE_DEATHS_REPLACED = 3
_READY = "ready"
_ACCEPTED = "accepted"


# -- the worker process ----------------------------------------------------------------------
def worker_main(parent_pid: str) -> None:
    """`python -m rlbench.evaluation --worker PARENT_PID`: requests as JSON lines on stdin,
    replies as JSON lines on the stdout it was started with; everything the evaluations print
    goes to each request's eval.log (between requests: to the worker's own log, its stderr)."""
    die_with_parent(int(parent_pid))
    keep_freed_memory()  # before anything allocates: every evaluation's buffers are reused (evaluation.memory)
    from rlbench.evaluation.evaluate import serve_request

    replies = os.fdopen(os.dup(1), "w", buffering=1)
    requests = os.fdopen(os.dup(0), "r")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # nothing an evaluation does may read the grader's requests
    os.close(null)
    idle_out = os.dup(2)  # the worker's own log
    os.dup2(idle_out, 1)
    started = time.perf_counter()
    _import_ahead()
    replies.write(json.dumps({_READY: True, "pid": os.getpid(), "startup_s": round(time.perf_counter() - started, 3)}) + "\n")
    for line in requests:
        message = json.loads(line)
        # The job is this worker's from now on: before this line, a worker that dies has done nothing
        # with it, and the grader hands it to a fresh worker (rlbench.evaluation.workers._Slot._run).
        replies.write(json.dumps({"id": message["id"], _ACCEPTED: True}) + "\n")
        _flush()
        log = os.open(message["log"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o644)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        try:
            ok = serve_request(message["request"], message["result"], message["error"])
        finally:
            _flush()
            os.dup2(idle_out, 1)
            os.dup2(idle_out, 2)
        reusable = ok and _reusable(Path(message["result"]))
        release_memory()
        replies.write(json.dumps({"id": message["id"], "ok": ok, "reusable": reusable}) + "\n")
        if not reusable:
            return


def _import_ahead() -> None:
    """What every evaluation imports, imported before the first request (the warm part)."""
    import torch  # noqa: F401
    import transformers  # noqa: F401
    from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: F401

    import rlbench.generation.backends  # noqa: F401
    import rlbench.tasks  # noqa: F401

    # transformers imports a model's code when it first loads one: the families of the registry's
    # models (Qwen2.5, Qwen3, SmolLM2 = Llama) are imported now, not during the first submission.
    for family in WARM_MODEL_FAMILIES:
        try:
            importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        except ImportError:
            pass


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass


def _reusable(result_path: Path) -> bool:
    """A worker is reused after an evaluation whose backend gives its memory back (not vLLM)."""
    try:
        return read_json(result_path).get("backend") != "vllm"
    except (OSError, ValueError, AttributeError):
        return False


# -- the grader's side -----------------------------------------------------------------------
@dataclass
class _Job:
    id: int
    work_dir: Path
    timeout: float
    future: Future = field(default_factory=Future)


class _Timeout(Exception):
    pass


class _Slot:
    """One GPU set's worker, driven by its own thread (which starts every process of the slot, so
    that each dies with the grader: lifeline.die_with_parent is tied to the starting thread).

    While idle with a live process the thread also watches that process (EOF on its replies, its
    exit status, every WATCH_S seconds): a worker that died idle (killed, out of memory) is
    replaced before a submission needs it. A job handed to a worker that dies before it has
    accepted the job (the race with such a death) is handed to a fresh worker, once."""

    def __init__(self, pool: "WorkerPool", gpu: str | None):
        self.pool, self.gpu = pool, gpu
        self.gpus = set(gpu.split(",")) if gpu else set()
        self.jobs: queue.Queue = queue.Queue()
        self._lock = threading.Lock()  # guards proc (close() may kill it from another thread)
        self.proc: subprocess.Popen | None = None
        self._buffer = b""
        self.ready = False  # the current process has finished its imports
        self.ready_event = threading.Event()  # set while a process that finished its imports is up
        self.used = False  # the current process has evaluated (it may hold GPU memory)
        self.last_used = 0.0
        self.startup_s: float | None = None
        self.idle_deaths = 0  # workers in a row that died idle (reset by a job's answer)
        self.thread = threading.Thread(target=self._loop, name=f"eval-worker-{gpu or 'cpu'}", daemon=True)
        self.thread.start()

    # commands, from any thread
    def run(self, job: _Job) -> dict:
        self.jobs.put(job)
        return job.future.result()

    def prestart(self) -> None:
        self.jobs.put("prestart")

    def release(self) -> None:
        """Stop the process (another slot needs these GPUs); the next job starts a new one."""
        self.jobs.put("release")

    def close(self) -> None:
        self.jobs.put(None)
        self.kill()  # an evaluation in flight is abandoned (the grader is stopping)
        self.thread.join(timeout=STOP_GRACE_S + 5)

    def kill(self) -> None:
        with self._lock:
            proc = self.proc
        if proc is not None and proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass

    # the slot's thread
    def _loop(self) -> None:
        while True:
            try:
                command = self.jobs.get(timeout=self._wait())
            except queue.Empty:
                self._tend()
                continue
            if command is None:
                self._stop()
                return
            if command == "prestart":
                self._alive() or self._start_quietly()
                continue
            if command == "release":
                self._stop()
                continue
            try:
                command.future.set_result(self._run(command))
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting submission
                command.future.set_exception(exc)
            if self.proc is None and not self.pool.closed:
                self._start_quietly()  # the next submission finds a warm worker

    def _wait(self) -> float | None:
        """How long to wait for a command: forever without a process, else until the next look at it."""
        if self.proc is None:
            return None
        idle_end = self._idle_end()
        if idle_end is None:
            return WATCH_S
        return min(WATCH_S, max(0.0, idle_end - time.monotonic()))

    def _idle_end(self) -> float | None:
        """When a process that evaluated on a GPU has been idle long enough to be replaced."""
        if not (self.gpus and self.used):
            return None
        return self.last_used + self.pool.idle_s

    def _tend(self) -> None:
        """The idle process, looked at: one that died is replaced (a limited number of times in a
        row), and so is one idle on a GPU for too long (a fresh process holds no GPU memory)."""
        if self.proc is None or self.pool.closed:
            return
        if self._died():
            self.idle_deaths += 1
            replace = self.idle_deaths <= IDLE_DEATHS_REPLACED
            proc = self.proc
            self._stop()
            print(
                f"rlbench.evaluation.workers: the idle evaluation worker {proc.pid} ({self.gpu or 'cpu'}) died"
                f" (exit status {proc.returncode}); {'replacing it' if replace else 'the next job starts one'}",
                file=sys.stderr,
            )
            if replace:
                self._start_quietly()
            return
        idle_end = self._idle_end()
        if idle_end is not None and time.monotonic() >= idle_end:
            self._stop()
            self._start_quietly()

    def _died(self) -> bool:
        """The idle process has exited, or is exiting: its exit status is known, or its replies
        reached EOF (psutil may call a killed worker a zombie while its other threads still exit,
        before waitpid reports it: EOF comes when the last of them has closed its files)."""
        if self.proc.poll() is not None:
            return True
        fd = self.proc.stdout.fileno()
        while select.select([fd], [], [], 0)[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                return True
            self._buffer += chunk  # nothing is expected between jobs; kept for _reply, which skips it
        return False

    def _alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _start_quietly(self) -> None:
        """_start ahead of need: a failure (no process could be started) is logged, never raised,
        so this thread lives on; the next job tries again and says why if it fails then."""
        try:
            self._start()
        except Exception:  # noqa: BLE001
            traceback.print_exc(file=sys.stderr)
            self._stop()

    def _start(self) -> None:
        self._stop()
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SCRIPTS_DIR), env.get("PYTHONPATH")]))
        if self.gpu is not None:
            env["CUDA_VISIBLE_DEVICES"] = self.gpu
        self.pool.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.pool.log_dir / f"worker-{self.gpu or 'cpu'}.log", "ab") as log:
            proc = subprocess.Popen(
                [sys.executable, "-m", "rlbench.evaluation", "--worker", str(os.getpid())],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=env,
                start_new_session=True,  # its own process group: a kill reaches what it started
            )
        with self._lock:
            self.proc = proc
        self._buffer, self.ready, self.used, self.startup_s = b"", False, False, None
        self.pool.starts += 1
        try:  # its imports, before anything is asked of it
            if self._reply(None, time.monotonic() + STARTUP_TIMEOUT_S) is None:
                self._stop()  # it died importing: the next job tries a new one, and says why if it fails
        except _Timeout:
            self._stop()

    def _stop(self) -> None:
        """End the process: EOF on its requests, a grace period, then SIGKILL to its group."""
        self.ready_event.clear()
        with self._lock:
            proc, self.proc = self.proc, None
        if proc is None:
            return
        try:
            proc.stdin.close()
        except OSError:
            pass
        try:
            proc.wait(timeout=STOP_GRACE_S if proc.poll() is None and self.ready else 0.5)
        except subprocess.TimeoutExpired:
            pass
        if proc.poll() is None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            proc.wait()
        proc.stdout.close()

    def _run(self, job: _Job) -> dict:
        if self.pool.closed:
            raise RuntimeError("the evaluation workers are closed")
        self.pool.overlapping_released(self)
        paths = _paths(job.work_dir)
        message = {"id": job.id, **{k: str(v) for k, v in paths.items()}}
        handed_over = False
        try:
            while True:
                proc = self._ready_process()
                reused = self.used
                accepted, reply = self._hand(proc, job, message)
                if reply is not None or accepted or handed_over or self.pool.closed:
                    break
                # It died before it read the job (killed while idle, just before the job came): it
                # did nothing with it, so the job costs no submission: a fresh worker gets it, once
                # (a job that kills every worker it is handed to still fails, below).
                handed_over = True
                self._stop()
                print(
                    f"rlbench.evaluation.workers: the evaluation worker {proc.pid} died before it accepted job {job.id}"
                    f" (exit status {proc.returncode}); the job goes to a new worker",
                    file=sys.stderr,
                )
        except _Timeout:
            self.kill()
            self._stop()
            raise EvaluationError(f"evaluation took longer than {job.timeout:g} s and was stopped") from None
        finally:
            shutil.rmtree(job.work_dir / "scratch", ignore_errors=True)
        self.used, self.last_used, self.idle_deaths = True, time.monotonic(), 0
        if reply is None:  # the process ended without answering: killed, or crashed
            with self._lock:
                self.proc = None
            returncode = proc.wait()
            proc.stdout.close()
            self.pool.crashes += 1
            return read_outcome(returncode, paths["result"], paths["error"], paths["log"], paths["phase"])
        if not (reply.get("ok") and reply.get("reusable")):
            self._stop()  # never reuse a process after a failure, nor after vLLM
        outcome = read_outcome(0 if reply.get("ok") else 1, paths["result"], paths["error"], paths["log"], paths["phase"])
        outcome["worker"] = {"mode": "warm", "reused": reused, "startup_s": self.startup_s, "handed_over": handed_over}
        return outcome

    def _ready_process(self) -> subprocess.Popen:
        """The slot's process, started now if there is none (GraderFault when none starts)."""
        if not self._alive():
            self._start()
        if self.proc is None:
            log = self.pool.log_dir / f"worker-{self.gpu or 'cpu'}.log"
            raise GraderFault(
                "the evaluation worker did not start",
                f"the evaluation worker exited or hung while importing; see {log}",
            )
        return self.proc

    def _hand(self, proc: subprocess.Popen, job: _Job, message: dict) -> tuple[bool, dict | None]:
        """Send the job; (whether the worker accepted it, its answer: None when it died first)."""
        deadline = time.monotonic() + job.timeout
        try:
            proc.stdin.write((json.dumps(message) + "\n").encode())
            proc.stdin.flush()
        except OSError:
            pass  # it died: its exit status tells how
        accepted = False
        while True:
            reply = self._reply(job.id, deadline)
            if reply is not None and reply.get(_ACCEPTED):
                accepted = True
                continue
            return accepted, reply

    def _reply(self, job_id: int | None, deadline: float) -> dict | None:
        """The worker's answer to this job (None: its stdout closed, it is gone); the ready line
        on the way is noted (job_id None: the ready line is the answer)."""
        while True:
            line = self._line(deadline)
            if line is None:
                return None
            try:
                reply = json.loads(line)
            except ValueError:
                continue
            if reply.get(_READY):
                self.ready, self.startup_s = True, reply.get("startup_s")
                self.ready_event.set()
                if job_id is None:
                    return reply
                continue
            if reply.get("id") == job_id:
                return reply

    def _line(self, deadline: float) -> bytes | None:
        fd = self.proc.stdout.fileno()
        while b"\n" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Timeout()
            readable, _, _ = select.select([fd], [], [], left)
            if not readable:
                raise _Timeout()
            chunk = os.read(fd, 65536)
            if not chunk:
                return None
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line


def _paths(work_dir: Path) -> dict[str, Path]:
    return {
        "request": work_dir / "request.json",
        "result": work_dir / "result.json",
        "error": work_dir / "error.json",
        "log": work_dir / "eval.log",
        "phase": work_dir / "phase.json",
    }


class WorkerPool:
    """The grader's evaluations, in warm workers (one per GPU set) or, with mode `fresh`, in a new
    process each (run_in_child). evaluate() has run_in_child's arguments, result and errors."""

    def __init__(self, log_dir: Path, mode: str, idle_s: float):
        self.log_dir, self.mode, self.idle_s = Path(log_dir), mode, float(idle_s)
        self._slots: dict[str | None, _Slot] = {}
        self._lock = threading.Lock()
        self._ids = 0
        self.closed = False
        self.starts = 0  # worker processes started (a measure of warmth, for tests and benchmarks)
        self.crashes = 0

    @classmethod
    def from_settings(cls, log_dir: Path, evaluation: dict) -> "WorkerPool":
        """The pool the config's `evaluation:` block asks for (ConfigError for a mode the schema does not allow)."""
        settings = evaluation_settings(evaluation)
        return cls(log_dir, settings["worker"], settings["worker_idle_s"])

    def _slot(self, gpu: str | None) -> _Slot:
        with self._lock:
            if self.closed:
                raise RuntimeError("the evaluation workers are closed")
            slot = self._slots.get(gpu)
            if slot is None:
                slot = self._slots[gpu] = _Slot(self, gpu)
            return slot

    def overlapping_released(self, slot: _Slot) -> None:
        """Other slots sharing a GPU with this one stop their processes (one per GPU at a time).
        They are idle: the grader holds the locks of these GPUs while this one evaluates."""
        with self._lock:
            others = [s for s in self._slots.values() if s is not slot and s.gpus & slot.gpus]
        for other in others:
            other.release()

    def prestart(self, gpu: str | None = None) -> None:
        """Start the worker of this GPU set now (imports done before the first submission)."""
        if self.mode == "warm":
            self._slot(gpu).prestart()

    def wait_ready(self, gpu: str | None = None, timeout: float | None = None) -> bool:
        """Wait until the worker of this GPU set has done its imports (benchmarks, tests)."""
        return self.mode == "warm" and self._slot(gpu).ready_event.wait(timeout)

    def worker_pid(self, gpu: str | None = None) -> int | None:
        """The pid of the worker process of this GPU set now (None: it has none; tests, diagnostics)."""
        with self._lock:
            slot = self._slots.get(gpu)
        if slot is None:
            return None
        with slot._lock:
            proc = slot.proc
        return None if proc is None else proc.pid

    def evaluate(
        self,
        task_settings: dict,
        model_dir: Path,
        eval_dir: Path,
        evaluation: dict,
        work_dir: Path,
        gpu: str | None = None,
        resources: dict | None = None,
        replicate: int = 0,
    ) -> dict:
        if self.mode == "fresh":
            return run_in_child(task_settings, model_dir, eval_dir, evaluation, work_dir, gpu, resources, replicate)
        write_request(task_settings, model_dir, eval_dir, evaluation, work_dir, resources, replicate)
        with self._lock:
            self._ids += 1
            job_id = self._ids
        job = _Job(job_id, work_dir, float(evaluation_settings(evaluation)["eval_timeout_s"]))
        return self._slot(gpu).run(job)

    def close(self) -> None:
        """Stop every worker (an evaluation in flight is abandoned: its process is killed)."""
        with self._lock:
            self.closed = True
            slots = list(self._slots.values())
        for slot in slots:
            slot.close()
