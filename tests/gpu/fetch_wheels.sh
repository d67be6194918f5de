#!/bin/sh
# Download exactly the wheels that tests/gpu/wheels.txt lists, for the GPU machine (CPython 3.12,
# manylinux x86-64), into DIR (default tests/gpu/wheels/, which git ignores). Needs the package
# registry; run it on this side before carrying the working tree to the GPU machine.
#   tests/gpu/fetch_wheels.sh [DIR]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-"$here/wheels"}
python=${PYTHON:-python3}
mkdir -p "$dir"
"$python" -m pip download --quiet --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
    --no-deps -d "$dir" -r "$here/wheels.txt"
# opencompass is carried for one file, the GSM8K protocol's dataset config (read as data, never
# imported): its 3 MB wheel is cut down to that file, byte for byte, and its metadata (RECORD keeps
# the file's hash), which leaves the carry room to grow within its 64 MiB.
PYTHONPATH="$here/../../scripts" "$python" - "$dir"/opencompass-*.whl <<'SLIM'
import sys
import zipfile
from pathlib import Path

from rlbench.tasks.gsm8k import OPENCOMPASS_CONFIG

wheel = Path(sys.argv[1])
with zipfile.ZipFile(wheel) as whole:
    names = whole.namelist()
    record = next(n for n in names if n.endswith(".dist-info/RECORD"))
    # entry_points.txt left out: it names a console script whose module is not kept
    kept = {f"opencompass/{OPENCOMPASS_CONFIG}"} | {
        n for n in names if ".dist-info/" in n and n != record and not n.endswith("/entry_points.txt")
    }
    if set(names) == kept | {record}:
        sys.exit(0)  # cut down already
    missing = kept - set(names)
    if missing:
        sys.exit(f"{wheel.name} lacks {sorted(missing)}")
    lines = [line for line in whole.read(record).decode().splitlines() if line.split(",")[0] in kept | {record}]
    parts = {name: whole.read(name) for name in sorted(kept)}
slim = wheel.with_suffix(".part")
with zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as out:
    for name, data in parts.items():
        out.writestr(name, data)
    out.writestr(record, "\n".join(lines) + "\n")
slim.replace(wheel)
SLIM
du -sh "$dir"
