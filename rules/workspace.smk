# Only what the agent gets is a parameter here: evaluation settings never rebuild a workspace.
# A new workspace archives the run's previous attempt: it is built only once everything run_agent needs is
# there (the held-out split, the baseline, the level's inputs; ancient, as run_agent has them, so that
# none of them rebuilds a workspace), so a split or a baseline that fails archives nothing.
rule prepare_workspace:
    input:
        unpack(level_inputs("agent")),
        train="results/data/{task}/train/train.jsonl",
        model="results/models/{model}",
        eval=ancient("results/data/{task}/eval/eval.jsonl"),
        eval_manifest=ancient("results/data/{task}/eval/manifest.json"),
        baseline=ancient("results/baselines/{task}/{model}.json"),
    output:
        manifest=run_path("workspace.json"),
    log:
        "results/logs/prepare_workspace/{task}/{model}/{agent}/{seed}.log",
    conda:
        "../envs/rlbench.yaml"
    params:
        # scoring (present in split mode only): what /submit reports on is what the agent gets, so a change of
        # feedback mode (or of the final share in split mode) rebuilds the workspace and reruns the agent (through
        # prepare_data's params too: see rules/data.smk).
        task=lambda wildcards: get_task_settings(wildcards, TRAIN_KEYS + ("scoring",)),
        hf_id=lambda wildcards: get_model_spec(wildcards)["hf_id"],
        mode=lambda wildcards: get_agent_spec(wildcards)["mode"],
    script:
        "../scripts/prepare_workspace.py"
