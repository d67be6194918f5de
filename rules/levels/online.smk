# L3 (interactive rollout): ALFWorld. A task whose registry entry is level L3 plays games in a
# stateful environment; its data are games, built here before the common data rules read them.
# - generate_games: the games of one split, "train" (what agents get) or "heldout" (the held-out
#   games; a generated source draws them with the installation's salt, so nobody can rebuild
#   them from the public seed). Offline sources generate them from a seed (deterministic: the same
#   seed and settings give byte-identical games; parallel over `threads` processes), hub sources
#   collect them from a local copy of the official data. Each game is validated by the engine's
#   handcoded expert, whose trajectories become the agent's expert demonstrations. The output is
#   cached like any Snakemake output: it is rebuilt only when its settings or code change.
# prepare_data / prepare_eval_data copy the games into the splits (online_data_inputs in
# inputs.smk); evaluations then read only the held-out split.


rule generate_games:
    input:
        unpack(get_games_input),
    output:
        games=directory("results/levels/online/{task}/{split}"),
    log:
        "results/logs/generate_games/{task}/{split}.log",
    benchmark:
        "results/benchmarks/generate_games/{task}/{split}.tsv"
    wildcard_constraints:
        split="train|heldout",
    conda:
        "../../envs/rlbench.yaml"
    threads: get_generation_threads
    params:
        task=get_games_settings,
    script:
        "../../scripts/generate_games.py"
