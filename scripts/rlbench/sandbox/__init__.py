"""Isolation for untrusted processes: the bubblewrap plan (bubblewrap) and the loopback bridge that lets a
sandbox with its own network namespace reach chosen host ports (netbridge). Used for the agent and for
model-written programs alike.

Builds on: nothing in the library.
"""
