"""Scoring machinery that tasks compose: running untrusted programs against unit tests (execution and its
driver) and the LLM judges (judges/: prompts, backends, the judgment cache).

Builds on: sandbox.
"""
