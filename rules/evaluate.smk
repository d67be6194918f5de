rule evaluate_baseline:
    input:
        model="results/models/{model}",
        eval="results/data/{task}/eval/eval.jsonl",
        eval_manifest="results/data/{task}/eval/manifest.json",
    output:
        baseline="results/baselines/{task}/{model}.json",
    log:
        "results/logs/evaluate_baseline/{task}/{model}.log",
    benchmark:
        "results/benchmarks/evaluate_baseline/{task}/{model}.tsv"
    conda:
        "../envs/rlbench.yaml"
    params:
        task=get_task_settings,
        evaluation=config["evaluation"],
    script:
        "../scripts/evaluate_baseline.py"


rule evaluate_final:
    input:
        artifacts=run_path("artifacts.json"),
        eval="results/data/{task}/eval/eval.jsonl",
        eval_manifest="results/data/{task}/eval/manifest.json",
        baseline="results/baselines/{task}/{model}.json",
    output:
        final=run_path("final.json"),
    log:
        "results/logs/evaluate_final/{task}/{model}/{agent}/{seed}.log",
    benchmark:
        "results/benchmarks/evaluate_final/{task}/{model}/{agent}/{seed}.tsv"
    conda:
        "../envs/rlbench.yaml"
    params:
        task=get_task_settings,
        evaluation=config["evaluation"],
    script:
        "../scripts/evaluate_final.py"
