localrules:
    all,
    aggregate,


rule aggregate:
    input:
        summaries=get_run_files("summary.json"),
    output:
        leaderboard=report(
            "results/report/leaderboard.csv",
            caption="../workflow/report/leaderboard.rst",
            category="Results",
        ),
    log:
        "results/logs/aggregate/aggregate.log",
    conda:
        "../envs/rlbench.yaml"
    params:
        report=config["report"],
    script:
        "../scripts/aggregate.py"
