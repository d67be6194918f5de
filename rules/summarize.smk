# Also read beside run.json, not declared (they are the run's own record, written by run_agent):
# grader/ledger.jsonl, grader/code.git, grader/snapshots/NNNN/code and workspace/run_meta.json.
# The manifest gives the agent's operating mode, audited against the recorded code (mode_audit).
# reports/: the reference harness's per-run files (metrics.json: the ten process metrics;
# figures/score_trajectory.png), beside summary.md / summary.jsonl / summary.json.
# Only the narrative setting of the report block is a param: changing the tables' settings
# leaves the summaries alone.
rule summarize_run:
    input:
        unpack(get_narrative_model_input),
        run=run_path("run.json"),
        artifacts=run_path("artifacts.json"),
        manifest=run_path("workspace.json"),
        final=run_path("final.json"),
        baseline="results/baselines/{task}/{model}.json",
        integrity=run_path("integrity.json"),
    output:
        summary=run_path("summary.json"),
        markdown=run_path("summary.md"),
        iterations=run_path("summary.jsonl"),
        metrics=run_path("reports/metrics.json"),
        trajectory_png=report(
            run_path("reports/figures/score_trajectory.png"),
            caption="../workflow/report/run_trajectory.rst",
            category="Runs",
            subcategory="{task}",
            labels={"model": "{model}", "agent": "{agent}", "seed": "{seed}"},
        ),
        trajectory_svg=run_path("reports/figures/score_trajectory.svg"),
    log:
        "results/logs/summarize_run/{task}/{model}/{agent}/{seed}.log",
    conda:
        "../envs/rlbench.yaml"
    params:
        level=get_level,
        narrative=config["report"]["narrative"],
        narrative_cache=f"{RESULTS}/judgments/narrative",
    script:
        "../scripts/summarize_run.py"


# The run explorer's page (rlbench.explorer), from the run's records; rebuilt by `make report`. Cheap: run
# where Snakemake runs, never submitted to a cluster.
localrules:
    run_page,


rule run_page:
    input:
        run=run_path("run.json"),
        summary=run_path("summary.json"),
        integrity=run_path("integrity.json"),
        final=run_path("final.json"),
    output:
        page=report(
            run_path(RUN_PAGE_NAME),
            caption="../workflow/report/run_page.rst",
            category="Runs",
            subcategory="{task}",
            labels={
                "model": "{model}",
                "agent": "{agent}",
                "seed": "{seed}",
                "page": "run explorer",
            },
        ),
    log:
        "results/logs/run_page/{task}/{model}/{agent}/{seed}.log",
    conda:
        "../envs/rlbench.yaml"
    script:
        "../scripts/run_page.py"
