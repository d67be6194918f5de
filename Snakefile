# Agent² RL-Bench: agents post-train base models under a budget; a grader scores them.


from snakemake.utils import min_version

min_version("9.0")


configfile: "config/config.yaml"


report: "workflow/report/workflow.rst"


include: "rules/common.smk"
include: "rules/data.smk"
include: "rules/workspace.smk"
include: "rules/agent.smk"
include: "rules/collect.smk"
include: "rules/audit.smk"
include: "rules/evaluate.smk"
include: "rules/summarize.smk"
include: "rules/report.smk"
include: "rules/multi.smk"
include: "rules/levels/inputs.smk"
include: "rules/levels/static.smk"
include: "rules/levels/judge.smk"
include: "rules/levels/online.smk"


rule all:
    default_target: True
    input:
        get_final_output(),
