# Also read beside run.json, not declared (they are the run's own record, written by run_agent):
# grader/ledger.jsonl, grader/code.git, grader/snapshots/NNNN/code and workspace/run_meta.json.
# The manifest gives the agent's operating mode, audited against the recorded code (mode_audit).
rule summarize_run:
    input:
        run=run_path("run.json"),
        artifacts=run_path("artifacts.json"),
        manifest=run_path("workspace.json"),
        final=run_path("final.json"),
        baseline="results/baselines/{task}/{model}.json",
    output:
        summary=run_path("summary.json"),
        markdown=run_path("summary.md"),
        iterations=run_path("summary.jsonl"),
    log:
        "results/logs/summarize_run/{task}/{model}/{agent}/{seed}.log",
    conda:
        "../envs/rlbench.yaml"
    params:
        level=get_level,
    script:
        "../scripts/summarize_run.py"
