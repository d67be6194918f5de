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
# What the sampler asks nvidia-smi for, per GPU, at every sample (uuid: to know the run's GPUs by it).
GPU_SAMPLE_FIELDS = ("index", "uuid", "utilization.gpu", "memory.used", "memory.total")
# A sample interval counts as busy for a GPU whose utilisation (nvidia-smi utilization.gpu: the share
# of the recent past in which a kernel ran) was above this many percent; at or below, idle.
GPU_BUSY_ABOVE_PERCENT = 0
# nvidia-smi's fields that are numbers (MiB, percent); the others (index, uuid, name) stay text.
_NUMERIC_FIELDS = frozenset({"utilization.gpu", "memory.used", "memory.total"})


class GpuQueryError(RuntimeError):
    """nvidia-smi is there but did not answer (it failed, timed out or printed what we cannot read)."""


def query_gpus(fields: tuple[str, ...] = GPU_SAMPLE_FIELDS) -> list[dict] | None:
    """One {field: value} per GPU that nvidia-smi lists (``--query-gpu``; the numeric fields as int,
    "[N/A]" / "[Not Supported]" as None); None without nvidia-smi on PATH. Raises GpuQueryError when
    nvidia-smi fails or prints a line without every field."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run(
            [smi, f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise GpuQueryError(f"nvidia-smi ({smi}) did not answer: {exc}") from exc
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip()[-500:]
        raise GpuQueryError(f"nvidia-smi ({smi}) failed with exit status {done.returncode}: {said}")
    rows = []
    for line in done.stdout.splitlines():
        if not line.strip():
            continue
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != len(fields):
            raise GpuQueryError(f"nvidia-smi printed {line.strip()!r}, not the {len(fields)} fields {', '.join(fields)}")
        row = {}
        for name, value in zip(fields, parts):
            if name in _NUMERIC_FIELDS:
                try:
                    row[name] = round(float(value))
                except ValueError:  # [N/A], [Not Supported]: what this GPU does not report
                    row[name] = None
            else:
                row[name] = value
        rows.append(row)
    return rows


def gpu_row(rows: list[dict], gpu: str) -> dict | None:
    """nvidia-smi's row of the GPU that a CUDA_VISIBLE_DEVICES entry names: by index, by UUID, or by a
    prefix of one UUID (as CUDA accepts: 'GPU-5f2c'); None when no row, or more than one, matches."""
    exact = [r for r in rows if gpu in (r.get("index"), r.get("uuid"))]
    if exact:
        return exact[0]
    prefixed = [r for r in rows if gpu.startswith("GPU-") and str(r.get("uuid") or "").startswith(gpu)]
    return prefixed[0] if len(prefixed) == 1 else None


def gpu_sample(gpus: list[str] | None = None) -> dict[str, dict[str, int]] | None:
    """The resource trace's GPU fields (ResourceSampler): gpu_utilization_percent, gpu_memory_used_mib
    and gpu_memory_total_mib, each {gpu index: value} (a value nvidia-smi does not report is left out),
    for the run's `gpus` (CUDA_VISIBLE_DEVICES entries: indices, UUIDs or UUID prefixes; a MIG
    instance matches no row and is not sampled) or, none given, every GPU nvidia-smi lists (all were
    visible). Other jobs' GPUs on a shared node stay out of the run's figures. {} when nvidia-smi
    fails; None without nvidia-smi."""
    try:
        rows = query_gpus(GPU_SAMPLE_FIELDS)
    except GpuQueryError:
        traceback.print_exc(file=sys.stderr)
        return {}
    if rows is None:
        return None
    if gpus:
        rows = list({id(r): r for r in (gpu_row(rows, g) for g in gpus) if r is not None}.values())
    sample: dict[str, dict[str, int]] = {
        "gpu_utilization_percent": {},
        "gpu_memory_used_mib": {},
        "gpu_memory_total_mib": {},
    }
    for row in rows:
        for field, key in (
            ("utilization.gpu", "gpu_utilization_percent"),
            ("memory.used", "gpu_memory_used_mib"),
            ("memory.total", "gpu_memory_total_mib"),
        ):
            if row[field] is not None:
                sample[key][row["index"]] = row[field]
    return sample


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
        gpu_utilization_percent {gpu index: % busy (nvidia-smi utilization.gpu)},
        gpu_memory_used_mib {gpu index: MiB used on the device, by anyone} and
        gpu_memory_total_mib    {gpu index: MiB on the device}: the run's `gpus` (CUDA_VISIBLE_DEVICES
                            entries; none given: every GPU nvidia-smi lists), and only where
                            nvidia-smi is (absent without it, never zeros)
        agent_log_bytes     the size of the agent's log (log_path: where its stdout goes; 0 while
                            there is none), only with log_path: it dates each log line within one
                            interval (the run explorer, rlbench.explorer.turns)

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
        log_path: Path | None = None,
        gpus: list[str] | None = None,
    ):
        self.processes, self.workspace, self.out = processes, Path(workspace), Path(out)
        self.gpus = list(gpus or [])
        self.log_path = None if log_path is None else Path(log_path)
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
        if self.log_path is not None:
            try:
                record["agent_log_bytes"] = self.log_path.stat().st_size
            except OSError:
                record["agent_log_bytes"] = 0
        if self._gpu:
            record.update(gpu_sample(self.gpus) or {})
        return record


def _gpu_values(sample: dict, key: str) -> dict[str, int]:
    values = sample.get(key)
    if not isinstance(values, dict):
        return {}
    return {str(gpu): v for gpu, v in values.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def gpu_hours(samples: list[dict], gpus: list[str] | None = None) -> dict | None:
    """GPU-hours busy and idle over a trace's samples (in time order), summed over the run's GPUs.

    The run's GPUs: `gpus` (run.json's, CUDA_VISIBLE_DEVICES) where every one of them is a GPU index the
    trace has utilisation for; otherwise (none given: every GPU was visible to the run; or ids such as
    UUIDs that are not nvidia-smi's indices) every GPU the trace has utilisation for, which the sampler
    has limited to the run's GPUs (traces recorded before it did may hold a shared node's other GPUs
    where the ids were UUIDs). Each interval between two consecutive samples counts, for each of those
    GPUs, as busy when the utilisation read at its end is above GPU_BUSY_ABOVE_PERCENT, else as idle;
    an interval whose end sample has no reading for a GPU counts as neither. None when no sample has a GPU utilisation (no nvidia-smi)."""
    # In nvidia-smi's order (by index), as the samples list them.
    sampled = list(dict.fromkeys(gpu for s in samples for gpu in _gpu_values(s, "gpu_utilization_percent")))
    if not sampled:
        return None
    chosen = [str(g) for g in gpus or ()]
    counted = chosen if chosen and set(chosen) <= set(sampled) else sampled
    busy = idle = 0.0
    for before, after in zip(samples, samples[1:]):
        seconds = after["ts"] - before["ts"]
        if seconds <= 0:
            continue
        utilisation = _gpu_values(after, "gpu_utilization_percent")
        for gpu in counted:
            if gpu in utilisation:
                if utilisation[gpu] > GPU_BUSY_ABOVE_PERCENT:
                    busy += seconds
                else:
                    idle += seconds
    return {
        "busy": round(busy / 3600, 6),
        "idle": round(idle / 3600, 6),
        "gpus": counted,
        "busy_above_percent": GPU_BUSY_ABOVE_PERCENT,
    }


def read_trace(path: Path) -> tuple[list[dict], int] | None:
    """A resources.jsonl's samples (records with a numeric ts, in file order) and how many lines could not
    be read; None when there is no trace."""
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
    return samples, bad


def summarize_trace(path: Path, gpus: list[str] | None = None) -> dict | None:
    """What a resources.jsonl says: samples, first/last ts, peaks (rss, cpu, processes, workspace
    bytes, GPU memory per GPU and summed over GPUs, GPU utilisation per GPU), mean CPU, the last
    workspace size, and gpu_hours (busy and idle GPU-hours over the run's `gpus`: see gpu_hours);
    None when there is no trace. Unreadable lines are counted and skipped. The GPU fields are None
    when the trace has none (no nvidia-smi)."""
    read = read_trace(path)
    if read is None:
        return None
    samples, bad = read

    def peak(key: str):
        values = [s[key] for s in samples if isinstance(s.get(key), (int, float))]
        return max(values) if values else None

    def per_gpu_peak(key: str) -> dict[str, int] | None:
        peaks: dict[str, int] = {}
        for s in samples:
            for gpu, value in _gpu_values(s, key).items():
                peaks[gpu] = max(peaks.get(gpu, value), value)
        return peaks or None

    totals = [sum(used.values()) for used in (_gpu_values(s, "gpu_memory_used_mib") for s in samples) if used]
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
        "peak_gpu_memory_mib": per_gpu_peak("gpu_memory_used_mib"),
        "peak_gpu_memory_total_mib": max(totals) if totals else None,
        "peak_gpu_utilization_percent": per_gpu_peak("gpu_utilization_percent"),
        "gpu_hours": gpu_hours(samples, gpus),
    }
