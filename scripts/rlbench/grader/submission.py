"""What a submission must satisfy before the grader loads it: its path inside the workspace, its checkpoint files.

A model_path is resolved to a real directory inside the workspace, every link below it checked
(resolve_submission); the checkpoint's names are checked before a byte is copied (inspect_names), the
grader's copy before it is loaded (inspect_checkpoint). Whatever fails is a SubmissionRefused: a stable
reason code and a message that says what to change; an OSError of the agent's own paths is one too
(agent_error), never an error of the grader's.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from fnmatch import fnmatch
from pathlib import Path

from rlbench.fileio import nofollow
from rlbench.recording.ledger import safe_text

# Files that make up a checkpoint; everything else (optimizer state, logs) is ignored.
CHECKPOINT_PATTERNS = ("*.safetensors", "*.json", "*.jinja", "*.model", "*.txt", "*.tiktoken")
# Weight formats that unpickle on load: they can run code inside the grader.
PICKLE_WEIGHT_PATTERNS = ("pytorch_model*.bin", "model*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle")
# LoRA adapter files (peft's save_pretrained): transformers' from_pretrained applies the adapter of
# a directory that holds adapter_config.json beside config.json, vLLM ignores it, so the score would
# depend on the backend; adapter weights alone are dead weight. Any of them is refused (merge first).
ADAPTER_FILE_PATTERNS = ("adapter_config.json", "adapter_model*.safetensors", "adapter_model*.bin")
# The JSON files of a checkpoint that transformers' loaders (the model's, the tokenizer's, the
# processors') read for `auto_map`: classes in the checkpoint's own Python files, remote code.
REMOTE_CODE_CONFIGS = (
    "config.json",
    "tokenizer_config.json",
    "processor_config.json",
    "preprocessor_config.json",
    "video_preprocessor_config.json",
)
# How much of a model_path a message quotes: enough to recognise it, never a wall of text.
SHOWN_PATH_CHARS = 200
# Subdirectories of a checkpoint deeper than this are not copied (nor loaded: transformers reads
# the top level and additional_chat_templates/); it bounds the descriptors a copy holds open.
CHECKPOINT_MAX_DEPTH = 16


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


def outside_workspace(model_path: str) -> SubmissionRefused:
    """The refusal of a model_path that leads out of the workspace. It quotes model_path as sent and
    nothing else: where a link leads on the grader's host (other runs' results, say), or where the
    workspace itself lies there, is none of the agent's business."""
    return SubmissionRefused(
        403,
        "outside_workspace",
        f"model_path must name a directory inside your workspace; {shown(model_path)!r} leads outside it "
        "(through a symbolic link or ..): save the model inside the workspace and send its relative path, "
        'such as "output/v1"',
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
    """resolve_submission's checks, on a tree the agent may change while they run: every OSError
    that its paths answer (a file, link or directory swapped, removed or made unreadable meanwhile)
    is a refusal of the submission (agent_error), never an error of the grader's; ENAMETOOLONG of
    model_path itself is left to resolve_submission (invalid_path)."""
    root = Path(os.path.realpath(workspace))
    raw = Path(model_path)
    candidate = raw if raw.is_absolute() else root / raw
    try:
        real = Path(os.path.realpath(candidate))
    except OSError as exc:  # a link replaced between realpath's lstat and its readlink
        if exc.errno == errno.ENAMETOOLONG:
            raise
        raise agent_error(candidate, ".", exc) from None
    if real != root and root not in real.parents:
        raise outside_workspace(model_path)
    try:
        st = os.stat(real)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            raise SubmissionRefused(404, "missing_path", f"model_path does not exist: {shown(model_path)}") from None
        raise agent_error(real, ".", exc) from None
    if not stat.S_ISDIR(st.st_mode):
        raise SubmissionRefused(
            400, "not_a_directory", f"model_path must be a model directory, got a file: {shown(model_path)}"
        )
    escaping = _first_link_outside(root, real)
    if escaping is not None:
        raise SubmissionRefused(
            403,
            "outside_workspace",
            f"{safe_text(str(escaping.relative_to(real)))} in {shown(model_path)} links outside the workspace",
        )
    return real


def _first_link_outside(root: Path, real: Path) -> Path | None:
    """The first path below the directory `real` (depth first, links not descended into, as
    Path.rglob("*")) whose real path is outside root, or None. A directory that cannot be listed
    for its permissions is passed over (the snapshot refuses it: unreadable_checkpoint); one that
    vanished or was swapped for something else since it was seen, or an entry whose links changed
    while resolved, is a refusal (agent_error)."""
    stack = [real]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as listing:
                entries = sorted(listing, key=lambda e: e.name, reverse=True)
        except PermissionError:
            continue
        except OSError as exc:
            raise agent_error(real, _shown_rel(directory, real), exc) from None
        for entry in entries:
            path = Path(entry.path)
            try:
                target = Path(os.path.realpath(path))
            except OSError as exc:  # a link replaced between realpath's lstat and its readlink
                raise agent_error(real, _shown_rel(path, real), exc) from None
            if target != root and root not in target.parents:
                return path
            try:
                is_dir = entry.is_dir(follow_symlinks=False)
            except OSError:
                is_dir = False  # vanished since listed
            if is_dir:
                stack.append(path)
    return None


def _shown_rel(path: Path, top: Path) -> str:
    return "." if path == top else str(path.relative_to(top))


def inspect_names(names: list[str]) -> None:
    """Refuse, from the top-level file names alone, LoRA adapter files (alone or beside a full
    model), pickle weights and directories without safetensors weights or config.json (before a
    byte is copied)."""
    adapter = sorted(n for n in names if any(fnmatch(n, p) for p in ADAPTER_FILE_PATTERNS))
    if adapter:
        what = (
            "this is a LoRA adapter, not a full model"
            if "config.json" not in names
            else "the directory holds a full model and LoRA adapter files beside it (transformers would "
            "apply the adapter on load, vLLM would not)"
        )
        raise SubmissionRefused(
            422,
            "lora_adapter",
            f"{what}: {safe_text(', '.join(adapter), SHOWN_PATH_CHARS)}. Merge the adapter into the model "
            "first (model = PeftModel.from_pretrained(base, adapter).merge_and_unload(); "
            "model.save_pretrained(dir); tokenizer.save_pretrained(dir)) and submit a directory that holds "
            "the merged model and no adapter_* files",
        )
    pickled = sorted(n for n in names if any(fnmatch(n, p) for p in PICKLE_WEIGHT_PATTERNS))
    if pickled:
        raise SubmissionRefused(
            422,
            "pickle_weights",
            f"pickle weight files are not accepted ({safe_text(', '.join(pickled), SHOWN_PATH_CHARS)}): save with "
            "safetensors (model.save_pretrained(dir), the default) and remove the pickle files",
        )
    if not any(n.endswith(".safetensors") for n in names):
        raise SubmissionRefused(
            422, "no_safetensors", "no *.safetensors weights in the directory: save with model.save_pretrained(dir)"
        )
    if "config.json" not in names:
        raise SubmissionRefused(422, "no_config", "config.json is missing: save with model.save_pretrained(dir)")


def inspect_checkpoint(model_dir: Path, names: list[str] | None = None) -> None:
    """Refuse what the grader will not load: see inspect_names, then remote code (auto_map or
    trust_remote_code in any of REMOTE_CODE_CONFIGS) and references to files outside the checkpoint
    (inspect_file_references). model_dir must be the grader's own copy (snapshot_checkpoint),
    never the agent's directory; names: the agent's directory's top-level files, as listed when it
    was copied (the copy holds checkpoint files only, so it cannot show the pickle files), by
    default the copy's own."""
    if names is None:
        names = [p.name for p in model_dir.iterdir() if p.is_file()]
    inspect_names(names)
    config = _json_object(model_dir / "config.json", "bad_config")
    for name in REMOTE_CODE_CONFIGS:
        data = config if name == "config.json" else _optional_json_object(model_dir / name, "bad_config")
        if data is not None and ("auto_map" in data or data.get("trust_remote_code")):
            raise SubmissionRefused(
                422,
                "remote_code",
                f"{name} asks for remote code (auto_map); the grader never runs checkpoint code: save the "
                "model and tokenizer with built-in transformers classes (save_pretrained) and remove auto_map",
            )
    inspect_file_references(model_dir, config)


def _json_object(path: Path, reason: str) -> dict:
    """A checkpoint file's JSON object, or a refusal (with `reason`) saying what is wrong with it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:  # str(exc) holds the path of the grader's copy: never quoted
        raise SubmissionRefused(
            422, reason, f"{path.name} cannot be read as a file ({exc.strerror or type(exc).__name__})"
        ) from None
    except (UnicodeError, ValueError, RecursionError) as exc:
        raise SubmissionRefused(422, reason, f"{path.name} is not valid JSON: {safe_text(str(exc), 300)}") from None
    if not isinstance(data, dict):
        raise SubmissionRefused(422, reason, f"{path.name} must hold a JSON object")
    return data


def _optional_json_object(path: Path, reason: str) -> dict | None:
    """_json_object of a checkpoint file that may be absent (None); a directory of that name is
    not the file (a loader passes it over)."""
    return _json_object(path, reason) if path.is_file() else None


def _plain_file_name(value: object) -> bool:
    """A bare file name: what the loader joins to the checkpoint's directory and finds there.

    os.path.join(dir, "/abs") is "/abs" and "../x" climbs out, so anything else may name a file
    anywhere on the grader's host."""
    return isinstance(value, str) and value not in ("", ".", "..") and not any(c in value for c in ("/", "\\", "\0"))


def _bad_reference(where: str, values: list, example: str) -> SubmissionRefused:
    shown_values = safe_text(", ".join(repr(v) for v in values[:5]), SHOWN_PATH_CHARS)
    more = f" and {len(values) - 5} more" if len(values) > 5 else ""
    return SubmissionRefused(
        422,
        "bad_file_reference",
        f"{where} must name files of the checkpoint directory itself, by plain file name ({example}); "
        f"not: {shown_values}{more}. The grader loads only the files you submit: save the model with "
        "model.save_pretrained(dir) and tokenizer.save_pretrained(dir) into the submitted directory",
    )


def inspect_file_references(model_dir: Path, config: dict) -> None:
    """Refuse file references that transformers resolves relative to the checkpoint but that could
    lead out of it (an absolute path, a ../ path) or name a file it does not hold.

    They are: each shard index's weight_map values (model.safetensors.index.json: a checkpoint
    without weights of its own would otherwise load another model of the host, and be scored);
    config.json's transformers_weights (the weights file or index to load); tokenizer_config.json's
    fast_tokenizer_files and *_file keys (_inspect_tokenizer_files)."""
    present = {p.name for p in model_dir.iterdir() if p.is_file()}
    weights = config.get("transformers_weights")
    if weights is not None and (not _plain_file_name(weights) or weights not in present):
        raise _bad_reference("config.json's transformers_weights", [weights], 'e.g. "model.safetensors"')
    for index in sorted(p for p in model_dir.glob("*.index.json") if p.is_file()):
        weight_map = _json_object(index, "bad_file_reference").get("weight_map")
        if not isinstance(weight_map, dict):
            raise SubmissionRefused(
                422,
                "bad_file_reference",
                f"{index.name} has no weight_map object (tensor name -> shard file name): "
                "save with model.save_pretrained(dir), or remove the index of a checkpoint that is not sharded",
            )
        # Only the safetensors shards can be loaded (and are copied): other indexes' shards must be plain names.
        need_present = index.name.endswith(".safetensors.index.json")
        bad = sorted(
            {
                v if isinstance(v, str) else repr(v)
                for v in weight_map.values()
                if not _plain_file_name(v) or (need_present and v not in present)
            }
        )
        if bad:
            raise _bad_reference(f"{index.name}'s weight_map", bad, 'e.g. "model-00001-of-00002.safetensors"')
    tokenizer_config = _optional_json_object(model_dir / "tokenizer_config.json", "bad_file_reference")
    if tokenizer_config is not None:
        _inspect_tokenizer_files(tokenizer_config, present)


def _inspect_tokenizer_files(tokenizer_config: dict, present: set[str]) -> None:
    """tokenizer_config.json's file references: fast_tokenizer_files (the tokenizer.json to load), and
    every *_file key (tokenizer_file, vocab_file, merges_file, special_tokens_map_file...), which
    reach the tokenizer's constructor as paths (transformers 4.x lets them override the files it
    found in the checkpoint; 5.x still passes on those its tokenizer class does not look for itself,
    such as merges_file, and opens them). Each must be null or a plain file name of the checkpoint."""
    files = tokenizer_config.get("fast_tokenizer_files")
    if files is not None:
        bad = [f for f in files if not _plain_file_name(f) or f not in present] if isinstance(files, list) else [files]
        if bad:
            raise _bad_reference("tokenizer_config.json's fast_tokenizer_files", bad, 'e.g. "tokenizer.json"')
    for key, value in sorted(tokenizer_config.items()):
        if key.endswith("_file") and value is not None and (not _plain_file_name(value) or value not in present):
            raise _bad_reference(
                f"tokenizer_config.json's {safe_text(key, 80)}", [value], 'e.g. "tokenizer.json", or remove the key'
            )


def is_checkpoint_file(name: str) -> bool:
    return any(fnmatch(name, pattern) for pattern in CHECKPOINT_PATTERNS)


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The files that make up a checkpoint, relative to model_dir, sorted (for the grader's own
    copies: it follows no links, as Path.rglob does not, but checks nothing)."""
    files = [p.relative_to(model_dir) for p in model_dir.rglob("*") if p.is_file() and is_checkpoint_file(p.name)]
    return sorted(files)


# -- refusals of what the agent's side did --------------------------------------------------------
def checkpoint_changed(model_dir: Path, what: str) -> SubmissionRefused:
    return SubmissionRefused(
        409,
        "checkpoint_changed",
        f"{what} changed while the grader was checking or copying {safe_text(str(model_dir.name), SHOWN_PATH_CHARS)}: "
        "submit a checkpoint once it is completely saved, and leave it alone until the answer comes",
    )


# What the agent's side answers when a path it holds was swapped, removed or replaced while the
# grader lists, stats, opens or resolves it (a file for a link or a directory, a directory for a
# link or a file; EINVAL: readlink of what is no longer a link; ENXIO/ENODEV: a socket, a device):
# the submission changed under the grader (checkpoint_changed).
_CHANGED_ERRNOS = frozenset(
    {errno.ENOENT, errno.ENOTDIR, errno.ELOOP, errno.EISDIR, errno.EINVAL, errno.ENXIO, errno.ENODEV, errno.ESTALE}
)


def agent_error(model_dir: Path, rel: str, exc: OSError) -> SubmissionRefused:
    """The refusal an OSError of the agent's own paths (listing, stat, open, resolving, reading
    them) calls for: checkpoint_changed for a race (_CHANGED_ERRNOS), unreadable_checkpoint for
    anything else (permissions, an I/O error); the grader's own errors (nofollow.GRADER_ERRNOS) are
    re-raised as they are, never blamed on the agent."""
    if exc.errno in nofollow.GRADER_ERRNOS:
        raise exc
    if exc.errno in _CHANGED_ERRNOS:
        what = safe_text(str(rel), SHOWN_PATH_CHARS) if rel not in ("", ".") else "the directory"
        return checkpoint_changed(model_dir, what)
    return unreadable_checkpoint(model_dir, rel, exc)


def file_refused(model_dir: Path, rel: object, reason: str, problem: str) -> SubmissionRefused:
    """A 422 refusal for one file of the checkpoint: "<rel> in <directory name> <problem>"."""
    return SubmissionRefused(
        422, reason, f"{safe_text(str(rel), SHOWN_PATH_CHARS)} in {safe_text(model_dir.name, SHOWN_PATH_CHARS)} {problem}"
    )


def unreadable_checkpoint(model_dir: Path, rel: str, exc: OSError) -> SubmissionRefused:
    return file_refused(
        model_dir,
        rel,
        "unreadable_checkpoint",
        f"cannot be read ({exc.strerror or exc}): the grader copies the checkpoint as it is; make its files "
        "and directories readable (chmod -R u+rwX,go+rX DIR)",
    )

