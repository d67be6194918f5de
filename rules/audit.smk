# What a run's score can be trusted for (rlbench.integrity, scripts/audit_run.py): the contamination scan
# of everything the agent wrote (every code revision in grader/code.git, the files it created in the
# workspace) and its driver said (the LLM gateway's transcript) against the held-out items, and of the
# training split itself; the best submission's weight lineage against the base model; the optional trace
# judge (audit.judge). Also read beside run.json, not declared: grader/, workspace/ and the transcript.
rule audit_run:
    input:
        unpack(get_audit_judge_model_input),
        run=run_path("run.json"),
        artifacts=run_path("artifacts.json"),
        manifest=run_path("workspace.json"),
        eval="results/data/{task}/eval/eval.jsonl",
        train="results/data/{task}/train/train.jsonl",
        base_model="results/models/{model}",
    output:
        integrity=run_path("integrity.json"),
    log:
        "results/logs/audit_run/{task}/{model}/{agent}/{seed}.log",
    conda:
        "../envs/rlbench.yaml"
    params:
        audit=config["audit"],
        judgments=f"{RESULTS}/judgments/audit",
    script:
        "../scripts/audit_run.py"
