"""Model materialisation: turn one model registry entry into a Hugging Face model directory.

Modules: materialise (the entry: prepare_model dispatches on the entry's `source` and writes the directory
atomically; `python -m rlbench.models.materialise`), spec (a registry entry read and validated against the
model schema: load_spec, validate_spec, ModelPrepareError), model_dir (what a model directory may hold, its
description and checks), and one module per source: tiny, gguf, hub, local.

Builds on: paths, config.
"""
