rule run_agent:
    input:
        manifest=run_path("workspace.json"),
        eval="results/data/{task}/eval/eval.jsonl",
        baseline="results/baselines/{task}/{model}.json",
    output:
        run=run_path("run.json"),
        ledger=run_path("grader/ledger.jsonl"),
    log:
        "results/logs/run_agent/{task}/{model}/{agent}/{seed}.log",
    benchmark:
        "results/benchmarks/run_agent/{task}/{model}/{agent}/{seed}.tsv"
    conda:
        "../envs/rlbench.yaml"
    threads: 1
    params:
        task=get_task_settings,
        agent=get_agent_spec,
        hf_id=lambda wildcards: get_model_spec(wildcards)["hf_id"],
        budget=config["budget"],
        evaluation=config["evaluation"],
        sandbox=config["sandbox"]["backend"],
    script:
        "../scripts/run_agent.py"
