# The ledger (grader/ledger.jsonl) is read beside run.json rather than declared as an output:
# Snakemake deletes a rerun job's outputs first, and an interrupted attempt's ledger must survive.
# Also read beside run.json, not declared: grader/ (ledger, snapshots, code.git), the final
# workspace (listing, model versions under output/, final code/) and resources.jsonl (the trace).
rule collect_artifacts:
    input:
        run=run_path("run.json"),
        manifest=run_path("workspace.json"),
    output:
        artifacts=run_path("artifacts.json"),
    log:
        "results/logs/collect_artifacts/{task}/{model}/{agent}/{seed}.log",
    conda:
        "../envs/rlbench.yaml"
    script:
        "../scripts/collect_artifacts.py"
