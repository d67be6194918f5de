"""Evaluate one model on one task's held-out split, in this process, in a fresh child process or in a warm
worker: the one path the grader, the baseline and the final evaluation share.

Builds on: paths, fileio, proc, config, generation, tasks.
"""
