# A split is built beside the recorded one and takes its place only once complete (prepare_data.py). Its data
# file is update(): Snakemake neither deletes it before the rule reruns nor after a failed rerun (it restores
# it), so a config or a source that fails keeps the recorded split; the manifest, which says the split
# matches the config, is removed, so the next run builds it again.
rule prepare_data:
    input:
        unpack(level_inputs("train_data")),
    output:
        train=update("results/data/{task}/train/train.jsonl"),
        manifest="results/data/{task}/train/manifest.json",
    log:
        "results/logs/prepare_data/{task}.log",
    conda:
        "../envs/rlbench.yaml"
    params:
        # scoring (present in split mode only: rlbench.config.task_settings) does not change the training split; it
        # is here so that a change of what /submit reports on reruns the task's agents through the split they train
        # on. prepare_workspace's params carry it too, but Snakemake never looks at those when a job upstream of
        # the workspace's ancient inputs (the partition, the baseline) reruns, as such a change always makes them.
        task=lambda wildcards: get_task_settings(wildcards, TRAIN_KEYS + ("scoring",)),
    script:
        "../scripts/prepare_data.py"


localrules:
    eval_salt,


# One random salt per installation, drawn once. It is what keeps a generated held-out split
# underivable from the code, the config and the training split, all of which agents can know.
# update(): Snakemake keeps the file when the rule reruns (--forceall, --forcerun, an edit of this
# rule), and ensure_salt keeps an existing salt, so only deleting the file draws a new one. It
# reaches prepare_eval_data as an input file, never as a param: params are stored in .snakemake/.
rule eval_salt:
    output:
        salt=update(EVAL_SALT),
    log:
        "results/logs/eval_salt.log",
    run:
        ensure_salt(Path(output.salt))


rule prepare_eval_data:
    input:
        unpack(get_eval_data_input),
        unpack(level_inputs("eval_data")),
    output:
        eval=update("results/data/{task}/eval/eval.jsonl"),
        manifest="results/data/{task}/eval/manifest.json",
    log:
        "results/logs/prepare_eval_data/{task}.log",
    conda:
        "../envs/rlbench.yaml"
    params:
        task=lambda wildcards: get_task_settings(wildcards, EVAL_DATA_KEYS),
    script:
        "../scripts/prepare_eval_data.py"


# scoring.feedback: split (rlbench.config.scoring_settings): the held-out items in a feedback part, which
# /submit reports on, and a final part the agent never sees scores of, drawn with the salt. Only split-mode
# tasks ask for it (rlbench.config.task_settings keeps a `scoring` block in split mode only, so a full-mode
# rule's inputs are what they were); run_agent gets it ancient (a new salt reruns the evaluations, never an agent).
PARTITION = "results/data/{task}/partition.json"


rule partition_eval:
    input:
        eval="results/data/{task}/eval/eval.jsonl",
        salt=EVAL_SALT,
    output:
        partition=PARTITION,
    log:
        "results/logs/partition_eval/{task}.log",
    conda:
        "../envs/rlbench.yaml"
    params:
        scoring=lambda wildcards: get_task_settings(wildcards)["scoring"],
    script:
        "../scripts/partition_eval.py"


rule prepare_model:
    output:
        model=directory("results/models/{model}"),
    log:
        "results/logs/prepare_model/{model}.log",
    benchmark:
        "results/benchmarks/prepare_model/{model}.tsv"
    conda:
        "../envs/rlbench.yaml"
    params:
        # The weights' recipe: the registry entry but its decoding (generation:), which reruns evaluations only.
        spec=lambda wildcards: {
            k: v for k, v in get_model_spec(wildcards).items() if k != "generation"
        },
    script:
        "../scripts/prepare_model.py"
