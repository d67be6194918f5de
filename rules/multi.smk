# Multi-task runs (sweep grids with mode: multi): one agent run, one workspace, one base model, one budget over
# several tasks; the grader evaluates a submission on every task ("task": "all") or on the one it names.
# results/runs/multi/{tasks}/{model}/{agent}/{seed}/ holds the run (workspace/, grader/, run.json, its own
# summary.json and summary.md); tasks/{task}/ beside them holds each task's view of it, read like a single-task
# run's: artifacts.json and ledger.jsonl (member_artifacts), final.json (the task's best submission re-evaluated:
# evaluate_final's script), integrity.json (audit_run's) and the summaries (summarize_run's), which the tables
# read next to the single-task runs' with mode "multi". The data, baselines and judges are the tasks' own rules'.
# As for single-task runs, only what the agent gets reruns an agent: its tasks' training splits and settings
# (prepare_workspace_multi's params), the model, the agent entry and the budget.


rule prepare_workspace_multi:
    input:
        unpack(member_inputs("agent")),
        model="results/models/{model}",
    output:
        manifest=multi_path("workspace.json"),
    log:
        "results/logs/prepare_workspace_multi/{tasks}/{model}/{agent}/{seed}.log",
    conda:
        "../envs/rlbench.yaml"
    params:
        tasks=run_tasks,
        # what the agent gets of each task (as prepare_workspace's task param): a change rebuilds the workspace
        task_settings=lambda wildcards: {
            task: get_task_settings(
                member_wildcards(wildcards, task), TRAIN_KEYS + ("scoring",)
            )
            for task in run_tasks(wildcards)
        },
        hf_id=lambda wildcards: get_model_spec(wildcards)["hf_id"],
        mode=lambda wildcards: get_agent_spec(wildcards)["mode"],
    script:
        "../scripts/prepare_workspace_multi.py"


rule run_agent_multi:
    input:
        unpack(member_inputs("agent")),
        manifest=multi_path("workspace.json"),
    output:
        run=multi_path("run.json"),
    log:
        "results/logs/run_agent_multi/{tasks}/{model}/{agent}/{seed}.log",
    benchmark:
        "results/benchmarks/run_agent_multi/{tasks}/{model}/{agent}/{seed}.tsv"
    conda:
        "../envs/rlbench.yaml"
    threads: 1
    resources:
        runtime=get_multi_runtime_minutes,
    params:
        tasks=run_tasks,
        agent=get_agent_spec,
        hf_id=lambda wildcards: get_model_spec(wildcards)["hf_id"],
        budget=get_multi_budget,
        results=lambda wildcards: RESULTS,
    script:
        "../scripts/run_agent.py"


rule collect_artifacts_multi:
    input:
        run=multi_path("run.json"),
        manifest=multi_path("workspace.json"),
    output:
        artifacts=multi_path("artifacts.json"),
    log:
        "results/logs/collect_artifacts_multi/{tasks}/{model}/{agent}/{seed}.log",
    conda:
        "../envs/rlbench.yaml"
    script:
        "../scripts/collect_artifacts.py"


rule member_artifacts:
    input:
        unpack(member_check),
        run=multi_path("run.json"),
        artifacts=multi_path("artifacts.json"),
    output:
        artifacts=member_path("artifacts.json"),
        ledger=member_path("ledger.jsonl"),
    log:
        "results/logs/member_artifacts/{tasks}/{model}/{agent}/{seed}/{task}.log",
    conda:
        "../envs/rlbench.yaml"
    script:
        "../scripts/member_artifacts.py"


rule evaluate_final_member:
    input:
        unpack(level_inputs("evaluate")),
        unpack(
            lambda wildcards: (
                {"partition": PARTITION.format(task=wildcards.task)}
                if "scoring" in get_task_settings(wildcards)
                else {}
            )
        ),
        artifacts=member_path("artifacts.json"),
        ledger=member_path("ledger.jsonl"),
        eval="results/data/{task}/eval/eval.jsonl",
        eval_manifest="results/data/{task}/eval/manifest.json",
        baseline="results/baselines/{task}/{model}.json",
    output:
        final=member_path("final.json"),
    log:
        "results/logs/evaluate_final_member/{tasks}/{model}/{agent}/{seed}/{task}.log",
    benchmark:
        "results/benchmarks/evaluate_final_member/{tasks}/{model}/{agent}/{seed}/{task}.tsv"
    conda:
        "../envs/rlbench.yaml"
    params:
        task=get_task_settings,
        evaluation=get_scoring_settings(),
        judgments=lambda wildcards: JUDGMENT_CACHE.format(task=wildcards.task),
    script:
        "../scripts/evaluate_final.py"


rule audit_member:
    input:
        unpack(get_audit_judge_model_input),
        run=multi_path("run.json"),
        artifacts=member_path("artifacts.json"),
        manifest=multi_path("workspace.json"),
        eval="results/data/{task}/eval/eval.jsonl",
        train="results/data/{task}/train/train.jsonl",
        base_model="results/models/{model}",
    output:
        integrity=member_path("integrity.json"),
    log:
        "results/logs/audit_member/{tasks}/{model}/{agent}/{seed}/{task}.log",
    conda:
        "../envs/rlbench.yaml"
    params:
        audit=config["audit"],
        judgments=f"{RESULTS}/judgments/audit",
    script:
        "../scripts/audit_run.py"


rule summarize_member:
    input:
        unpack(get_narrative_model_input),
        run=multi_path("run.json"),
        artifacts=member_path("artifacts.json"),
        ledger=member_path("ledger.jsonl"),
        manifest=multi_path("workspace.json"),
        final=member_path("final.json"),
        baseline="results/baselines/{task}/{model}.json",
        integrity=member_path("integrity.json"),
        # every task's final evaluation: the run's mean Δ goes into each task's summary (its `multi` block)
        member_finals=lambda wildcards: [
            member_path("final.json").format(
                **{**dict(wildcards.items()), "task": task}
            )
            for task in run_tasks(wildcards)
        ],
    output:
        summary=member_path("summary.json"),
        markdown=member_path("summary.md"),
        iterations=member_path("summary.jsonl"),
        metrics=member_path("reports/metrics.json"),
        trajectory_png=report(
            member_path("reports/figures/score_trajectory.png"),
            caption="../workflow/report/run_trajectory.rst",
            category="Runs",
            subcategory="{task}",
            labels={
                "model": "{model}",
                "agent": "{agent} (multi: {tasks})",
                "seed": "{seed}",
            },
        ),
        trajectory_svg=member_path("reports/figures/score_trajectory.svg"),
    log:
        "results/logs/summarize_member/{tasks}/{model}/{agent}/{seed}/{task}.log",
    conda:
        "../envs/rlbench.yaml"
    params:
        tasks=run_tasks,
        level=get_level,
        narrative=config["report"]["narrative"],
        narrative_cache=f"{RESULTS}/judgments/narrative",
    script:
        "../scripts/summarize_run.py"


rule summarize_multi:
    input:
        run=multi_path("run.json"),
        members=lambda wildcards: [
            member_path("summary.json").format(
                **{**dict(wildcards.items()), "task": task}
            )
            for task in run_tasks(wildcards)
        ],
    output:
        summary=multi_path("summary.json"),
        markdown=multi_path("summary.md"),
    log:
        "results/logs/summarize_multi/{tasks}/{model}/{agent}/{seed}.log",
    conda:
        "../envs/rlbench.yaml"
    params:
        tasks=run_tasks,
    script:
        "../scripts/summarize_multi.py"


# The run explorer's page of the multi-task run (rlbench.explorer): every task's submissions on one axis.
localrules:
    run_page_multi,


rule run_page_multi:
    input:
        run=multi_path("run.json"),
        summary=multi_path("summary.json"),
    output:
        page=report(
            multi_path(RUN_PAGE_NAME),
            caption="../workflow/report/run_page.rst",
            category="Runs",
            subcategory="{tasks}",
            labels={
                "model": "{model}",
                "agent": "{agent}",
                "seed": "{seed}",
                "page": "run explorer",
            },
        ),
    log:
        "results/logs/run_page_multi/{tasks}/{model}/{agent}/{seed}.log",
    conda:
        "../envs/rlbench.yaml"
    script:
        "../scripts/run_page.py"
