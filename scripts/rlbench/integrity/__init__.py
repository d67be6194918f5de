"""What a run's score can be trusted for, checked after the run from what it recorded (the audit_run
rule, integrity.json): whether held-out items reached what the agent wrote or read (`contamination`),
whether the best submission descends from the base model (`lineage`), an optional LLM judge of the
agent's trace (`trace_judge`), and the run's verdict from them (`verdict`).

Builds on: paths, fileio, config, scoring, tasks, recording.
"""
