"""Benchmark: the grader's per-submission work on a checkpoint, before and after the one-pass snapshot, in one run.

    .venv/bin/python tests/benchmarks/bench_snapshot.py [--gib 4] [--shards 2] [--repeats 3] [--mode both] [--dir DIR]

Builds a synthetic safetensors checkpoint of --gib GiB in --shards shards (written tensor by
tensor: no more than a 64 MiB block in memory) inside a fake workspace under --dir (it needs about
three times --gib of free disk there: the checkpoint and two copies), then measures, alternating
and --repeats times (the median is printed):

  (a) one sequential read of the checkpoint files (8 MiB readinto);
  (b) the grader's work before: snapshot_checkpoint's copy, then checkpoint_manifest over the copy
      (a running fingerprint and each file's sha256: two sha256 passes over every byte), as they
      were (kept below, verbatim in what they do);
  (c) the grader's work now: take_snapshot (one read of the agent's files: copied in the kernel
      with copy_file_range while each copied block is hashed back from the page cache, files of a
      sharded checkpoint in parallel; or cloned and hashed);
  (d) a plain copy of the checkpoint files (read and write, no hash): the floor of any copy, which
      the disk's write speed sets once the copy outgrows the page cache's dirty limit.

Both (b) and (c) include inspect_checkpoint on the copy (the rest of the per-submission checks).
"cold": the source files' page cache dropped before each measurement (sync, then
posix_fadvise(DONTNEED) on every file: no root needed); "warm": everything read once before.
Prints seconds and the ratios (b)/(a) and (c)/(a): the target is (c)/(a) <= 1.0. On a file system
with copy-on-write clones (XFS with reflink=1, btrfs: point --dir there) (c) clones.
Machines are shared and noisy: compare ratios, not seconds.
"""

from __future__ import annotations

import argparse
import errno
import hashlib
import json
import os
import shutil
import stat
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from rlbench.fileio import nofollow  # noqa: E402
from rlbench.grader.snapshot import take_snapshot  # noqa: E402
from rlbench.grader.submission import (  # noqa: E402
    CHECKPOINT_MAX_DEPTH,
    checkpoint_files,
    inspect_checkpoint,
    inspect_names,
    is_checkpoint_file,
)

BLOCK = 64 << 20
READ_BLOCK = 8 << 20


# -- the synthetic checkpoint ---------------------------------------------------------------------
def write_shard(path: Path, tensors: int, tensor_bytes: int, seed: int) -> list[str]:
    """A safetensors file of `tensors` bf16 tensors of tensor_bytes each, streamed block by block."""
    names = [f"model.layers.{seed}.{i}.weight" for i in range(tensors)]
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name in names:
        shape = [tensor_bytes // 2 // 4096, 4096]
        header[name] = {"dtype": "BF16", "shape": shape, "data_offsets": [offset, offset + tensor_bytes]}
        offset += tensor_bytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)  # the data starts 8-aligned, as safetensors writes it
    block = bytearray(os.urandom(BLOCK))
    with open(path, "wb") as out:
        out.write(len(raw).to_bytes(8, "little") + raw)
        for counter in range(offset // BLOCK):
            block[:16] = seed.to_bytes(8, "little") + counter.to_bytes(8, "little")  # no two blocks alike
            out.write(block)
        out.write(block[: offset % BLOCK])
    return names


def build_checkpoint(model: Path, gib: float, shards: int) -> int:
    model.mkdir(parents=True)
    per_shard = int(gib * (1 << 30)) // shards
    tensor_bytes = 256 << 20
    weight_map = {}
    for s in range(shards):
        shard = f"model-{s + 1:05d}-of-{shards:05d}.safetensors"
        each = max(min(tensor_bytes, per_shard // 8192 * 8192), 8192)  # a whole number of 4096-wide bf16 rows
        for name in write_shard(model / shard, max(per_shard // each, 1), each, s):
            weight_map[name] = shard
    (model / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (model / "config.json").write_text(json.dumps({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]}))
    (model / "generation_config.json").write_text("{}")
    (model / "tokenizer_config.json").write_text("{}")
    (model / "tokenizer.json").write_bytes(os.urandom(7 << 20).hex().encode()[: 11 << 20])  # ~ a real one's size
    (model / "optimizer.npz").write_bytes(os.urandom(1 << 20))  # not a checkpoint file: never copied
    try:  # the files must be real safetensors: their headers read back
        from safetensors import safe_open

        with safe_open(str(model / f"model-00001-of-{shards:05d}.safetensors"), framework="numpy") as handle:
            assert len(list(handle.keys())) >= 1
    except ImportError:
        pass
    return sum((model / rel).stat().st_size for rel in checkpoint_files(model))


# -- the grader's work before (its code as it was, minus the refusal messages) ----------------------
class OldFingerprint:
    """The old running fingerprint and each file's sha256, from the same 1 MiB blocks."""

    def __init__(self):
        self.digest = hashlib.sha256()
        self.files = []

    def add(self, rel, handle):
        self.digest.update(os.fsencode(rel) + b"\0")
        own, size = hashlib.sha256(), 0
        while block := handle.read(1 << 20):
            self.digest.update(block)
            own.update(block)
            size += len(block)
        self.digest.update(b"\0")
        self.files.append({"name": str(rel), "size": size, "sha256": own.hexdigest()})


def old_checkpoint_manifest(model_dir: Path) -> dict:
    running = OldFingerprint()
    for rel in checkpoint_files(model_dir):
        with open(model_dir / rel, "rb") as handle:
            running.add(rel, handle)
    return {"fingerprint": running.digest.hexdigest(), "files": running.files}


def old_copy_file_at(dir_fd: int, name: str, dest: Path) -> int:
    fd = os.open(name, nofollow.FILE_FLAGS, dir_fd=dir_fd)
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise nofollow.NotRegularFile(errno.EINVAL, "not a regular file", name)
        os.set_blocking(fd, True)
        dest.parent.mkdir(parents=True, exist_ok=True)
        out = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            left = st.st_size
            while left > 0:
                block = os.read(fd, min(left, 8 << 20))
                if not block:
                    break
                left -= len(block)
                view = memoryview(block)
                while view:
                    view = view[os.write(out, view) :]
        finally:
            os.close(out)
        return st.st_size - left
    finally:
        os.close(fd)


def old_snapshot_checkpoint(workspace: Path, model_dir: Path, dest: Path) -> list[str]:
    root = Path(os.path.realpath(workspace))
    if dest.exists():
        shutil.rmtree(dest)
    top = nofollow.open_directory_inside(root, model_dir)
    try:
        names = nofollow.top_level_names(top)
        inspect_names(names)
        dest.mkdir(parents=True)
        walk = nofollow.walk(top, CHECKPOINT_MAX_DEPTH)
        try:
            for entry in walk:
                if stat.S_ISDIR(entry.st.st_mode) or not is_checkpoint_file(entry.name):
                    continue
                old_copy_file_at(entry.dir_fd, entry.name, dest / entry.rel)
        finally:
            walk.close()
    finally:
        os.close(top)
    return names


# -- measurements ---------------------------------------------------------------------------------
def drop_cache(files: list[Path]) -> None:
    os.sync()
    for path in files:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def sequential_read(files: list[Path]) -> int:
    buffer, total = bytearray(READ_BLOCK), 0
    for path in files:
        with open(path, "rb", buffering=0) as handle:
            while n := handle.readinto(buffer):
                total += n
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=4.0, help="checkpoint size in GiB (default 4)")
    parser.add_argument("--shards", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--mode", choices=("cold", "warm", "both"), default="both")
    parser.add_argument("--dir", type=Path, default=None, help="where to build it (default: the temp directory)")
    args = parser.parse_args()
    modes = ("cold", "warm") if args.mode == "both" else (args.mode,)
    with tempfile.TemporaryDirectory(prefix="bench-snapshot-", dir=args.dir) as tmp:
        root = Path(tmp)
        workspace = root / "workspace"
        model = workspace / "output" / "v1"
        started = time.perf_counter()
        size = build_checkpoint(model, args.gib, args.shards)
        files = [model / rel for rel in checkpoint_files(model)]
        print(
            f"checkpoint: {size / (1 << 30):.2f} GiB in {len(files)} checkpoint files ({args.shards} shards) "
            f"under {root} (built in {time.perf_counter() - started:.0f} s); {os.cpu_count()} CPUs"
        )
        old_copy, new_copy = root / "snap-old" / "model", root / "snap-new" / "model"

        def read() -> str:
            assert sequential_read(files) == size
            return "-"

        def before() -> str:
            names = old_snapshot_checkpoint(workspace, model, old_copy)
            inspect_checkpoint(old_copy, names)
            before.manifest = old_checkpoint_manifest(old_copy)
            return "copy"

        def after() -> str:
            snapshot = take_snapshot(workspace, model, new_copy)
            inspect_checkpoint(new_copy, snapshot.names)
            after.manifest = snapshot.manifest
            return snapshot.method

        def plain_copy() -> str:
            for path in files:
                target = old_copy / path.relative_to(model)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(path, target)  # copy_file_range/sendfile: no bytes through Python
            return "-"

        runs = {
            "(a) one sequential read": read,
            "(b) before: copy + 2-digest manifest": before,
            "(c) now: take_snapshot": after,
            "(d) plain copy, no hash (floor)": plain_copy,
        }
        times = {(mode, label): [] for mode in modes for label in runs}
        methods = set()
        for repeat in range(args.repeats):
            for mode in modes:
                for label, run in runs.items():
                    for copy in (old_copy.parent, new_copy.parent):
                        shutil.rmtree(copy, ignore_errors=True)
                    if mode == "cold":
                        drop_cache(files)
                    else:
                        sequential_read(files)
                        os.sync()
                    t0 = time.perf_counter()
                    method = run()
                    times[mode, label].append(time.perf_counter() - t0)
                    if run is after:
                        methods.add(method)
            print(
                f"  repeat {repeat + 1}/{args.repeats}: "
                + "; ".join(f"{m} {' '.join(f'{times[m, k][-1]:.2f}' for k in runs)}" for m in modes),
                flush=True,
            )
        # The same files, the same digests: the new manifest's per-file sha256 are the old ones.
        assert [f["sha256"] for f in after.manifest["files"]] == [f["sha256"] for f in before.manifest["files"]]
        for copy in (old_copy.parent, new_copy.parent):
            shutil.rmtree(copy, ignore_errors=True)
    gib = size / (1 << 30)
    print(f"\nmedian of {args.repeats} (seconds, GiB/s); take_snapshot method: {', '.join(sorted(methods))}")
    for mode in modes:
        base = statistics.median(times[mode, "(a) one sequential read"])
        print(f"{mode}:")
        for label in runs:
            t = statistics.median(times[mode, label])
            print(f"  {label:<40} {t:7.2f} s  {gib / t:5.2f} GiB/s  ratio to (a): {t / base:5.2f}x")
    print("target: (c)/(a) <= 1.0")


if __name__ == "__main__":
    main()
