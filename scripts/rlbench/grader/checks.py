"""What a submission must satisfy before the grader loads it, its snapshot and its content fingerprint.

The agent owns its workspace and may change it at any moment, including while the grader looks at
it. So the grader never loads, hashes or inspects the workspace itself: it copies the checkpoint
first, without following a single symbolic link (every directory and file opened relative to its
parent's descriptor with O_NOFOLLOW) and fingerprinting it in the same read (or, where the file
system offers copy-on-write clones, cloning each file and hashing the clone), then inspects and
evaluates the copy. Whatever the agent swaps in between, what gets scored is what was copied, and
the copy holds only regular files that were inside the workspace.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import queue
import shutil
import stat
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from fnmatch import fnmatch
from pathlib import Path, PurePosixPath

from rlbench.fileio import nofollow
from rlbench.recording.ledger import safe_text

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
    """resolve_submission's checks, on a tree the agent may change while they run: every OSError
    that its paths answer (a file, link or directory swapped, removed or made unreadable meanwhile)
    is a refusal of the submission (_agent_error), never an error of the grader's; ENAMETOOLONG of
    model_path itself is left to resolve_submission (invalid_path)."""
    root = Path(os.path.realpath(workspace))
    raw = Path(model_path)
    candidate = raw if raw.is_absolute() else root / raw
    try:
        real = Path(os.path.realpath(candidate))
    except OSError as exc:  # a link replaced between realpath's lstat and its readlink
        if exc.errno == errno.ENAMETOOLONG:
            raise
        raise _agent_error(candidate, ".", exc) from None
    if real != root and root not in real.parents:
        raise SubmissionRefused(
            403,
            "outside_workspace",
            f"model_path must be inside the workspace ({root}); got {shown(model_path)} "
            f"(resolves to {safe_text(str(real), SHOWN_PATH_CHARS)})",
        )
    try:
        st = os.stat(real)
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:
            raise
        if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
            raise SubmissionRefused(404, "missing_path", f"model_path does not exist: {shown(model_path)}") from None
        raise _agent_error(real, ".", exc) from None
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
    while resolved, is a refusal (_agent_error)."""
    stack = [real]
    while stack:
        directory = stack.pop()
        try:
            with os.scandir(directory) as listing:
                entries = sorted(listing, key=lambda e: e.name, reverse=True)
        except PermissionError:
            continue
        except OSError as exc:
            raise _agent_error(real, _shown_rel(directory, real), exc) from None
        for entry in entries:
            path = Path(entry.path)
            try:
                target = Path(os.path.realpath(path))
            except OSError as exc:  # a link replaced between realpath's lstat and its readlink
                raise _agent_error(real, _shown_rel(path, real), exc) from None
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


# -- fingerprints ---------------------------------------------------------------------------------
# A checkpoint's fingerprint is a digest of its manifest: sha256 over this tag, then for each
# checkpoint file, in checkpoint_files order, its relative name (as bytes; a name holds no NUL),
# NUL, its size in decimal, NUL, its own sha256 (64 hex digits), LF. Each file's sha256 is the
# plain one (`sha256sum FILE`), so one sha256 pass over each byte gives both, and anyone can
# recompute the fingerprint from a checkpoint.json (manifest_fingerprint). Runs recorded before
# this definition hold legacy fingerprints (legacy_fingerprint): fingerprint_matches accepts both.
FINGERPRINT_TAG = b"rlbench checkpoint fingerprint v2\n"
# How checkpoint files are read: in blocks of STREAM_BLOCK bytes, through STREAM_BUFFERS reusable
# buffers, each block hashed (and written, for a copy) in threads while the next one is read.
STREAM_BLOCK = 8 << 20
STREAM_BUFFERS = 4
# A kernel copy (copy_file_range) goes this many bytes at a time, each hashed from the copy while
# the next is copied; checkpoint files are snapshot by up to SNAPSHOT_THREADS threads at once (a
# sharded checkpoint is hashed on several cores).
KERNEL_COPY_BLOCK = 32 << 20
SNAPSHOT_THREADS = max(1, min(4, os.cpu_count() or 1))


def manifest_order(name: str) -> tuple[str, ...]:
    """The sort key of a manifest's file names: the order of checkpoint_files (by path component)."""
    return PurePosixPath(name).parts


def manifest_fingerprint(files: list[dict]) -> str:
    """The fingerprint of a checkpoint from its manifest's files ({"name", "size", "sha256"}, in
    manifest_order): what fingerprint() and checkpoint_manifest() give, without reading a byte."""
    digest = hashlib.sha256(FINGERPRINT_TAG)
    for f in files:
        digest.update(b"%s\0%d\0%s\n" % (os.fsencode(f["name"]), f["size"], f["sha256"].encode("ascii")))
    return digest.hexdigest()


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view) :]


class _Streamer:
    """Reads a file once, in big blocks through a few reusable buffers (bounded memory), hashing
    each block and, for a copy, writing it. The calling thread reads; a hashing thread and a
    writing thread take each block in turn (hashlib and os.write release the GIL on big buffers),
    so reading, hashing and writing overlap: the cost is the slowest of the three, not their sum."""

    def __init__(self, block: int | None = None, buffers: int | None = None):
        self.block = block or STREAM_BLOCK
        self.count = max(buffers or STREAM_BUFFERS, 2)
        self._buffers: list[bytearray] = []

    def buffers(self) -> list[bytearray]:
        if not self._buffers:
            self._buffers = [bytearray(self.block) for _ in range(self.count)]
        return self._buffers

    def stream(self, src: int, size: int, out: int | None = None, name: str = "") -> tuple[int, str]:
        """Read src (a blocking descriptor, from its current offset) up to `size` bytes or its end
        (a file truncated meanwhile: what there was), writing every block to `out` when given;
        returns (bytes read, their sha256). A read error raises nofollow.Unreadable (named `name`); a write
        error stays a plain OSError."""
        digest = hashlib.sha256()
        if size <= self.block:  # one block (config.json, tokenizer files): no threads
            view = memoryview(self._buffers[0] if self._buffers else bytearray(size))
            total = 0
            while total < size:
                n = self._read(src, view[total:size], name)
                if n == 0:
                    break
                total += n
            digest.update(view[:total])
            if out is not None:
                _write_all(out, view[:total])
            return total, digest.hexdigest()
        return self._pipelined(src, size, out, name, digest)

    @staticmethod
    def _read(src: int, view: memoryview, name: str) -> int:
        try:
            return os.readv(src, [view])
        except OSError as exc:
            raise nofollow.Unreadable(exc.errno, exc.strerror, name) from None

    def _pipelined(self, src: int, size: int, out: int | None, name: str, digest) -> tuple[int, str]:
        free: queue.SimpleQueue = queue.SimpleQueue()
        to_hash: queue.SimpleQueue = queue.SimpleQueue()
        to_write: queue.SimpleQueue | None = queue.SimpleQueue() if out is not None else None
        failed: list[BaseException] = []  # a worker's first error; the others then only pass blocks on
        for buffer in self.buffers():
            free.put(buffer)

        def hasher() -> None:
            while (item := to_hash.get()) is not None:
                if not failed:
                    try:
                        digest.update(memoryview(item[0])[: item[1]])
                    except BaseException as exc:  # noqa: BLE001 - handed to the reading thread
                        failed.append(exc)
                (to_write or free).put(item if to_write is not None else item[0])
            if to_write is not None:
                to_write.put(None)

        def writer() -> None:
            while (item := to_write.get()) is not None:
                if not failed:
                    try:
                        _write_all(out, memoryview(item[0])[: item[1]])
                    except BaseException as exc:  # noqa: BLE001 - handed to the reading thread
                        failed.append(exc)
                free.put(item[0])

        threads = [threading.Thread(target=hasher, name="snapshot-hash", daemon=True)]
        if to_write is not None:
            threads.append(threading.Thread(target=writer, name="snapshot-write", daemon=True))
        for thread in threads:
            thread.start()
        total = 0
        try:
            while total < size and not failed:
                buffer = free.get()
                n = self._read(src, memoryview(buffer)[: min(size - total, self.block)], name)
                if n == 0:
                    break  # truncated while read: what there was
                total += n
                to_hash.put((buffer, n))
        finally:
            to_hash.put(None)
            for thread in threads:
                thread.join()
        if failed:
            raise failed[0]
        return total, digest.hexdigest()


def _file_entry(rel, size: int, sha256: str) -> dict:
    return {"name": str(rel), "size": size, "sha256": sha256}


def fingerprint(model_dir: Path) -> str:
    """The checkpoint's fingerprint (see FINGERPRINT_TAG): equal checkpoint files, equal fingerprint."""
    return checkpoint_manifest(model_dir)["fingerprint"]


def checkpoint_manifest(model_dir: Path) -> dict:
    """The fingerprint (the same value as fingerprint()) and each checkpoint file's name, size and
    sha256, all from one read of the files. For the grader's own copies (it follows no link in
    model_dir's tree, as checkpoint_files, but checks nothing): see workspace_checkpoint_manifest
    for a directory of the agent's, take_snapshot for the copy and its manifest in one read."""
    streamer = _Streamer()
    files = []
    for rel in checkpoint_files(model_dir):
        fd = os.open(model_dir / rel, os.O_RDONLY | os.O_CLOEXEC)
        try:
            size, sha256 = streamer.stream(fd, os.fstat(fd).st_size, name=str(rel))
        finally:
            os.close(fd)
        files.append(_file_entry(rel, size, sha256))
    return {"fingerprint": manifest_fingerprint(files), "files": files}


def legacy_fingerprint(model_dir: Path) -> str:
    """The fingerprint as runs recorded before FINGERPRINT_TAG hold it: sha256 over each checkpoint
    file's name, NUL, content, NUL, in checkpoint_files order (a second pass over every byte)."""
    digest = hashlib.sha256()
    for rel in checkpoint_files(model_dir):
        digest.update(os.fsencode(rel) + b"\0")
        with open(model_dir / rel, "rb") as handle:
            while block := handle.read(STREAM_BLOCK):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


def fingerprint_matches(model_dir: Path, expected: str | None, current: str | None = None) -> bool:
    """Whether model_dir's checkpoint files are those `expected` fingerprints, by the current
    definition or, failing that, by the legacy one (a run recorded before it). `current`: model_dir's
    fingerprint() when the caller already has it (saves a read)."""
    if not isinstance(expected, str) or not expected:
        return False
    if (current if current is not None else fingerprint(model_dir)) == expected:
        return True
    return legacy_fingerprint(model_dir) == expected


def workspace_checkpoint_manifest(workspace: Path, model_dir: Path, max_bytes: int | None = None) -> dict:
    """checkpoint_manifest of a directory inside the agent's workspace, read as the grader reads a
    submission: following no link (a checkpoint file that is a link, a FIFO or a device is left out
    and named in `skipped`), each file opened relative to its directory with O_NOFOLLOW and read up
    to the size it had when opened. The fingerprint is the one the grader would give the same
    regular files (None when something was skipped, unreadable, or when the files hold more than
    max_bytes: then `files` lists names and sizes only, and `truncated` says why)."""
    root = Path(os.path.realpath(workspace))
    result: dict = {"fingerprint": None, "files": [], "skipped": [], "truncated": None}
    try:
        top = nofollow.open_directory_inside(root, Path(os.path.realpath(model_dir)))
    except (OSError, ValueError) as exc:
        result["truncated"] = f"not a directory of the workspace ({exc.__class__.__name__})"
        return result
    streamer = _Streamer()
    hashed: list[dict] = []
    total = 0
    try:
        walk = nofollow.walk(top, CHECKPOINT_MAX_DEPTH, skip_unreadable=True)
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
                    fd = os.open(entry.name, nofollow.FILE_FLAGS, dir_fd=entry.dir_fd)
                except OSError:
                    result["skipped"].append(str(entry.rel))
                    continue
                try:
                    st = os.fstat(fd)
                    if not stat.S_ISREG(st.st_mode):
                        result["skipped"].append(str(entry.rel))
                        continue
                    os.set_blocking(fd, True)
                    size, sha256 = streamer.stream(fd, st.st_size, name=str(entry.rel))
                    hashed.append(_file_entry(entry.rel, size, sha256))
                except OSError:
                    result["skipped"].append(str(entry.rel))
                    result["truncated"] = result["truncated"] or "a file could not be read"
                finally:
                    os.close(fd)
        finally:
            walk.close()
    finally:
        os.close(top)
    hashed.sort(key=lambda f: manifest_order(f["name"]))
    if result["truncated"] is None and not result["skipped"]:
        result["fingerprint"] = manifest_fingerprint(hashed)
    result["files"] = hashed + result["files"]  # hashed, then those left unhashed
    result["files"].sort(key=lambda f: manifest_order(f["name"]))
    result["bytes"] = total
    return result


# -- copies that follow no link ------------------------------------------------------------------
def _changed(model_dir: Path, what: str) -> SubmissionRefused:
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


def _agent_error(model_dir: Path, rel: str, exc: OSError) -> SubmissionRefused:
    """The refusal an OSError of the agent's own paths (listing, stat, open, resolving, reading
    them) calls for: checkpoint_changed for a race (_CHANGED_ERRNOS), unreadable_checkpoint for
    anything else (permissions, an I/O error); the grader's own errors (nofollow.GRADER_ERRNOS) are
    re-raised as they are, never blamed on the agent."""
    if exc.errno in nofollow.GRADER_ERRNOS:
        raise exc
    if exc.errno in _CHANGED_ERRNOS:
        return _changed(model_dir, safe_text(str(rel), SHOWN_PATH_CHARS) if rel not in ("", ".") else "the directory")
    return _unreadable(model_dir, rel, exc)


# Linux's FICLONE ioctl (linux/fs.h: _IOW(0x94, 9, int)): make dest share src's extents (reflink).
FICLONE = 0x40049409
# What a file system without reflinks (ext4, tmpfs, overlayfs) or a clone across file systems
# answers: the snapshot copies the bytes instead, and tries no other clone.
_CLONE_UNSUPPORTED = frozenset(
    {errno.EOPNOTSUPP, errno.ENOTSUP, errno.EXDEV, errno.EINVAL, errno.ENOTTY, errno.ENOSYS, errno.EPERM}
)


def _clone(src_fd: int, dest_fd: int) -> None:
    """Make dest_fd's file a copy-on-write clone of src_fd's whole file (OSError where unsupported)."""
    if sys.platform != "linux":
        raise OSError(errno.EOPNOTSUPP, "no FICLONE outside Linux")
    import fcntl

    fcntl.ioctl(dest_fd, FICLONE, src_fd)


# copy_file_range errors that are the copy's (the grader's disk), not the agent's file.
_WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS})
# copy_file_range errors that mean "not between these files here": copy through the process instead.
_KERNEL_COPY_UNSUPPORTED = frozenset({errno.EXDEV, errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP})


def _kernel_copy(src: int, out: int, size: int, name: str, streamer: _Streamer) -> tuple[int, str] | None:
    """Copy `size` bytes (or what there is) of src into out with copy_file_range, in blocks,
    while a thread hashes each block as it reads it back from the copy: (bytes, sha256) of the
    copy, or None when the kernel will not copy between these two files (nothing copied yet).
    A write failure (a full disk) stays a plain OSError; any other is nofollow.Unreadable (the agent's file)."""
    blocks: queue.SimpleQueue = queue.SimpleQueue()
    digest = hashlib.sha256()
    failed: list[BaseException] = []
    buffer = memoryview(bytearray(streamer.block))

    def hasher() -> None:
        while (item := blocks.get()) is not None:
            if failed:
                continue
            offset, length = item
            try:
                while length:
                    got = os.preadv(out, [buffer[: min(length, len(buffer))]], offset)
                    if got == 0:
                        raise OSError(errno.EIO, "the copy is shorter than what was copied")
                    digest.update(buffer[:got])
                    offset, length = offset + got, length - got
            except BaseException as exc:  # noqa: BLE001 - handed to the copying thread
                failed.append(exc)

    thread = threading.Thread(target=hasher, name="snapshot-hash", daemon=True)
    total = 0
    started = False
    try:
        while total < size and not failed:
            try:
                n = os.copy_file_range(src, out, min(size - total, KERNEL_COPY_BLOCK))
            except OSError as exc:
                if total == 0 and exc.errno in _KERNEL_COPY_UNSUPPORTED:
                    return None
                if exc.errno in _WRITE_ERRNOS:
                    raise
                raise nofollow.Unreadable(exc.errno, exc.strerror, name) from None
            if n == 0:
                break  # truncated while copied: what there was
            if not started:
                thread.start()
                started = True
            blocks.put((total, n))
            total += n
    finally:
        blocks.put(None)
        if started:
            thread.join()
    if failed:
        raise failed[0]
    return total, digest.hexdigest()


@dataclass
class CheckpointSnapshot:
    """What take_snapshot made: `names`, the top-level names of the agent's directory as listed
    (inspect_checkpoint's `names`); `manifest`, the copy's checkpoint_manifest (fingerprint, each
    file's name, size, sha256); `method`, how the bytes got there: "clone" (every non-empty file a
    copy-on-write clone), "copy" (none), "mixed" (some), "empty" (no bytes at all)."""

    names: list[str]
    manifest: dict
    method: str


class _Snapshotter:
    """Copies checkpoint files and hashes them in the same read; clones them where it can."""

    def __init__(self) -> None:
        self.try_clone = True
        self.try_kernel_copy = hasattr(os, "copy_file_range")
        self.cloned = 0
        self.copied = 0
        self._lock = threading.Lock()  # files are snapshot in parallel (take_snapshot)

    def open_at(self, dir_fd: int, name: str, dest: Path) -> tuple[int, int, int]:
        """Open one checkpoint file relative to dir_fd without following a link, and create its
        copy (exclusively): (source fd, its size at open, copy fd), both to be closed by copy().
        Raises nofollow.NotRegularFile for anything that is not a regular file, nofollow.Unreadable when it cannot be
        opened, FileNotFoundError when it vanished."""
        fd, st, out = nofollow.open_regular_at(dir_fd, name, dest)
        return fd, st.st_size, out

    def copy(self, fd: int, size: int, out: int, name: str) -> tuple[int, str]:
        """Snapshot an opened file (open_at) into its copy and close both: the copy's (size,
        sha256). A clone where the file system offers one, else a copy in the kernel
        (copy_file_range: no byte crosses into this process to be written back), else a copy
        through this process; either way every byte of the copy is hashed once, from the copy
        itself (in the page cache, just written), while the next part is copied."""
        streamer = _Streamer()
        try:
            if size > 0 and self.try_clone and self._clone_to(fd, out, size):
                with self._lock:
                    self.cloned += 1
                return streamer.stream(out, os.fstat(out).st_size, name=name)
            if size > 0:
                with self._lock:
                    self.copied += 1
            if size > streamer.block and self.try_kernel_copy:
                copied = _kernel_copy(fd, out, size, name, streamer)
                if copied is not None:
                    return copied
                self.try_kernel_copy = False  # not here (another file system, an old kernel)
                os.ftruncate(out, 0)
                os.lseek(out, 0, os.SEEK_SET)
                os.lseek(fd, 0, os.SEEK_SET)
            return streamer.stream(fd, size, out=out, name=name)
        finally:
            os.close(out)
            os.close(fd)

    def file_at(self, dir_fd: int, name: str, dest: Path) -> tuple[int, str]:
        """Snapshot one regular file, opened relative to dir_fd without following a link, to dest
        (created exclusively); returns the copy's (size, sha256), both of the copy itself. The copy
        holds exactly the size the file had when opened (a file still growing is cut there: a
        snapshot is of one moment; one truncated meanwhile: what there was). Raises nofollow.NotRegularFile
        for anything that is not a regular file, nofollow.Unreadable when it cannot be read, OSError when
        the copy cannot be written.

        Where the file system can, dest is a copy-on-write clone of the opened file (FICLONE on the
        descriptor opened with O_NOFOLLOW, so it is the file checked), cut back to the size at open
        (the clone takes the file as it is at the clone, which may have grown since), and then read
        once for its sha256: the hash is of the copy that gets evaluated, whatever the agent writes
        after. Elsewhere its bytes are read once, each block written to dest and hashed."""
        fd, size, out = self.open_at(dir_fd, name, dest)
        return self.copy(fd, size, out, name)

    def _clone_to(self, fd: int, out: int, size: int) -> bool:
        try:
            _clone(fd, out)
        except OSError as exc:
            if exc.errno in _CLONE_UNSUPPORTED:
                self.try_clone = False  # this file system (or pair of them) will not: copy the rest
            os.ftruncate(out, 0)  # nothing should be there, but the copy starts from empty, at 0
            os.lseek(out, 0, os.SEEK_SET)
            return False
        if os.fstat(out).st_size > size:
            os.ftruncate(out, size)  # it grew since it was opened: the snapshot is of that moment
        return True

    @property
    def method(self) -> str:
        if self.cloned and self.copied:
            return "mixed"
        return "clone" if self.cloned else "copy" if self.copied else "empty"


def take_snapshot(workspace: Path, model_dir: Path, dest: Path) -> CheckpointSnapshot:
    """Copy the checkpoint files (not the agent's optimizer state) of model_dir, a real directory
    inside the workspace (resolve_submission), to dest, following no link, and fingerprint the
    copy in the same read: a CheckpointSnapshot whose manifest is checkpoint_manifest(dest).

    What the names alone condemn (inspect_names) is refused before anything is copied. A checkpoint
    file that is a symbolic link (or a FIFO, a device...) when the grader opens it is refused
    (not_a_regular_file), whatever it was when resolve_submission looked: that is the
    time-of-check/time-of-use race a link swapped in since would otherwise win. Links that are not
    checkpoint files (a `latest` link to a subdirectory) are neither followed nor copied. A file
    or directory the grader may not read is refused (unreadable_checkpoint); one that vanishes
    meanwhile, or a directory swapped, is checkpoint_changed; a failure to write the copy is the
    grader's (OSError). Each file is read once: cloned where the file system offers copy-on-write
    clones and then hashed, else copied and hashed block by block (_Snapshotter.file_at)."""
    root = Path(os.path.realpath(workspace))
    if dest.exists():
        shutil.rmtree(dest)
    try:
        top = nofollow.open_directory_inside(root, model_dir)
    except OSError as exc:
        if exc.errno in nofollow.GRADER_ERRNOS:
            raise
        if exc.errno in (errno.EACCES, errno.EPERM):
            raise _unreadable(model_dir, ".", exc) from None
        raise _changed(model_dir, "the directory (or a directory above it)") from None
    except ValueError:
        raise _changed(model_dir, "the directory (or a directory above it)") from None
    snapshotter = _Snapshotter()
    files: list[dict] = []
    pending: list[tuple[PurePosixPath, Future]] = []
    # Each file is opened (and checked) here, in walk order; its copy and hash run in the pool.
    pool = ThreadPoolExecutor(max_workers=SNAPSHOT_THREADS, thread_name_prefix="snapshot")
    try:
        try:
            names = nofollow.top_level_names(top)
        except nofollow.Unreadable as exc:
            raise _agent_error(model_dir, exc.filename, exc) from None
        inspect_names(names)
        dest.mkdir(parents=True)
        walk = nofollow.walk(top, CHECKPOINT_MAX_DEPTH)
        try:
            for entry in walk:
                if stat.S_ISDIR(entry.st.st_mode) or not is_checkpoint_file(entry.name):
                    continue
                try:
                    fd, size, out = snapshotter.open_at(entry.dir_fd, entry.name, dest / entry.rel)
                except nofollow.NotRegularFile:
                    raise _not_regular(model_dir, entry.rel) from None
                except FileNotFoundError:
                    raise _changed(model_dir, safe_text(str(entry.rel), SHOWN_PATH_CHARS)) from None
                pending.append((entry.rel, pool.submit(snapshotter.copy, fd, size, out, entry.name)))
            for rel, future in pending:
                size, sha256 = future.result()
                files.append(_file_entry(rel, size, sha256))
        except nofollow.Unreadable as exc:  # the agent's side: a race (checkpoint_changed) or its permissions
            raise _agent_error(model_dir, exc.filename, exc) from None
        finally:
            walk.close()
            pool.shutdown(wait=True)  # every descriptor closed (copy closes its own), even on failure
    finally:
        os.close(top)
    files.sort(key=lambda f: manifest_order(f["name"]))
    manifest = {"fingerprint": manifest_fingerprint(files), "files": files}
    return CheckpointSnapshot(names=names, manifest=manifest, method=snapshotter.method)


def snapshot_checkpoint(workspace: Path, model_dir: Path, dest: Path) -> list[str]:
    """take_snapshot's copy, returning only the names of the files at model_dir's top level, as
    listed then (inspect_checkpoint's `names`); see take_snapshot for what is copied and refused."""
    return take_snapshot(workspace, model_dir, dest).names


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
        code = nofollow.open_directory_inside(root, root / "code")
    except OSError as exc:
        summary["not_copied"] = f"code/ is not a directory of the workspace ({errno.errorcode.get(exc.errno, exc)})"
        return summary
    try:
        walk = nofollow.walk(code, CODE_SNAPSHOT_MAX_DEPTH, skip_unreadable=True)
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
                    summary["bytes"] += nofollow.copy_file_at(entry.dir_fd, entry.name, dest / entry.rel, limit=limit)
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
