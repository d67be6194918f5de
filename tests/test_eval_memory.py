"""The evaluating process's heap (rlbench.evaluation.memory): with keep_freed_memory, buffers that
grow step by step, as generation's key/value cache does, reuse the memory the previous step freed
instead of mapping fresh pages that the kernel must fault in and zero."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Buffers of 2 to 30 MiB growing by 1 MiB, each written then freed (the cache's growth, one layer):
# the page faults the loop costs, read from /proc/self/stat (field minflt).
GROWTH = """
import ctypes, json, sys
sys.path.insert(0, {scripts!r})
from rlbench.evaluation.memory import keep_freed_memory
tuned = keep_freed_memory() if {tune} else None
def faults():
    return int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[7])
before = faults()
for mib in range(2, 31):
    buffer = ctypes.create_string_buffer(mib << 20)  # calloc'd, then written page by page
    ctypes.memset(buffer, 1, mib << 20)
    del buffer
print(json.dumps({{"tuned": tuned, "faults": faults() - before}}))
"""


def growth_faults(tune: bool) -> dict:
    code = GROWTH.format(scripts=str(REPO / "scripts"), tune=tune)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    return json.loads(out.stdout)


@pytest.mark.skipif(not Path("/proc/self/stat").exists() or sys.platform != "linux", reason="glibc and /proc only")
def test_growing_buffers_reuse_freed_memory_instead_of_faulting_in_new_pages():
    default, tuned = growth_faults(False), growth_faults(True)
    assert tuned["tuned"] is True
    pages = sum(range(2, 31)) << 20 >> 12  # every buffer's pages: what mapping each anew costs
    # Default glibc: each new, larger buffer is above the mmap threshold its predecessor set, so it is
    # mapped afresh and every page faults. Tuned: the heap grows once to the largest buffer.
    assert default["faults"] > 0.8 * pages
    assert tuned["faults"] < 0.25 * pages
