# Only what the agent gets is a parameter here: evaluation settings never rebuild a workspace.
rule prepare_workspace:
    input:
        train="results/data/{task}/train/train.jsonl",
        model="results/models/{model}",
    output:
        manifest=run_path("workspace.json"),
    log:
        "results/logs/prepare_workspace/{task}/{model}/{agent}/{seed}.log",
    conda:
        "../envs/rlbench.yaml"
    params:
        task=lambda wildcards: get_task_settings(wildcards, TRAIN_KEYS),
        hf_id=lambda wildcards: get_model_spec(wildcards)["hf_id"],
        mode=lambda wildcards: get_agent_spec(wildcards)["mode"],
    script:
        "../scripts/prepare_workspace.py"
