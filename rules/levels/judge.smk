# L2 (static, judge-based: AlpacaEval 2.0) and every task with a `judge:` block (DeepSearchQA).
# What such a task needs beyond the common rules:
# - judge_config: the judge's record (settings, identity hash, the local judge model's
#   fingerprint) and a readiness check (the API key variable is set, the model is there), so a
#   judge that cannot work fails here, before any agent runs;
# - the local judge's model, materialised by the common prepare_model rule;
# - the judgment cache, results/judgments/{task}/ (JUDGMENT_CACHE): judgments keyed by a hash of
#   (judge, prompt, outputs, replicate), shared by the baseline, the graders and the final
#   evaluations, so a rerun asks the judge nothing it has answered. It only grows and is no rule's
#   output: a judge change gives new keys, it never invalidates recorded runs.
# The evaluations get the judge through level_inputs (rules/levels/inputs.smk); run_agent gets
# it ancient(): changing the judge reruns evaluations, never an agent.


rule judge_config:
    input:
        unpack(get_judge_model_input),
    output:
        judge="results/judges/{task}/judge.json",
    log:
        "results/logs/judge_config/{task}.log",
    conda:
        "../../envs/rlbench.yaml"
    params:
        judge=get_judge,
        task=lambda wildcards: wildcards.task,
    script:
        "../../scripts/judge_config.py"
