"""Processes that must not outlive the one that started them (lifeline: the kernel's parent-death signal).

Builds on: nothing in the library.
"""
