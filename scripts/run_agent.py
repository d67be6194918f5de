"""Rule run_agent: grader up, agent run under its budget; an agent's failure is a result, not an error."""

import os
import sys
from pathlib import Path

sys.stderr = open(snakemake.log[0], "w")

from rlbench.config import current_task_settings
from rlbench.evaluation.evaluate import evaluation_resources
from rlbench.fileio.jsonio import read_json
from rlbench.agent_run.runner import run_agent
from rlbench.agent_run.spec import RunSpec
from rlbench.agent_run.supervision import stop_with_owner

# The runner must not outlive the Snakemake that started it: killed with -9, Snakemake cannot stop its jobs,
# and an orphaned runner (agent and grader included) would race the attempt a resumed sweep starts. When the
# Snakemake process is gone the runner gets SIGTERM: the agent is stopped, run.json says interrupted, and the
# runner exits. Snakemake runs this script as its direct child (bash execs it); see stop_with_owner.
owner = stop_with_owner()
print(f"runner {os.getpid()} stops when pid {owner.pid} ({owner.name()}) is gone", file=sys.stderr)
run_dir = Path(snakemake.output.run).parent
budget = snakemake.params.budget
config = snakemake.config
results = Path(snakemake.params.results)


def task_inputs(prefix: str = "") -> dict:
    """One task's inputs: all of them in a single-task run; a multi-task run's member k's are named m<k>_<name>
    (rules/multi.smk: member_inputs)."""
    return {k[len(prefix):]: v for k, v in snakemake.input.items() if k.startswith(prefix)} if prefix else snakemake.input


def member(task: str, inputs) -> dict:
    """What the grader evaluates one task with (a RunSpec member, or a single-task run's own fields)."""
    return {
        # Evaluation and machine settings come from the config, not params: not rerun triggers.
        "task_settings": current_task_settings(config, task),
        "eval_dir": Path(inputs["eval"]).parent,
        "baseline": read_json(Path(inputs["baseline"])),
        # A judge's model and the task's judgment cache (rules/levels/judge.smk); outside the workspace.
        "resources": evaluation_resources(inputs, results / "judgments" / task),
        # scoring.feedback split: which held-out items /submit reports on (absent in full mode)
        "partition": read_json(Path(inputs["partition"])) if inputs.get("partition") else None,
        "data": {"train": read_json(Path(inputs["train_manifest"])), "eval": read_json(Path(inputs["eval_manifest"]))},
    }


if "tasks" in snakemake.wildcards.keys():  # a multi-task run (rules/multi.smk)
    tasks = snakemake.params.tasks
    members = {task: member(task, task_inputs(f"m{k}_")) for k, task in enumerate(tasks)}
    first = members[tasks[0]]
    run = {
        "task_settings": {"name": "multi", "tasks": {task: m["task_settings"] for task, m in members.items()}},
        "eval_dir": first["eval_dir"],
        "baseline": first["baseline"],  # the base model's record: the same model for every task
        "resources": {},
        "partition": None,
        "data": {task: m.pop("data") for task, m in members.items()},
    }
else:
    members = None
    run = member(snakemake.wildcards.task, task_inputs())
record = run_agent(
    RunSpec(
        run_dir=run_dir,
        workspace=run_dir / "workspace",
        task_settings=run["task_settings"],
        agent=snakemake.params.agent,
        hf_id=snakemake.params.hf_id,
        eval_dir=run["eval_dir"],
        baseline=run["baseline"],
        time_limit_s=budget["time_limit_s"],
        kill_grace_s=budget["kill_grace_s"],
        evaluation=config["evaluation"],
        resources=run["resources"],
        grader=config["grader"],
        sandbox_backend=config["sandbox"]["backend"],
        network=config["sandbox"]["network"],
        # The whole results tree (held-out split, other runs' ledgers) is hidden from the agent.
        hidden_paths=[results],
        # Snakemake runs jobs in its working directory: its .snakemake/ metadata (eval sizes, data seeds) and
        # config are hidden like the repository's.
        masked_paths=[Path.cwd()],
        seed=int(snakemake.wildcards.seed),
        threads=snakemake.threads,
        labels=dict(snakemake.wildcards),
        data=run["data"],
        partition=run["partition"],
        members=members,
    )
)
print(
    f"run finished: {record.status}, exit code {record.exit_code} (signal {record.exit_signal}), "
    f"{record.submissions} submissions, {record.stray_processes} stray processes stopped",
    file=sys.stderr,
)
if record.status == "interrupted":
    sys.exit("run_agent was interrupted; the agent's processes were stopped. Rerun to start it again.")
