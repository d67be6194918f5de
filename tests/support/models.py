"""Checkpoint copies for submissions: the same model under a new fingerprint."""

from __future__ import annotations

import shutil
from pathlib import Path

from safetensors.torch import load_file, save_file


def copy_model(source: Path, dest: Path) -> Path:
    shutil.copytree(source, dest)
    for path in dest.rglob("*"):
        path.chmod(0o644)
    return dest


def perturb(model_dir: Path) -> None:
    weights = load_file(model_dir / "model.safetensors")
    name = sorted(weights)[0]
    weights[name] = weights[name] + 0.01
    save_file(weights, model_dir / "model.safetensors", metadata={"format": "pt"})

