# What each level plug-in (rules/levels/*.smk) adds to the common rules' inputs, registered in
# LEVEL_INPUTS (rules/common.smk) and fed to them through unpack(level_inputs(stage)). A function
# (wildcards, stage) -> {name: path}; stage "evaluate" (baseline and final evaluations) or "agent"
# (the grader inside run_agent, which gets them ancient: they never rerun an agent).


# -- judge.smk: tasks with a `judge:` block -------------------------------------------------------
def get_judge(wildcards):
    return get_task_settings(wildcards).get("judge")


def get_judge_model_input(wildcards):
    """The local judge's model directory (a models registry name), when the judge is local."""
    judge = get_judge(wildcards)
    if judge and judge.get("backend") == "local":
        return {"judge_model": f"results/models/{judge['model']}"}
    return {}


def judge_level_inputs(wildcards, stage):
    if not get_judge(wildcards):
        return {}
    inputs = {
        "judge_config": f"results/judges/{wildcards.task}/judge.json",
        **get_judge_model_input(wildcards),
    }
    if stage == "agent":
        return {name: ancient(path) for name, path in inputs.items()}
    return inputs


LEVEL_INPUTS.append(judge_level_inputs)


# -- static.smk: execution-scored tasks (an `execution:` block) ------------------------------------
def execution_level_inputs(wildcards, stage):
    if not get_task_settings(wildcards).get("execution"):
        return {}
    path = f"results/levels/static/{wildcards.task}/execution.json"
    return {"execution_check": ancient(path) if stage == "agent" else path}


LEVEL_INPUTS.append(execution_level_inputs)
