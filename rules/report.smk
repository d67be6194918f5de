# The analysis stage across runs: every table and figure comes from the recorded runs' summaries,
# so regenerating them reruns no agent and no evaluation. The tables' and figures' settings are
# params: changing them reruns only these two rules. Which tables and figures there are, with their
# files and captions, is rlbench.analysis.catalogue's (rules/common.smk: report_outputs, report_files).
localrules:
    all,
    aggregate,
    report_figures,


rule aggregate:
    input:
        summaries=get_table_summaries(),
    output:
        **report_outputs(TABLE, "Tables"),
        leaderboard=report(
            "results/report/leaderboard.csv",
            caption="../workflow/report/leaderboard.rst",
            category="Tables",
            subcategory="Runs",
        ),
    log:
        "results/logs/aggregate/aggregate.log",
    conda:
        "../envs/rlbench.yaml"
    params:
        report=config["report"],
    script:
        "../scripts/aggregate.py"


rule report_figures:
    input:
        summaries=get_table_summaries(),
        tables=report_files(TABLE),
        pages=get_run_pages(),
    output:
        **report_outputs(FIGURE, "Figures"),
        index=report(
            "results/report/index.html",
            caption="../workflow/report/index.rst",
            category="Overview",
        ),
    log:
        "results/logs/report_figures/report_figures.log",
    conda:
        "../envs/rlbench.yaml"
    params:
        report=config["report"],
    script:
        "../scripts/report_figures.py"
