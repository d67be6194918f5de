"""Agent² RL-Bench: the benchmark library behind the Snakemake workflow.

Its packages are layered and imports flow one way (docs/architecture.md): each unit's docstring states
what it builds on, and tests/test_layering.py holds the code to those statements.
"""

__version__ = "0.1.0"
