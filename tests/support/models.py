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



def chat_template_record(model_dir: Path) -> dict:
    """The `chat_template` record a baseline evaluation of model_dir leaves (ChatFormat.record):
    what evaluation.evaluate.base_chat_template reads back for the grader."""
    from transformers import AutoTokenizer

    from rlbench.generation.chat_format import ChatFormat

    return ChatFormat.for_model(AutoTokenizer.from_pretrained(model_dir)).record()


def base_resources(model_dir: Path) -> dict:
    """GraderConfig.resources for submissions against the base model model_dir."""
    from rlbench.evaluation.evaluate import base_chat_template

    return {"base_chat_template": base_chat_template({"chat_template": chat_template_record(model_dir)})}


def baseline_record(model_dir: Path, score: float = 0.0) -> dict:
    """A baseline result (evaluate_baseline's) for a RunSpec: score, fingerprint, the model's size
    and its chat template record."""
    from rlbench.grader.fingerprint import checkpoint_manifest

    manifest = checkpoint_manifest(model_dir)
    return {
        "score": score,
        "fingerprint": manifest["fingerprint"],
        "model_bytes": sum(f["size"] for f in manifest["files"]),
        "chat_template": chat_template_record(model_dir),
    }
