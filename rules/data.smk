rule prepare_data:
    output:
        train="results/data/{task}/train/train.jsonl",
        manifest="results/data/{task}/train/manifest.json",
    log:
        "results/logs/prepare_data/{task}.log",
    conda:
        "../envs/rlbench.yaml"
    params:
        task=lambda wildcards: get_task_settings(wildcards, TRAIN_KEYS),
    script:
        "../scripts/prepare_data.py"


rule prepare_eval_data:
    input:
        train="results/data/{task}/train/train.jsonl",
    output:
        eval="results/data/{task}/eval/eval.jsonl",
        manifest="results/data/{task}/eval/manifest.json",
    log:
        "results/logs/prepare_eval_data/{task}.log",
    conda:
        "../envs/rlbench.yaml"
    params:
        task=lambda wildcards: get_task_settings(wildcards, EVAL_DATA_KEYS),
    script:
        "../scripts/prepare_eval_data.py"


rule prepare_model:
    output:
        model=directory("results/models/{model}"),
    log:
        "results/logs/prepare_model/{model}.log",
    benchmark:
        "results/benchmarks/prepare_model/{model}.tsv"
    conda:
        "../envs/rlbench.yaml"
    params:
        spec=get_model_spec,
    script:
        "../scripts/prepare_model.py"
