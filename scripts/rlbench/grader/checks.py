"""What a submission must satisfy before the grader loads it, its snapshot and its content fingerprint.

The agent owns its workspace and may change it at any moment, including while the grader looks at
it. So the grader never loads, hashes or inspects the workspace itself: it copies the checkpoint
first, without following a single symbolic link (every directory and file opened relative to its
parent's descriptor with O_NOFOLLOW), then inspects, fingerprints and evaluates the copy. Whatever
the agent swaps in between, what gets scored is what was copied, and the copy holds only regular
files that were inside the workspace.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath
from typing import Iterator

from rlbench.ledger import safe_text

# Files that make up a checkpoint; everything else (optimizer state, logs) is ignored.
CHECKPOINT_PATTERNS = ("*.safetensors", "*.json", "*.jinja", "*.model", "*.txt", "*.tiktoken")
# Weight formats that unpickle on load: they can run code inside the grader.
PICKLE_WEIGHT_PATTERNS = ("pytorch_model*.bin", "model*.bin", "*.pt", "*.pth", "*.ckpt", "*.pkl", "*.pickle")
# How much of a model_path a message quotes: enough to recognise it, never a wall of text.
SHOWN_PATH_CHARS = 200
# Subdirectories of a checkpoint deeper than this are not copied (nor loaded: transformers reads
# the top level and additional_chat_templates/); it bounds the descriptors a copy holds open.
CHECKPOINT_MAX_DEPTH = 16
# The grader's audit copy of the agent's code/ at each submission: small files only, bounded.
CODE_SNAPSHOT_MAX_FILE_BYTES = 1 << 20
CODE_SNAPSHOT_MAX_FILES = 2000
CODE_SNAPSHOT_MAX_TOTAL_BYTES = 16 << 20
CODE_SNAPSHOT_MAX_ENTRIES = 50_000  # entries looked at (a virtualenv in code/ must not cost minutes)
CODE_SNAPSHOT_MAX_DEPTH = 16
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a file swapped for a FIFO after it was listed must not block the grader in open().
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC


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


def inspect_names(names: list[str]) -> None:
    """Refuse, from the top-level file names alone, LoRA adapters, pickle weights and directories
    without safetensors weights or config.json (before a byte is copied)."""
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
    """Refuse what the grader will not load: see inspect_names, then remote code and references to
    files outside the checkpoint. model_dir must be the grader's own copy (snapshot_checkpoint),
    never the agent's directory; names: the agent's directory's top-level files, as listed when it
    was copied (the copy holds checkpoint files only, so it cannot show the pickle files), by
    default the copy's own."""
    if names is None:
        names = [p.name for p in model_dir.iterdir() if p.is_file()]
    inspect_names(names)
    config = _json_object(model_dir / "config.json", "bad_config")
    if "auto_map" in config or config.get("trust_remote_code"):
        raise SubmissionRefused(
            422,
            "remote_code",
            "config.json asks for remote code (auto_map); the grader never runs checkpoint code: "
            "save the model with a built-in transformers architecture",
        )
    inspect_file_references(model_dir, config)


def _json_object(path: Path, reason: str) -> dict:
    """A checkpoint file's JSON object, or a refusal (with `reason`) saying what is wrong with it."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeError, ValueError, RecursionError) as exc:
        raise SubmissionRefused(422, reason, f"{path.name} is not valid JSON: {safe_text(str(exc), 300)}") from None
    if not isinstance(data, dict):
        raise SubmissionRefused(422, reason, f"{path.name} must hold a JSON object")
    return data


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
    fast_tokenizer_files (the tokenizer.json to load)."""
    present = {p.name for p in model_dir.iterdir() if p.is_file()}
    weights = config.get("transformers_weights")
    if weights is not None and (not _plain_file_name(weights) or weights not in present):
        raise _bad_reference("config.json's transformers_weights", [weights], 'e.g. "model.safetensors"')
    for index in sorted(model_dir.glob("*.index.json")):
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
    tokenizer_config = model_dir / "tokenizer_config.json"
    if tokenizer_config.is_file():
        files = _json_object(tokenizer_config, "bad_file_reference").get("fast_tokenizer_files")
        if files is not None:
            bad = (
                [f for f in files if not _plain_file_name(f) or f not in present]
                if isinstance(files, list)
                else [files]
            )
            if bad:
                raise _bad_reference("tokenizer_config.json's fast_tokenizer_files", bad, 'e.g. "tokenizer.json"')


def is_checkpoint_file(name: str) -> bool:
    return any(fnmatch(name, pattern) for pattern in CHECKPOINT_PATTERNS)


def checkpoint_files(model_dir: Path) -> list[Path]:
    """The files that make up a checkpoint, relative to model_dir, sorted (for the grader's own
    copies: it follows no links, as Path.rglob does not, but checks nothing)."""
    files = [p.relative_to(model_dir) for p in model_dir.rglob("*") if p.is_file() and is_checkpoint_file(p.name)]
    return sorted(files)


class _Fingerprint:
    """The running fingerprint of a checkpoint (sha256 over each file's name and content, in
    checkpoint_files order) and, when `per_file`, each file's own size and sha256, computed from
    the same blocks in the same pass."""

    def __init__(self, per_file: bool):
        self.digest = hashlib.sha256()
        self.per_file = per_file
        self.files: list[dict] = []

    def add(self, rel: PurePosixPath | Path, blocks: Iterator[bytes]) -> None:
        self.digest.update(os.fsencode(rel) + b"\0")  # = str(rel).encode() for UTF-8 names; never raises
        own = hashlib.sha256() if self.per_file else None
        size = 0
        for block in blocks:
            self.digest.update(block)
            if own is not None:
                own.update(block)
                size += len(block)
        self.digest.update(b"\0")
        if own is not None:
            self.files.append({"name": str(rel), "size": size, "sha256": own.hexdigest()})


def _blocks(handle) -> Iterator[bytes]:
    while block := handle.read(1 << 20):
        yield block


def _fingerprint(model_dir: Path, per_file: bool) -> _Fingerprint:
    running = _Fingerprint(per_file)
    for rel in checkpoint_files(model_dir):
        with open(model_dir / rel, "rb") as handle:
            running.add(rel, _blocks(handle))
    return running


def fingerprint(model_dir: Path) -> str:
    """sha256 over the checkpoint's file names and contents; equal weights, equal fingerprint."""
    return _fingerprint(model_dir, per_file=False).digest.hexdigest()


def checkpoint_manifest(model_dir: Path) -> dict:
    """The fingerprint (the same value as fingerprint()) and each checkpoint file's name, size and
    sha256, all from one read of the files. For the grader's own copies (it follows no link in
    model_dir's tree, as checkpoint_files, but checks nothing): see workspace_checkpoint_manifest
    for a directory of the agent's."""
    running = _fingerprint(model_dir, per_file=True)
    return {"fingerprint": running.digest.hexdigest(), "files": running.files}


def workspace_checkpoint_manifest(workspace: Path, model_dir: Path, max_bytes: int | None = None) -> dict:
    """checkpoint_manifest of a directory inside the agent's workspace, read as the grader reads a
    submission: following no link (a checkpoint file that is a link, a FIFO or a device is left out
    and named in `skipped`), each file opened relative to its directory with O_NOFOLLOW. The
    fingerprint is the one the grader would give the same regular files (None when something was
    skipped, unreadable, or when the files hold more than max_bytes: then `files` lists names and
    sizes only, and `truncated` says why)."""
    root = Path(os.path.realpath(workspace))
    result: dict = {"fingerprint": None, "files": [], "skipped": [], "truncated": None}
    try:
        top = open_directory_inside(root, Path(os.path.realpath(model_dir)))
    except (OSError, ValueError) as exc:
        result["truncated"] = f"not a directory of the workspace ({exc.__class__.__name__})"
        return result
    running = _Fingerprint(per_file=True)
    total = 0
    try:
        walk = _walk(top, CHECKPOINT_MAX_DEPTH, skip_unreadable=True)
        try:
            for entry in walk:
                if stat.S_ISDIR(entry.st.st_mode) or not is_checkpoint_file(entry.name):
                    continue
                if not stat.S_ISREG(entry.st.st_mode):
                    result["skipped"].append(str(entry.rel))
                    continue
                total += entry.st.st_size
                if result["truncated"] is None and max_bytes is not None and total > max_bytes:
                    result["truncated"] = f"more than {max_bytes} bytes: not hashed"
                if result["truncated"] is not None:
                    result["files"].append({"name": str(entry.rel), "size": entry.st.st_size, "sha256": None})
                    continue
                try:
                    fd = os.open(entry.name, _FILE_FLAGS, dir_fd=entry.dir_fd)
                except OSError:
                    result["skipped"].append(str(entry.rel))
                    continue
                try:
                    if not stat.S_ISREG(os.fstat(fd).st_mode):
                        result["skipped"].append(str(entry.rel))
                        continue
                    os.set_blocking(fd, True)
                    with os.fdopen(os.dup(fd), "rb") as handle:
                        running.add(entry.rel, _blocks(handle))
                except OSError:
                    result["skipped"].append(str(entry.rel))
                    result["truncated"] = result["truncated"] or "a file could not be read"
                finally:
                    os.close(fd)
        finally:
            walk.close()
    finally:
        os.close(top)
    if result["truncated"] is None and not result["skipped"]:
        result["fingerprint"] = running.digest.hexdigest()
    result["files"] = running.files + result["files"]  # hashed, then those left unhashed
    result["files"].sort(key=lambda f: PurePosixPath(f["name"]).parts)
    result["bytes"] = total
    return result


# -- copies that follow no link ------------------------------------------------------------------
def _changed(model_dir: Path, what: str) -> SubmissionRefused:
    return SubmissionRefused(
        409,
        "checkpoint_changed",
        f"{what} changed while the grader was copying {safe_text(str(model_dir.name), SHOWN_PATH_CHARS)}: "
        "submit a checkpoint once it is completely saved, and leave it alone until the answer comes",
    )


def _inside(root: Path, path: str) -> bool:
    return path == str(root) or path.startswith(str(root).rstrip("/") + "/")


def open_directory_inside(root: Path, directory: Path) -> int:
    """An O_NOFOLLOW descriptor of `directory`, a real path inside the real path `root`.

    Opened one component at a time from root, each relative to its parent's descriptor with
    O_NOFOLLOW: a component swapped for a symlink since the path was resolved fails (ELOOP or
    ENOTDIR) instead of leading elsewhere. The open directory's path is then checked again through
    /proc/self/fd (where there is one). Raises OSError (or ValueError if directory is not under root)."""
    parts = directory.relative_to(root).parts
    fd = os.open(root, _DIR_FLAGS)
    try:
        for part in parts:
            child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        try:
            where = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            where = None  # no /proc: the component-wise O_NOFOLLOW walk is the guarantee
        if where is not None and not _inside(root, where):
            raise OSError(errno.EXDEV, f"the opened directory is outside {root}: {where}")
        return fd
    except BaseException:
        os.close(fd)
        raise


@dataclass
class _Entry:
    rel: PurePosixPath  # path relative to the walked directory
    name: str
    dir_fd: int  # the descriptor of its directory (valid while the walk is at this entry)
    st: os.stat_result  # lstat: a link is a link


def _walk(
    dir_fd: int, max_depth: int, rel: PurePosixPath = PurePosixPath(), depth: int = 0, skip_unreadable: bool = False
) -> Iterator[_Entry]:
    """Every entry below an open directory, sorted, depth first, never following a link: real
    subdirectories are opened with O_NOFOLLOW relative to their parent and descended into (up to
    max_depth); entries that vanish while walked are skipped. A directory that cannot be read
    raises Unreadable, or is skipped (skip_unreadable). Closing the generator closes every
    descriptor it opened."""
    try:
        names = sorted(os.listdir(dir_fd))
    except OSError as exc:
        if skip_unreadable:
            return
        raise Unreadable(exc.errno, exc.strerror, str(rel)) from None
    for name in names:
        try:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if skip_unreadable:
                continue
            raise Unreadable(exc.errno, exc.strerror, str(rel / name)) from None
        yield _Entry(rel / name, name, dir_fd, st)
        if stat.S_ISDIR(st.st_mode) and depth < max_depth:
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as exc:
                if exc.errno == errno.ELOOP or skip_unreadable:  # ELOOP: swapped for a link since listed
                    continue
                raise Unreadable(exc.errno, exc.strerror, str(rel / name)) from None
            try:
                yield from _walk(child, max_depth, rel / name, depth + 1, skip_unreadable)
            finally:
                os.close(child)


class NotRegularFile(OSError):
    """What was opened as a checkpoint file is not a regular file (any more)."""


class Unreadable(OSError):
    """The agent's file or directory cannot be read (its permissions, most likely): its doing, not
    the grader's, unlike a failure to write the copy (a full disk), which stays a plain OSError."""


def _copy_file_at(dir_fd: int, name: str, dest: Path, limit: int | None = None) -> int:
    """Copy one regular file, opened relative to dir_fd without following a link, to dest (created
    exclusively); returns its size. Copies exactly the size it had when opened (a file still
    growing is cut there: a snapshot is of one moment). Raises NotRegularFile for anything that is
    not a regular file, OSError when it cannot be read; `limit`: refuse (NotRegularFile) bigger ones."""
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise NotRegularFile(errno.ELOOP, "a symbolic link", name) from None
        raise Unreadable(exc.errno, exc.strerror, name) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(errno.EINVAL, "not a regular file", name)
        if limit is not None and st.st_size > limit:
            raise NotRegularFile(errno.EFBIG, "too large", name)
        os.set_blocking(fd, True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            left = st.st_size
            while left > 0:
                try:
                    block = os.read(fd, min(left, 8 << 20))
                except OSError as exc:
                    raise Unreadable(exc.errno, exc.strerror, name) from None
                if not block:
                    break  # truncated while copied: the copy holds what there was
                left -= len(block)
                view = memoryview(block)
                while view:
                    view = view[os.write(out, view) :]
        finally:
            os.close(out)
        return st.st_size - left
    finally:
        os.close(fd)


def _top_level_names(dir_fd: int) -> list[str]:
    """The names of the non-directory entries directly in a directory (links included, unfollowed)."""
    names = []
    for name in os.listdir(dir_fd):
        try:
            if not stat.S_ISDIR(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode):
                names.append(name)
        except FileNotFoundError:
            continue
    return sorted(names)


def snapshot_checkpoint(workspace: Path, model_dir: Path, dest: Path) -> list[str]:
    """Copy the checkpoint files (not the agent's optimizer state) of model_dir, a real directory
    inside the workspace (resolve_submission), to dest, following no link; returns the names of
    the files at its top level, as listed then (inspect_checkpoint's `names`).

    What the names alone condemn (inspect_names) is refused before anything is copied. A checkpoint
    file that is a symbolic link (or a FIFO, a device...) when the grader opens it is refused
    (not_a_regular_file), whatever it was when resolve_submission looked: that is the
    time-of-check/time-of-use race a link swapped in since would otherwise win. Links that are not
    checkpoint files (a `latest` link to a subdirectory) are neither followed nor copied. A file
    or directory the grader may not read is refused (unreadable_checkpoint); a failure to write
    the copy is the grader's (OSError)."""
    root = Path(os.path.realpath(workspace))
    if dest.exists():
        shutil.rmtree(dest)
    try:
        top = open_directory_inside(root, model_dir)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise _unreadable(model_dir, ".", exc) from None
        raise _changed(model_dir, "the directory (or a directory above it)") from None
    except ValueError:
        raise _changed(model_dir, "the directory (or a directory above it)") from None
    try:
        names = _top_level_names(top)
        inspect_names(names)
        dest.mkdir(parents=True)
        walk = _walk(top, CHECKPOINT_MAX_DEPTH)
        try:
            for entry in walk:
                if stat.S_ISDIR(entry.st.st_mode) or not is_checkpoint_file(entry.name):
                    continue
                try:
                    _copy_file_at(entry.dir_fd, entry.name, dest / entry.rel)
                except NotRegularFile:
                    raise _not_regular(model_dir, entry.rel) from None
                except FileNotFoundError:
                    raise _changed(model_dir, safe_text(str(entry.rel), SHOWN_PATH_CHARS)) from None
        except Unreadable as exc:
            raise _unreadable(model_dir, exc.filename, exc) from None
        finally:
            walk.close()
    finally:
        os.close(top)
    return names


def _unreadable(model_dir: Path, rel: str, exc: OSError) -> SubmissionRefused:
    return SubmissionRefused(
        422,
        "unreadable_checkpoint",
        f"{safe_text(str(rel), SHOWN_PATH_CHARS)} in {safe_text(model_dir.name, SHOWN_PATH_CHARS)} cannot be read "
        f"({exc.strerror or exc}): the grader copies the checkpoint as it is; make its files and directories "
        "readable (chmod -R u+rwX,go+rX DIR)",
    )


def _not_regular(model_dir: Path, rel: PurePosixPath) -> SubmissionRefused:
    return SubmissionRefused(
        422,
        "not_a_regular_file",
        f"{safe_text(str(rel), SHOWN_PATH_CHARS)} in {safe_text(model_dir.name, SHOWN_PATH_CHARS)} is not a regular "
        "file (a symbolic link, a FIFO...): the grader copies checkpoint files without following links. "
        "Put the files themselves in the directory (cp --dereference, or save the model there)",
    )


def snapshot_code(workspace: Path, dest: Path) -> dict:
    """The grader's audit copy of the agent's code/ (small files only, bounded), following no link.

    A code/ that is itself a link is not copied at all (a link to the held-out directory, or to /,
    would have the grader copy it); links and special files inside are skipped, real
    subdirectories descended into. Stops at CODE_SNAPSHOT_MAX_FILES files,
    CODE_SNAPSHOT_MAX_TOTAL_BYTES bytes or CODE_SNAPSHOT_MAX_ENTRIES entries looked at; returns
    what it did (also written to dest/.snapshot.json when anything was left out)."""
    summary = {"files": 0, "bytes": 0, "skipped": 0, "truncated": False}
    root = Path(os.path.realpath(workspace))
    try:
        code = open_directory_inside(root, root / "code")
    except OSError as exc:
        summary["not_copied"] = f"code/ is not a directory of the workspace ({errno.errorcode.get(exc.errno, exc)})"
        return summary
    try:
        walk = _walk(code, CODE_SNAPSHOT_MAX_DEPTH, skip_unreadable=True)
        try:
            for seen, entry in enumerate(walk, 1):
                if seen > CODE_SNAPSHOT_MAX_ENTRIES or summary["files"] >= CODE_SNAPSHOT_MAX_FILES:
                    summary["truncated"] = True
                    break
                if not stat.S_ISREG(entry.st.st_mode):
                    summary["skipped"] += not stat.S_ISDIR(entry.st.st_mode)
                    continue
                room = CODE_SNAPSHOT_MAX_TOTAL_BYTES - summary["bytes"]
                if entry.st.st_size > min(CODE_SNAPSHOT_MAX_FILE_BYTES, room):
                    summary["skipped"] += 1
                    summary["truncated"] |= entry.st.st_size <= CODE_SNAPSHOT_MAX_FILE_BYTES
                    continue
                try:
                    limit = min(CODE_SNAPSHOT_MAX_FILE_BYTES, room)  # it may have grown since listed
                    summary["bytes"] += _copy_file_at(entry.dir_fd, entry.name, dest / entry.rel, limit=limit)
                    summary["files"] += 1
                except OSError:  # swapped, vanished, grown: an audit copy skips it
                    summary["skipped"] += 1
        finally:
            walk.close()
    finally:
        os.close(code)
    if summary["truncated"] or summary["skipped"]:
        dest.mkdir(parents=True, exist_ok=True)
        (dest / ".snapshot.json").write_text(json.dumps(summary) + "\n")
    return summary


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
