"""Agent² RL-Bench: the benchmark library behind the Snakemake workflow."""

__version__ = "0.1.0"
