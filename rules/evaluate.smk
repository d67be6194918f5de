# Level plug-ins add their inputs (a judge's record and model: rules/levels/judge.smk) through
# level_inputs; a change in them reruns the evaluations, never an agent (run_agent gets them ancient).
rule evaluate_baseline:
    input:
        unpack(level_inputs("evaluate")),
        unpack(
            lambda wildcards: (
                {"partition": PARTITION.format(task=wildcards.task)}
                if "scoring" in get_task_settings(wildcards)
                else {}
            )
        ),
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
        evaluation=get_scoring_settings(baseline=True),
        model_generation=lambda wildcards: REGISTRIES.models[wildcards.model].get(
            "generation"
        ),
        judgments=lambda wildcards: JUDGMENT_CACHE.format(task=wildcards.task),
    script:
        "../scripts/evaluate_baseline.py"


rule evaluate_final:
    input:
        unpack(level_inputs("evaluate")),
        unpack(
            lambda wildcards: (
                {"partition": PARTITION.format(task=wildcards.task)}
                if "scoring" in get_task_settings(wildcards)
                else {}
            )
        ),
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
        evaluation=get_scoring_settings(),
        judgments=lambda wildcards: JUDGMENT_CACHE.format(task=wildcards.task),
    script:
        "../scripts/evaluate_final.py"
