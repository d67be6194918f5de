"""What one agent run is given (RunSpec) and what it records (RunRecord, written as run.json)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class RunSpec:
    """One agent run: where it lives, what it may use, how long it has."""

    run_dir: Path
    workspace: Path
    task_settings: dict
    agent: dict
    hf_id: str
    eval_dir: Path
    baseline: dict  # score + fingerprint of the base model
    time_limit_s: float
    kill_grace_s: float = 10.0
    evaluation: dict = field(default_factory=dict)
    # What the task's evaluation may use beyond the split (tasks.base.EvalContext): judge_model_dir,
    # judgment_cache. Outside the workspace, hidden from the agent like the rest of results/.
    resources: dict = field(default_factory=dict)
    # The sweep config's `grader:` block (checkpoint size bound, disk reserve; schema defaults when empty).
    grader: dict = field(default_factory=dict)
    sandbox_backend: str = "auto"
    # sandbox.network: "isolated" (own network namespace; the grader and the agent's allow_ports bridged in) or
    # "host" (the host's network).
    network: str = "isolated"
    hidden_paths: list[Path] = field(default_factory=list)
    # Hidden like the repository, beside the home and caches: run_agent.py passes Snakemake's working directory
    # (its .snakemake/ metadata lists eval sizes and data seeds; with -d it is not the repository).
    masked_paths: list[Path] = field(default_factory=list)
    seed: int = 0
    threads: int = 1
    labels: dict = field(default_factory=dict)  # task/model/agent/seed for run.json
    data: dict = field(default_factory=dict)  # hashes of the splits, for provenance
    # scoring.feedback split: the held-out split's partition (partition.json); None: full mode (the reference's)
    partition: dict | None = None
    # A multi-task run: its tasks in run order, each {"task_settings", "eval_dir", "baseline", "resources",
    # "partition"} (what the grader evaluates that task with; grader.targets.TaskTarget). The single-task fields
    # above then describe the run as a whole: task_settings {"name": "multi", "tasks": {task: settings}}, baseline
    # the base model's record (fingerprint, size, chat template: the same model for every task), eval_dir and
    # partition unused. None: a single-task run.
    members: dict[str, dict] | None = None

    @property
    def tasks(self) -> list[str] | None:
        """A multi-task run's tasks, in run order (the agent's TASKS); None for a single-task run."""
        return list(self.members) if self.members else None


@dataclass
class RunRecord:
    """run.json: what happened to one agent run."""

    status: str  # completed | failed | timeout | error | interrupted | stopped
    # The exit status of the process the runner started, as Popen reports it (negative: killed by that signal).
    # Backend none: the agent's command itself. Backend bubblewrap: bwrap, which passes on its command's exit
    # code, reports a command killed by signal n as 128+n, and is itself what the runner SIGKILLs at the end of
    # the grace period (then -9; every process in the sandbox dies with it).
    exit_code: int | None
    timed_out: bool
    start_time: float
    end_time: float
    duration_s: float
    time_limit_s: float
    submissions: int
    valid_submissions: int
    best: dict | None
    sandbox: str
    sandbox_note: str
    command: list[str]
    gpus: list[str]  # CUDA_VISIBLE_DEVICES given to the agent and the grader (by SLURM, say)
    attempt: int = 1
    previous_attempts: list[str] = field(default_factory=list)  # archived under attempts/<k>/
    error: str | None = None
    labels: dict = field(default_factory=dict)
    provenance: dict = field(default_factory=dict)
    # The signal that ended the agent's command ("SIGKILL", "SIGTERM", ...), null when it exited by itself: from a
    # negative exit_code, and under bubblewrap also from 128+n (so there an agent that itself exits with 129-192
    # reads as signalled, as in a shell).
    exit_signal: str | None = None
    # Processes of the run (found by the run marker in their environment) still running once the agent's own
    # process had ended, or after its tree was killed at the deadline or interrupt: daemons it left behind.
    # All were SIGKILLed before run.json was written.
    stray_processes: int = 0
    # Why an interrupted run stopped: the signal the runner got, and whether the Snakemake that started it was gone.
    interrupted_by: str | None = None
    agent_kind: str = "script"  # script (a reference agent) or cli (a coding-agent tool driven by an LLM)
    # status "stopped": why the runner ended the run early ({"kind": "llm_endpoint_dead" | "llm_limit", "detail"}).
    stopped_by: dict | None = None
    # kind cli: the tool and its version, the driver (no key), limits, token totals (from the gateway) and usage as
    # the gateway and the tool's own log report it, where the prompt, the tool's logs and the transcript are.
    llm: dict | None = None
    # What the agent could reach: {"isolated": bool, "reachable": ["127.0.0.1:<port> (grader)", ...] or ["*"] when
    # it shared the host's network, "note": str}.
    network: dict = field(default_factory=dict)
    # The agent's memory and process limits: {"memory_bytes", "processes", "enforced_by": "cgroup v2" | "cgroup v1"
    # | null, "oom_kills": processes the kernel killed at the memory limit, "note": why nothing enforced them}.
    limits: dict | None = None
    # A multi-task run: its tasks, and per task the best really scored submission (grader/best_by_task.json);
    # `best` is then the best mean over all the tasks among the submissions evaluated on all of them.
    tasks: list[str] | None = None
    best_by_task: dict | None = None
    # The GPU pre-flight, before the budget started (agent_run.preflight.gpu_preflight): {"ok", "checked",
    # "message", "gpus"}. Not ok: status error, `error` says why, and the agent was never started.
    preflight: dict | None = None
