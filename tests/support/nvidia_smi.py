"""A fake nvidia-smi for tests of the GPU telemetry and the GPU pre-flight: an executable named nvidia-smi
in a directory put first on PATH, answering `--query-gpu=<fields> --format=csv,noheader,nounits` from a
JSON file of GPUs that the test rewrites as it goes (one {field: value} per GPU; "fail" instead of a list
makes it exit with status 9 and an error on stderr, as nvidia-smi does without a driver)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

SCRIPT = """#!{python}
import json, sys
state = json.load(open({state!r}))
if state == "fail":
    sys.exit("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.")
query = next(a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--query-gpu="))
assert "--format=csv,noheader,nounits" in sys.argv, sys.argv
for gpu in state:
    print(", ".join(str(gpu.get(field, "[N/A]")) for field in query.split(",")))
"""


def gpu(index: int, utilization: int = 0, used_mib: int = 0, total_mib: int = 81559) -> dict:
    """One fake GPU as nvidia-smi reports it."""
    return {
        "index": index,
        "uuid": f"GPU-fake-{index}",
        "utilization.gpu": utilization,
        "memory.used": used_mib,
        "memory.total": total_mib,
    }


class FakeNvidiaSmi:
    """The fake's directory (`bin`, to put first on PATH) and its state: set(gpus) changes what it answers."""

    def __init__(self, root: Path, gpus: list[dict] | str):
        self.bin = root / "fake-bin"
        self.bin.mkdir(parents=True, exist_ok=True)
        self.state = root / "fake-gpus.json"
        self.set(gpus)
        script = self.bin / "nvidia-smi"
        script.write_text(SCRIPT.format(python=sys.executable, state=str(self.state)))
        script.chmod(0o755)

    def set(self, gpus: list[dict] | str) -> None:
        tmp = self.state.with_suffix(".tmp")
        tmp.write_text(json.dumps(gpus))
        tmp.replace(self.state)  # atomic: a sample never reads half a state
