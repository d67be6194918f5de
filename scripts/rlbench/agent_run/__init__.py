"""Run one agent under its budget.

- spec: what a run is given (RunSpec) and what it records (RunRecord, run.json)
- workspace: the agent's workspace (base model and training split read-only, task files, rules), for one task or,
  in a multi-task run, one folder per task
- instructions: what the workspace tells the agent (instructions.md, a multi-task run's description.md)
- environment: the agent's command and environment, what the sandbox hides and shows
- process_tree: finding, stopping and reading the exit of the agent's processes
- supervision: waiting until the deadline, stopping on request, stopping with the Snakemake that started it
- attempts: an interrupted attempt archived, never overwritten; the run marker
- runner: run_agent, the grader and the sandboxed agent started and stopped together

Builds on: paths, fileio, proc, sandbox, tasks, recording, grader, coding_agents.
"""
