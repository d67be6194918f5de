"""The ``local`` source: a copy of an existing model directory, keeping only safetensors weights and metadata
files.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from rlbench.models.model_dir import ALLOWED_PATTERNS, FORBIDDEN_WEIGHT_PATTERNS, matches
from rlbench.models.spec import ModelPrepareError


def build_local(spec: dict, out: Path) -> dict:
    """Copy an existing model directory, keeping only safetensors weights and metadata files."""
    src = Path(os.path.expanduser(str(spec["path"]))).resolve()
    if not src.is_dir():
        raise ModelPrepareError(
            f"model {spec['name']!r}: local path {src} does not exist or is not a directory; "
            "fix `path:` in its registry entry (e.g. a directory made by `hf download ID --local-dir DIR`)"
        )
    if not any(src.glob("*.safetensors")):
        raise ModelPrepareError(
            f"model {spec['name']!r}: {src} has no *.safetensors weights; convert it "
            "(load it and call `model.save_pretrained(dir)`) and point `path:` at the result"
        )
    if not (src / "config.json").is_file():
        raise ModelPrepareError(f"model {spec['name']!r}: {src} has no config.json; it is not a Hugging Face model directory")
    if out.resolve() == src or src in out.resolve().parents:
        raise ModelPrepareError(f"model {spec['name']!r}: the output directory must not be inside the source {src}")
    for item in sorted(src.rglob("*")):
        rel = item.relative_to(src)
        if not item.is_file() or any(part.startswith(".") for part in rel.parts):
            continue
        if matches(rel.name, FORBIDDEN_WEIGHT_PATTERNS) or not matches(rel.name, ALLOWED_PATTERNS):
            continue
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(item, out / rel)
    return {"path": str(src)}
