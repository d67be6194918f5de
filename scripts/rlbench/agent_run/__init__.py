"""Run one agent under its budget: the workspace it gets, the grader and the sandboxed agent started and
stopped together, attempts archived when a run is interrupted.

Builds on: paths, fileio, proc, sandbox, tasks, recording, grader, coding_agents.
"""
