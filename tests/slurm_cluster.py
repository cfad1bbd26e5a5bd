"""A real SLURM cluster on this host for tests: munge, MariaDB, slurmdbd, slurmctld and two slurmd "nodes".

Every daemon runs in the foreground as a child of this process, with all its state, sockets, logs and ports in one
temp folder, and is stopped by PID. Needs root and Debian's slurmctld, slurmd, slurm-client, slurmdbd, munge and
mariadb-server packages (`nox -s slurm` installs them). See docs/slurm.md.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "slurmdbd", "munge", "mariadb-server")
BINARIES = ("slurmctld", "slurmd", "slurmdbd", "sbatch", "sacctmgr", "munged", "mariadbd", "mariadb-install-db")
HOSTS_LINE = "127.0.0.1 n1 n2  # dtbench test cluster"


def missing_binaries() -> list[str]:
    found = {name: shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin") for name in BINARIES}
    return [name for name, path in found.items() if not path]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _sbin(name: str) -> str:
    return shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin") or name


class LocalSlurm:
    """Start with start(), stop with stop() (after cancelling every job and waiting for the queue to empty).

    `env` holds SLURM_CONF for every client command and job; `nodes` are the node names (they resolve through an
    /etc/hosts line this class adds and removes).
    """

    def __init__(self, root: Path | None = None, nodes: tuple[str, ...] = ("n1", "n2"), cpus_per_node: int = 1):
        self.root = Path(root or tempfile.mkdtemp(prefix="dtbench-slurm-"))
        self.nodes = nodes
        self.cpus_per_node = cpus_per_node
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self.env = {**os.environ, "SLURM_CONF": str(self.root / "etc" / "slurm.conf")}
        self._added_hosts = False
        self.munge_dir: Path | None = None

    # -- life cycle ---------------------------------------------------------------------------------------------
    def start(self, timeout_s: float = 120.0) -> None:
        try:
            self._start(timeout_s)
        except BaseException:
            self.stop()
            raise

    def _start(self, timeout_s: float) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        for sub in ("etc", "state", "log", "db"):
            (self.root / sub).mkdir(exist_ok=True)
        self._hosts()
        self._munge()
        db_port, dbd_port, ctld_port = free_port(), free_port(), free_port()
        node_ports = [free_port() for _ in self.nodes]
        self._mariadb(db_port, timeout_s)
        self._write_configs(db_port, dbd_port, ctld_port, node_ports)
        self._spawn("slurmdbd", [_sbin("slurmdbd"), "-D"])
        self._until(self._add_cluster, timeout_s, "slurmdbd to register the cluster")
        self._spawn("slurmctld", [_sbin("slurmctld"), "-D", "-f", self.env["SLURM_CONF"]])
        for node in self.nodes:
            self._spawn(f"slurmd-{node}", [_sbin("slurmd"), "-D", "-N", node, "-f", self.env["SLURM_CONF"]])
        self._until(self._nodes_idle, timeout_s, "the nodes to come up idle")

    def stop(self, timeout_s: float = 90.0) -> None:
        """Cancel every job, wait for the queue to empty (or slurmstepd orphans remain), then stop the daemons."""
        if any(name == "slurmctld" and p.poll() is None for name, p in self.procs):
            self.run("scancel", "--user", "root", check=False)
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                queue = self.run("squeue", "-h", check=False)
                if queue.returncode == 0 and not queue.stdout.strip():
                    break
                time.sleep(1)
        for _name, proc in reversed(self.procs):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(10)
        self.procs.clear()
        if self.munge_dir is not None:
            shutil.rmtree(self.munge_dir, ignore_errors=True)
            self.munge_dir = None
        if self._added_hosts:
            lines = Path("/etc/hosts").read_text().splitlines()
            Path("/etc/hosts").write_text("".join(f"{line}\n" for line in lines if line != HOSTS_LINE))
            self._added_hosts = False

    # -- helpers --------------------------------------------------------------------------------------------------
    def run(self, *command: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return subprocess.run(list(command), env=self.env, capture_output=True, text=True, check=check,
                              timeout=timeout)

    def log(self, name: str) -> str:
        path = self.root / "log" / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _spawn(self, name: str, command: list[str], user: str | None = None) -> subprocess.Popen:
        if user:
            command = ["runuser", "-u", user, "--", *command]
        out = open(self.root / "log" / f"{name}.out", "ab")  # noqa: SIM115 - the child owns it
        proc = subprocess.Popen(command, env=self.env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        out.close()
        self.procs.append((name, proc))
        return proc

    def _until(self, ready, timeout_s: float, what: str) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            dead = [name for name, p in self.procs if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}; logs in {self.root / 'log'}")
            if ready():
                return
            time.sleep(0.5)
        raise RuntimeError(f"timed out after {timeout_s:.0f} s waiting for {what}; logs in {self.root / 'log'}")

    def _hosts(self) -> None:
        try:
            for node in self.nodes:
                socket.gethostbyname(node)
        except OSError:
            with open("/etc/hosts", "a") as f:
                f.write(HOSTS_LINE + "\n")
            self._added_hosts = True

    def _munge(self) -> None:
        # munged (user munge) checks that every folder above its socket is reachable by all: pytest's temp folders
        # are not, so munge gets a folder of its own directly in the system's temp folder.
        folder = self.munge_dir = Path(tempfile.mkdtemp(prefix="dtbench-munge-"))
        shutil.chown(folder, "munge", "munge")
        os.chmod(folder, 0o755)
        self.munge_socket = folder / "munge.socket"
        self._spawn("munged", [_sbin("munged"), "-F", f"--socket={self.munge_socket}",
                               f"--pid-file={folder / 'munged.pid'}", f"--log-file={folder / 'munged.log'}",
                               f"--seed-file={folder / 'munged.seed'}"], user="munge")
        self._until(self.munge_socket.exists, 30, "munged's socket")

    def _mariadb(self, port: int, timeout_s: float) -> None:
        data, sock = self.root / "db", self.root / "db.sock"
        subprocess.run([_sbin("mariadb-install-db"), "--no-defaults", f"--datadir={data}", "--user=root",
                        "--auth-root-authentication-method=normal", "--skip-test-db"], check=True,
                       capture_output=True, timeout=120)
        self._spawn("mariadbd", [_sbin("mariadbd"), "--no-defaults", f"--datadir={data}", f"--socket={sock}",
                                 f"--port={port}", "--bind-address=127.0.0.1", "--user=root",
                                 f"--pid-file={self.root / 'db.pid'}", "--skip-name-resolve"])
        self._until(sock.exists, timeout_s, "MariaDB's socket")
        sql = ("CREATE USER IF NOT EXISTS 'slurm'@'127.0.0.1' IDENTIFIED BY 'slurm'; "
               "GRANT ALL ON *.* TO 'slurm'@'127.0.0.1'; FLUSH PRIVILEGES;")
        self._until(lambda: subprocess.run([_sbin("mariadb"), "--no-defaults", f"--socket={sock}", "-uroot",
                                            "-e", sql], capture_output=True, timeout=30).returncode == 0,
                    timeout_s, "MariaDB to take the slurm user")

    def _write_configs(self, db_port: int, dbd_port: int, ctld_port: int, node_ports: list[int]) -> None:
        d = self.root
        auth = f"AuthType=auth/munge\nAuthInfo=socket={self.munge_socket}\n"
        # A requeued job waits out the credential lifetime (cred_expire, 120 s by default) before it starts again.
        ctld_auth = f"AuthType=auth/munge\nAuthInfo=socket={self.munge_socket},cred_expire=10\n"
        nodes = "".join(f"NodeName={n} NodeHostname=localhost NodeAddr=127.0.0.1 Port={p} "
                        f"CPUs={self.cpus_per_node} RealMemory=4000 State=UNKNOWN\n"
                        for n, p in zip(self.nodes, node_ports, strict=True))
        (d / "etc" / "slurm.conf").write_text(
            f"ClusterName=dtbench\nSlurmctldHost=localhost\nSlurmctldPort={ctld_port}\nSlurmUser=root\n"
            f"SlurmdUser=root\n{ctld_auth}CredType=cred/munge\nStateSaveLocation={d}/state\n"
            f"SlurmdSpoolDir={d}/state/spool-%n\nSlurmctldPidFile={d}/slurmctld.pid\n"
            f"SlurmdPidFile={d}/slurmd-%n.pid\nSlurmctldLogFile={d}/log/slurmctld.log\n"
            f"SlurmdLogFile={d}/log/slurmd-%n.log\nProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
            "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\nMpiDefault=none\nReturnToService=2\n"
            "JobRequeue=1\nKillWait=20\nMinJobAge=600\nSchedulerParameters=sched_interval=2\n"
            f"AccountingStorageType=accounting_storage/slurmdbd\nAccountingStorageHost=localhost\n"
            f"AccountingStoragePort={dbd_port}\nAccountingStoragePass={self.munge_socket}\n"
            "JobAcctGatherType=jobacct_gather/linux\n"
            "JobAcctGatherFrequency=30\n"
            f"{nodes}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n")
        dbd = d / "etc" / "slurmdbd.conf"  # next to slurm.conf: slurmdbd has no -f
        dbd.write_text(
            f"{auth}DbdHost=localhost\nDbdPort={dbd_port}\nSlurmUser=root\n"
            "StorageType=accounting_storage/mysql\nStorageHost=127.0.0.1\n"
            f"StoragePort={db_port}\nStorageUser=slurm\nStoragePass=slurm\nStorageLoc=slurm_acct_db\n"
            f"PidFile={d}/slurmdbd.pid\nLogFile={d}/log/slurmdbd.log\n")
        dbd.chmod(0o600)

    def _add_cluster(self) -> bool:
        self.run("sacctmgr", "-i", "add", "cluster", "dtbench", check=False)
        listed = self.run("sacctmgr", "-n", "-P", "list", "cluster", "format=cluster", check=False)
        return "dtbench" in listed.stdout.split()

    def _nodes_idle(self) -> bool:
        out = self.run("sinfo", "-h", "-N", "-o", "%N %t", check=False).stdout.split()
        states = dict(zip(out[::2], out[1::2], strict=False))
        return all(states.get(n) == "idle" for n in self.nodes)


if __name__ == "__main__":  # start a cluster by hand: python tests/slurm_cluster.py; Ctrl-C stops it
    cluster = LocalSlurm()
    cluster.start()
    print(f"export SLURM_CONF={cluster.env['SLURM_CONF']}")
    try:
        signal.pause()
    except KeyboardInterrupt:
        pass
    finally:
        cluster.stop()
