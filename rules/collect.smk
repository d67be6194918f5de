rule collect_artifacts:
    input:
        run=run_path("run.json"),
        ledger=run_path("grader/ledger.jsonl"),
        manifest=run_path("workspace.json"),
    output:
        artifacts=run_path("artifacts.json"),
    log:
        "results/logs/collect_artifacts/{task}/{model}/{agent}/{seed}.log",
    conda:
        "../envs/rlbench.yaml"
    script:
        "../scripts/collect_artifacts.py"
