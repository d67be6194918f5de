"""Model materialisation: turn one model registry entry into a Hugging Face model directory.

Builds on: paths, config.
"""
