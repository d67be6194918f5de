"""Across runs: the paper's tables, the figures, the HTML report page, and the headless browser that checks it.

Builds on: fileio, summaries.
"""
