"""Per-run summaries from a finished run's record: summary.json / summary.md, the process metrics, the
iterations, the failure types, the operating-mode audit, the optional LLM narrative and reports/.

Modules: summary (summarize: summary.json and the summary.jsonl records), submissions (the ledger's
recorded submissions as the reference reads them), agent_code (what the agent's code shows: training
methods, key configuration), routes (training routes), metrics (the paper's process metrics and ours),
iterations (the per-iteration records), failures (failure typing, L3 interactive failures included),
stories (each iteration's account: what was done, why, code lines, diff), mode_audit and modes (the
operating-mode audit), artifacts (artifacts.json: what a run left behind), markdown (summary.md),
formatting (values as text), narrative (the optional LLM narrative), run_report (reports/).

Builds on: fileio, scoring, recording, grader.
"""
