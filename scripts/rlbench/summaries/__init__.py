"""Per-run summaries from a finished run's record: summary.json / summary.md, the process metrics, the
iterations, the failure types, the operating-mode audit, the optional LLM narrative and reports/.

Builds on: fileio, scoring, recording, grader.
"""
