"""Run one agent under its budget: grader up, agent sandboxed, process tree killed at the deadline."""

from __future__ import annotations

import os
import subprocess
import time
from contextlib import ExitStack
from dataclasses import asdict
from pathlib import Path

from rlbench.agent_run.attempts import attempt_recorded, begin_attempt, previous_attempts
from rlbench.agent_run.environment import (
    PRIVATE_HOME,
    agent_command,
    agent_env,
    masked_paths,
    readiness_problems,
    refuse_provider_key,
    visible_gpus,
    visible_paths,
)
from rlbench.agent_run.preflight import gpu_preflight
from rlbench.agent_run.process_tree import agent_processes, exit_signal, kill_tree, stop_strays
from rlbench.agent_run.spec import RunRecord, RunSpec
from rlbench.agent_run.supervision import DiskWatch, StopRequest, supervise
from rlbench.agent_run.workspace import readonly_parts, rebuild_workspace, unshare_readonly_files
from rlbench.coding_agents.session import CliSession, scrub_provider_keys
from rlbench.config import grader_settings
from rlbench.evaluation.evaluate import base_chat_template, base_model_bytes, delta_baseline
from rlbench.fileio.jsonio import read_json, write_json
from rlbench.grader.grading import Grader, GraderConfig
from rlbench.grader.server import GradingServer, new_secret
from rlbench.grader.targets import TaskTarget
from rlbench.recording.ledger import is_scored
from rlbench.recording.provenance import provenance
from rlbench.recording.trace import ResourceSampler, tree_of
from rlbench.sandbox import bubblewrap as sandbox
from rlbench.sandbox.limits import AgentCgroup, limit_settings


def run_agent(spec: RunSpec) -> RunRecord:
    """Run the agent to completion or deadline; always returns (and writes) a run record.

    Before the budget starts, the GPU pre-flight (agent_run.preflight) checks the GPUs the job was given; when
    they are missing, busy or smaller than expected, the agent is not started and the run ends with status
    error, its reason in run.json (`error`, `preflight`).

    When an earlier attempt of this run was interrupted, it is archived under attempts/<k>/ (ledger included)
    and the agent starts again from a fresh workspace. A SIGTERM/SIGINT to the runner stops the agent and
    ends the run with status interrupted. At the end of every run, whatever the
    outcome, every process carrying the run's marker is killed.
    """
    with StopRequest() as stop:
        return _run_agent(spec, stop)


def _baseline_final(baseline: dict, partition: dict | None, evaluation: dict) -> dict:
    """split mode: the base model's numbers on the final part (baseline.json final_split), its score the one
    evaluation.baseline_score chooses; {} in full mode (the grader refuses split mode without them)."""
    final_split = baseline.get("final_split") if partition is not None else None
    if not isinstance(final_split, dict):
        return {}
    return {**final_split, "score": delta_baseline(final_split, evaluation)[0]}


def _targets(spec: RunSpec, base_template: str | None) -> dict[str, TaskTarget] | None:
    """A multi-task run's grader targets (grader.targets), one per member task; None for a single-task run."""
    if not spec.members:
        return None
    targets = {}
    for name, member in spec.members.items():
        baseline = member["baseline"]
        targets[name] = TaskTarget(
            task_settings=member["task_settings"],
            eval_dir=Path(member["eval_dir"]).resolve(),
            baseline_score=delta_baseline(baseline, spec.evaluation)[0],
            baseline_fingerprint=baseline["fingerprint"],
            baseline_metrics=baseline,
            resources={
                **(member.get("resources") or {}),
                "base_chat_template": base_template,
                "model_generation": baseline.get("model_generation"),
            },
            partition=member.get("partition"),
            baseline_final_metrics=_baseline_final(baseline, member.get("partition"), spec.evaluation),
        )
    return targets


def _run_agent(spec: RunSpec, stop: StopRequest) -> RunRecord:
    # Checked before anything is archived or started: a baseline without it is refused (rerun it).
    base_template = base_chat_template(spec.baseline)
    guard = grader_settings(spec.grader)
    max_checkpoint_bytes = int(guard["checkpoint_size_factor"] * base_model_bytes(spec.baseline))
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    if attempt_recorded(spec.run_dir):  # an interrupted attempt: archived once a fresh workspace is built
        rebuild_workspace(read_json(spec.run_dir / "workspace.json"))
    # Unsandboxed, nothing binds models/ and data/ read-only: they become private copies, not links into results/
    # (before the clock starts: copying a large model is not the agent's time).
    if spec.sandbox_backend == "none" or not sandbox.bubblewrap_available()[0]:
        unshare_readonly_files(spec.workspace)
    grader_dir = spec.run_dir / "grader"
    command = agent_command(spec.agent) if spec.agent.get("kind") != "cli" else []  # cli: planned by its adapter
    marker = new_secret()
    attempt = begin_attempt(spec.run_dir, marker)
    # Before the budget starts: the GPUs the job was given exist, are idle and have the memory expected.
    preflight = gpu_preflight(visible_gpus())
    start = time.time()
    record_provenance = provenance(
        spec.task_settings,
        data=spec.data,
        models={"base": spec.baseline["fingerprint"]},
        evaluation=spec.evaluation,
    )
    targets = _targets(spec, base_template)
    grader = Grader(
        GraderConfig(
            workspace=spec.workspace.resolve(),
            grader_dir=grader_dir,
            task_settings=spec.task_settings,
            eval_dir=spec.eval_dir.resolve(),
            # what improvements are computed against (evaluation.baseline_score: first or mean; a multi-task run:
            # the mean of its tasks')
            baseline_score=(
                delta_baseline(spec.baseline, spec.evaluation)[0]
                if targets is None
                else sum(t.baseline_score for t in targets.values()) / len(targets)
            ),
            baseline_fingerprint=spec.baseline["fingerprint"],
            start_time=start,
            timeout_s=spec.time_limit_s,
            secret=new_secret(),
            evaluation=spec.evaluation,
            baseline_metrics=spec.baseline,
            # The base model's chat template, which the submissions' prompts are rendered with.
            resources={
                **spec.resources,
                "base_chat_template": base_template,
                "model_generation": spec.baseline.get("model_generation"),
            },
            gpus=visible_gpus(),
            provenance=record_provenance,
            max_checkpoint_bytes=max_checkpoint_bytes,
            disk_reserve_bytes=guard["disk_reserve_bytes"],
            partition=spec.partition,
            baseline_final_metrics=_baseline_final(spec.baseline, spec.partition, spec.evaluation),
            tasks=targets,
        )
    )
    if preflight["ok"]:
        grader.warm_up()  # the evaluation worker imports torch while the agent starts
    exit_code, timed_out, error, status, strays, limits = None, False, None, "error", 0, None
    plan = sandbox.SandboxPlan("none", command, "not started")
    cli = None
    if spec.agent.get("kind") == "cli":  # a coding-agent tool driven by an LLM through the run's gateway
        cli = CliSession(spec.agent, spec.workspace, spec.run_dir, spec.time_limit_s, spec.workspace / PRIVATE_HOME)
        problems = cli.readiness()
    else:
        problems = readiness_problems(spec.agent)
    stopped_by: dict | None = None
    log_path = spec.workspace / "agent.log"
    with GradingServer(grader) as server:
        if not preflight["ok"]:
            error = f"GPU pre-flight failed, the agent was not started: {preflight['message']}"
        elif problems:
            error = f"agent {spec.agent['name']!r} is not ready: " + "; ".join(problems)
        elif stop.reason is not None:
            status = "interrupted"
        else:
            proc = None
            # The agent's memory and process limits (a cgroup of its own) and its OOM score, above the grader's.
            cgroup = AgentCgroup(f"rlbench-agent-{os.getpid()}", **limit_settings(spec.agent.get("limits"))).__enter__()
            try:
                with ExitStack() as running:
                    env = scrub_provider_keys(agent_env(spec, server.url, marker), spec.agent.get("driver"))
                    visible = visible_paths()
                    stdout_path, stderr_path = log_path, None
                    if cli is not None:
                        running.enter_context(cli)  # gateway up, launch planned, the tool's files written
                        command = cli.argv
                        env.update(cli.env)
                        refuse_provider_key(env, command, spec.agent.get("driver"))
                        visible += cli.visible
                        stdout_path, stderr_path = cli.stdout_path, cli.stderr_path
                    plan = sandbox.plan(
                        command,
                        spec.workspace,
                        hidden=spec.hidden_paths,
                        readonly_inside=readonly_parts(spec.workspace),
                        backend=spec.sandbox_backend,
                        visible=visible,
                        masked=masked_paths(spec.masked_paths),
                        identity_dir=spec.run_dir / "sandbox-etc",  # the synthetic /etc/passwd and /etc/group
                        network=sandbox.network_policy(
                            spec.network,
                            spec.run_dir / "net",
                            {server.port: "grader", **(cli.ports if cli is not None else {})},
                            extra=(spec.agent.get("network") or {}).get("allow_ports", []),
                        ),
                    )
                    running.enter_context(plan.bridge())  # the network bridge's host side, while the agent runs
                    (spec.workspace / PRIVATE_HOME).mkdir(exist_ok=True)
                    log = running.enter_context(open(stdout_path, "ab"))
                    err = running.enter_context(open(stderr_path, "ab")) if stderr_path else subprocess.STDOUT
                    proc = subprocess.Popen(
                        cgroup.wrap(plan.argv),
                        cwd=spec.workspace,
                        env=env,
                        stdin=subprocess.DEVNULL,
                        stdout=log,
                        stderr=err,
                        start_new_session=True,
                    )
                    # CPU, RAM, disk (and GPU memory where nvidia-smi exists) of the agent, sampled while it runs.
                    running.enter_context(
                        ResourceSampler(
                            lambda: tree_of(proc.pid) + agent_processes(proc, marker),
                            spec.workspace,
                            spec.run_dir / "resources.jsonl",
                            interval_s=5,
                            log_path=stdout_path,
                            gpus=visible_gpus(),
                        )
                    )
                    # What ends the run early: the LLM gateway (dead endpoint, a limit), the workspace's disk.
                    checks = [cli.stop_reason] if cli is not None else []
                    disk_limit = (spec.agent.get("limits") or {}).get("disk_bytes")
                    if disk_limit is not None:
                        checks.append(DiskWatch(spec.workspace, disk_limit))
                    reason: list = []
                    watch = None
                    if checks:
                        watch = lambda: reason.append(next(filter(None, (c() for c in checks)), None)) or reason[-1]  # noqa: E731
                    exit_code, ending = supervise(
                        proc,
                        grader.config.deadline,
                        spec.kill_grace_s,
                        marker,
                        stop,
                        plan.backend == "bubblewrap",
                        check=watch,
                    )
                    if ending == "stopped":
                        kind, detail = reason[-1]
                        stopped_by = {"kind": kind, "detail": detail}
                        error = f"the run was stopped: {detail}"
                timed_out = ending == "timeout"
                if ending == "exited":
                    status = "completed" if exit_code == 0 else "failed"
                else:
                    status = ending
            except (OSError, RuntimeError) as exc:
                error = f"could not start the agent: {exc}"
            finally:
                if proc is not None and proc.poll() is None:  # an unexpected exception left it running
                    kill_tree(proc, spec.kill_grace_s, marker, plan.backend == "bubblewrap")
                strays = stop_strays(marker, plan.backend == "bubblewrap")
                limits = cgroup.record()
                cgroup.__exit__(None, None, None)
                if limits["oom_kills"] and status == "failed" and stopped_by is None:  # the kernel ended it
                    detail = (
                        f"the kernel killed {limits['oom_kills']} agent process(es) at its memory limit "
                        f"(limits.memory_bytes {limits['memory_bytes']})"
                    )
                    stopped_by, error = {"kind": "memory_limit", "detail": detail}, f"the run was stopped: {detail}"
                    status = "stopped"
        if status == "interrupted":  # nobody waits for the answers of evaluations still in flight
            server.drain_timeout_s = spec.kill_grace_s
    end = time.time()
    grader.finish(end)  # run_meta.json's end_time: the agent has stopped, the server has drained
    scored = [e for e in grader.entries if is_scored(e)]
    record = RunRecord(
        status=status,
        exit_code=exit_code,
        timed_out=timed_out,
        start_time=start,
        end_time=end,
        duration_s=round(end - start, 3),
        time_limit_s=spec.time_limit_s,
        submissions=len(grader.entries),
        valid_submissions=len(scored),
        best=grader.best,
        sandbox=plan.backend,
        sandbox_note=plan.note,
        command=command,
        gpus=grader.config.gpus,
        attempt=attempt,
        previous_attempts=previous_attempts(spec.run_dir),
        error=error,
        labels=spec.labels,
        provenance=record_provenance,
        exit_signal=exit_signal(exit_code, plan.backend == "bubblewrap"),
        stray_processes=strays,
        interrupted_by=stop.reason if status == "interrupted" else None,
        agent_kind=spec.agent.get("kind", "script"),
        stopped_by=stopped_by,
        network=plan.network,
        limits=limits,
        tasks=spec.tasks,
        best_by_task=dict(grader.best_by_task.best) if spec.members else None,
        preflight=preflight,
    )
    if cli is not None:
        record.llm = cli.record()
    write_json(spec.run_dir / "run.json", asdict(record))
    return record
