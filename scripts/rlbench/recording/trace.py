"""The resource trace of a run: ResourceSampler appends one JSON line per interval to
<run_dir>/resources.jsonl (CPU, memory and processes of the agent's tree, the workspace's size, GPU
memory), and summarize_trace reads it back.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from rlbench.recording.workspace_state import WORKSPACE_MAX_ENTRIES, workspace_usage

if TYPE_CHECKING:  # psutil is only needed by whoever passes processes in
    import psutil

NVIDIA_SMI_TIMEOUT_S = 10


def gpu_memory_used() -> dict[str, int] | None:
    """MiB used on each GPU (nvidia-smi), {} when it answers nothing; None without nvidia-smi."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    used = {}
    for line in out.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 2 and parts[1].isdigit():
            used[parts[0]] = int(parts[1])
    return used


def tree_of(pid: int) -> list["psutil.Process"]:
    """The process pid and its descendants; [] once it is gone (a ResourceSampler source)."""
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


class ResourceSampler:
    """A daemon thread that appends one JSON line to `out` every interval_s seconds (the first at
    once, the last when the context exits):

        ts                  unix seconds
        cpu_percent         over the processes, summed (100 = one core busy): CPU time used since
                            the previous sample of the same process, or since it started
        rss_bytes           resident memory, summed
        n_processes         how many of `processes()` were alive
        workspace_bytes     the workspace's size (workspace_usage: no link followed), with
        workspace_files     its file count, and
        workspace_truncated true when the walk stopped after max_entries entries; the walk is
        workspace_ts        made at most every workspace_interval_s seconds (default: the larger
                            of interval_s and 30 s: a big workspace costs CPU time to walk), and
                            for the first and the last sample; workspace_ts says when
        gpu_memory_used_mib {gpu index: MiB used on the device, by anyone} (only where nvidia-smi is)

    processes: called at each sample, returns the processes to measure (e.g. the agent's tree);
    a process listed twice is counted once, one that is gone by the time it is read is skipped.
    Lines are appended (an existing file is continued). Failures are logged, never raised: a trace
    must not disturb the run it records. In the runner, around the supervision of the agent:

        with ResourceSampler(lambda: tree_of(proc.pid) + agent_processes(proc, marker),
                             spec.workspace, spec.run_dir / "resources.jsonl"):
            exit_code, ending = supervise(...)
    """

    def __init__(
        self,
        processes: Callable[[], list["psutil.Process"]],
        workspace: Path,
        out: Path,
        interval_s: float = 5,
        max_entries: int = WORKSPACE_MAX_ENTRIES,
        workspace_interval_s: float | None = None,
    ):
        self.processes, self.workspace, self.out = processes, Path(workspace), Path(out)
        self.interval_s, self.max_entries = interval_s, max_entries
        self.workspace_interval_s = max(interval_s, 30) if workspace_interval_s is None else workspace_interval_s
        self._usage: tuple[float, dict] | None = None  # (when, workspace_usage) of the last walk
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._cpu: dict[tuple[int, float], tuple[float, float]] = {}  # (pid, create_time) -> (cpu s, at)
        self._gpu = shutil.which("nvidia-smi") is not None
        self.samples = 0

    def __enter__(self) -> "ResourceSampler":
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self._thread = threading.Thread(target=self._run, name="resource-sampler", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self.interval_s + 60)

    def _run(self) -> None:
        self._write_sample()
        while not self._stop.wait(self.interval_s):
            self._write_sample()
        self._write_sample(walk=True)  # the last one, as the context exits

    def _write_sample(self, walk: bool = False) -> None:
        try:
            record = self.sample(walk)
            with open(self.out, "a") as handle:
                handle.write(json.dumps(record, sort_keys=True) + "\n")
            self.samples += 1
        except Exception:  # noqa: BLE001
            traceback.print_exc(file=sys.stderr)

    def sample(self, walk: bool = False) -> dict:
        """One record (see the class); walk: walk the workspace whatever the time since the last walk."""
        now = time.time()
        cpu = rss = alive = 0
        seen: dict[tuple[int, float], tuple[float, float]] = {}
        try:
            processes = list(self.processes())
        except Exception:  # noqa: BLE001 - the caller's callable; an empty sample rather than none
            traceback.print_exc(file=sys.stderr)
            processes = []
        for proc in processes:
            try:
                with proc.oneshot():
                    key = (proc.pid, proc.create_time())
                    if key in seen:
                        continue
                    times = proc.cpu_times()
                    used = times.user + times.system
                    memory = proc.memory_info().rss
            except Exception:  # noqa: BLE001 - gone, a zombie, not ours to read
                continue
            before_used, before_at = self._cpu.get(key, (0.0, key[1]))
            elapsed = now - before_at
            if elapsed > 0:
                cpu += max(0.0, used - before_used) / elapsed * 100
            rss += memory
            alive += 1
            seen[key] = (used, now)
        self._cpu = seen
        if walk or self._usage is None or now - self._usage[0] >= self.workspace_interval_s:
            self._usage = (now, workspace_usage(self.workspace, self.max_entries))
        walked, usage = self._usage
        record = {
            "ts": round(now, 3),
            "cpu_percent": round(cpu, 1),
            "rss_bytes": rss,
            "n_processes": alive,
            "workspace_bytes": usage["bytes"],
            "workspace_files": usage["files"],
            "workspace_truncated": usage["truncated"],
            "workspace_ts": round(walked, 3),
        }
        if self._gpu:
            used_mib = gpu_memory_used()
            if used_mib is not None:
                record["gpu_memory_used_mib"] = used_mib
        return record


def summarize_trace(path: Path) -> dict | None:
    """What a resources.jsonl says: samples, first/last ts, peaks (rss, cpu, processes, workspace
    bytes, GPU memory per GPU and summed over GPUs), mean CPU, the last workspace size; None when
    there is no trace. Unreadable lines are counted and skipped."""
    path = Path(path)
    if not path.is_file():
        return None
    samples, bad = [], 0
    with open(path, errors="replace") as handle:
        for line in handle:
            try:
                record = json.loads(line)
            except ValueError:
                bad += bool(line.strip())
                continue
            if isinstance(record, dict) and isinstance(record.get("ts"), (int, float)):
                samples.append(record)
            else:
                bad += 1

    def peak(key: str):
        values = [s[key] for s in samples if isinstance(s.get(key), (int, float))]
        return max(values) if values else None

    gpu_peaks: dict[str, int] = {}
    gpu_total = None
    for s in samples:
        used = s.get("gpu_memory_used_mib")
        if isinstance(used, dict) and used:
            for gpu, mib in used.items():
                gpu_peaks[gpu] = max(gpu_peaks.get(gpu, 0), mib)
            gpu_total = max(gpu_total or 0, sum(used.values()))
    cpus = [s["cpu_percent"] for s in samples if isinstance(s.get("cpu_percent"), (int, float))]
    return {
        "samples": len(samples),
        "bad_lines": bad,
        "first_ts": samples[0]["ts"] if samples else None,
        "last_ts": samples[-1]["ts"] if samples else None,
        "duration_s": round(samples[-1]["ts"] - samples[0]["ts"], 3) if samples else None,
        "peak_rss_bytes": peak("rss_bytes"),
        "peak_cpu_percent": peak("cpu_percent"),
        "mean_cpu_percent": round(sum(cpus) / len(cpus), 1) if cpus else None,
        "peak_processes": peak("n_processes"),
        "peak_workspace_bytes": peak("workspace_bytes"),
        "final_workspace_bytes": samples[-1].get("workspace_bytes") if samples else None,
        "workspace_truncated": any(s.get("workspace_truncated") for s in samples),
        "peak_gpu_memory_mib": gpu_peaks or None,
        "peak_gpu_memory_total_mib": gpu_total,
    }
