"""A Hugging Face model directory's files: what one may hold (safetensors weights, never pickle), its
description from its files alone, and the checks and fixes every materialised directory gets.
"""

from __future__ import annotations

import fnmatch
import json
import struct
from pathlib import Path

from rlbench.models.spec import ModelPrepareError

# What a model directory may contain; weights are only ever safetensors.
ALLOWED_PATTERNS = ("*.safetensors", "*.json", "*.jinja", "*.txt", "*.model", "tokenizer*")
# Pickle-based weight formats we refuse to carry along (they can execute code when loaded).
FORBIDDEN_WEIGHT_PATTERNS = ("*.bin", "*.pt", "*.pth", "*.pkl", "*.pickle", "*.ckpt", "*.bin.index.json")

_SAFETENSORS_DTYPES = {
    "F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16",
    "F8_E4M3": "float8_e4m3fn", "F8_E5M2": "float8_e5m2",
    "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool",
}


def describe_model_dir(model_dir: Path) -> dict:
    """Summarise a model directory from its files alone (reads safetensors headers, not weights).

    Promises keys: model_type, architectures, num_parameters (unique stored tensors' elements),
    dtype (one name, or "mixed:a,b"), files (sorted relative paths), size_bytes, chat_template.
    """
    model_dir = Path(model_dir)
    files = sorted(p.relative_to(model_dir).as_posix() for p in model_dir.rglob("*") if p.is_file())
    config = _read_json(model_dir / "config.json")
    num_parameters = 0
    dtypes: set[str] = set()
    for st in sorted(model_dir.glob("*.safetensors")):
        for name, info in _safetensors_header(st).items():
            if name == "__metadata__":
                continue
            count = 1
            for dim in info["shape"]:
                count *= dim
            num_parameters += count
            dtypes.add(_SAFETENSORS_DTYPES.get(info["dtype"], info["dtype"].lower()))
    return {
        "model_type": config.get("model_type"),
        "architectures": config.get("architectures"),
        "num_parameters": num_parameters,
        "dtype": next(iter(dtypes)) if len(dtypes) == 1 else "mixed:" + ",".join(sorted(dtypes)),
        "files": files,
        "size_bytes": sum((model_dir / f).stat().st_size for f in files),
        "chat_template": _has_chat_template(model_dir),
    }


def matches(name: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(name, p) for p in patterns)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def _safetensors_header(path: Path) -> dict:
    """The JSON header of a safetensors file (8-byte little-endian length, then JSON)."""
    with open(path, "rb") as fh:
        (length,) = struct.unpack("<Q", fh.read(8))
        return json.loads(fh.read(length))


def _has_chat_template(model_dir: Path) -> bool:
    if (model_dir / "chat_template.jinja").is_file() or (model_dir / "chat_template.json").is_file():
        return True
    return bool(_read_json(model_dir / "tokenizer_config.json").get("chat_template"))


def ensure_generation_config(model_dir: Path) -> None:
    """Write generation_config.json from config.json's special-token ids when a model lacks one."""
    if (model_dir / "generation_config.json").is_file():
        return
    config = _read_json(model_dir / "config.json")
    gen = {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if config.get(k) is not None}
    gen["_from_model_config"] = True
    (model_dir / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")


def normalise_permissions(root: Path) -> None:
    """Make the tree world-readable: save_pretrained writes weights 0600 via a temp file, which
    breaks agents/containers running under another uid."""
    root.chmod(0o755)
    for item in root.rglob("*"):
        item.chmod(0o755 if item.is_dir() else 0o644)


def check_model_dir(model_dir: Path, spec: dict) -> None:
    """Raise unless ``model_dir`` is a complete, pickle-free Hugging Face model directory."""
    problems = []
    if not (model_dir / "config.json").is_file():
        problems.append("no config.json")
    if not any(model_dir.glob("*.safetensors")):
        problems.append("no *.safetensors weights")
    if not any((model_dir / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        problems.append("no tokenizer files (tokenizer.json / tokenizer.model / vocab.json)")
    pickles = [p.name for p in model_dir.rglob("*") if p.is_file() and matches(p.name, FORBIDDEN_WEIGHT_PATTERNS)]
    if pickles:
        problems.append(f"pickle-based weight files {pickles}")
    if problems:
        raise ModelPrepareError(f"model {spec['name']!r} is incomplete: {'; '.join(problems)}")

