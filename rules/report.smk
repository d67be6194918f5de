# The analysis stage across runs: every table and figure comes from the recorded runs' summaries,
# so regenerating them reruns no agent and no evaluation. The tables' and figures' settings are
# params: changing them reruns only these two rules.
localrules:
    all,
    aggregate,
    report_figures,


rule aggregate:
    input:
        summaries=get_run_files("summary.json"),
    output:
        **report_tables(),
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
        summaries=get_run_files("summary.json"),
        tables=[f"results/report/{name}.csv" for name in REPORT_TABLES],
    output:
        **report_figures(),
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
