# An agent run is expensive (hours of GPU): only what the agent gets (workspace, agent, budget)
# can rerun it. The held-out split and the baseline are ancient() inputs and the evaluation
# settings are read from the config, not params, so changing them reruns evaluation only.
rule run_agent:
    input:
        unpack(level_inputs("agent")),
        # scoring.feedback split: which held-out items /submit reports on (the mode itself reruns the agent
        # through prepare_data's params, see rules/data.smk; the partition file is ancient, as the split is)
        unpack(
            lambda wildcards: (
                {"partition": ancient(PARTITION.format(task=wildcards.task))}
                if "scoring" in get_task_settings(wildcards)
                else {}
            )
        ),
        manifest=run_path("workspace.json"),
        train_manifest="results/data/{task}/train/manifest.json",
        eval=ancient("results/data/{task}/eval/eval.jsonl"),
        eval_manifest=ancient("results/data/{task}/eval/manifest.json"),
        baseline=ancient("results/baselines/{task}/{model}.json"),
    output:
        run=run_path("run.json"),
    log:
        "results/logs/run_agent/{task}/{model}/{agent}/{seed}.log",
    benchmark:
        "results/benchmarks/run_agent/{task}/{model}/{agent}/{seed}.tsv"
    conda:
        "../envs/rlbench.yaml"
    threads: 1
    resources:
        runtime=get_agent_runtime_minutes,
    params:
        agent=get_agent_spec,
        hf_id=lambda wildcards: get_model_spec(wildcards)["hf_id"],
        budget=config["budget"],
        # The results tree, hidden from the agent (a function: it is not a file prefix to stage).
        results=lambda wildcards: RESULTS,
    script:
        "../scripts/run_agent.py"
