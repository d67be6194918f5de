"""Runtime recording: the agent's code at each submission (a shadow git repository), the resource
trace of a run, the final state of its workspace, and a run reconstructed from its record alone.

The agent's workspace is hostile by assumption (links, FIFOs, .gitattributes with filters, hooks,
nested repositories). Nothing here runs git on it: the grader commits its own link-free copy of
code/ (grader.checks.snapshot_code), and even that copy is only ever read by `git hash-object
--no-filters` on named regular files; the tree is built with plumbing (update-index --index-info,
write-tree, commit-tree), so no attribute, ignore rule, hook or nested .git of the agent's changes
what is recorded. Git itself runs with no system, global or user configuration.

Layout of the records (beside the run's other files):

    <run_dir>/grader/code.git/               bare repository, branch main, one commit per submission
                                             that reached scoring ("submission N", dated when it
                                             was received); the ledger's `code_revision` is its sha
    <run_dir>/grader/snapshots/NNNN/checkpoint.json
                                             the submitted checkpoint: fingerprint, files (name,
                                             size, sha256), config.json, recorded_at
    <run_dir>/resources.jsonl                ResourceSampler: one JSON line per interval
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Callable

from rlbench.fileio import nofollow

if TYPE_CHECKING:  # psutil is only needed by whoever passes processes in
    import psutil

CODE_GIT = "code.git"
BRANCH = "refs/heads/main"
IDENTITY = ("rlbench grader", "grader@rlbench.invalid")
GIT_TIMEOUT_S = 120
# Arguments per `git hash-object` call (a code snapshot holds at most 2000 files).
HASH_BATCH = 256
# Options on every git call: no hooks, no background maintenance, no fsmonitor, no signing;
# path checks for other file systems off (the paths are our own copy's, on this one).
GIT_OPTIONS = (
    "-c", "core.hooksPath=/dev/null",
    "-c", "core.fsmonitor=false",
    "-c", "gc.auto=0",
    "-c", "maintenance.auto=false",
    "-c", "commit.gpgSign=false",
    "-c", "core.protectNTFS=false",
    "-c", "core.protectHFS=false",
)  # fmt: skip
# The workspace walk of the resource sampler and of the final state: entries looked at, depth.
WORKSPACE_MAX_ENTRIES = 200_000
WORKSPACE_MAX_DEPTH = 64
BY_TOP_MAX = 200  # top-level names listed one by one; the rest are counted under "(other)"
NVIDIA_SMI_TIMEOUT_S = 10
SUBMISSION_MESSAGE = re.compile(r"^submission (\d+)$")


class RecordingError(RuntimeError):
    """A record could not be made (git missing, or a git command failed)."""


# -- the shadow repository of the agent's code ------------------------------------------------------
def git_env(home: Path) -> dict[str, str]:
    """The environment of every git call: nothing inherited from GIT_* variables, no system,
    global or user configuration, HOME pointed away from anyone's real one."""
    env = {k: v for k, v in os.environ.items() if k in ("PATH", "TMPDIR", "SYSTEMROOT")}
    env.update(
        GIT_CONFIG_NOSYSTEM="1",
        GIT_CONFIG_GLOBAL="/dev/null",
        HOME=str(home),
        XDG_CONFIG_HOME=str(home),
        GIT_TERMINAL_PROMPT="0",
        GIT_OPTIONAL_LOCKS="0",
        LC_ALL="C",
    )
    return env


def _is_git_component(name: str) -> bool:
    """A path component git refuses in a tree (.git, in any case)."""
    return name.lower() == ".git"


def tree_files(tree_dir: Path) -> list[str]:
    """The regular files under tree_dir (the grader's own copy), as sorted relative POSIX paths;
    links and special files are left out, so are paths with a .git component (git refuses them)
    and names git's line-based plumbing could misread (a newline)."""
    files: list[str] = []
    if not tree_dir.is_dir() or tree_dir.is_symlink():
        return files
    for top, dirs, names in os.walk(tree_dir, followlinks=False):
        dirs[:] = [d for d in dirs if not _is_git_component(d) and "\n" not in d]
        for name in names:
            path = Path(top) / name
            if _is_git_component(name) or "\n" in name or not stat.S_ISREG(path.lstat().st_mode):
                continue
            files.append(path.relative_to(tree_dir).as_posix())
    return sorted(files)


class CodeRepository:
    """<grader_dir>/code.git: one commit per submission, holding the grader's copy of code/.

    Commits are serialised (submissions are concurrent): each one's parent is the commit before it
    in time. An unchanged code/ still gets its own commit (same tree)."""

    def __init__(self, git_dir: Path):
        # Absolute: git runs in other directories (hash-object in the copy's), and the runner gives
        # relative run directories (results/runs/...).
        self.git_dir = Path(os.path.abspath(git_dir))
        self._lock = threading.Lock()

    # plumbing
    def _git(self, *args: str, input: bytes | None = None, env: dict | None = None, cwd: Path | None = None) -> bytes:
        git = shutil.which("git")
        if git is None:
            raise RecordingError("git is not installed")
        command = [git, "--git-dir", str(self.git_dir), *GIT_OPTIONS, *args]
        try:
            done = subprocess.run(
                command,
                input=input,
                capture_output=True,
                env={**git_env(self.git_dir), **(env or {})},
                cwd=cwd or self.git_dir.parent,
                timeout=GIT_TIMEOUT_S,
            )
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RecordingError(f"git {args[0]}: {exc}") from None
        if done.returncode != 0:
            raise RecordingError(
                f"git {args[0]} failed ({done.returncode}): {done.stderr.decode(errors='replace')[-2000:]}"
            )
        return done.stdout

    def exists(self) -> bool:
        return (self.git_dir / "HEAD").is_file()

    def _init(self) -> None:
        if self.exists():
            return
        self.git_dir.mkdir(parents=True, exist_ok=True)
        self._git("init", "--bare", "--quiet", "--template=", str(self.git_dir))
        self._git("symbolic-ref", "HEAD", BRANCH)

    def head(self) -> str | None:
        if not self.exists():
            return None
        try:
            return self._git("rev-parse", "--verify", "--quiet", f"{BRANCH}^{{commit}}").decode().strip() or None
        except RecordingError:
            return None

    def commit(self, tree_dir: Path, message: str, when: float) -> str:
        """Commit the files of tree_dir (see tree_files) as they are; returns the commit's sha.
        Raises RecordingError."""
        with self._lock:
            self._init()
            files = tree_files(Path(tree_dir))
            shas: list[str] = []
            for start in range(0, len(files), HASH_BATCH):
                batch = files[start : start + HASH_BATCH]
                # --no-filters: the content as it is, whatever any attribute says.
                out = self._git("hash-object", "-w", "--no-filters", "--", *batch, cwd=Path(tree_dir))
                shas += out.decode().split()
            if len(shas) != len(files):
                raise RecordingError(f"git hash-object returned {len(shas)} ids for {len(files)} files")
            index = self.git_dir / "rlbench-index"
            index.unlink(missing_ok=True)
            env = {"GIT_INDEX_FILE": str(index)}
            try:
                listing = b"".join(
                    b"100644 " + sha.encode() + b"\t" + os.fsencode(rel) + b"\0" for sha, rel in zip(shas, files)
                )
                self._git("update-index", "--add", "-z", "--index-info", input=listing, env=env)
                tree = self._git("write-tree", env=env).decode().strip()
            finally:
                index.unlink(missing_ok=True)
            parent = self.head()
            name, email = IDENTITY
            date = f"@{int(when)} +0000"
            identity = {
                "GIT_AUTHOR_NAME": name,
                "GIT_AUTHOR_EMAIL": email,
                "GIT_AUTHOR_DATE": date,
                "GIT_COMMITTER_NAME": name,
                "GIT_COMMITTER_EMAIL": email,
                "GIT_COMMITTER_DATE": date,
            }
            parents = ["-p", parent] if parent else []
            sha = self._git("commit-tree", tree, *parents, "-m", message, env=identity).decode().strip()
            self._git("update-ref", BRANCH, sha, parent or "0" * 40)
            return sha

    # reading
    def log(self) -> list[dict]:
        """Every commit, oldest first: sha, submission (from "submission N"; None otherwise),
        time (unix seconds), tree, message."""
        if self.head() is None:
            return []
        out = self._git("log", "--reverse", "--format=%H%x1f%at%x1f%T%x1f%s%x1e", BRANCH).decode(errors="replace")
        commits = []
        for record in out.split("\x1e"):
            if not record.strip():
                continue
            sha, at, tree, subject = record.strip("\n").split("\x1f", 3)
            match = SUBMISSION_MESSAGE.match(subject)
            commits.append(
                {
                    "sha": sha,
                    "submission": int(match.group(1)) if match else None,
                    "time": int(at),
                    "tree": tree,
                    "message": subject,
                }
            )
        return commits

    def files(self, rev: str) -> list[dict]:
        """The files of a revision: path, size, blob sha."""
        out = self._git("ls-tree", "-r", "-l", "-z", rev)
        files = []
        for record in out.split(b"\0"):
            if not record:
                continue
            meta, path = record.split(b"\t", 1)
            mode, kind, blob, size = meta.split()
            if kind == b"blob":
                files.append({"path": os.fsdecode(path), "size": int(size), "blob": blob.decode()})
        return files

    def show(self, rev: str, path: str) -> bytes:
        """One file's content at a revision (`git show rev:path`, without any conversion)."""
        return self._git("cat-file", "blob", f"{rev}:{path}")

    def export(self, rev: str, dest: Path) -> int:
        """Write the files of a revision under dest (contents as stored: no attribute, filter or
        checkout machinery involved); returns how many. Paths that would leave dest are skipped."""
        files = self.files(rev)
        if not files:
            dest.mkdir(parents=True, exist_ok=True)
            return 0
        out = self._git("cat-file", "--batch", input=b"".join(f["blob"].encode() + b"\n" for f in files))
        position, written = 0, 0
        for f in files:
            header_end = out.index(b"\n", position)
            _, _, size = out[position:header_end].split()
            start = header_end + 1
            content = out[start : start + int(size)]
            position = start + int(size) + 1
            rel = PurePosixPath(f["path"])
            if rel.is_absolute() or ".." in rel.parts:
                continue
            target = dest / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(content)
            written += 1
        return written


def code_revisions(grader_dir: Path) -> list[dict]:
    """The commits of <grader_dir>/code.git, oldest first (see CodeRepository.log); [] when there
    is none or git cannot read it."""
    repo = CodeRepository(Path(grader_dir) / CODE_GIT)
    try:
        return repo.log()
    except RecordingError as exc:
        print(f"recording: cannot read {repo.git_dir}: {exc}", file=sys.stderr)
        return []


# -- the workspace's size ------------------------------------------------------------------------------
def workspace_usage(workspace: Path, max_entries: int = WORKSPACE_MAX_ENTRIES, listing: int = 0) -> dict:
    """What the workspace holds, walked without following a link (directories opened with
    O_NOFOLLOW relative to their parent): files, bytes (apparent sizes; a file hard-linked
    several times counted once), dirs, links, other entries, per top-level name (files and bytes;
    top-level files under "."); stops after max_entries entries (`truncated`). listing: also the
    first that many files (path, size), in sorted walk order."""
    usage: dict = {"files": 0, "bytes": 0, "dirs": 0, "links": 0, "other": 0, "truncated": False, "by_top": {}}
    if listing:
        usage["listing"] = []
    seen_inodes: set[tuple[int, int]] = set()
    try:
        top = os.open(workspace, nofollow.DIR_FLAGS)
    except OSError as exc:
        usage["error"] = f"{workspace}: {exc.strerror or exc}"
        return usage
    try:
        walk = nofollow.walk(top, WORKSPACE_MAX_DEPTH, skip_unreadable=True)
        try:
            for count, entry in enumerate(walk, 1):
                if count > max_entries:
                    usage["truncated"] = True
                    break
                mode = entry.st.st_mode
                if stat.S_ISDIR(mode):
                    usage["dirs"] += 1
                    continue
                if stat.S_ISLNK(mode):
                    usage["links"] += 1
                    continue
                if not stat.S_ISREG(mode):
                    usage["other"] += 1
                    continue
                usage["files"] += 1
                size = entry.st.st_size
                if entry.st.st_nlink > 1:
                    key = (entry.st.st_dev, entry.st.st_ino)
                    size = 0 if key in seen_inodes else size
                    seen_inodes.add(key)
                usage["bytes"] += size
                group = entry.rel.parts[0] if len(entry.rel.parts) > 1 else "."
                if group not in usage["by_top"] and len(usage["by_top"]) >= BY_TOP_MAX:
                    group = "(other)"
                bucket = usage["by_top"].setdefault(group, {"files": 0, "bytes": 0})
                bucket["files"] += 1
                bucket["bytes"] += size
                if listing and len(usage["listing"]) < listing:
                    usage["listing"].append({"path": str(entry.rel), "size": entry.st.st_size})
        finally:
            walk.close()
    finally:
        os.close(top)
    if listing:
        usage["listing_truncated"] = usage["files"] > len(usage["listing"]) or usage["truncated"]
    return usage


# -- the resource trace ------------------------------------------------------------------------------
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


# -- a run, reconstructed from its record ---------------------------------------------------------------
PROMPT_MAX_CHARS = 100_000


def _json_or_none(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _ledger(path: Path) -> list[dict]:
    entries = []
    if path.is_file():
        for line in path.read_text(errors="replace").splitlines():
            try:
                entries.append(json.loads(line))
            except ValueError:
                continue
    return entries


def reconstruct(run_dir: Path) -> dict:
    """A run as its record under results/runs/... tells it: the agent's prompt
    (agent/prompt.md), its transcript (gateway/transcript.jsonl: path and size), and for every
    request the grader recorded, its outcome with the code revision (code.git: sha and files) and
    the checkpoint (snapshots/NNNN/checkpoint.json); then the resource trace summary and the final
    evaluation. `missing` names the records that are not there."""
    run_dir = Path(run_dir)
    grader = run_dir / "grader"
    missing = []
    prompt_path = run_dir / "agent" / "prompt.md"
    prompt = None
    if prompt_path.is_file():
        text = prompt_path.read_text(errors="replace")
        prompt = {"path": str(prompt_path), "chars": len(text), "text": text[:PROMPT_MAX_CHARS]}
    else:
        missing.append("agent/prompt.md")
    transcript_path = run_dir / "gateway" / "transcript.jsonl"
    transcript = None
    if transcript_path.is_file():
        with open(transcript_path, "rb") as handle:
            lines = sum(1 for line in handle if line.strip())
        transcript = {"path": str(transcript_path), "records": lines, "bytes": transcript_path.stat().st_size}
    else:
        missing.append("gateway/transcript.jsonl")
    ledger_path = grader / "ledger.jsonl"
    if not ledger_path.is_file():
        missing.append("grader/ledger.jsonl")
    repo = CodeRepository(grader / CODE_GIT)
    revisions = code_revisions(grader)
    if not revisions:
        missing.append(f"grader/{CODE_GIT}")
    by_sha = {r["sha"]: r for r in revisions}
    submissions = []
    for entry in _ledger(ledger_path):
        if entry.get("pending"):
            continue
        sid = entry.get("submission_id")
        revision = entry.get("code_revision")
        code = None
        if revision and revision in by_sha:
            try:
                code = [f["path"] for f in repo.files(revision)]
            except RecordingError:
                code = None
        checkpoint = (
            _json_or_none(grader / "snapshots" / f"{sid:04d}" / "checkpoint.json") if isinstance(sid, int) else None
        )
        submissions.append(
            {
                "submission_id": sid,
                "submitted_at": entry.get("submitted_at"),
                "since_start_s": entry.get("since_start_s"),
                "model_path": entry.get("model_path"),
                "status": entry.get("status"),
                "reason": entry.get("reason"),
                "score": entry.get("score"),
                "improvement": entry.get("improvement"),
                "error": entry.get("error"),
                "code_revision": revision,
                "code_files": code,
                "checkpoint": (
                    None
                    if checkpoint is None
                    else {
                        "fingerprint": checkpoint.get("fingerprint"),
                        "files": len(checkpoint.get("files") or []),
                        "bytes": sum(f.get("size", 0) for f in checkpoint.get("files") or []),
                    }
                ),
            }
        )
    run = _json_or_none(run_dir / "run.json") or {}
    manifest = _json_or_none(run_dir / "workspace.json") or {}
    final = _json_or_none(run_dir / "final.json")
    return {
        "run_dir": str(run_dir),
        "labels": run.get("labels"),
        "status": run.get("status"),
        "exit_code": run.get("exit_code"),
        "start_time": run.get("start_time"),
        "end_time": run.get("end_time"),
        "mode": manifest.get("mode"),
        "prompt": prompt,
        "transcript": transcript,
        "submissions": submissions,
        "code_revisions": revisions,
        "resources": summarize_trace(run_dir / "resources.jsonl"),
        "final": None if final is None else {k: final.get(k) for k in ("score", "baseline_score", "delta")},
        "missing": missing,
    }


def export_revision_to_temp(grader_dir: Path, rev: str) -> tempfile.TemporaryDirectory:
    """A temporary directory holding a revision's files (the caller cleans it up)."""
    tmp = tempfile.TemporaryDirectory(prefix="rlbench-rev-")
    CodeRepository(Path(grader_dir) / CODE_GIT).export(rev, Path(tmp.name))
    return tmp
