# What each level plug-in (rules/levels/*.smk) adds to the common rules' inputs, registered in
# LEVEL_INPUTS (rules/common.smk) and fed to them through unpack(level_inputs(stage)). A function
# (wildcards, stage) -> {name: path}; stage "evaluate" (baseline and final evaluations), "agent"
# (the grader inside run_agent, which gets them ancient: they never rerun an agent), "train_data"
# or "eval_data" (what prepare_data / prepare_eval_data build a split from: an L3 task's games).


# The stages at which a model is scored: what the judge and the sandbox check feed.
EVALUATION_STAGES = ("evaluate", "agent")


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
    if stage not in EVALUATION_STAGES or not get_judge(wildcards):
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
    execution = get_task_settings(wildcards).get("execution")
    if stage not in EVALUATION_STAGES or not execution:
        return {}
    path = f"results/levels/static/{wildcards.task}/execution.json"
    return {"execution_check": ancient(path) if stage == "agent" else path}


LEVEL_INPUTS.append(execution_level_inputs)


# -- online.smk: interactive tasks (level L3) --------------------------------------------------
# The settings each split's games depend on: changing the held-out size never rebuilds the
# training games (and so never reruns an agent).
# The held-out split depends on train_size too where it is drawn to exclude the training items
# (DeepSearchQA's questions); catalogue_size / kb_size: the environment WebShop / DeepSearchQA
# builds both splits over.
GAME_KEYS = {
    "train": TRAIN_KEYS,
    "heldout": SPLIT_KEYS + ("train_size", "eval_size"),
}


def is_online(wildcards):
    return get_task_settings(wildcards).get("level") == "L3"


def get_games_settings(wildcards):
    keys = GAME_KEYS[wildcards.split]
    # What else a task's training games depend on (WebShop's hub source: eval_size).
    if wildcards.split == "train":
        settings = get_task_settings(wildcards)
        keys = keys + get_task(settings).training_split_keys(settings)
    return get_task_settings(wildcards, keys)


def get_games_input(wildcards):
    """The salt, for the held-out games of a generated source (hub games are public)."""
    if (
        wildcards.split == "heldout"
        and get_task_settings(wildcards).get("source") != "hub"
    ):
        return {"salt": EVAL_SALT}
    return {}


def get_generation_threads(wildcards):
    """Processes that build games: the task's environment.generation_workers, else all cores."""
    environment = get_task_settings(wildcards).get("environment") or {}
    return environment.get("generation_workers") or workflow.cores


def online_level_inputs(wildcards, stage):
    if not is_online(wildcards):
        return {}
    if stage == "train_data":
        return {"train_games": f"results/levels/online/{wildcards.task}/train"}
    if stage == "eval_data":
        return {"heldout_games": f"results/levels/online/{wildcards.task}/heldout"}
    return {}


LEVEL_INPUTS.append(online_level_inputs)
