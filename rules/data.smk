rule prepare_data:
    output:
        train="results/data/{task}/train/train.jsonl",
        eval="results/data/{task}/eval/eval.jsonl",
        manifest="results/data/{task}/manifest.json",
    params:
        task=get_task_settings,
    log:
        "results/logs/prepare_data/{task}.log",
    conda:
        "../envs/rlbench.yaml"
    script:
        "../scripts/prepare_data.py"


rule prepare_model:
    output:
        model=directory("results/models/{model}"),
    params:
        spec=get_model_spec,
    log:
        "results/logs/prepare_model/{model}.log",
    benchmark:
        "results/benchmarks/prepare_model/{model}.tsv"
    conda:
        "../envs/rlbench.yaml"
    script:
        "../scripts/prepare_model.py"
