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
du -sh "$dir"
