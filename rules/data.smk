rule prepare_data:
    output:
        train="results/data/{task}/train/train.jsonl",
        eval="results/data/{task}/eval/eval.jsonl",
        manifest="results/data/{task}/manifest.json",
    log:
        "results/logs/prepare_data/{task}.log",
    conda:
        "../envs/rlbench.yaml"
    params:
        task=get_task_settings,
    script:
        "../scripts/prepare_data.py"


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
