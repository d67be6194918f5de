"""The grading server: scores agent submissions on the held-out split, records every one.

Builds on: fileio, tasks, evaluation, recording.
"""
