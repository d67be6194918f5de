# L1 (static, rule-based verifier): GSM8K (an answer rule) and HumanEval (unit-test execution).
# Data and evaluation run through the common rules with the task's own parts. What execution-scored
# tasks (a task with an `execution:` block) need beyond them:
# - check_execution: the code-execution sandbox probed once per task with its own limits (a
#   passing program passes, a looping one times out, the network and the results tree are out of
#   reach), recorded in results/levels/static/{task}/execution.json. A broken sandbox fails
#   here, before a baseline is scored as if every program had failed; the evaluations carry the
#   record in their provenance. run_agent gets it ancient(): it never reruns an agent.


rule check_execution:
    output:
        check="results/levels/static/{task}/execution.json",
    log:
        "results/logs/check_execution/{task}.log",
    conda:
        "../../envs/rlbench.yaml"
    params:
        execution=lambda wildcards: get_task_settings(wildcards)["execution"],
        results=lambda wildcards: RESULTS,
    script:
        "../../scripts/check_execution.py"
