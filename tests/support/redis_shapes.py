"""The Redis deployments operators run, started for real on loopback: one server (with
AOF persistence, over TLS, on a unix socket), a master with a replica watched by
`redis-sentinel`, and a three-master Redis Cluster (`redis-cli --cluster create`).

Each is a context manager that starts the Debian binaries (`redis-server`,
`redis-sentinel`, `redis-cli`; `make test` installs them) in a temporary directory
and kills them on exit.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from app.limits.shared_store import SharedStore
from tests.support.procs import free_port
from tests.support.tls import Certificate
from tests.support.waiting import PATIENCE, wait_until


def cluster_port() -> int:
    """A free port whose cluster bus port (+10000) is a valid port too, and free."""
    while True:
        port = free_port()
        if port + 10000 < 65536:
            with contextlib.suppress(OSError), socket.socket() as s:
                s.bind(("127.0.0.1", port + 10000))
                return port


def _exe(name: str) -> str:
    found = shutil.which(name)
    assert found, f"{name} is not installed (make test installs it)"
    return found


def cli(port: int, *args: str, tls: Certificate | None = None) -> str:
    """`redis-cli -p PORT ARGS...`: its output (raises if it fails)."""
    cmd = [_exe("redis-cli"), "-h", "127.0.0.1", "-p", str(port)]
    if tls is not None:
        cmd += ["--tls", "--cacert", str(tls.ca), "--cert", str(tls.cert), "--key", str(tls.key)]
    done = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=30, check=True)
    return done.stdout.strip()


def wait_for(check: Callable[[], bool], what: str) -> None:
    """Until `check` holds; a check that raises (a server not up yet) is 'not yet'."""
    wait_until(check, what, quiet=True)


def _listening(port: int) -> bool:
    with socket.create_connection(("127.0.0.1", port), 0.2):
        return True


@dataclass
class Server:
    """One `redis-server` (or `redis-sentinel`) process; `restart` keeps its port and dir."""

    workdir: Path
    args: list[str]
    port: int
    exe: str = "redis-server"
    proc: subprocess.Popen[bytes] | None = None
    tls: Certificate | None = None
    unix_socket: Path | None = None
    password: str | None = None

    @property
    def url(self) -> str:
        auth = f":{self.password}@" if self.password else ""
        if self.unix_socket is not None:
            return f"unix://{auth}{self.unix_socket}?db=0"
        return f"{'rediss' if self.tls else 'redis'}://{auth}127.0.0.1:{self.port}/0"

    def start(self) -> Server:
        self.workdir.mkdir(parents=True, exist_ok=True)
        with open(self.workdir / "server.log", "ab") as log:
            self.proc = subprocess.Popen(
                [_exe(self.exe), *self.args], cwd=self.workdir, stdout=log, stderr=log
            )
        check = self._unix_ready if self.unix_socket is not None else lambda: _listening(self.port)
        wait_for(check, f"{self.exe} on {self.port} listening")
        return self

    def _unix_ready(self) -> bool:
        assert self.unix_socket is not None
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(0.2)
            s.connect(str(self.unix_socket))
        return True

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None

    def restart(self) -> None:
        self.kill()
        self.start()

    def stall(self, seconds: float) -> subprocess.Popen[bytes]:
        """Make the server unresponsive for `seconds` (`DEBUG SLEEP`: the server must run
        with `--enable-debug-command local`), without waiting for it to end."""
        cmd = [_exe("redis-cli"), "-h", "127.0.0.1", "-p", str(self.port)]
        return subprocess.Popen(
            [*cmd, "DEBUG", "SLEEP", str(seconds)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )

    def cli(self, *args: str) -> str:
        if self.password:
            args = ("--no-auth-warning", "-a", self.password, *args)
        return cli(self.port, *args, tls=self.tls)


def server(
    workdir: Path,
    *,
    persist: bool = False,
    tls: Certificate | None = None,
    client_certs: bool = False,
    unix: bool = False,
    password: str | None = None,
    extra: tuple[str, ...] = (),
) -> Server:
    """A started `redis-server`. `persist`: AOF, fsync always, so a kill and a restart
    keep every write (as the shipped compose file runs it)."""
    port = cluster_port() if "--cluster-enabled" in extra else free_port()
    args = ["--bind", "127.0.0.1", "--save", "", "--dir", str(workdir)]
    args += (
        ["--appendonly", "yes", "--appendfsync", "always"] if persist else ["--appendonly", "no"]
    )
    socket_path = None
    if tls is not None:
        args += ["--port", "0", "--tls-port", str(port), "--tls-cert-file", str(tls.cert)]
        args += ["--tls-key-file", str(tls.key), "--tls-ca-cert-file", str(tls.ca)]
        args += ["--tls-auth-clients", "yes" if client_certs else "no"]
    else:
        args += ["--port", str(port)]
    if unix:
        socket_path = workdir / "redis.sock"
        args += ["--unixsocket", str(socket_path), "--unixsocketperm", "700"]
    if password:
        args += ["--requirepass", password]
    s = Server(workdir, [*args, *extra], port, tls=tls, unix_socket=socket_path, password=password)
    return s.start()


@contextlib.contextmanager
def running(make: Callable[[], Server]) -> Iterator[Server]:
    s = make()
    try:
        yield s
    finally:
        s.kill()


@dataclass
class SentinelSetup:
    """A master, its replica, and Sentinels watching them as `service`."""

    master: Server
    replica: Server
    sentinels: list[Server] = field(default_factory=list)
    service: str = "tokengate-master"

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{self.service}/0"

    def master_port(self) -> int:
        out = cli(self.sentinels[0].port, "SENTINEL", "get-master-addr-by-name", self.service)
        return int(out.split()[1])

    def failover(self) -> None:
        """Promote the replica (as Sentinel does when the master fails), wait until done."""
        before = self.master_port()
        cli(self.sentinels[0].port, "SENTINEL", "FAILOVER", self.service)
        wait_for(lambda: self.master_port() != before, "failover")
        promoted = self.master_port()
        wait_for(lambda: "role:master" in cli(promoted, "INFO", "replication"), "promoted master")

    def stop(self) -> None:
        for s in [*self.sentinels, self.replica, self.master]:
            s.kill()


@contextlib.contextmanager
def sentinel_setup(workdir: Path, sentinels: int = 2) -> Iterator[SentinelSetup]:
    master = server(workdir / "master")
    replica = server(workdir / "replica", extra=("--replicaof", "127.0.0.1", str(master.port)))
    setup = SentinelSetup(master, replica)
    try:
        wait_for(
            lambda: "master_link_status:up" in replica.cli("INFO", "replication"), "replication"
        )
        for i in range(sentinels):
            folder = workdir / f"sentinel{i}"
            folder.mkdir(parents=True)
            port = free_port()
            conf = folder / "sentinel.conf"
            conf.write_text(
                f"port {port}\nbind 127.0.0.1\ndir {folder}\n"
                f"sentinel monitor {setup.service} 127.0.0.1 {master.port} 1\n"
                f"sentinel down-after-milliseconds {setup.service} 1000\n"
                f"sentinel failover-timeout {setup.service} 5000\n"
            )
            sentinel = Server(folder, [str(conf)], port, exe="redis-sentinel")
            setup.sentinels.append(sentinel.start())
        wait_for(lambda: setup.master_port() == master.port, "sentinel sees the master")
        yield setup
    finally:
        setup.stop()


@dataclass
class Cluster:
    nodes: list[Server]

    @property
    def url(self) -> str:
        return "redis+cluster://" + ",".join(f"127.0.0.1:{n.port}" for n in self.nodes)

    def slot_owner(self, key: str) -> int:
        """The port of the master holding `key`'s slot."""
        slot = cli(self.nodes[0].port, "CLUSTER", "KEYSLOT", key)
        for line in cli(self.nodes[0].port, "CLUSTER", "NODES").splitlines():
            fields = line.split()
            for span in fields[8:]:
                low, _, high = span.partition("-")
                if low.isdigit() and int(low) <= int(slot) <= int(high or low):
                    return int(fields[1].split(":")[1].split("@")[0])
        raise LookupError(key)


@contextlib.contextmanager
def cluster(workdir: Path, masters: int = 3) -> Iterator[Cluster]:
    """Three masters, no replicas, every slot covered (`redis-cli --cluster create`)."""
    nodes = [
        server(
            workdir / f"node{i}",
            extra=("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf"),
        )
        for i in range(masters)
    ]
    try:
        addresses = [f"127.0.0.1:{n.port}" for n in nodes]
        create = ("--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes")
        cli(nodes[0].port, *create)
        for n in nodes:

            def ok(n: Server = n) -> bool:
                return "cluster_state:ok" in n.cli("CLUSTER", "INFO")

            wait_for(ok, "cluster ok")
        yield Cluster(nodes)
    finally:
        for n in nodes:
            n.kill()


async def sharing(store: SharedStore) -> SharedStore:
    """`store` started and sharing its limits through Redis. On a loaded machine the first
    connect may miss `redis.connect_timeout_ms`; the store then rightly fails open, and a
    gateway's once-a-second housekeeping reconnects it: do what that does until it shares
    (a bound on a hang, not on the machine's speed)."""
    await store.start()
    async with asyncio.timeout(PATIENCE):
        while not store.engine.usable:
            await asyncio.sleep(0.1)
            await store.engine.housekeeping()
    return store
