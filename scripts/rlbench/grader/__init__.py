"""The grading server: scores agent submissions on the held-out split, records every one.

Modules: submission (what a submission must satisfy: its path inside the workspace, the checkpoint
checks, SubmissionRefused), fingerprint (a checkpoint's content fingerprint and manifest, the
streaming hasher), snapshot (the copies that follow no link: the checkpoint, code/), gpu_locks (the
GPUs a request names, one lock per GPU), visible (the files the agent sees: timer.sh, run_meta.json,
scores.json, submissions.json: best-effort copies), audit (the records each scored submission
leaves), ledger_file (the ledger on disk: lines whole or absent, those the disk refused written
later), grading (the
Grader: submission handling, ledger, cache, evaluation dispatch), http (the FastAPI app and its
routes), server (uvicorn in a thread).

Builds on: fileio, tasks, evaluation, recording.
"""
