"""The GPU pre-flight of an agent run, before its budget starts: the GPUs the job was given
(CUDA_VISIBLE_DEVICES, the run's `gpus`) exist, nobody else is using them, and they have the memory
the machine is expected to give (PostTrainBench checks the same before every run). A run that fails it
ends with status `error` and the reason in run.json, without its agent ever starting; the sweep goes on.

What counts (nvidia-smi, asked once):

* exist: every id given is a GPU nvidia-smi lists, by index or by UUID;
* idle: its memory used is at most IDLE_MEMORY_MIB (a bare CUDA context takes a few hundred MiB; the
  run itself has touched no GPU yet) and its utilisation at most IDLE_UTILIZATION_PERCENT;
* expected memory: where the machine says what to expect (EXPECTED_MEMORY_VAR in the environment, a
  machine setting such as a SLURM profile's, in MiB), every GPU's memory.total is at least that.

No GPUs given: a CPU run; it passes and says so. GPUs given but no nvidia-smi on PATH (a container
without it, a test cluster's fake GPUs): nothing can be checked; it passes and says so (`checked`
false). MIG instances (ids MIG-...) are not listed by nvidia-smi's GPU query: passed unchecked too.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from rlbench.recording.trace import GpuQueryError, gpu_row, query_gpus

PREFLIGHT_FIELDS = ("index", "uuid", "utilization.gpu", "memory.used", "memory.total")
IDLE_MEMORY_MIB = 1024
IDLE_UTILIZATION_PERCENT = 10
EXPECTED_MEMORY_VAR = "RLBENCH_GPU_MEMORY_MIB"


def expected_gpu_memory(environ: Mapping[str, str] = os.environ) -> int | None:
    """The least memory (MiB) each GPU must have, from EXPECTED_MEMORY_VAR; None when unset. ValueError
    for a value that is not a positive whole number of MiB."""
    value = environ.get(EXPECTED_MEMORY_VAR, "").strip()
    if not value:
        return None
    if not value.isdigit() or int(value) <= 0:
        raise ValueError(f"{EXPECTED_MEMORY_VAR}={value!r}: expected a positive whole number of MiB, e.g. 80000")
    return int(value)


def gpu_preflight(
    gpus: list[str],
    environ: Mapping[str, str] = os.environ,
    query: Callable[[tuple[str, ...]], list[dict] | None] = query_gpus,
) -> dict:
    """run.json's `preflight` for the GPUs given: {"ok": bool, "checked": bool (nvidia-smi was asked),
    "message": what was found, "gpus": [nvidia-smi's row of each GPU given that it lists]}. The expected
    memory comes from `environ` (EXPECTED_MEMORY_VAR)."""
    if not gpus:
        return _result(True, False, "no GPUs given (CUDA_VISIBLE_DEVICES is empty or unset): a CPU run, nothing to check")
    given = ",".join(gpus)
    try:
        expected_memory_mib = expected_gpu_memory(environ)
    except ValueError as exc:
        return _result(False, False, str(exc))
    try:
        rows = query(PREFLIGHT_FIELDS)
    except GpuQueryError as exc:
        return _result(False, True, f"GPUs {given} were given, but they could not be checked: {exc}")
    if rows is None:
        return _result(True, False, f"GPUs {given} were given, but nvidia-smi is not on PATH: they were not checked")
    mig = [g for g in gpus if g.startswith("MIG-")]
    found, problems = [], []
    for gpu in gpus:
        if gpu in mig:
            continue
        row = gpu_row(rows, gpu)
        if row is None:
            listed = ", ".join(r["index"] for r in rows) or "none"
            problems.append(f"GPU {gpu} does not exist (nvidia-smi lists GPUs {listed})")
            continue
        found.append(row)
        used, busy, total = row["memory.used"], row["utilization.gpu"], row["memory.total"]
        if (used or 0) > IDLE_MEMORY_MIB or (busy or 0) > IDLE_UTILIZATION_PERCENT:
            problems.append(
                f"GPU {gpu} is in use by another process: {used} MiB used (idle: at most {IDLE_MEMORY_MIB}), "
                f"{busy} % utilisation (idle: at most {IDLE_UTILIZATION_PERCENT} %)"
            )
        if expected_memory_mib is not None and (total is None or total < expected_memory_mib):
            problems.append(
                f"GPU {gpu} has {total} MiB of memory, less than the {expected_memory_mib} MiB expected "
                f"({EXPECTED_MEMORY_VAR})"
            )
    if problems:
        return _result(False, True, "; ".join(problems), found)
    note = f" (MIG instances {', '.join(mig)} not checked)" if mig else ""
    expected = f", each with at least {expected_memory_mib} MiB" if expected_memory_mib is not None else ""
    checked = [g for g in gpus if g not in mig]
    if not checked:
        return _result(True, False, f"GPUs {given} were given: MIG instances, which nvidia-smi's GPU query does not list; not checked", found)
    return _result(True, True, f"the GPUs given ({','.join(checked)}) exist and are idle{expected}{note}", found)


def _result(ok: bool, checked: bool, message: str, found: list[dict] = ()) -> dict:
    return {"ok": ok, "checked": checked, "message": message, "gpus": list(found)}
