"""A throwaway single-node SLURM cluster on this machine, entirely inside one state directory.

Debian's `slurm-wlm` and `munge` packages provide the daemons; nothing under /etc, /run or /var
is used and no systemd is needed. Everything is started in the foreground as a child of this
process and stopped by PID (never by name: other sessions on the machine may run their own
SLURM):

    with SlurmCluster(tmp_path / "slurm") as cluster:
        subprocess.run(["sbatch", "--wrap", "hostname"], env=cluster.env)

The node has the machine's real CPU count and memory and `gpus` fake GPUs: `gres.conf` lists
files in the state directory as `File=`, so SLURM allocates them and sets CUDA_VISIBLE_DEVICES
like on a GPU node (see _fake_gpu). Ports are picked free at start. Clients find this cluster
through `env` (SLURM_CONF, and bin/ wrappers first on PATH). Needs root: slurmd runs each job as
the user who submitted it.

As a script, for debugging: `python tests/cluster/slurm_cluster.py STATE_DIR` starts a cluster,
prints the environment to use and stops it on Ctrl-C.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

CLIENTS = ("sbatch", "srun", "salloc", "squeue", "sinfo", "scontrol", "scancel", "sacct")
REQUIRED_BINARIES = ("slurmctld", "slurmd", "munged", "sbatch")
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin", "/sbin"])


def find_binary(name: str) -> str | None:
    return shutil.which(name, path=SEARCH_PATH)


def missing_binaries() -> list[str]:
    """The SLURM/munge programs this cluster needs that are not installed here."""
    return [name for name in REQUIRED_BINARIES if find_binary(name) is None]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def machine_memory_mb() -> int:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    raise RuntimeError("no MemTotal in /proc/meminfo")


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie child is dead for our purposes
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class SlurmError(RuntimeError):
    pass


class SlurmCluster:
    """munged + slurmctld + slurmd with every file under `state_dir`; `env` is for the clients."""

    def __init__(
        self,
        state_dir: Path | str,
        *,
        partition: str = "debug",
        gpus: int = 2,
        cpus: int | None = None,
        memory_mb: int | None = None,
        cluster_name: str = "rlbench",
    ):
        self.state_dir = Path(state_dir).resolve()
        self.partition = partition
        self.gpus = gpus
        self.cpus = cpus or os.cpu_count() or 1
        # What slurmd will report, less a margin; a node claiming more than it has is drained.
        self.memory_mb = memory_mb or max(256, int(machine_memory_mb() * 0.95))
        self.cluster_name = cluster_name
        self.node = socket.gethostname().split(".")[0]
        self.conf = self.state_dir / "etc" / "slurm.conf"
        self.munge_socket = self.state_dir / "munge" / "munge.socket"
        self.procs: dict[str, subprocess.Popen] = {}
        self._logs: list = []

    # -- environment -----------------------------------------------------------------------

    @property
    def bin_dir(self) -> Path:
        return self.state_dir / "bin"

    @property
    def env(self) -> dict[str, str]:
        """os.environ plus what SLURM clients (and jobs submitted with --export=ALL) need:
        SLURM_CONF, and bin/ first on PATH (see _write_client_wrappers)."""
        path = [str(self.bin_dir), *[p for p in os.environ.get("PATH", "").split(os.pathsep) if p]]
        for extra in ("/usr/sbin", "/usr/bin"):
            if extra not in path:
                path.append(extra)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SRUN_"))}
        env.update(SLURM_CONF=str(self.conf), PATH=os.pathsep.join(path))
        return env

    # -- configuration ---------------------------------------------------------------------

    def _write_config(self) -> None:
        s = self.state_dir
        for sub in ("etc", "munge", "ctld", "spool", "log", "run", "gpus"):
            (s / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(s / "munge", 0o755)  # munged wants its socket's directory traversable
        gpu_files = [self._fake_gpu(s / "gpus" / f"nvidia{index}") for index in range(self.gpus)]
        self.ctld_port, self.slurmd_port = free_port(), free_port()
        while self.slurmd_port == self.ctld_port:
            self.slurmd_port = free_port()
        gres = f" Gres=gpu:{self.gpus}" if self.gpus else ""
        lines = [
            f"ClusterName={self.cluster_name}",
            f"SlurmctldHost={self.node}(127.0.0.1)",
            f"SlurmctldPort={self.ctld_port}",
            f"SlurmdPort={self.slurmd_port}",
            "SlurmUser=root",
            "SlurmdUser=root",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={self.munge_socket}",
            "MpiDefault=none",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core_Memory",
            "SchedulerType=sched/backfill",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "JobCompType=jobcomp/none",
            "GresTypes=gpu",
            "ReturnToService=2",
            # Finished jobs stay visible to `squeue --states=all` this long: the Snakemake
            # executor's status checks (slurm-status-command: squeue) rely on it.
            "MinJobAge=600",
            "InactiveLimit=0",
            "KillWait=5",
            "Waittime=0",
            "SlurmctldTimeout=60",
            "SlurmdTimeout=120",
            "MailProg=/bin/true",
            f"PlugStackConfig={s / 'etc' / 'plugstack.conf'}",
            f"StateSaveLocation={s / 'ctld'}",
            f"SlurmdSpoolDir={s / 'spool'}",
            f"SlurmctldPidFile={s / 'run' / 'slurmctld.pid'}",
            f"SlurmdPidFile={s / 'run' / 'slurmd.pid'}",
            f"SlurmctldLogFile={s / 'log' / 'slurmctld.log'}",
            f"SlurmdLogFile={s / 'log' / 'slurmd.log'}",
            "SlurmctldDebug=info",
            "SlurmdDebug=info",
            f"NodeName={self.node} NodeAddr=127.0.0.1 CPUs={self.cpus} RealMemory={self.memory_mb}{gres} State=UNKNOWN",
            f"PartitionName={self.partition} Nodes={self.node} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")
        (s / "etc" / "plugstack.conf").write_text("")
        # gres.conf is read from slurm.conf's directory.
        gres_lines = [f"NodeName={self.node} Name=gpu File={path}" for path in gpu_files]
        (s / "etc" / "gres.conf").write_text("\n".join(gres_lines) + "\n")
        self._write_munge_key()
        self._write_client_wrappers()

    def _write_client_wrappers(self) -> None:
        """bin/<client>: the real client with SLURM_CONF pinned to this cluster.

        A real cluster's slurm.conf is at the compiled-in /etc/slurm/slurm.conf (or served by
        slurmctld in configless mode); this one lives in the state directory and is found through
        SLURM_CONF alone. Snakemake's slurm-jobstep executor runs its `srun` with every SLURM_*
        variable removed, SLURM_CONF included, so that srun would find no configuration. The
        wrappers are on the jobs' PATH (sbatch --export=ALL) and restore it.
        """
        self.bin_dir.mkdir(parents=True, exist_ok=True)
        for name in CLIENTS:
            real = find_binary(name)
            if real is None:
                continue
            wrapper = self.bin_dir / name
            wrapper.write_text(
                "#!/bin/sh\n"
                "# Written by tests/cluster/slurm_cluster.py: this test cluster's configuration.\n"
                f"SLURM_CONF='{self.conf}'\n"
                "export SLURM_CONF\n"
                f'exec \'{real}\' "$@"\n'
            )
            wrapper.chmod(0o755)

    @property
    def gpu_devices(self) -> bool:
        """Whether the fake GPUs are device files, so that jobs get CUDA_VISIBLE_DEVICES."""
        files = [self.state_dir / "gpus" / f"nvidia{i}" for i in range(self.gpus)]
        return bool(files) and all(f.exists() and stat.S_ISCHR(f.stat().st_mode) for f in files)

    @staticmethod
    def _fake_gpu(path: Path) -> Path:
        """A device file for gres.conf's File=. slurmd only sets CUDA_VISIBLE_DEVICES for files
        that are character devices, so make one with /dev/null's numbers (harmless: nothing opens
        it, and task/none enforces no device cgroup). Where mknod is not allowed, fall back to a
        plain file: SLURM still allocates the GPU (SLURM_GPUS_ON_NODE) but sets no
        CUDA_VISIBLE_DEVICES.
        """
        if path.exists() or path.is_symlink():
            path.unlink()
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        except OSError:
            path.touch()
        return path

    def _write_munge_key(self) -> None:
        key = self.state_dir / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)

    # -- processes -------------------------------------------------------------------------

    def _spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        log = open(self.state_dir / "log" / f"{name}.out", "ab")
        self._logs.append(log)
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**self.env, "SLURM_CONF": str(self.conf)},
            start_new_session=True,  # Ctrl-C in the test runner does not hit the daemons
        )
        self.procs[name] = proc
        (self.state_dir / "run" / f"{name}.child.pid").write_text(f"{proc.pid}\n")
        return proc

    def _wait_for(self, what: str, check, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise SlurmError(f"{name} exited with {proc.returncode} while waiting for {what}\n{self.logs()}")
            if check():
                return
            time.sleep(0.25)
        raise SlurmError(f"timed out after {timeout:.0f} s waiting for {what}\n{self.logs()}")

    def _client(self, *argv: str, timeout: float = 15) -> subprocess.CompletedProcess:
        return subprocess.run(
            [find_binary(argv[0]) or argv[0], *argv[1:]],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def start(self, timeout: float = 60) -> "SlurmCluster":
        """Start munged, slurmctld and slurmd; return once the node is idle in `sinfo`."""
        missing = missing_binaries()
        if missing:
            raise SlurmError(f"not installed: {', '.join(missing)}")
        if os.geteuid() != 0:
            raise SlurmError("a local SLURM cluster needs root (slurmd runs jobs as their user)")
        if len(str(self.munge_socket)) > 100:
            raise SlurmError(f"state directory path too long for a unix socket: {self.munge_socket}")
        self._write_config()
        s = self.state_dir
        try:
            self._spawn(
                "munged",
                [
                    find_binary("munged"),
                    "--foreground",
                    "--force",  # tolerate this root-owned, per-test state directory
                    f"--socket={self.munge_socket}",
                    f"--key-file={s / 'munge' / 'munge.key'}",
                    f"--pid-file={s / 'munge' / 'munged.pid'}",
                    f"--log-file={s / 'log' / 'munged.log'}",
                    f"--seed-file={s / 'munge' / 'munged.seed'}",
                ],
            )
            self._wait_for("the munge socket", self.munge_socket.exists, timeout)
            self._spawn("slurmctld", [find_binary("slurmctld"), "-D", "-i", "-f", str(self.conf)])
            self._wait_for("slurmctld", lambda: self._client("scontrol", "ping").returncode == 0, timeout)
            self._spawn("slurmd", [find_binary("slurmd"), "-D", "-f", str(self.conf), "-N", self.node])
            self._wait_for(f"node {self.node} idle", self._node_idle, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _node_idle(self) -> bool:
        proc = self._client("sinfo", "--noheader", "--Node", "--format=%N %T", "--partition", self.partition)
        return proc.returncode == 0 and any(
            line.split()[:2] == [self.node, "idle"] for line in proc.stdout.splitlines() if line.strip()
        )

    def _stray_pids(self) -> list[int]:
        """Processes of this cluster that are not our children: slurmctld's slurmscriptd, the
        slurmstepd of each job step and the jobs' own processes. Recognised by SLURM_CONF pointing
        at our slurm.conf (jobs inherit it), or by a command line or an open file under our state
        directory (slurmstepd rewrites its environment for its title but keeps slurmd's log open).
        Never this process or its ancestors.
        """
        marker = f"SLURM_CONF={self.conf}".encode()
        state = str(self.state_dir)
        own = {os.getpid()}
        parent = os.getppid()
        while parent > 1 and parent not in own:
            own.add(parent)
            try:
                with open(f"/proc/{parent}/stat") as handle:
                    parent = int(handle.read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                break
        pids = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit() or int(entry) in own:
                continue
            proc_dir = f"/proc/{entry}"
            try:
                with open(f"{proc_dir}/environ", "rb") as handle:
                    if marker in handle.read().split(b"\0"):
                        pids.append(int(entry))
                        continue
                with open(f"{proc_dir}/cmdline", "rb") as handle:
                    if state.encode() in handle.read():
                        pids.append(int(entry))
                        continue
                for fd in os.listdir(f"{proc_dir}/fd"):
                    if os.readlink(f"{proc_dir}/fd/{fd}").startswith(state + os.sep):
                        pids.append(int(entry))
                        break
            except OSError:
                continue
        return pids

    def _jobs_left(self) -> bool:
        proc = self._client("squeue", "--noheader", "--states=PENDING,RUNNING,SUSPENDED,COMPLETING,CONFIGURING")
        return proc.returncode != 0 or bool(proc.stdout.strip())

    @staticmethod
    def _terminate(pids: list[int], grace: float) -> None:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline and any(pid_alive(pid) for pid in pids):
            time.sleep(0.1)
        for pid in pids:
            if pid_alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def stop(self) -> None:
        """Cancel every job and give it KillWait to end; stop slurmd, slurmctld and munged by
        PID; then kill whatever of this cluster survived (see _stray_pids). Safe to call twice."""
        ctld = self.procs.get("slurmctld")
        if ctld is not None and ctld.poll() is None:
            try:
                self._client("scancel", "--quiet", f"--partition={self.partition}", timeout=10)
                deadline = time.monotonic() + 15
                while time.monotonic() < deadline and self._jobs_left():
                    time.sleep(0.25)
            except (OSError, subprocess.SubprocessError):
                pass
        for name in ("slurmd", "slurmctld", "munged"):
            proc = self.procs.get(name)
            if proc is None:
                continue
            if proc.poll() is None:
                self._terminate([proc.pid], grace=10)
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        strays = self._stray_pids()
        if strays:
            self._terminate(strays, grace=5)
        for log in self._logs:
            log.close()
        self._logs.clear()

    def logs(self, tail: int = 40) -> str:
        """The end of every daemon log, for error messages."""
        parts = []
        for path in sorted((self.state_dir / "log").glob("*")):
            try:
                lines = path.read_text(errors="replace").splitlines()[-tail:]
            except OSError:
                continue
            parts.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(parts)

    def __enter__(self) -> "SlurmCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} STATE_DIR")
    cluster = SlurmCluster(sys.argv[1])
    try:
        cluster.start()
        # Block only now: the daemons must not inherit a signal mask that ignores SIGTERM.
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
        print(f"export PATH={cluster.bin_dir}:$PATH SLURM_CONF={cluster.conf}  # Ctrl-C stops it", flush=True)
        signal.sigwait({signal.SIGINT, signal.SIGTERM})
    finally:
        cluster.stop()
