"""What the tests share: settings, helpers, harnesses. Test modules import from here (or use the
fixtures of tests/conftest.py), never from one another.

- settings: the tiny model, the small offline GSM8K split, the evaluation settings, the fixed salt.
- workflow: Snakemake through its CLI on a scratch directory (run, dry-run job counts, configs).
- models: copies and perturbations of a checkpoint (a new fingerprint for the same model).
- grader: live grading-server helpers (ledger consistency, evaluation processes, waiting).
- runs: RunSpec for the runner on the tiny model and GSM8K split.
- diagnostics: synthetic ledgers and run directories for the analysis tests.
- cli_agents: a real coding-agent tool through the runner, sandbox and gateway, against a scripted LLM.
- faults: fault injection into real sweeps (kills, full disks) and the audit of what they leave.
- full_disk: a small tmpfs in a private mount namespace that fills up, and the grader driver run on it.
- opencompass_upstream: OpenCompass's own prompt rendering, for the protocol tests.
"""
