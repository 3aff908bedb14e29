"""Real Apache Kafka brokers (KRaft, no ZooKeeper) for tests, from Maven Central's jars.

    from tests.infra.kafka import kafka_broker, kafka_cluster

    with kafka_broker() as kafka:            # one broker+controller
        produce_to(kafka.bootstrap)          # "127.0.0.1:PORT"

    with kafka_cluster(3) as kafka:          # 3 combined broker+controllers, 3-voter quorum
        kafka.kill(2)                        # kill -9 node 2; kafka.restart(2) brings it back

The jars (``org.apache.kafka:kafka_2.13`` and its runtime dependencies, about 45 MB) are
fetched once with Maven from ``tests/infra/kafka-pom.xml`` into ``ASSAYWATCH_KAFKA_LIB``
(default ``~/.cache/assaywatch/kafka-<version>``) and reused. Each node gets free loopback
ports, a temporary log dir, its storage formatted with ``kafka.tools.StorageTool`` and a
Log4j 2 config that writes ``server.log`` in its folder, nothing on the terminal. Every wait
is bounded; every process is killed when the ``with`` block ends.

Readiness is checked with the Kafka protocol itself (a Metadata request, written here in a
few lines so that this module needs only the standard library): a node is ready when it
answers and lists every broker of the cluster as alive.

Command line (for CI and by hand): ``python -m tests.infra.kafka fetch`` fetches the jars;
``python -m tests.infra.kafka run [--nodes 3]`` starts brokers and prints the bootstrap
address until interrupted.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import fcntl
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

#: Newest 4.x that Maven Central served when this was written (2026-12).
KAFKA_VERSION = "4.4.0"
HERE = Path(__file__).resolve().parent
POM = HERE / "kafka-pom.xml"
MARKER = ".assaywatch-kafka-lib"
HOST = "127.0.0.1"

FETCH_TIMEOUT_S = 900.0
FORMAT_TIMEOUT_S = 120.0
START_TIMEOUT_S = 120.0
STOP_TIMEOUT_S = 15.0

DEFAULT_JVM_OPTS = ("-Xms128m", "-Xmx512m", "-XX:+UseG1GC", "-XX:MaxGCPauseMillis=20",
                    "-Djava.awt.headless=true")

LOG4J2 = """\
status = error
name = assaywatch-test-kafka
appender.file.type = File
appender.file.name = FILE
appender.file.fileName = {log}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = FILE
logger.kafka.name = kafka
logger.kafka.level = {level}
logger.apache.name = org.apache.kafka
logger.apache.level = {level}
logger.state.name = state.change.logger
logger.state.level = WARN
logger.request.name = kafka.request.logger
logger.request.level = WARN
"""


class KafkaError(RuntimeError):
    """The jars could not be fetched, or a node did not format, start or stop in time."""


# --------------------------------------------------------------------------------------
# jars


def kafka_lib_dir(version: str = KAFKA_VERSION) -> Path:
    """Where the jars are kept: ``$ASSAYWATCH_KAFKA_LIB`` or ``~/.cache/assaywatch/kafka-V``."""
    env = os.environ.get("ASSAYWATCH_KAFKA_LIB")
    if env:
        return Path(env).expanduser().resolve()
    return Path.home() / ".cache" / "assaywatch" / f"kafka-{version}"


def _lib_is_complete(lib: Path, version: str) -> bool:
    marker = lib / MARKER
    return marker.is_file() and marker.read_text(encoding="utf-8").split()[:1] == [version]


def fetch_kafka(lib: Path | None = None, version: str = KAFKA_VERSION,
                timeout: float = FETCH_TIMEOUT_S) -> Path:
    """Return a folder holding the broker's jars, fetching them with Maven if needed.

    Safe to call from parallel test processes (a file lock serialises the fetch); the folder
    is filled under a temporary name and renamed, so a half-fetched folder is never used.
    """
    lib = (lib or kafka_lib_dir(version)).resolve()
    if _lib_is_complete(lib, version):
        return lib
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaError("Maven is needed to fetch Kafka's jars: apt-get install -y maven")
    lib.parent.mkdir(parents=True, exist_ok=True)
    with open(lib.parent / f".{lib.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _lib_is_complete(lib, version):
            return lib
        tmp = Path(tempfile.mkdtemp(prefix=f".{lib.name}.", dir=lib.parent))
        try:
            cmd = [mvn, "-B", "-q", "-f", str(POM), f"-Dkafka.version={version}",
                   "dependency:copy-dependencies", "-DincludeScope=runtime",
                   f"-DoutputDirectory={tmp}"]
            try:
                res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                                     stdin=subprocess.DEVNULL)
            except subprocess.TimeoutExpired as exc:
                raise KafkaError(f"fetching Kafka {version} took over {timeout:.0f}s") from exc
            jars = sorted(p.name for p in tmp.glob("*.jar"))
            if res.returncode != 0 or f"kafka_2.13-{version}.jar" not in jars:
                raise KafkaError(f"mvn failed ({res.returncode}) fetching Kafka {version}:\n"
                                 + (res.stdout + res.stderr)[-4000:])
            (tmp / MARKER).write_text(version + "\n" + "\n".join(jars) + "\n",
                                      encoding="utf-8")
            if lib.exists():
                shutil.rmtree(lib)
            os.replace(tmp, lib)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return lib


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        raise KafkaError("Kafka 4 needs Java 17 or newer: "
                         "apt-get install -y openjdk-17-jre-headless")
    return java


# --------------------------------------------------------------------------------------
# the Kafka protocol, just enough to ask a node which brokers are alive


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("connection closed")
        buf += chunk
    return buf


def alive_brokers(host: str, port: int, timeout: float = 2.0) -> list[int]:
    """Node ids of the brokers that ``host:port`` reports alive (Metadata v4, no topics).

    Raises OSError (or ConnectionError) while the node does not answer yet.
    """
    client_id = b"assaywatch-tests"
    # request header v1: api_key=3 (Metadata), api_version=4, correlation_id, client_id
    # body v4: topics = [] (none), allow_auto_topic_creation = false
    body = (struct.pack(">hhih", 3, 4, 7, len(client_id)) + client_id
            + struct.pack(">ib", 0, 0))
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        sock.sendall(struct.pack(">i", len(body)) + body)
        (size,) = struct.unpack(">i", _recv_exact(sock, 4))
        data = _recv_exact(sock, size)
    correlation_id, _throttle, count = struct.unpack_from(">iii", data, 0)
    if correlation_id != 7:
        raise ConnectionError("unexpected Metadata response")
    pos, nodes = 12, []
    for _ in range(count):
        (node_id,) = struct.unpack_from(">i", data, pos)
        (hlen,) = struct.unpack_from(">h", data, pos + 4)
        pos += 6 + hlen + 4  # host, port
        (rlen,) = struct.unpack_from(">h", data, pos)
        pos += 2 + max(rlen, 0)  # rack (nullable)
        nodes.append(node_id)
    return sorted(nodes)


def free_ports(n: int) -> list[int]:
    """``n`` distinct free TCP ports on 127.0.0.1 (held together while picked)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind((HOST, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


# --------------------------------------------------------------------------------------
# nodes and clusters


@dataclass
class KafkaNode:
    """One combined broker+controller process."""

    node_id: int
    port: int
    controller_port: int
    folder: Path
    proc: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def config(self) -> Path:
        return self.folder / "server.properties"

    @property
    def server_log(self) -> Path:
        return self.folder / "server.log"

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        out = []
        for path in (self.folder / "stdout.log", self.server_log):
            if path.exists():
                text = path.read_text(encoding="utf-8", errors="replace").splitlines()
                out.append(f"--- {path}\n" + "\n".join(text[-lines:]))
        return "\n".join(out)


@dataclass
class KafkaCluster:
    """Running nodes; ``bootstrap`` lists every node (clients skip the dead ones)."""

    cluster_id: str
    nodes: list[KafkaNode]
    lib: Path
    workdir: Path
    jvm_opts: tuple[str, ...] = DEFAULT_JVM_OPTS
    log_level: str = "INFO"
    env: dict[str, str] = field(default_factory=dict)

    @property
    def bootstrap(self) -> str:
        return ",".join(n.address for n in self.nodes)

    def node(self, node_id: int) -> KafkaNode:
        return next(n for n in self.nodes if n.node_id == node_id)

    # --- processes -------------------------------------------------------------------

    def _cmd(self, node: KafkaNode, main: str, *args: str) -> list[str]:
        log4j = self.workdir / f"log4j2-{node.node_id}.properties"
        return [_java(), *self.jvm_opts, f"-Dlog4j2.configurationFile={log4j}",
                "-cp", f"{self.lib}/*", main, *args]

    def format(self, timeout: float = FORMAT_TIMEOUT_S) -> None:
        """Format every node's storage (in parallel: each is a JVM start)."""
        procs = []
        for node in self.nodes:
            cmd = self._cmd(node, "kafka.tools.StorageTool", "format", "-t", self.cluster_id,
                            "-c", str(node.config))
            out = open(node.folder / "format.log", "wb")
            procs.append((node, out, subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT,
                                                      stdin=subprocess.DEVNULL, env=self._env())))
        deadline = time.monotonic() + timeout
        failed = []
        for node, out, proc in procs:
            try:
                rc = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                rc = -9
            out.close()
            if rc != 0:
                failed.append(f"node {node.node_id} (rc={rc}):\n"
                              + (node.folder / "format.log").read_text(errors="replace")[-2000:])
        if failed:
            raise KafkaError("kafka storage format failed: " + "\n".join(failed))

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env.update(self.env)
        return env

    def start_node(self, node: KafkaNode) -> None:
        """Start (or restart) one node's process; does not wait for it."""
        if node.alive:
            return
        out = open(node.folder / "stdout.log", "ab")
        try:
            node.proc = subprocess.Popen(self._cmd(node, "kafka.Kafka", str(node.config)),
                                         stdout=out, stderr=subprocess.STDOUT,
                                         stdin=subprocess.DEVNULL, env=self._env(),
                                         start_new_session=True)
        finally:
            out.close()

    def wait_ready(self, timeout: float = START_TIMEOUT_S,
                   nodes: list[KafkaNode] | None = None) -> None:
        """Wait until every live node (or ``nodes``) reports all live nodes as brokers."""
        waiting = [n for n in (nodes or self.nodes) if n.alive]
        expected = sorted(n.node_id for n in self.nodes if n.alive)
        deadline = time.monotonic() + timeout
        last: object = None
        while waiting:
            for node in list(waiting):
                if not node.alive:
                    raise KafkaError(f"Kafka node {node.node_id} exited with "
                                     f"{node.proc.returncode if node.proc else None}\n"
                                     + node.log_tail())
                try:
                    last = alive_brokers(HOST, node.port)
                except (OSError, struct.error) as exc:
                    last = exc
                    continue
                if last == expected:
                    waiting.remove(node)
            if not waiting:
                return
            if time.monotonic() > deadline:
                raise KafkaError(f"Kafka nodes {[n.node_id for n in waiting]} not ready after "
                                 f"{timeout:.0f}s (last answer: {last!r})\n"
                                 + "\n".join(n.log_tail() for n in waiting))
            time.sleep(0.25)

    def kill(self, node_id: int, sig: int = signal.SIGKILL) -> None:
        """Send ``sig`` (default SIGKILL: kill -9) to one node and reap it."""
        node = self.node(node_id)
        if node.proc is None or node.proc.poll() is not None:
            return
        node.proc.send_signal(sig)
        try:
            node.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            node.proc.kill()
            node.proc.wait(timeout=STOP_TIMEOUT_S)

    def restart(self, node_id: int, timeout: float = START_TIMEOUT_S) -> None:
        """Start a killed node again on the same ports and data, and wait for it."""
        node = self.node(node_id)
        self.start_node(node)
        self.wait_ready(timeout)

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM every live node, then SIGKILL what is left after ``timeout``."""
        live = [n for n in self.nodes if n.alive]
        for node in live:
            assert node.proc is not None
            with contextlib.suppress(ProcessLookupError):
                node.proc.terminate()
        deadline = time.monotonic() + timeout
        for node in live:
            assert node.proc is not None
            try:
                node.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                node.proc.kill()
                node.proc.wait(timeout=STOP_TIMEOUT_S)


def _properties(node: KafkaNode, voters: str, n_nodes: int, data_dir: Path,
                overrides: Mapping[str, object]) -> str:
    rf = min(3, n_nodes)
    isr = min(2, n_nodes)
    props: dict[str, object] = {
        "process.roles": "broker,controller",
        "node.id": node.node_id,
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://{HOST}:{node.port},CONTROLLER://{HOST}:{node.controller_port}",
        "advertised.listeners": f"PLAINTEXT://{HOST}:{node.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
        "log.dirs": data_dir,
        "num.partitions": 1,
        "default.replication.factor": 1,
        "offsets.topic.replication.factor": rf,
        "offsets.topic.num.partitions": 5,
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": isr,
        "transaction.state.log.num.partitions": 5,
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": isr,
        "group.initial.rebalance.delay.ms": 0,
        # fence a killed broker after 3 s instead of 9 s, so failover tests are quick
        "broker.heartbeat.interval.ms": 500,
        "broker.session.timeout.ms": 3000,
        "auto.create.topics.enable": "true",
        "num.network.threads": 2,
        "num.io.threads": 4,
        "log.segment.bytes": 64 * 1024 * 1024,
    }
    props.update(overrides)
    return "".join(f"{k}={v}\n" for k, v in props.items())


def _cluster_id() -> str:
    """A random Kafka cluster id (a UUID in 22 characters of URL-safe base64). One id in 64
    starts with '-', which the storage tool's argument parser takes for an option (it then
    fails with "expected one argument"): draw again until it does not."""
    while True:
        cid = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not cid.startswith("-"):
            return cid


@contextlib.contextmanager
def kafka_cluster(n_nodes: int = 3, *, overrides: Mapping[str, object] | None = None,
                  lib: Path | None = None, workdir: Path | None = None,
                  jvm_opts: tuple[str, ...] = DEFAULT_JVM_OPTS, log_level: str = "INFO",
                  start_timeout: float = START_TIMEOUT_S,
                  keep: bool | None = None) -> Iterator[KafkaCluster]:
    """``n_nodes`` combined broker+controllers with an ``n_nodes``-voter KRaft quorum.

    ``overrides`` are extra or replaced server.properties for every node. Internal topics
    get replication factor min(3, n) and min.insync.replicas min(2, n). The temporary
    folder (configs, data, ``server.log`` per node) is removed at the end unless ``keep``
    (default: env ``ASSAYWATCH_KAFKA_KEEP``) is set.
    """
    lib = fetch_kafka(lib)
    if keep is None:
        keep = bool(os.environ.get("ASSAYWATCH_KAFKA_KEEP"))
    own_dir = workdir is None
    root = Path(tempfile.mkdtemp(prefix="assaywatch-kafka-")) if own_dir else Path(workdir)
    ports = free_ports(2 * n_nodes)
    nodes = [KafkaNode(node_id=i + 1, port=ports[2 * i], controller_port=ports[2 * i + 1],
                       folder=root / f"node{i + 1}") for i in range(n_nodes)]
    voters = ",".join(f"{n.node_id}@{HOST}:{n.controller_port}" for n in nodes)
    cluster = KafkaCluster(cluster_id=_cluster_id(), nodes=nodes, lib=lib, workdir=root,
                           jvm_opts=tuple(jvm_opts), log_level=log_level)
    try:
        for node in nodes:
            node.folder.mkdir(parents=True, exist_ok=True)
            node.config.write_text(_properties(node, voters, n_nodes, node.folder / "data",
                                               overrides or {}), encoding="utf-8")
            (root / f"log4j2-{node.node_id}.properties").write_text(
                LOG4J2.format(log=node.server_log, level=log_level), encoding="utf-8")
        cluster.format()
        for node in nodes:
            cluster.start_node(node)
        cluster.wait_ready(start_timeout)
        yield cluster
    finally:
        cluster.stop()
        if keep:
            print(f"kept Kafka folder {root}", file=sys.stderr)
        elif own_dir:
            shutil.rmtree(root, ignore_errors=True)


@contextlib.contextmanager
def kafka_broker(**kwargs: object) -> Iterator[KafkaCluster]:
    """One broker+controller on 127.0.0.1; ``.bootstrap`` is its address."""
    with kafka_cluster(1, **kwargs) as cluster:  # type: ignore[arg-type]
        yield cluster


# --------------------------------------------------------------------------------------
# command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.infra.kafka", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("fetch", help="fetch the jars into ASSAYWATCH_KAFKA_LIB (or the default)")
    run = sub.add_parser("run", help="start nodes, print the bootstrap address, wait")
    run.add_argument("--nodes", type=int, default=1)
    run.add_argument("--seconds", type=float, default=3600.0, help="stop after this long")
    args = parser.parse_args(argv)
    if args.command == "fetch":
        start = time.monotonic()
        lib = fetch_kafka()
        jars = list(lib.glob("*.jar"))
        size = sum(p.stat().st_size for p in jars)
        print(f"{lib}: {len(jars)} jars, {size / 2**20:.1f} MiB "
              f"({time.monotonic() - start:.1f}s)")
        return 0
    start = time.monotonic()
    with kafka_cluster(args.nodes) as cluster:
        print(f"bootstrap={cluster.bootstrap} cluster_id={cluster.cluster_id} "
              f"dir={cluster.workdir} (ready in {time.monotonic() - start:.1f}s)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            time.sleep(args.seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main())
