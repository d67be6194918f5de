"""The agent's code at each submission: a shadow git repository (<run_dir>/grader/code.git) the grader
commits its copy of code/ to, and reads back (log, files, export).

The agent's workspace is hostile by assumption (links, FIFOs, .gitattributes with filters, hooks,
nested repositories). Nothing here runs git on it: the grader commits its own link-free copy of
code/ (grader.snapshot.snapshot_code), and even that copy is only ever read by `git hash-object
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
    <run_dir>/resources.jsonl                ResourceSampler (rlbench.recording.trace): one JSON line
                                             per interval
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import threading
from pathlib import Path, PurePosixPath

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
SUBMISSION_MESSAGE = re.compile(r"^submission (\d+)$")


class RecordingError(RuntimeError):
    """A record could not be made (git missing, or a git command failed)."""


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

    def diff(self, old: str | None, new: str) -> str:
        """The unified diff from revision `old` to `new` (`old` None: from nothing, every file of `new`
        added), as git prints it: renames found, binary files named but not shown, no external diff
        driver and no text conversion."""
        options = ("--no-color", "--no-ext-diff", "--no-textconv", "--no-commit-id", "-M", "-p")
        if old is None:
            return self._git("diff-tree", *options, "--root", "-r", new).decode(errors="replace")
        return self._git("diff-tree", *options, "-r", old, new).decode(errors="replace")

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
