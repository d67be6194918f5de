"""What a submission must satisfy before the grader loads it, and its content fingerprint."""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from fnmatch import fnmatch
from pathlib import Path

from rlbench.ledger import safe_text

# Files that make up a checkpoint; everything else (optimizer state, logs) is ignored.
CHECKPOINT_PATTERNS = ("*.safetensors", "*.json", "*.jinja", "*.model", "*.txt", "*.tiktoken")
# Weight formats that unpickle on load: they can run code inside the grader.
PICKLE_WEIGHT_PATTERNS = ("pytorch_model*.bin", "model*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle")
# How much of a model_path a message quotes: enough to recognise it, never a wall of text.
SHOWN_PATH_CHARS = 200


class SubmissionRefused(Exception):
    """A submission the grader will not evaluate; `reason` is a stable code, message says why."""

    def __init__(self, status: int, reason: str, message: str):
        super().__init__(message)
        self.status, self.reason, self.message = status, reason, message


def shown(model_path: str) -> str:
    """model_path as a message quotes it: valid UTF-8 (lone surrogates escaped), bounded."""
    return safe_text(model_path, SHOWN_PATH_CHARS)


def invalid_path(model_path: str, problem: str) -> SubmissionRefused:
    return SubmissionRefused(
        400,
        "invalid_path",
        f"model_path {problem}, so no file can have that path: {shown(model_path)!r}; "
        'send the relative path of the saved model directory, such as "output/v1"',
    )


def resolve_submission(workspace: Path, model_path: object) -> Path:
    """The real directory a model_path names; refused when outside the workspace, missing, or a
    path the OS cannot represent (invalid_path: NUL byte, lone surrogate, name or path too long)."""
    if not isinstance(model_path, str) or not model_path.strip():
        raise SubmissionRefused(400, "malformed_request", 'the request needs "model_path": a directory path string')
    # Checked before any OS call: these raise ValueError/UnicodeEncodeError there, not OSError.
    try:
        encoded = os.fsencode(model_path)
    except UnicodeError:
        raise invalid_path(model_path, "holds a character no file name can hold (a lone surrogate)") from None
    if b"\0" in encoded:
        raise invalid_path(model_path, "holds a NUL byte")
    try:
        return _resolve(workspace, model_path)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise invalid_path(
                model_path, "is too long for the file system (a name over 255 bytes or a path over 4096 bytes)"
            ) from None
        raise


def _resolve(workspace: Path, model_path: str) -> Path:
    root = Path(os.path.realpath(workspace))
    raw = Path(model_path)
    candidate = raw if raw.is_absolute() else root / raw
    real = Path(os.path.realpath(candidate))
    if real != root and root not in real.parents:
        raise SubmissionRefused(
            403,
            "outside_workspace",
            f"model_path must be inside the workspace ({root}); got {shown(model_path)} "
            f"(resolves to {safe_text(str(real), SHOWN_PATH_CHARS)})",
        )
    if not real.exists():
        raise SubmissionRefused(404, "missing_path", f"model_path does not exist: {shown(model_path)}")
    if not real.is_dir():
        raise SubmissionRefused(
            400, "not_a_directory", f"model_path must be a model directory, got a file: {shown(model_path)}"
        )
    for path in real.rglob("*"):
        target = Path(os.path.realpath(path))
        if target != root and root not in target.parents:
            raise SubmissionRefused(
                403,
                "outside_workspace",
                f"{safe_text(str(path.relative_to(real)))} in {shown(model_path)} links outside the workspace",
            )
    return real


def inspect_checkpoint(model_dir: Path) -> None:
    """Refuse LoRA adapters, pickle weights, remote code and directories without safetensors."""
    names = [p.name for p in model_dir.iterdir() if p.is_file()]
    if "adapter_config.json" in names and "config.json" not in names:
        raise SubmissionRefused(
            422,
            "lora_adapter",
            "this is a LoRA adapter, not a full model: merge it first "
            "(model = PeftModel.from_pretrained(base, adapter).merge_and_unload(); "
            "model.save_pretrained(dir); tokenizer.save_pretrained(dir)) and submit the merged directory",
        )
    pickled = sorted(n for n in names if any(fnmatch(n, p) for p in PICKLE_WEIGHT_PATTERNS))
    if pickled:
        raise SubmissionRefused(
            422,
            "pickle_weights",
            f"pickle weight files are not accepted ({', '.join(pickled)}): save with safetensors "
            "(model.save_pretrained(dir), the default) and remove the pickle files",
        )
    if not any(n.endswith(".safetensors") for n in names):
        raise SubmissionRefused(
            422, "no_safetensors", "no *.safetensors weights in the directory: save with model.save_pretrained(dir)"
        )
    if "config.json" not in names:
        raise SubmissionRefused(422, "no_config", "config.json is missing: save with model.save_pretrained(dir)")
    try:
        config = json.loads((model_dir / "config.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise SubmissionRefused(422, "bad_config", f"config.json is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise SubmissionRefused(422, "bad_config", "config.json must hold a JSON object")
    if "auto_map" in config or config.get("trust_remote_code"):
        raise SubmissionRefused(
            422,
            "remote_code",
            "config.json asks for remote code (auto_map); the grader never runs checkpoint code: "
            "save the model with a built-in transformers architecture",
        )


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The files that make up a checkpoint, relative to model_dir, sorted."""
    files = [
        p.relative_to(model_dir)
        for p in model_dir.rglob("*")
        if p.is_file() and any(fnmatch(p.name, pattern) for pattern in CHECKPOINT_PATTERNS)
    ]
    return sorted(files)


def fingerprint(model_dir: Path) -> str:
    """sha256 over the checkpoint's file names and contents; equal weights, equal fingerprint."""
    digest = hashlib.sha256()
    for rel in checkpoint_files(model_dir):
        digest.update(os.fsencode(rel) + b"\0")  # = str(rel).encode() for UTF-8 names; never raises
        with open(model_dir / rel, "rb") as handle:
            while block := handle.read(1 << 20):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


def snapshot_checkpoint(model_dir: Path, dest: Path) -> None:
    """Copy the checkpoint files (not the agent's optimizer state) to dest, so what is scored stays put."""
    if dest.exists():
        shutil.rmtree(dest)
    for rel in checkpoint_files(model_dir):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(model_dir / rel, dest / rel)


def gpu_order(gpu: str) -> tuple:
    """Sort key for GPU ids: numeric ids by value ("2" before "10"), then any other id (UUIDs)."""
    return (0, int(gpu), "") if gpu.isdigit() else (1, 0, gpu)


def requested_gpus(value: object, available: list[str]) -> list[str]:
    """The GPU ids a request's "gpu" names ("0", "2,3", 1), each one checked against `available`.

    As the reference grader: a comma-separated list of ids, every one of which must be among the
    GPUs the grader was given (CUDA_VISIBLE_DEVICES); a grader without GPUs refuses any value.
    """
    choices = sorted(available, key=gpu_order)
    hint = (
        f'available GPUs: {", ".join(choices)} (GET $GRADING_SERVER_URL/health lists them); '
        'omit "gpu" to use the first one'
        if choices
        else 'this grader has no GPUs (CUDA_VISIBLE_DEVICES is empty): omit "gpu" from the request'
    )
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise SubmissionRefused(400, "invalid_gpu", f'"gpu" must be a string of GPU ids such as "0" or "0,1"; {hint}')
    ids: list[str] = []
    for part in str(value).split(","):
        if part.strip() and part.strip() not in ids:
            ids.append(part.strip())
    if not ids:
        raise SubmissionRefused(400, "invalid_gpu", f'"gpu" is empty; {hint}')
    unknown = [g for g in ids if g not in available]
    if unknown:
        listed = safe_text(", ".join(unknown), SHOWN_PATH_CHARS)
        raise SubmissionRefused(400, "invalid_gpu", f"GPU {listed} not available; {hint}")
    return ids
