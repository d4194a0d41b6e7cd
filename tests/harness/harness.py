#!/usr/bin/env python3
"""Narad fault harness: seeded faults, a history, and a checker that can fail (issue 32).

Each round starts N fresh `narad serve` processes (on loopback, or each in its own network
namespace), runs a workload (producers, consumers that ack, nack or let leases lapse, pinned
consumers, topic churn) while one seeded schedule injects faults (kill -9 and restart,
SIGSTOP/SIGCONT, a kill during start-up, a full data disk, and with N > 1 as root network
partitions: each node in its own network namespace, nftables cuts between them), then heals
every node, drains every topic and checks the recorded history: nothing answered 202 may be
missing, nothing may be delivered that was never produced, no two messages may share an offset,
and every acknowledged topic change must be visible on every node.

`random.Random(seed)` decides the whole fault schedule of a round (kinds, nodes, order, planned
times, durations) and the workload's choices, so the same seed replays the same schedule;
timings on a loaded machine still vary. Round r of a run uses seed `--seed + r`, so a failing
round replays alone with `--seed <its seed> --rounds 1`.

Standard library only (Python 3.11). Every loop is bounded in count and time, and the harness
stops every process it started: a try/finally, an atexit hook, handlers for SIGTERM, SIGINT and
SIGHUP, and (when util-linux `setpriv` has it) a parent-death signal on every node, so a
harness killed with -9 does not leave nodes behind.

Exit codes: 0 every round passed; 1 the checker found a violation; 2 the harness could not run
a round (a node that would not start, bad arguments).
"""

from __future__ import annotations

import argparse
import atexit
import collections
import http.client
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

# --- Bounds ----------------------------------------------------------------------------------
ROUNDS_MAX = 1000
NODES_MAX = 9
DURATION_S_MAX = 3600.0
FAULTS_PER_ROUND_MAX = 40
OPS_PER_WORKER_MAX = 100_000
# Longest a node may take from spawn to /readyz 200.
READY_WAIT_S = 60.0
# Per-request socket timeout (a paused node holds requests this long at most).
REQUEST_TIMEOUT_S = 10.0
# Lease length of the harness's topics: short, so lapsed leases come back within a round.
VISIBILITY_MS = 3000
# Drain: stop once nothing was delivered for this long (longer than a lease, so leases taken
# and dropped by the workload have come back), or after DRAIN_S_MAX.
DRAIN_QUIET_S = VISIBILITY_MS / 1000 + 3.0
DRAIN_S_MAX = 120.0
DRAIN_REQUESTS_MAX = 20_000
# How long the workers together may take to notice the stop (a request timeout plus slack).
JOIN_S_MAX = REQUEST_TIMEOUT_S + 15.0
# Messages per batch produce and per batch consume in the workload.
BATCH_PRODUCE_MAX = 20
BATCH_CONSUME_MAX = 20
# Topic churn works over this many scratch names (so creates meet existing names too).
SCRATCH_TOPICS = 5
# Disk-full fault: each node's data directory is a tmpfs of this size (a fresh broker
# preallocates WAL segments, see tests/disk_full.rs), filled with a ballast file at most this big.
TMPFS_BYTES = 512 << 20
BALLAST_BYTES_MAX = 600 << 20
# An ack answered this long before a crash must have been durable: its settle record rides the
# next group commit (ARCHITECTURE.md "Consumption"; tests/disk_full.rs uses the same bound).
ACK_DURABLE_S = 1.5
# Entries of each list kept in the JSON report, and printed under a round's table line.
REPORT_LIST_MAX = 100
PRINT_LIST_MAX = 5

# Netns mode (N > 1, root): every node in its own network namespace, a veth pair per node to a
# bridge in the root namespace, addresses from 10.77.X.0/24 (X picked free per run). Every name
# the harness makes carries NETNS_PREFIX and its pid (`narh<pid>b` bridge, `narh<pid>v<k>` veth,
# `narh-<pid>-n<k>` namespace), so leftovers of a killed run are found and removed at start.
NETNS_PREFIX = "narh"
NETNS_NET = "10.77"
NFT_TABLE = "narad_harness"
# Network commands (ip, nft) and installing nftables are bounded.
NET_CMD_TIMEOUT_S = 20.0
APT_TIMEOUT_S = 180.0
# Default length of a one-node cut (--partition-s); splits and one-way drops hold half to three
# quarters of it. The issue's long mode: 30 s.
PARTITION_S_DEFAULT = 30.0
PARTITION_SHAPES = ["isolate", "split", "oneway"]
# During a cut, /readyz of every node is probed this often (the history shows who said ready).
READYZ_PROBE_S = 1.0

MAIN_TOPICS = ["h-orders", "h-events"]
# A replica child of the first main topic, created with it: every message accepted for the
# parent must reach it too (fan-out), and its consumers ack like any others. Never produced to.
CHILD_TOPIC = "h-orders-copy"
CHILD_PARENT = "h-orders"
MAIN_PARTITIONS = 3
FAULT_KINDS = ["kill", "pause", "startkill", "diskfull", "partition"]
CRASH_FAULTS = {"kill", "startkill"}


# Scale rounds (--scale): how long a decommission request is retried (no leader during a fault),
# and how long, after healing, the joiner may take to leave the member list.
DECOMMISSION_ASK_S = 10.0
SCALE_SETTLE_S = 90.0


def now_mono() -> float:
    return time.monotonic()


# --- Processes -------------------------------------------------------------------------------


def free_port_pair(rng: random.Random) -> int:
    """Two consecutive free loopback ports (API, cluster) below the ephemeral range."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            eph_low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        eph_low = 32768
    low = 10_000
    for _ in range(400):
        p = rng.randrange(low, max(low + 2, eph_low - 2), 2)
        socks = []
        try:
            for q in (p, p + 1):
                s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                socks.append(s)
                s.bind(("127.0.0.1", q))
            return p
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free loopback port pair")


def has_pdeathsig() -> bool:
    exe = shutil.which("setpriv")
    if not exe:
        return False
    try:
        out = subprocess.run([exe, "--help"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return False
    return "pdeathsig" in out.stdout + out.stderr


def _run(argv: list[str], stdin: str | None = None, check: bool = True,
         timeout: float = NET_CMD_TIMEOUT_S) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
    if check and r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {r.stderr.strip() or r.stdout.strip()}")
    return r


_NFT_TRIED: list[str | None] = []


def ensure_nft() -> str | None:
    """None when `nft` runs, else why not. Installs Debian's `nftables` (once, bounded) when the
    command is missing."""
    if shutil.which("nft"):
        return None
    if _NFT_TRIED:
        return _NFT_TRIED[0]
    why = None
    if not shutil.which("apt-get"):
        why = "nft (nftables) is not installed and there is no apt-get"
    else:
        print("harness: nft missing, installing nftables (apt-get, bounded)", flush=True)
        try:
            r = subprocess.run(["apt-get", "install", "-y", "nftables"], capture_output=True, text=True,
                               timeout=APT_TIMEOUT_S, env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"})
            if r.returncode != 0 or not shutil.which("nft"):
                why = f"apt-get install nftables failed: {(r.stderr or r.stdout).strip()[-200:]}"
        except (OSError, subprocess.SubprocessError) as e:
            why = f"apt-get install nftables failed: {e}"
    _NFT_TRIED.append(why)
    return why


def netns_unavailable() -> str | None:
    """Why nodes cannot run in network namespaces here, or None."""
    if os.geteuid() != 0:
        return "network namespaces and nftables need root"
    if not shutil.which("ip"):
        return "ip (iproute2) is not installed"
    why = ensure_nft()
    if why:
        return why
    probe = f"{NETNS_PREFIX}-{os.getpid()}-probe"
    try:
        _run(["ip", "netns", "add", probe])
        _run(["ip", "netns", "del", probe])
    except (RuntimeError, OSError, subprocess.SubprocessError) as e:
        return f"ip netns does not work here: {e}"
    return None


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def clean_leftovers() -> list[str]:
    """Deletes namespaces, veths and bridges a harness run left behind (its pid is gone).
    Returns what it removed."""
    import re
    removed = []
    me = os.getpid()
    try:
        out = _run(["ip", "netns", "list"], check=False).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        name = line.split()[0] if line.split() else ""
        m = re.fullmatch(rf"{NETNS_PREFIX}-(\d+)-\w+", name)
        if m and int(m.group(1)) != me and not _pid_alive(int(m.group(1))):
            _run(["ip", "netns", "del", name], check=False)
            removed.append(name)
    try:
        out = _run(["ip", "-o", "link", "show"], check=False).stdout
    except (OSError, subprocess.SubprocessError):
        out = ""
    for line in out.splitlines():
        parts = line.split(":")
        if len(parts) < 2:
            continue
        name = parts[1].strip().split("@")[0]
        m = re.fullmatch(rf"{NETNS_PREFIX}(\d+)(b|v\d+)", name)
        if m and int(m.group(1)) != me and not _pid_alive(int(m.group(1))):
            _run(["ip", "link", "del", name], check=False)
            removed.append(name)
    return removed


class Netns:
    """One round's network: a bridge in the root namespace (the harness's side, address .254)
    and, per node, a namespace with a veth pair to the bridge (node k at .k+1). Cuts are an
    nftables table in the nodes' namespaces; `heal` deletes them, `teardown` deletes every
    namespace, veth and the bridge."""

    def __init__(self, n: int, tag: str):
        self.pid = os.getpid()
        self.bridge = f"{NETNS_PREFIX}{self.pid}b"
        self.ns = [f"{NETNS_PREFIX}-{self.pid}-{tag}n{k + 1}" for k in range(n)]
        self.veth = [f"{NETNS_PREFIX}{self.pid}v{k + 1}" for k in range(n)]
        self.made_ns: list[str] = []
        self.made_links: list[str] = []
        self.net = self._free_net()
        self.addrs = [f"{self.net}.{k + 1}" for k in range(n)]
        self.host_addr = f"{self.net}.254"
        # Namespaces that have a cut table now.
        self.cut: set[int] = set()

    @staticmethod
    def _free_net() -> str:
        used = _run(["ip", "-4", "-o", "addr", "show"], check=False).stdout
        start = os.getpid() % 250
        for i in range(250):
            x = (start + i) % 250
            if f" {NETNS_NET}.{x}." not in used:
                return f"{NETNS_NET}.{x}"
        raise RuntimeError(f"no free {NETNS_NET}.X.0/24")

    def build(self) -> None:
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        self.made_links.append(self.bridge)
        _run(["ip", "addr", "add", f"{self.host_addr}/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        for k, ns in enumerate(self.ns):
            _run(["ip", "netns", "add", ns])
            self.made_ns.append(ns)
            _run(["ip", "link", "add", self.veth[k], "type", "veth", "peer", "name", "eth0", "netns", ns])
            self.made_links.append(self.veth[k])
            _run(["ip", "link", "set", self.veth[k], "master", self.bridge])
            _run(["ip", "link", "set", self.veth[k], "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self.addrs[k]}/24", "dev", "eth0"])
            _run(["ip", "-n", ns, "link", "set", "eth0", "up"])

    def drop(self, k: int, saddrs: list[str], daddrs: list[str]) -> None:
        """In node k's namespace: drop packets arriving from `saddrs` and leaving to `daddrs`."""
        rules = [f"table inet {NFT_TABLE} {{"]
        rules.append("  chain input { type filter hook input priority -10; policy accept;")
        if saddrs:
            rules.append(f"    ip saddr {{ {', '.join(saddrs)} }} drop")
        rules.append("  }")
        rules.append("  chain output { type filter hook output priority -10; policy accept;")
        if daddrs:
            rules.append(f"    ip daddr {{ {', '.join(daddrs)} }} drop")
        rules.append("  }")
        rules.append("}")
        _run(["ip", "netns", "exec", self.ns[k], "nft", "-f", "-"], stdin="\n".join(rules) + "\n")
        self.cut.add(k)

    def heal(self) -> None:
        """Deletes every cut table (each namespace, not only the ones it knows: a failure halfway
        through a cut must not leave a rule behind)."""
        for k, ns in enumerate(self.ns):
            if ns in self.made_ns:
                _run(["ip", "netns", "exec", ns, "nft", "delete", "table", "inet", NFT_TABLE], check=False)
        self.cut.clear()

    def teardown(self) -> None:
        for ns in list(self.made_ns):
            _run(["ip", "netns", "del", ns], check=False)
            self.made_ns.remove(ns)
        for link in list(self.made_links):
            # A veth goes with its namespace; the bridge (and any veth still here) goes now.
            if os.path.exists(f"/sys/class/net/{link}"):
                _run(["ip", "link", "del", link], check=False)
            self.made_links.remove(link)


class Node:
    def __init__(self, index: int, root: str, port: int):
        self.index = index
        self.id = f"n{index + 1}"
        self.dir = os.path.join(root, f"node-{index + 1}")
        self.data_dir = os.path.join(self.dir, "data")
        self.log_path = os.path.join(root, f"node-{index + 1}.log")
        self.port = port
        self.cluster_port = port + 1
        # The address it listens on: loopback, or its namespace's address in netns mode.
        self.host = "127.0.0.1"
        self.netns: str | None = None
        self.proc: subprocess.Popen | None = None
        self.paused = False
        # Bumped on every spawn: clients reconnect when it changed.
        self.generation = 0
        self.tmpfs = False
        self.ballast: str | None = None
        # Set when the harness killed the process, so an exit of its own is told apart.
        self.killed = False
        self.exit_seen = False
        # A decommission of it was accepted (--scale): it stays up but never ready again.
        self.decommissioned = False

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


def last_line(path: str) -> str:
    """The last line a node wrote (its reason, when it stops at start-up), and where to look."""
    try:
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - 4096))
            lines = [x for x in f.read().decode("utf-8", "replace").splitlines() if x.strip()]
    except OSError:
        lines = []
    return f"{lines[-1][:300] if lines else '(no output)'} (log {path})"


class Cluster:
    """The N nodes of one round. Only the main thread spawns (the parent-death signal is tied to
    the thread that forked)."""

    def __init__(self, binary: str, root: str, n: int, port_rng: random.Random, use_tmpfs: bool,
                 netns: Netns | None = None, joiners: int = 0):
        self.binary = binary
        # The last `joiners` nodes are outside the peer list: they join the running cluster
        # (--scale) and are not started with the others.
        self.joiners = joiners
        # Nodes the workload may send requests to: 0..active-1 (the peers, plus a joiner from
        # its join until its decommission starts).
        self.active = n - joiners
        self.net = netns
        self.root = root
        self.secret = "harness-cluster-secret-" + str(port_rng.randrange(1 << 30))
        # NARAD_TEST_DEAD_AFTER_MS for every node (0: the broker's default); set by main.
        self.dead_after_ms = 0
        self.pdeathsig = has_pdeathsig()
        self.nodes: list[Node] = []
        for i in range(n):
            self.nodes.append(Node(i, root, free_port_pair(port_rng)))
            if netns is not None:
                self.nodes[i].host = netns.addrs[i]
                self.nodes[i].netns = netns.ns[i]
        self.tmpfs_reason = None
        # Why nodes share loopback when they could be cut off (None in netns mode).
        self.netns_reason: str | None = None
        for node in self.nodes:
            os.makedirs(node.dir, exist_ok=True)
        if use_tmpfs:
            self.tmpfs_reason = self._mount_tmpfs()
        for node in self.nodes:
            os.makedirs(node.data_dir, exist_ok=True)

    def _mount_tmpfs(self) -> str | None:
        if os.geteuid() != 0:
            return "not root: cannot mount a tmpfs per node for the disk-full fault"
        if not shutil.which("mount"):
            return "no mount(8)"
        for node in self.nodes:
            r = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES}", "tmpfs", node.dir],
                capture_output=True,
                text=True,
                timeout=30,
            )
            if r.returncode != 0:
                return f"mount tmpfs at {node.dir} failed: {r.stderr.strip()}"
            node.tmpfs = True
        return None

    def node_command(self, node: Node) -> tuple[list[str], dict[str, str]]:
        """How a node starts: the one place that builds a node's command (in netns mode wrapped in
        `ip netns exec <its namespace>`, listening on the namespace's address).

        Security is off (no credentials in the harness), 2 shards so single produces cross
        shards through transit. With N > 1 the cluster variables are set as README.md's 3-node
        example sets them (every member in the peer list, one secret).
        """
        argv = [
            self.binary,
            "serve",
            "--addr",
            f"{node.host}:{node.port}",
            "--data-dir",
            node.data_dir,
        ]
        if self.pdeathsig:
            argv = ["setpriv", "--pdeathsig", "KILL", "--"] + argv
        if node.netns:
            # `ip netns exec` and setpriv exec in place: the pid stays the broker's.
            argv = ["ip", "netns", "exec", node.netns] + argv
        env = dict(os.environ)
        env.update(
            {
                "NARAD_SECURITY_ENABLED": "false",
                "NARAD_SHARDS": env.get("NARAD_SHARDS", "2"),
                "NARAD_LOG_LEVEL": env.get("NARAD_LOG_LEVEL", "warn"),
                "NARAD_NODE_ID": node.id,
                "NARAD_CLUSTER_ADDR": f"{node.host}:{node.cluster_port}",
            }
        )
        if len(self.nodes) > 1:
            peers = self.nodes[: len(self.nodes) - self.joiners]
            env["NARAD_CLUSTER_PEERS"] = ",".join(
                f"{m.id}@{m.host}:{m.cluster_port}" for m in peers
            )
            if node not in peers:
                env["NARAD_CLUSTER_ADVERTISE_ADDR"] = f"{node.host}:{node.cluster_port}"
            if self.joiners:
                # Scale rounds: a leader plans moves (and promotes the joiner) 2 s after its
                # election instead of 12 s, so that a 20 s round sees moves and a decommission.
                env["NARAD_TEST_PROMOTE_AFTER_MS"] = "2000"
            env["NARAD_CLUSTER_SECRET"] = self.secret
            if self.dead_after_ms:
                # Members are marked dead this long after their last heartbeat (the broker's
                # own default is 30 s): pauses and cuts longer than it reroute at once.
                env["NARAD_TEST_DEAD_AFTER_MS"] = str(self.dead_after_ms)
            if self.net is not None:
                # A plaintext cluster port off loopback: refused with security on
                # (config.rs validate_cluster); said explicitly so it stays allowed if the
                # harness ever turns security on.
                env["NARAD_SECURITY_ALLOW_PLAINTEXT_RAFT"] = "true"
        return argv, env

    def spawn(self, node: Node) -> None:
        assert threading.current_thread() is threading.main_thread()
        assert not node.alive()
        argv, env = self.node_command(node)
        with open(node.log_path, "ab") as log:
            log.write(f"--- spawn generation {node.generation + 1} at {time.time():.3f}\n".encode())
            log.flush()
            node.proc = subprocess.Popen(
                argv,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        node.paused = False
        node.killed = False
        node.exit_seen = False
        node.generation += 1

    def wait_ready(self, node: Node, limit_s: float = READY_WAIT_S) -> str | None:
        """None once /readyz answers 200, else why not."""
        deadline = now_mono() + limit_s
        while now_mono() < deadline:
            if not node.alive():
                code = node.proc.returncode if node.proc else None
                return f"{node.id} exited during start-up (status {code}): {last_line(node.log_path)}"
            try:
                c = http.client.HTTPConnection(node.host, node.port, timeout=2)
                c.request("GET", "/readyz")
                r = c.getresponse()
                r.read()
                c.close()
                if r.status == 200:
                    return None
            except (OSError, http.client.HTTPException):
                pass
            time.sleep(0.05)
        return f"{node.id} not ready after {limit_s:.0f}s"

    def kill9(self, node: Node) -> None:
        if node.proc is None:
            return
        if node.proc.poll() is None:
            node.killed = True
            try:
                os.kill(node.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            node.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        node.paused = False

    def stop(self, node: Node) -> None:
        if node.alive() and node.paused:
            try:
                os.kill(node.proc.pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
        self.kill9(node)

    def stop_all(self) -> None:
        try:
            for node in self.nodes:
                self.stop(node)
                self.remove_ballast(node)
                if node.tmpfs:
                    subprocess.run(["umount", "--lazy", node.dir], capture_output=True, timeout=30)
                    node.tmpfs = False
        finally:
            # The namespaces go even when stopping a node failed (their processes die with the
            # harness by the parent-death signal; a namespace outlives only a bind mount).
            if self.net is not None:
                self.net.heal()
                self.net.teardown()

    def remove_ballast(self, node: Node) -> None:
        if node.ballast:
            try:
                os.unlink(node.ballast)
            except OSError:
                pass
            node.ballast = None


# Every cluster alive in this process, for the exit hooks.
_LIVE: list[Cluster] = []


def _cleanup() -> None:
    for c in list(_LIVE):
        try:
            c.stop_all()
        except Exception as e:  # noqa: BLE001 - a cleanup must go on with the other nodes
            print(f"harness: cleanup error: {e}", file=sys.stderr)
        _LIVE.remove(c)


class Interrupted(Exception):
    pass


def _on_signal(signum, _frame):
    raise Interrupted(signal.Signals(signum).name)


# --- History ---------------------------------------------------------------------------------


class History:
    """The JSON-lines record of one round: every request with its answer or failure, every
    fault, every phase. Times are monotonic seconds since the round began."""

    def __init__(self, path: str):
        self.t_base = now_mono()
        self.path = path
        self.f = open(path, "w")
        self.lock = threading.Lock()
        self.events: list[dict] = []
        self.phase = "workload"

    def t(self) -> float:
        return round(now_mono() - self.t_base, 4)

    def add(self, ev: dict) -> None:
        ev.setdefault("phase", self.phase)
        with self.lock:
            self.events.append(ev)
            self.f.write(json.dumps(ev, separators=(",", ":")) + "\n")

    def close(self) -> None:
        with self.lock:
            self.f.close()


class Client:
    """One worker's keep-alive connections, one per node, reopened after a node restarts."""

    def __init__(self, cluster: Cluster):
        self.cluster = cluster
        self.conns: dict[int, tuple[int, http.client.HTTPConnection]] = {}

    def drop(self, i: int) -> None:
        c = self.conns.pop(i, None)
        if c:
            c[1].close()

    def call(self, i: int, method: str, path: str, body: bytes | None = None,
             headers: dict | None = None, timeout: float = REQUEST_TIMEOUT_S):
        """(status or None, body bytes, error or None)."""
        node = self.cluster.nodes[i]
        cur = self.conns.get(i)
        if cur is None or cur[0] != node.generation:
            self.drop(i)
            cur = (node.generation, http.client.HTTPConnection(node.host, node.port, timeout=timeout))
            self.conns[i] = cur
        conn = cur[1]
        conn.timeout = timeout
        if conn.sock is not None:
            conn.sock.settimeout(timeout)
        h = {"X-Narad-Client": "narad-harness"}
        if body is not None:
            h["Content-Type"] = "application/json"
        h.update(headers or {})
        try:
            conn.request(method, path, body=body, headers=h)
            r = conn.getresponse()
            data = r.read()
            if r.getheader("Connection", "").lower() == "close":
                self.drop(i)
            return r.status, data, None
        except socket.timeout:
            self.drop(i)
            return None, b"", "timeout"
        except ConnectionRefusedError:
            self.drop(i)
            return None, b"", "refused"
        except (OSError, http.client.HTTPException) as e:
            self.drop(i)
            return None, b"", type(e).__name__


def parse_messages(status, data: bytes, batch: bool) -> list[dict]:
    """The delivered messages of a consume answer as {id, p, o, h}; id None when the payload is
    not one of the harness's messages."""
    if status != 200:
        return []
    try:
        doc = json.loads(data)
    except ValueError:
        return [{"id": None, "p": None, "o": None, "h": None, "raw": data[:200].decode("utf-8", "replace")}]
    msgs = doc.get("messages", []) if batch else [doc]
    out = []
    for m in msgs:
        pl = m.get("payload")
        mid = pl.get("id") if isinstance(pl, dict) else None
        d = {"id": mid, "p": m.get("partition"), "o": m.get("offset"), "h": m.get("receipt_handle")}
        if mid is None:
            d["raw"] = json.dumps(pl)[:200]
        out.append(d)
    return out


# --- Workload --------------------------------------------------------------------------------


class Ctx:
    def __init__(self, cluster: Cluster, hist: History, round_no: int, seed: int):
        self.cluster = cluster
        self.hist = hist
        self.round_no = round_no
        self.seed = seed
        self.stop = threading.Event()
        # Produced to: the main topics. Consumed from: those and the child.
        self.topics = list(MAIN_TOPICS)
        self.consumed = list(MAIN_TOPICS) + [CHILD_TOPIC]
        self.errors: list[str] = []

    def n(self) -> int:
        return self.cluster.active


def _record(ctx: Ctx, t0: float, node: int, op: str, topic: str, status, err,
            data: bytes = b"", **kw) -> dict:
    """Appends one request to the history; the answer's body is kept when it is an error."""
    ev = {"type": "op", "t0": t0, "t1": ctx.hist.t(), "node": node, "op": op, "topic": topic,
          "status": status, "error": err}
    ev.update(kw)
    if status is not None and status >= 300 and data:
        ev["body"] = data[:160].decode("utf-8", "replace").strip()
    ctx.hist.add(ev)
    return ev


def _pause_between(ctx: Ctx, rng: random.Random, lo: float, hi: float) -> None:
    ctx.stop.wait(rng.uniform(lo, hi))


def worker_producer(ctx: Ctx, k: int, batch: bool) -> None:
    """Single or batch produces to random nodes and topics; every message a unique id."""
    rng = random.Random(f"{ctx.seed}:producer:{k}:{batch}")
    cl = Client(ctx.cluster)
    seq = 0
    for _ in range(OPS_PER_WORKER_MAX):
        if ctx.stop.is_set():
            break
        if rng.random() < 0.02:
            cl.conns.clear()  # a new connection may land on another shard
        node = rng.randrange(ctx.n())
        topic = rng.choice(ctx.topics)
        t0 = ctx.hist.t()
        if batch:
            msgs, ids = [], []
            for _ in range(rng.randint(1, BATCH_PRODUCE_MAX)):
                mid = f"r{ctx.round_no}-b{k}-{seq}"
                seq += 1
                ids.append(mid)
                m = {"payload": {"id": mid, "pad": "x" * rng.randrange(64)}}
                roll = rng.random()
                if roll < 0.2:
                    m["partition"] = rng.randrange(MAIN_PARTITIONS)
                elif roll < 0.4:
                    m["key"] = f"k{rng.randrange(50)}"
                msgs.append(m)
            body = json.dumps({"messages": msgs}).encode()
            st, data, err = cl.call(node, "POST", f"/v1/topics/{topic}/produce/batch", body)
            _record(ctx, t0, node, "produce_batch", topic, st, err, data, ids=ids)
        else:
            mid = f"r{ctx.round_no}-s{k}-{seq}"
            seq += 1
            q = ""
            roll = rng.random()
            if roll < 0.2:
                q = f"?partition={rng.randrange(MAIN_PARTITIONS)}"
            elif roll < 0.4:
                q = f"?key=k{rng.randrange(50)}"
            body = json.dumps({"id": mid, "pad": "y" * rng.randrange(64)}).encode()
            st, data, err = cl.call(node, "POST", f"/v1/topics/{topic}/produce{q}", body)
            _record(ctx, t0, node, "produce", topic, st, err, data, ids=[mid])
        _pause_between(ctx, rng, 0.002, 0.02)


def consume_once(ctx: Ctx, cl: Client, node: int, topic: str, batch_max: int | None,
                 partition: int | None, wait: str, t_out: float = REQUEST_TIMEOUT_S + 2) -> list[dict]:
    q = [f"wait={wait}"]
    if batch_max:
        q.append(f"max={batch_max}")
    if partition is not None:
        q.append(f"partition={partition}")
    t0 = ctx.hist.t()
    st, data, err = cl.call(node, "GET", f"/v1/topics/{topic}/consume?" + "&".join(q), timeout=t_out)
    msgs = parse_messages(st, data, bool(batch_max))
    _record(ctx, t0, node, "consume", topic, st, err, data, msgs=msgs,
            partition=partition, max=batch_max)
    return msgs


def settle(ctx: Ctx, cl: Client, node: int, topic: str, msgs: list[dict], kind: str) -> None:
    """Acks (kind "ack") or nacks ("nack") the delivered messages: one request for one, a batch
    ack for several."""
    handles = [m["h"] for m in msgs if m.get("h")]
    if not handles:
        return
    ext = "&extend=0" if kind == "nack" else ""
    t0 = ctx.hist.t()
    if len(handles) == 1:
        st, data, err = cl.call(node, "POST", f"/v1/topics/{topic}/ack?receipt_handle={handles[0]}{ext}", b"")
        results = [st]
    else:
        body = json.dumps({"receipt_handles": handles}).encode()
        st, data, err = cl.call(node, "POST", f"/v1/topics/{topic}/ack" + (f"?{ext[1:]}" if ext else ""), body)
        results = [None] * len(handles)
        if st == 200:
            try:
                results = [r.get("status") for r in json.loads(data)["results"]]
            except (ValueError, KeyError, TypeError, AttributeError):
                pass
    _record(ctx, t0, node, kind, topic, st, err, data, handles=handles, results=results)


def worker_consumer(ctx: Ctx, k: int, mode: str) -> None:
    """mode "ack": consume (single or batch) and ack; "nack": nack or let the lease lapse;
    "pinned": consume one partition (`partition=`) and ack."""
    rng = random.Random(f"{ctx.seed}:consumer:{k}:{mode}")
    cl = Client(ctx.cluster)
    for _ in range(OPS_PER_WORKER_MAX):
        if ctx.stop.is_set():
            break
        node = rng.randrange(ctx.n())
        topic = rng.choice(ctx.consumed)
        batch = rng.randint(2, BATCH_CONSUME_MAX) if (mode != "nack" and rng.random() < 0.5) else None
        part = rng.randrange(MAIN_PARTITIONS) if mode == "pinned" else None
        msgs = consume_once(ctx, cl, node, topic, batch, part, "500ms")
        if msgs:
            if mode == "nack":
                if rng.random() < 0.5:
                    settle(ctx, cl, node, topic, msgs, "nack")
                # else: the lease lapses and the message comes back after VISIBILITY_MS
            else:
                # Sometimes ack on another node than the one that delivered.
                ack_node = rng.randrange(ctx.n()) if rng.random() < 0.3 else node
                settle(ctx, cl, ack_node, topic, msgs, "ack")
        _pause_between(ctx, rng, 0.005, 0.05 if mode != "nack" else 0.3)


def worker_topics(ctx: Ctx) -> None:
    """Creates and deletes scratch topics (metadata churn) on random nodes."""
    rng = random.Random(f"{ctx.seed}:topics")
    cl = Client(ctx.cluster)
    for _ in range(OPS_PER_WORKER_MAX):
        if ctx.stop.is_set():
            break
        node = rng.randrange(ctx.n())
        name = f"h-scratch-{rng.randrange(SCRATCH_TOPICS)}"
        t0 = ctx.hist.t()
        if rng.random() < 0.55:
            body = json.dumps({"name": name, "partitions": 3}).encode()
            st, data, err = cl.call(node, "POST", "/v1/topics", body)
            _record(ctx, t0, node, "topic_create", name, st, err, data)
        else:
            st, data, err = cl.call(node, "DELETE", f"/v1/topics/{name}")
            _record(ctx, t0, node, "topic_delete", name, st, err, data)
        _pause_between(ctx, rng, 0.1, 0.5)


# --- Faults ----------------------------------------------------------------------------------


def make_schedule(rng: random.Random, duration: float, n: int, kinds: list[str],
                  partition_s: float = PARTITION_S_DEFAULT,
                  shapes: list[str] | None = None) -> list[dict]:
    """The round's faults, decided entirely by `rng`: planned start, kind, node, parameters.
    A partition draws as many numbers from `rng` as it always did (a shape, one float that
    seeds its own generator), so adding its parameters left the other faults of a seed alone."""
    out: list[dict] = []
    if not kinds:
        return out
    # Every kind once, in a seeded order, before any repeats: a short round still covers them.
    first = rng.sample(kinds, len(kinds))
    t = rng.uniform(1.0, 3.0)
    while t < duration - 2.0 and len(out) < FAULTS_PER_ROUND_MAX:
        kind = first[len(out)] if len(out) < len(first) else rng.choice(kinds)
        f = {"at": round(t, 3), "kind": kind, "node": rng.randrange(n)}
        if kind == "kill":
            f["down_s"] = round(rng.uniform(0.1, 2.0), 3)
        elif kind == "pause":
            f["pause_s"] = round(rng.uniform(0.5, 4.0), 3)
        elif kind == "startkill":
            f["after_s"] = round(rng.uniform(0.02, 0.8), 3)
        elif kind == "diskfull":
            f["hold_s"] = round(rng.uniform(1.0, 4.0), 3)
        elif kind == "partition":
            f["shape"] = rng.choice(shapes or PARTITION_SHAPES)
            sub = random.Random(rng.random())
            if f["shape"] == "isolate":
                # f["node"] is cut off from every other node, both directions.
                f["hold_s"] = round(partition_s * sub.uniform(1.0, 1.25), 3)
            elif f["shape"] == "split":
                # A minority (f["node"] and up to (n-1)//2 - 1 more) against the majority.
                others = [i for i in range(n) if i != f["node"]]
                f["minority"] = sorted([f["node"]] + sub.sample(others, max(0, (n - 1) // 2 - 1)))
                f["hold_s"] = round(partition_s * sub.uniform(0.5, 0.75), 3)
            else:
                # One direction only: packets from f["node"] to the others ("out"), or from the
                # others to it ("in"), are dropped.
                f["direction"] = sub.choice(["out", "in"])
                f["hold_s"] = round(partition_s * sub.uniform(0.5, 0.75), 3)
        out.append(f)
        t += rng.uniform(2.0, 5.0)
    return out


def partition_unavailable(cluster: Cluster) -> str | None:
    """Why network partitions cannot run here, or None when they can."""
    if len(cluster.nodes) < 2:
        return "one node has no peer to be cut off from"
    if cluster.net is None:
        return cluster.netns_reason or "nodes run on shared loopback (--netns off)"
    return None


def partition_sides(f: dict, n: int) -> dict[int, str]:
    """Each node's side of a partition: "cut" (the isolated or one-way node, or the minority)
    or "rest"."""
    if f["shape"] == "split":
        cut = set(f.get("minority", [f["node"]]))
    else:
        cut = {f["node"]}
    return {i: ("cut" if i in cut else "rest") for i in range(n)}


def cut_network(net: Netns, f: dict, n: int) -> None:
    """Installs the nftables drops of partition `f`. Two-way cuts drop on both sides; a
    one-way drop only on the sending side."""
    sides = partition_sides(f, n)
    cut = [i for i in range(n) if sides[i] == "cut"]
    rest = [i for i in range(n) if sides[i] == "rest"]
    a = net.addrs
    if f["shape"] in ("isolate", "split"):
        for i in cut:
            net.drop(i, [a[j] for j in rest], [a[j] for j in rest])
        for j in rest:
            net.drop(j, [a[i] for i in cut], [a[i] for i in cut])
    elif f.get("direction", "out") == "out":
        for i in cut:
            net.drop(i, [], [a[j] for j in rest])
    else:
        for j in rest:
            net.drop(j, [], [a[i] for i in cut])


def probe_readyz(ctx: Ctx, cl: Client, until: float) -> None:
    """Until `until` (monotonic), asks every node's /readyz every READYZ_PROBE_S and records it
    (op "readyz"): the history shows which side of a cut called itself ready."""
    while now_mono() < until and not ctx.stop.is_set():
        nxt = now_mono() + READYZ_PROBE_S
        for i in range(ctx.n()):
            t0 = ctx.hist.t()
            st, data, err = cl.call(i, "GET", "/readyz", timeout=2.0)
            _record(ctx, t0, i, "readyz", "", st, err, data)
        time.sleep(max(0.0, min(nxt, until) - now_mono()))


def fault_partition(ctx: Ctx, f: dict) -> str | None:
    """A network partition (issue 32) between the nodes' namespaces, for f["hold_s"]: one node
    cut off both ways ("isolate"), a minority/majority split, or a one-way drop. The harness
    (the workload's side, on the bridge) keeps reaching every node, so the history shows what
    each side answered. Healed (the tables deleted) before it returns, also on an error.
    Returns why it was skipped, or None."""
    why = partition_unavailable(ctx.cluster)
    if why:
        return why
    net = ctx.cluster.net
    h = ctx.hist
    sides = partition_sides(f, ctx.n())
    base = {"type": "fault", "kind": "partition", "node": f["node"], "shape": f["shape"]}
    try:
        cut_network(net, f, ctx.n())
        h.add({**base, "t": h.t(), "what": "cut", "direction": f.get("direction"),
               "sides": {f"n{i + 1}": s for i, s in sides.items()}})
        probe_readyz(ctx, Client(ctx.cluster), now_mono() + f["hold_s"])
    finally:
        net.heal()
        h.add({**base, "t": h.t(), "what": "healed"})
    return None


def diskfull_unavailable(cluster: Cluster) -> str | None:
    return cluster.tmpfs_reason if cluster.tmpfs_reason else (
        None if all(nd.tmpfs for nd in cluster.nodes) else "data directories are not on a tmpfs")


def fill_disk(node: Node) -> int:
    """Writes a ballast file until the node's tmpfs is full; bytes written."""
    path = os.path.join(node.dir, "ballast")
    node.ballast = path
    chunk = b"\0" * (1 << 20)
    written = 0
    try:
        with open(path, "wb") as f:
            while written < BALLAST_BYTES_MAX:
                f.write(chunk)
                f.flush()
                written += len(chunk)
    except OSError:
        pass
    # Fill the last partial MiB too.
    try:
        with open(path, "ab") as f:
            for _ in range(1 << 10):
                f.write(b"\0" * 1024)
                f.flush()
    except OSError:
        pass
    return written


def note_exits(ctx: Ctx) -> None:
    """Records every node that exited on its own (not killed by the harness) since last looked."""
    for node in ctx.cluster.nodes:
        if node.proc is None or node.killed or node.exit_seen:
            continue
        rc = node.proc.poll()
        if rc is not None:
            node.exit_seen = True
            ctx.hist.add({"type": "fault", "kind": "exit", "node": node.index, "t": ctx.hist.t(),
                          "what": "exited", "returncode": rc})


# Kinds a cluster round may aim at the metadata group's leader instead of their drawn node.
LEADER_AIMED_KINDS = ("kill", "pause", "startkill")


def aimed_at_leader(f: dict) -> bool:
    """Whether this fault goes to the Raft leader: one in three of the aimable kinds, decided by
    its planned start (no draw from the round's generator, so every seed keeps its schedule)."""
    return f["kind"] in LEADER_AIMED_KINDS and int(round(f["at"] * 1000)) % 3 == 0


def raft_leader(cluster: "Cluster") -> int | None:
    """The index of the node that leads the metadata group, as a running node's
    `GET /v1/cluster/members` says; None when no node answers with a leader."""
    c = Client(cluster)
    try:
        for node in cluster.nodes:
            if not node.alive() or node.paused:
                continue
            status, data, _ = c.call(node.index, "GET", "/v1/cluster/members", timeout=2.0)
            if status != 200:
                continue
            try:
                members = json.loads(data).get("members", [])
            except ValueError:
                continue
            for m in members:
                if m.get("leader"):
                    for n in cluster.nodes:
                        if n.id == m.get("id"):
                            return n.index
    finally:
        for i in list(c.conns):
            c.drop(i)
    return None


def run_fault(ctx: Ctx, f: dict) -> str | None:
    """Runs one fault to its end (a killed node is back up when it returns). Returns an error
    that stops the round (a node that will not start), else None. In a cluster, one in three
    kills, pauses and start-up kills go to the Raft leader of the moment (`aimed_at_leader`);
    the history names the node hit and says it was aimed."""
    cl = ctx.cluster
    h = ctx.hist
    kind = f["kind"]
    aimed = {}
    if len(cl.nodes) > 1 and aimed_at_leader(f):
        leader = raft_leader(cl)
        if leader is not None:
            f = {**f, "node": leader}
            aimed = {"aimed": "leader"}
    node = cl.nodes[f["node"]]
    base = {"type": "fault", "kind": kind, "node": f["node"], **aimed}
    if kind == "kill":
        h.add({**base, "t": h.t(), "what": "kill"})
        cl.kill9(node)
        time.sleep(f["down_s"])
        h.add({**base, "t": h.t(), "what": "spawn"})
        cl.spawn(node)
        err = cl.wait_ready(node)
        h.add({**base, "t": h.t(), "what": "ready" if err is None else "not_ready", "error": err})
        return err
    if kind == "startkill":
        h.add({**base, "t": h.t(), "what": "kill"})
        cl.kill9(node)
        h.add({**base, "t": h.t(), "what": "spawn"})
        cl.spawn(node)
        time.sleep(f["after_s"])
        h.add({**base, "t": h.t(), "what": "kill", "during_startup": True})
        cl.kill9(node)
        h.add({**base, "t": h.t(), "what": "spawn"})
        cl.spawn(node)
        err = cl.wait_ready(node)
        h.add({**base, "t": h.t(), "what": "ready" if err is None else "not_ready", "error": err})
        return err
    if kind == "pause":
        if not node.alive():
            h.add({**base, "t": h.t(), "what": "skipped", "reason": "node not running"})
            return None
        h.add({**base, "t": h.t(), "what": "stop"})
        os.kill(node.proc.pid, signal.SIGSTOP)
        node.paused = True
        time.sleep(f["pause_s"])
        os.kill(node.proc.pid, signal.SIGCONT)
        node.paused = False
        h.add({**base, "t": h.t(), "what": "cont"})
        return None
    if kind == "diskfull":
        why = diskfull_unavailable(cl)
        if why:
            h.add({**base, "t": h.t(), "what": "skipped", "reason": why})
            return None
        h.add({**base, "t": h.t(), "what": "fill"})
        n = fill_disk(node)
        h.add({**base, "t": h.t(), "what": "full", "ballast_bytes": n})
        time.sleep(f["hold_s"])
        cl.remove_ballast(node)
        h.add({**base, "t": h.t(), "what": "freed"})
        return None
    if kind == "partition":
        why = fault_partition(ctx, f)
        if why:
            h.add({**base, "t": h.t(), "what": "skipped", "reason": why})
        return None
    if kind == "join":
        # Scale out: the node outside the peer list starts and joins; once ready the workload
        # uses it too, and the leader's planner moves partitions to it under the faults.
        h.add({**base, "t": h.t(), "what": "spawn"})
        cl.spawn(node)
        err = cl.wait_ready(node)
        h.add({**base, "t": h.t(), "what": "ready" if err is None else "not_ready", "error": err})
        if err is None:
            cl.active = len(cl.nodes)
        return None
    if kind == "decommission":
        # Scale in: the joiner is decommissioned through a peer (the workload stops sending it
        # requests: it refuses client produce from now on); its partitions move back.
        if node.generation == 0:
            h.add({**base, "t": h.t(), "what": "skipped", "reason": "never joined"})
            return None
        cl.active = len(cl.nodes) - cl.joiners
        c = Client(cl)
        # Who owns what now (partitions moved to the joiner): for the checker's move seam.
        record_owners(ctx, c, "owners_seen")
        deadline = now_mono() + DECOMMISSION_ASK_S
        k = 0
        while now_mono() < deadline:
            via = k % cl.active
            k += 1
            t0 = h.t()
            st, data, err = c.call(via, "POST", f"/v1/cluster/members/{node.id}/decommission", b"")
            _record(ctx, t0, via, "decommission", "-", st, err, data)
            if st == 204:
                node.decommissioned = True
                h.add({**base, "t": h.t(), "what": "decommission", "via": via})
                return None
            time.sleep(0.5)
        h.add({**base, "t": h.t(), "what": "skipped", "reason": "decommission not accepted"})
        return None
    raise ValueError(f"unknown fault kind {kind}")


def wait_decommissioned(ctx: Ctx) -> dict:
    """Scale rounds after healing: waits (at most SCALE_SETTLE_S) until the joiner is no longer a
    member; then the moves every node finished (`narad_moves_total`). The joiner keeps running:
    while it still owns partitions it serves them to the others."""
    cl = ctx.cluster
    joiner = cl.nodes[-1]
    c = Client(cl)
    record_owners(ctx, c, "owners_seen")
    out = {"joined": joiner.generation > 0, "decommission_sent": joiner.decommissioned,
           "decommissioned": False, "moves_completed": 0,
           "moves_force_promoted": 0}
    deadline = now_mono() + SCALE_SETTLE_S
    while joiner.decommissioned and now_mono() < deadline:
        st, data, _ = c.call(0, "GET", "/v1/cluster/members", timeout=2.0)
        if st == 200:
            try:
                ids = [m.get("id") for m in json.loads(data).get("members", [])]
            except ValueError:
                ids = None
            if ids is not None and joiner.id not in ids:
                out["decommissioned"] = True
                break
        time.sleep(0.5)
    for i, node in enumerate(cl.nodes):
        if node.generation == 0:
            continue
        st, data, _ = c.call(i, "GET", "/metrics", timeout=2.0)
        if st != 200:
            continue
        for line in data.decode("utf-8", "replace").splitlines():
            for label, key in (("completed", "moves_completed"), ("force_promoted", "moves_force_promoted")):
                if line.startswith(f'narad_moves_total{{outcome="{label}"}} '):
                    out[key] += int(float(line.split()[1]))
    ctx.hist.add({"type": "scale", "t": ctx.hist.t(), **out})
    return out


# --- Checker ---------------------------------------------------------------------------------


def parse_handle(h: str):
    try:
        p, o, _ = h.split(":")
        return int(p), int(o)
    except (ValueError, AttributeError):
        return None


def check(events: list[dict], n_nodes: int) -> dict:
    """Judges one round's history (see tests/harness/README.md for each rule)."""
    ops = [e for e in events if e.get("type") == "op"]
    faults = [e for e in events if e.get("type") == "fault"]
    attempted: set[str] = set()
    accepted: dict[str, float] = {}  # id -> t1 of its first 202
    accepted_parent: set[str] = set()  # ids accepted for the child's parent
    for e in ops:
        if e["op"] in ("produce", "produce_batch"):
            attempted.update(e["ids"])
            if e["status"] == 202:
                for i in e["ids"]:
                    accepted.setdefault(i, e["t1"])
                if e["topic"] == CHILD_PARENT:
                    accepted_parent.update(e["ids"])

    deliveries = []  # (t0, t1, node, topic, p, o, id, phase)
    handle_of: dict[tuple, tuple] = {}  # (topic, handle) -> (topic, p, o, id)
    for e in ops:
        if e["op"] != "consume":
            continue
        for m in e.get("msgs", []):
            deliveries.append((e["t0"], e["t1"], e["node"], e["topic"], m["p"], m["o"], m["id"], e["phase"]))
            if m.get("h"):
                handle_of[(e["topic"], m["h"])] = (e["topic"], m["p"], m["o"], m["id"])

    delivered_ids = collections.Counter(d[6] for d in deliveries if d[6] is not None)
    # Delivered from the topic it was produced to: a copy in the child does not excuse a loss
    # in the parent.
    delivered_main = {d[6] for d in deliveries if d[6] is not None and d[3] != CHILD_TOPIC}
    lost = sorted(i for i in accepted if i not in delivered_main)
    # The child gets a copy of every message accepted for its parent (when the round had one:
    # histories recorded before it existed have no create of it).
    has_child = any(e["op"] == "topic_create" and e["topic"] == CHILD_TOPIC for e in ops)
    in_child = {d[6] for d in deliveries if d[3] == CHILD_TOPIC and d[6] is not None}
    lost_child = sorted(i for i in accepted_parent if i not in in_child) if has_child else []
    lost += [f"{CHILD_TOPIC}:{i}" for i in lost_child]
    unexpected = [
        {"t0": d[0], "node": d[2], "topic": d[3], "partition": d[4], "offset": d[5], "id": d[6]}
        for d in deliveries if d[6] is None or d[6] not in attempted
    ]

    # Offsets: one message per (topic, partition, offset).
    at: dict[tuple, str] = {}
    conflicts = []
    for d in deliveries:
        if d[6] is None or d[4] is None:
            continue
        key = (d[3], d[4], d[5])
        prev = at.setdefault(key, d[6])
        if prev != d[6]:
            conflicts.append({"topic": d[3], "partition": d[4], "offset": d[5], "ids": [prev, d[6]]})

    # Duplicates per topic: a message stored at more than one offset, and deliveries beyond the
    # first of one offset (redeliveries after a lapse, a nack, a crash).
    places: dict[tuple, set] = collections.defaultdict(set)
    per_offset = collections.Counter()
    for d in deliveries:
        if d[6] is None:
            continue
        places[(d[3], d[6])].add((d[4], d[5]))
        per_offset[(d[3], d[4], d[5])] += 1
    dup = collections.defaultdict(lambda: {"stored_twice": 0, "redeliveries": 0})
    for (topic, _), where in places.items():
        if len(where) > 1:
            dup[topic]["stored_twice"] += len(where) - 1
    for (topic, _, _), c in per_offset.items():
        if c > 1:
            dup[topic]["redeliveries"] += c - 1

    # Acked then delivered again: a delivery of an offset whose ack was answered 204 before the
    # delivery's request began. Allowed only at the seam SEMANTICS.md §1 names for this
    # harness's faults: an owner crash soon after the ack (the acks of the group commit being
    # written replay), within ACK_DURABLE_S of its answer and before the redelivery.
    acked_at: dict[tuple, float] = {}
    for e in ops:
        if e["op"] != "ack":
            continue
        for h, r in zip(e["handles"], e["results"]):
            if r == 204 and (e["topic"], h) in handle_of:
                topic, p, o, _ = handle_of[(e["topic"], h)]
                k = (topic, p, o)
                acked_at[k] = min(acked_at.get(k, e["t1"]), e["t1"])
    crashes = [(f["t"], f["node"]) for f in faults if f.get("what") == "kill"]
    # (topic, partition) -> the index of the node owning it, from the setup's describes.
    owner_of: dict[tuple, int] = {}
    for e in events:
        if e.get("type") == "owners":
            for p, o in enumerate(e.get("owners", [])):
                if isinstance(o, str) and o.startswith("n") and o[1:].isdigit():
                    owner_of[(e["topic"], p)] = int(o[1:]) - 1
    # (topic, partition) whose owner changed during the round (a scale round's moves): an ack
    # racing the flip is lost with the old owner's leases and the new owner delivers the
    # message again (CLUSTER.md §9.3 step 5).
    seen_owners: dict[tuple, set] = {}
    for e in events:
        if e.get("type") in ("owners", "owners_seen"):
            for p, o in enumerate(e.get("owners", [])):
                seen_owners.setdefault((e["topic"], p), set()).add(o)
    moved = {k for k, v in seen_owners.items() if len(v) > 1}
    acked_again = []
    for d in deliveries:
        k = (d[3], d[4], d[5])
        ta = acked_at.get(k)
        if ta is None or d[0] <= ta:
            continue
        # Only the partition's owner holds the ack (a crash elsewhere cannot undo it), when the
        # round recorded who owns what.
        owner = owner_of.get((d[3], d[4]))
        seam = [c for c in crashes if ta - 0.5 <= c[0] <= min(ta + ACK_DURABLE_S, d[0])
                and (owner is None or c[1] == owner)]
        after = [c for c in crashes if ta < c[0] <= d[0]]
        acked_again.append({"topic": d[3], "partition": d[4], "offset": d[5], "id": d[6],
                            "acked_at": ta, "delivered_at": d[0], "node": d[2],
                            "seam": f"crash of n{seam[0][1] + 1} at {seam[0][0]:.3f}" if seam
                            else ("partition moved" if (d[3], d[4]) in moved else None),
                            "crash_after_s": round(after[0][0] - ta, 3) if after else None})
    unexplained = [a for a in acked_again if a["seam"] is None]

    # Availability per node, and time from each kill to the next 202.
    avail = []
    for i in range(n_nodes):
        mine = [e for e in ops if e["node"] == i and e["phase"] == "workload"]
        prod = [e for e in mine if e["op"] in ("produce", "produce_batch")]
        cons = [e for e in mine if e["op"] == "consume"]
        avail.append({
            "node": f"n{i + 1}",
            "produce_ok": sum(1 for e in prod if e["status"] == 202),
            "produce_total": len(prod),
            "consume_ok": sum(1 for e in cons if e["status"] in (200, 204)),
            "consume_total": len(cons),
        })
    produce_ok = sorted((e["t0"], e["t1"], e["node"]) for e in ops
                        if e["op"] in ("produce", "produce_batch") and e["status"] == 202)
    kill_to_202 = []
    for tk, node in crashes:
        any_ = next((t1 - tk for t0, t1, _ in produce_ok if t0 >= tk), None)
        same = next((t1 - tk for t0, t1, nd in produce_ok if t0 >= tk and nd == node), None)
        kill_to_202.append({"kill_at": tk, "node": f"n{node + 1}",
                            "to_next_202_s": None if any_ is None else round(any_, 3),
                            "to_next_202_same_node_s": None if same is None else round(same, 3)})

    # Availability per side of each partition: produces 202 / consumes 200 or 204 / readyz 200
    # among the requests that began while the cut was in place.
    cuts = []
    open_cut = None
    for f in faults:
        if f.get("kind") != "partition":
            continue
        if f.get("what") == "cut":
            open_cut = f
        elif f.get("what") == "healed" and open_cut is not None:
            cuts.append((open_cut, f["t"]))
            open_cut = None
    part_avail = []
    side_tot: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for c, t_end in cuts:
        sides = c.get("sides", {})
        per_node = {}
        for e in ops:
            if not c["t"] <= e["t0"] < t_end:
                continue
            name = f"n{e['node'] + 1}"
            if e["op"] in ("produce", "produce_batch"):
                kind, ok = "produce", e["status"] == 202
            elif e["op"] == "consume":
                kind, ok = "consume", e["status"] in (200, 204)
            elif e["op"] == "readyz":
                kind, ok = "ready", e["status"] == 200
            else:
                continue
            cnt = per_node.setdefault(name, collections.Counter())
            cnt[f"{kind}_total"] += 1
            cnt[f"{kind}_ok"] += int(ok)
        nodes_out = []
        for name in sorted(per_node, key=lambda x: int(x[1:])):
            side = sides.get(name, "?")
            nodes_out.append({"node": name, "side": side, **dict(per_node[name])})
            side_tot[side].update(per_node[name])
        part_avail.append({"shape": c.get("shape"), "node": f"n{c['node'] + 1}",
                           "direction": c.get("direction"), "from": c["t"], "to": t_end,
                           "held_s": round(t_end - c["t"], 2), "nodes": nodes_out})
    side_avail = {side: dict(cnt) for side, cnt in sorted(side_tot.items())}

    # Metadata: the last definite answer per scratch topic against what every node shows.
    expect: dict[str, str | None] = {}
    decided_by: dict[str, dict] = {}
    for e in ops:
        if e["error"] == "refused":
            continue  # never reached the node: changes nothing
        if e["op"] == "topic_create":
            if e["status"] == 201 or (e["status"] == 409 and "already exists" in (e.get("body") or "")):
                expect[e["topic"]] = "present"
                decided_by[e["topic"]] = e
            elif e["status"] in (None, 500, 502, 503):
                expect[e["topic"]] = None  # ambiguous: either outcome is correct
        elif e["op"] == "topic_delete":
            if e["status"] in (204, 404):
                expect[e["topic"]] = "absent"
                decided_by[e["topic"]] = e
            elif e["status"] in (None, 500, 502, 503):
                expect[e["topic"]] = None
    for t in MAIN_TOPICS:
        expect[t] = "present"
    if has_child:
        expect[CHILD_TOPIC] = "present"
    meta_bad = []
    meta_checked = 0
    for e in ops:
        if e["op"] != "probe_topic":
            continue
        want = expect.get(e["topic"])
        if want is None:
            continue
        meta_checked += 1
        seen = {200: "present", 404: "absent"}.get(e["status"], f"status {e['status']}")
        if seen != want:
            bad = {"node": f"n{e['node'] + 1}", "topic": e["topic"], "want": want, "seen": seen}
            d = decided_by.get(e["topic"])
            if d is not None:
                # The answer the expectation rests on, and whether its node was on the cut side
                # of a partition then (a stale answer from a node that cannot reach the leader).
                side = next((c.get("sides", {}).get(f"n{d['node'] + 1}") for c, t_end in cuts
                             if c["t"] <= d["t0"] < t_end), None)
                bad["decided_by"] = {"op": d["op"], "node": f"n{d['node'] + 1}", "t0": d["t0"],
                                     "status": d["status"], "partition_side": side}
            meta_bad.append(bad)

    by_kind = collections.Counter(
        (f"partition-{f.get('shape')}" if f["kind"] == "partition"
         else f["kind"] + ("@leader" if f.get("aimed") == "leader" else ""))
        for f in faults if f.get("what") in ("kill", "stop", "fill", "cut") and not f.get("during_startup"))
    skipped = sorted({f"{f['kind']}: {f['reason']}" for f in faults if f.get("what") == "skipped"})
    exits = [{"node": f"n{f['node'] + 1}", "t": f["t"], "returncode": f["returncode"]}
             for f in faults if f.get("what") == "exited"]
    return {
        "produce_attempted": len(attempted),
        "produce_accepted": len(accepted),
        "deliveries": len(deliveries),
        "delivered_distinct": len(delivered_ids),
        "lost": len(lost),
        "lost_ids": lost[:REPORT_LIST_MAX],
        "lost_in_child": len(lost_child),
        "child_copies": len(in_child),
        "unexpected": len(unexpected),
        "unexpected_list": unexpected[:REPORT_LIST_MAX],
        "offset_conflicts": len(conflicts),
        "offset_conflict_list": conflicts[:REPORT_LIST_MAX],
        "duplicates": {t: dict(v) for t, v in sorted(dup.items())},
        "stored_twice": sum(v["stored_twice"] for v in dup.values()),
        "redeliveries": sum(v["redeliveries"] for v in dup.values()),
        "acked_redelivered": len(acked_again),
        "acked_redelivered_unexplained": len(unexplained),
        "acked_redelivered_list": acked_again[:REPORT_LIST_MAX],
        "metadata_checked": meta_checked,
        "metadata_bad": len(meta_bad),
        "metadata_bad_list": meta_bad[:REPORT_LIST_MAX],
        "availability": avail,
        "kill_to_202": kill_to_202,
        "partition_availability": part_avail[:REPORT_LIST_MAX],
        "partition_side_availability": side_avail,
        "faults_run": dict(sorted(by_kind.items())),
        "node_exits": len(exits),
        "node_exit_list": exits[:REPORT_LIST_MAX],
        "faults_skipped": skipped,
    }


# What fails a round; with --strict also acks that came back outside the crash seam and nodes
# that exited on their own (reported as warnings otherwise).
FAILING = ("lost", "unexpected", "offset_conflicts", "metadata_bad")
STRICT = ("acked_redelivered_unexplained", "node_exits")


def verdict(res: dict, strict: bool = False) -> list[str]:
    """The violations that fail a round."""
    return [f"{k}={res[k]}" for k in FAILING + (STRICT if strict else ()) if res.get(k)]


def warnings_of(res: dict) -> list[str]:
    return [f"{k}={res[k]}" for k in STRICT if res.get(k)]


# --- Rounds ----------------------------------------------------------------------------------


def setup_topics(ctx: Ctx) -> str | None:
    cl = Client(ctx.cluster)
    for t in MAIN_TOPICS + [CHILD_TOPIC]:
        spec = {"name": t, "partitions": MAIN_PARTITIONS, "visibility_timeout_ms": VISIBILITY_MS}
        if t == CHILD_TOPIC:
            spec["parent"] = CHILD_PARENT  # created attached, before any produce
        body = json.dumps(spec).encode()
        for _ in range(50):
            t0 = ctx.hist.t()
            st, data, err = cl.call(0, "POST", "/v1/topics", body)
            _record(ctx, t0, 0, "topic_create", t, st, err, data)
            if st in (201, 409):
                break
            time.sleep(0.2)
        else:
            return f"could not create topic {t}"
    if ctx.n() > 1:
        record_owners(ctx, cl)
    return None


def record_owners(ctx: Ctx, cl: Client, kind: str = "owners") -> None:
    """Records each topic's owner node per partition (a describe's `partition_stats`), for the
    checker's crash seam: an ack can come undone only by a crash of its partition's owner."""
    for t in MAIN_TOPICS + [CHILD_TOPIC]:
        st, data, _ = cl.call(0, "GET", f"/v1/topics/{t}")
        if st != 200:
            continue
        try:
            stats = json.loads(data).get("partition_stats", [])
        except ValueError:
            continue
        by_partition = {p.get("partition", i): p.get("owner_node") for i, p in enumerate(stats)}
        owners = [by_partition.get(i) for i in range(len(stats))]
        if owners and all(isinstance(o, str) and o for o in owners):
            ctx.hist.add({"type": kind, "t": ctx.hist.t(), "topic": t, "owners": owners})


def heal(ctx: Ctx) -> str | None:
    cl = ctx.cluster
    h = ctx.hist
    note_exits(ctx)
    if cl.net is not None:
        cl.net.heal()
    for node in cl.nodes:
        if node.generation == 0:
            continue  # a joiner that never joined
        base = {"type": "fault", "kind": "heal", "node": node.index}
        if node.paused and node.alive():
            os.kill(node.proc.pid, signal.SIGCONT)
            node.paused = False
            h.add({**base, "t": h.t(), "what": "cont"})
        if node.ballast:
            cl.remove_ballast(node)
            h.add({**base, "t": h.t(), "what": "freed"})
        if not node.alive():
            h.add({**base, "t": h.t(), "what": "spawn"})
            cl.spawn(node)
        if node.decommissioned:
            continue  # out of the cluster (or on its way): never ready again
        err = cl.wait_ready(node)
        if err:
            return err
    return None


def dispatch_backlog(ctx: Ctx, cl: Client) -> int | None:
    """Records accepted but not yet handed to their owner, summed over the nodes
    (`narad_ingress_dispatch_backlog_records`); None when a node did not answer."""
    total = 0
    for i in range(ctx.n()):
        st, data, _ = cl.call(i, "GET", "/metrics", timeout=2.0)
        if st != 200:
            return None
        for line in data.decode("utf-8", "replace").splitlines():
            if line.startswith("narad_ingress_dispatch_backlog_records "):
                try:
                    total += int(float(line.split()[1]))
                except (IndexError, ValueError):
                    return None
    return total


def drain(ctx: Ctx) -> dict:
    """Consumes and acks on every node until nothing was delivered for DRAIN_QUIET_S and no
    node still holds accepted records for their owner (a hand-off to an owner that was cut off
    may take a commit timeout, 30 s, to give up and reroute); at most DRAIN_S_MAX."""
    cl = Client(ctx.cluster)
    start = now_mono()
    last = now_mono()
    requests = 0
    got = 0
    backlog_seen = None
    while now_mono() - start < DRAIN_S_MAX and requests < DRAIN_REQUESTS_MAX:
        if now_mono() - last >= DRAIN_QUIET_S:
            backlog_seen = dispatch_backlog(ctx, cl)
            if backlog_seen == 0:
                break
            last = now_mono() - DRAIN_QUIET_S + 1.0  # look again in a second
        for i in range(ctx.n()):
            for t in ctx.consumed:
                msgs = consume_once(ctx, cl, i, t, 100, None, "200ms")
                requests += 1
                if msgs:
                    got += len(msgs)
                    last = now_mono()
                    settle(ctx, cl, i, t, msgs, "ack")
    return {"drain_s": round(now_mono() - start, 2), "drain_requests": requests,
            "drain_delivered": got, "drain_timed_out": backlog_seen != 0,
            "drain_backlog_left": backlog_seen}


def probe_metadata(ctx: Ctx) -> None:
    cl = Client(ctx.cluster)
    names = list(MAIN_TOPICS) + [CHILD_TOPIC] + [f"h-scratch-{k}" for k in range(SCRATCH_TOPICS)]
    for i in range(ctx.n()):
        for t in names:
            t0 = ctx.hist.t()
            st, data, err = cl.call(i, "GET", f"/v1/topics/{t}")
            _record(ctx, t0, i, "probe_topic", t, st, err, data)


def panics_in_logs(cluster: Cluster) -> int:
    n = 0
    for node in cluster.nodes:
        try:
            with open(node.log_path, "rb") as f:
                n += sum(1 for line in f if b"panicked" in line)
        except OSError:
            pass
    return n


def run_round(args, r: int) -> dict:
    seed = args.seed + r
    rng = random.Random(seed)
    root = os.path.join(args.workdir, f"round-{r:03d}-seed-{seed}")
    shutil.rmtree(root, ignore_errors=True)
    os.makedirs(root)
    kinds = [k for k in args.faults if k]
    schedule = make_schedule(rng, args.duration, args.nodes, kinds, args.partition_s,
                             args.partition_shapes)
    joiners = 1 if getattr(args, "scale", False) else 0
    total = args.nodes + joiners
    if joiners:
        # Not drawn from the seed's generator: a seed's faults are the same with or without
        # --scale. The joiner (the last node) joins early and is decommissioned past the middle.
        schedule = sorted(schedule + [
            {"at": round(args.duration * 0.15, 3), "kind": "join", "node": args.nodes},
            {"at": round(args.duration * 0.55, 3), "kind": "decommission", "node": args.nodes},
        ], key=lambda f: f["at"])
    net = None
    if args.netns_use:
        net = Netns(total, f"r{r}")
        try:
            net.build()
        except (RuntimeError, OSError, subprocess.SubprocessError) as e:
            net.teardown()
            return {"round": r, "seed": seed, "dir": root, "schedule": schedule,
                    "error": f"could not build the network namespaces: {e}", "run_s": 0.0}
    cluster = Cluster(args.binary, root, total, random.Random(), "diskfull" in kinds, net,
                      joiners=joiners)
    cluster.netns_reason = args.netns_reason
    cluster.dead_after_ms = max(0, getattr(args, "dead_after_ms", 0))
    _LIVE.append(cluster)
    hist = History(os.path.join(root, "history.jsonl"))
    ctx = Ctx(cluster, hist, r, seed)
    res: dict = {"round": r, "seed": seed, "dir": root, "schedule": schedule}
    t_start = now_mono()
    threads: list[threading.Thread] = []
    try:
        hist.phase = "setup"
        hist.add({"type": "phase", "t": hist.t(), "name": "setup", "seed": seed, "nodes": args.nodes,
                  "schedule": schedule,
                  "netns": None if net is None else {"namespaces": net.ns, "addrs": net.addrs,
                                                     "bridge": net.bridge, "host": net.host_addr}})
        peers = cluster.nodes[: total - joiners]
        for node in peers:
            cluster.spawn(node)
        for node in peers:
            err = cluster.wait_ready(node)
            if err:
                res["error"] = err
                return res
        err = setup_topics(ctx)
        if err:
            res["error"] = err
            return res
        hist.phase = "workload"
        hist.add({"type": "phase", "t": hist.t(), "name": "workload"})
        specs = [(worker_producer, (ctx, 0, False)), (worker_producer, (ctx, 1, False)),
                 (worker_producer, (ctx, 0, True)),
                 (worker_consumer, (ctx, 0, "ack")), (worker_consumer, (ctx, 1, "ack")),
                 (worker_consumer, (ctx, 0, "nack")), (worker_consumer, (ctx, 0, "pinned")),
                 (worker_topics, (ctx,))]
        for fn, a in specs:
            th = threading.Thread(target=fn, args=a, daemon=True, name=fn.__name__)
            th.start()
            threads.append(th)
        w0 = now_mono()
        # The decommission is HTTP only: it runs on its own thread at its time, so that it
        # overlaps whatever fault the main thread is running then (a spawn must stay here).
        side = [f for f in schedule if f["kind"] == "decommission"]
        schedule = [f for f in schedule if f["kind"] != "decommission"]
        side_threads = []
        for f in side:
            def later(f=f):
                if ctx.stop.wait(max(0.0, f["at"] - (now_mono() - w0))):
                    return
                # A join held back by a long fault on the main thread comes first.
                while cluster.active < len(cluster.nodes):
                    if ctx.stop.wait(0.5):
                        return
                run_fault(ctx, f)
            th = threading.Thread(target=later, daemon=True, name="decommission")
            th.start()
            side_threads.append(th)
        for f in schedule:
            delay = f["at"] - (now_mono() - w0)
            if delay > 0:
                time.sleep(delay)
            if now_mono() - w0 > args.duration and f["kind"] != "join":
                break
            note_exits(ctx)
            err = run_fault(ctx, f)
            if err:
                res["error"] = err
                break
        for th in side_threads:
            th.join(max(0.0, args.duration - (now_mono() - w0)) + DECOMMISSION_ASK_S + 5.0)
        rest = args.duration - (now_mono() - w0)
        if rest > 0 and "error" not in res:
            time.sleep(rest)
        ctx.stop.set()
        hist.phase = "heal"
        hist.add({"type": "phase", "t": hist.t(), "name": "heal"})
        err = heal(ctx)
        if err:
            res.setdefault("error", err)
        if joiners and "error" not in res:
            res["scale"] = wait_decommissioned(ctx)
        join_by = now_mono() + JOIN_S_MAX
        for th in threads:
            th.join(max(0.0, join_by - now_mono()))
        if any(th.is_alive() for th in threads):
            res.setdefault("error", "a workload thread did not stop")
        if "error" in res:
            return res
        hist.phase = "drain"
        hist.add({"type": "phase", "t": hist.t(), "name": "drain"})
        res.update(drain(ctx))
        hist.phase = "check"
        probe_metadata(ctx)
        hist.add({"type": "phase", "t": hist.t(), "name": "check"})
    finally:
        ctx.stop.set()
        cluster.stop_all()
        if cluster in _LIVE:
            _LIVE.remove(cluster)
        hist.close()
        res["run_s"] = round(now_mono() - t_start, 1)
    res["panics_logged"] = panics_in_logs(cluster)
    res.update(check(hist.events, total))
    if res.get("drain_timed_out"):
        res.setdefault("notes", []).append("drain ended at its time limit, not quiet")
    return res


# --- Output ----------------------------------------------------------------------------------


COLUMNS = [
    ("round", lambda r: str(r["round"])),
    ("seed", lambda r: str(r["seed"])),
    ("faults", lambda r: ",".join(f"{k}:{v}" for k, v in r.get("faults_run", {}).items()) or "-"),
    ("202/sent", lambda r: f"{r.get('produce_accepted', 0)}/{r.get('produce_attempted', 0)}"),
    ("delivered", lambda r: str(r.get("delivered_distinct", 0))),
    ("lost", lambda r: str(r.get("lost", "-"))),
    ("unexp", lambda r: str(r.get("unexpected", "-"))),
    ("dup", lambda r: str(r.get("stored_twice", "-"))),
    ("redeliv", lambda r: str(r.get("redeliveries", "-"))),
    ("ack-again", lambda r: f"{r.get('acked_redelivered', 0)}({r.get('acked_redelivered_unexplained', 0)})"),
    ("offs", lambda r: str(r.get("offset_conflicts", "-"))),
    ("exits", lambda r: str(r.get("node_exits", "-"))),
    ("meta", lambda r: f"{r.get('metadata_bad', 0)}/{r.get('metadata_checked', 0)}"),
    ("prod%", lambda r: _pct(sum(a["produce_ok"] for a in r.get("availability", [])),
                             sum(a["produce_total"] for a in r.get("availability", [])))),
    ("cons%", lambda r: _pct(sum(a["consume_ok"] for a in r.get("availability", [])),
                             sum(a["consume_total"] for a in r.get("availability", [])))),
    ("kill->202", lambda r: _max_s([k["to_next_202_s"] for k in r.get("kill_to_202", [])])),
    ("cut p/c/r%", lambda r: _side(r, "cut")),
    ("rest p/c/r%", lambda r: _side(r, "rest")),
    ("moves", lambda r: _scale(r)),
    ("secs", lambda r: str(r.get("run_s", "-"))),
    ("result", lambda r: r["result"]),
]


def _scale(r):
    """Scale rounds: moves finished (+ force-promoted) and whether the joiner left."""
    s = r.get("scale")
    if not s:
        return "-"
    forced = f"+{s['moves_force_promoted']}f" if s["moves_force_promoted"] else ""
    where = "out" if s["decommissioned"] else ("in" if s["joined"] else "never")
    return f"{s['moves_completed']}{forced} {where}"


def _pct(a, b):
    return f"{100.0 * a / b:.1f}" if b else "-"


def _side(r, side):
    """Produce / consume / readyz success shares of one side of the round's partitions."""
    a = r.get("partition_side_availability", {}).get(side)
    if not a:
        return "-"
    return "/".join(_pct(a.get(f"{k}_ok", 0), a.get(f"{k}_total", 0)).split(".")[0]
                    for k in ("produce", "consume", "ready"))


def _max_s(xs):
    xs = [x for x in xs if x is not None]
    return f"{max(xs):.2f}s" if xs else "-"


def print_table(rows: list[dict], header: bool) -> None:
    cells = [[c[1](r) for c in COLUMNS] for r in rows]
    widths = [max(len(c[0]), *(len(row[i]) for row in cells)) if cells else len(c[0])
              for i, c in enumerate(COLUMNS)]
    widths = [max(w, 6) for w in widths]
    if header:
        print("  ".join(c[0].rjust(w) for c, w in zip(COLUMNS, widths)))
    for row in cells:
        print("  ".join(v.rjust(w) for v, w in zip(row, widths)))
    sys.stdout.flush()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=30.0, help="workload seconds per round")
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--binary", default=None, help="the narad binary (default: target/debug/narad)")
    ap.add_argument("--workdir", default=None, help="where rounds keep data, logs and histories")
    ap.add_argument("--report", default=None, help="write the JSON report here")
    ap.add_argument("--faults", default="kill,pause,startkill,diskfull,partition",
                    help=f"comma-separated subset of {','.join(FAULT_KINDS)}, or 'none'")
    ap.add_argument("--netns", choices=["auto", "on", "off"], default="auto",
                    help="nodes in their own network namespaces: auto = with more than one node, "
                         "partition among the faults, and root (else loopback, the reason printed)")
    ap.add_argument("--partition-s", type=float, default=PARTITION_S_DEFAULT,
                    help="length of a one-node cut (splits and one-way drops: half to 3/4 of it)")
    ap.add_argument("--partition-shapes", default=",".join(PARTITION_SHAPES),
                    help=f"the partition shapes drawn from: subset of {','.join(PARTITION_SHAPES)}")
    ap.add_argument("--dead-after-ms", type=int, default=0,
                    help="cluster: members are marked dead this long after their last heartbeat "
                         "(NARAD_TEST_DEAD_AFTER_MS; 0 = the broker's 30 s), so that pauses "
                         "(0.5-4 s) can outlast it")
    ap.add_argument("--scale", action="store_true",
                    help="cluster: one more node outside the peer list joins early in each round "
                         "(partitions move to it under the faults) and is decommissioned past "
                         "the middle (they move back)")
    ap.add_argument("--keep", action="store_true", help="keep data directories of passing rounds")
    ap.add_argument("--strict", action="store_true",
                    help="also fail on acks redelivered outside the crash seam and on nodes that exited")
    ap.add_argument("--check", default=None, metavar="HISTORY",
                    help="only run the checker over a recorded history.jsonl")
    args = ap.parse_args(argv)

    if args.check:
        with open(args.check) as f:
            events = [json.loads(line) for line in f if line.strip()]
        nodes = max((e.get("node", 0) for e in events if "node" in e), default=0) + 1
        res = check(events, nodes)
        print(json.dumps(res, indent=1))
        return 1 if verdict(res, args.strict) else 0

    args.faults = [] if args.faults in ("", "none") else args.faults.split(",")
    args.partition_shapes = [x for x in args.partition_shapes.split(",") if x]
    bad_kind = [k for k in args.faults if k not in FAULT_KINDS]
    bad_kind += [x for x in args.partition_shapes if x not in PARTITION_SHAPES]
    if not args.partition_shapes or not 0.5 <= args.partition_s <= DURATION_S_MAX:
        bad_kind.append("partition-shapes/partition-s")
    if bad_kind or not 1 <= args.rounds <= ROUNDS_MAX or not 1 <= args.nodes <= NODES_MAX \
            or not 1.0 <= args.duration <= DURATION_S_MAX:
        print(f"harness: bad arguments (faults {bad_kind}, rounds 1..{ROUNDS_MAX}, "
              f"nodes 1..{NODES_MAX}, duration 1..{DURATION_S_MAX:.0f})", file=sys.stderr)
        return 2
    if args.binary is None:
        here = os.path.dirname(os.path.abspath(__file__))
        args.binary = os.path.join(here, "..", "..", "target", "debug", "narad")
    args.binary = os.path.abspath(args.binary)
    if not os.access(args.binary, os.X_OK):
        print(f"harness: no executable narad at {args.binary}", file=sys.stderr)
        return 2
    own_workdir = args.workdir is None
    args.workdir = os.path.abspath(args.workdir or tempfile.mkdtemp(prefix="narad-harness-"))
    os.makedirs(args.workdir, exist_ok=True)

    atexit.register(_cleanup)
    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, _on_signal)

    args.netns_use = False
    args.netns_reason = None
    if args.nodes > 1 and args.netns != "off" and (args.netns == "on" or "partition" in args.faults):
        args.netns_reason = netns_unavailable()
        if args.netns_reason is None:
            args.netns_use = True
            gone = clean_leftovers()
            if gone:
                print(f"harness: removed leftovers of an earlier run: {', '.join(gone)}")
        elif args.netns == "on":
            print(f"harness: --netns on, but {args.netns_reason}", file=sys.stderr)
            return 2
        else:
            print(f"harness: nodes on loopback, partitions skipped: {args.netns_reason}")
    elif args.nodes > 1 and args.netns == "off":
        args.netns_reason = "nodes run on shared loopback (--netns off)"

    print(f"narad fault harness: rounds={args.rounds} seed={args.seed} duration={args.duration}s "
          f"nodes={args.nodes} faults={','.join(args.faults) or 'none'} "
          f"netns={'on' if args.netns_use else 'off'} partition_s={args.partition_s} workdir={args.workdir}")
    print(f"binary {args.binary}")
    rows = []
    code = 0
    t0 = now_mono()
    try:
        for r in range(args.rounds):
            res = run_round(args, r)
            if "error" in res:
                res["result"] = "ERROR"
                code = max(code, 2)
            else:
                bad = verdict(res, args.strict)
                res["violations"] = bad
                res["warnings"] = [w for w in warnings_of(res) if w not in bad]
                res["result"] = "FAIL" if bad else ("warn" if res["warnings"] else "ok")
                if bad:
                    code = max(code, 1) if code != 2 else 2
            rows.append(res)
            print_table([res], header=(r == 0))
            for s in res.get("faults_skipped", []):
                print(f"    skipped {s}")
            if res.get("warnings"):
                print(f"    warnings: {', '.join(res['warnings'])} (fail with --strict)")
                outside = [a for a in res.get("acked_redelivered_list", []) if a["seam"] is None]
                for a in outside[:PRINT_LIST_MAX]:
                    print(f"    acked then delivered again outside the crash seam: {a}")
                if len(outside) > PRINT_LIST_MAX:
                    print(f"    ... {len(outside) - PRINT_LIST_MAX} more in the report")
                for x in res.get("node_exit_list", [])[:PRINT_LIST_MAX]:
                    print(f"    node exited on its own: {x}")
            if res["result"] not in ("ok", "warn"):
                print(f"    round {r}: {res.get('error') or ', '.join(res['violations'])}; "
                      f"history {res['dir']}/history.jsonl; replay: --seed {res['seed']} --rounds 1")
                for k in ("lost_ids", "unexpected_list", "offset_conflict_list", "metadata_bad_list"):
                    if res.get(k):
                        print(f"    {k}: {res[k][:PRINT_LIST_MAX]}")
            elif not args.keep and not res.get("warnings"):
                for node_dir in os.listdir(res["dir"]):
                    p = os.path.join(res["dir"], node_dir)
                    if os.path.isdir(p):
                        shutil.rmtree(p, ignore_errors=True)
    except Interrupted as e:
        print(f"harness: interrupted by {e}; stopping every node", file=sys.stderr)
        code = 2
    finally:
        _cleanup()
    total = {
        "rounds": len(rows),
        "rounds_failed": sum(1 for r in rows if r["result"] not in ("ok", "warn")),
        "rounds_warned": sum(1 for r in rows if r["result"] == "warn"),
        "produce_accepted": sum(r.get("produce_accepted", 0) for r in rows),
        "produce_attempted": sum(r.get("produce_attempted", 0) for r in rows),
        "lost": sum(r.get("lost", 0) for r in rows),
        "unexpected": sum(r.get("unexpected", 0) for r in rows),
        "offset_conflicts": sum(r.get("offset_conflicts", 0) for r in rows),
        "stored_twice": sum(r.get("stored_twice", 0) for r in rows),
        "redeliveries": sum(r.get("redeliveries", 0) for r in rows),
        "acked_redelivered": sum(r.get("acked_redelivered", 0) for r in rows),
        "acked_redelivered_unexplained": sum(r.get("acked_redelivered_unexplained", 0) for r in rows),
        "metadata_bad": sum(r.get("metadata_bad", 0) for r in rows),
        "node_exits": sum(r.get("node_exits", 0) for r in rows),
        "run_s": round(now_mono() - t0, 1),
    }
    print(f"total: {json.dumps(total)}")
    if args.report:
        report = {
            "config": {"rounds": args.rounds, "seed": args.seed, "duration_s": args.duration,
                       "nodes": args.nodes, "faults": args.faults, "strict": args.strict,
                       "netns": args.netns_use, "partition_s": args.partition_s,
                       "partition_shapes": args.partition_shapes,
                       "binary": args.binary,
                       "workdir": args.workdir},
            "rounds": rows,
            "total": total,
            "ok": code == 0,
            "exit_code": code,
        }
        with open(args.report, "w") as f:
            json.dump(report, f, indent=1)
    if own_workdir and code == 0 and not args.keep:
        shutil.rmtree(args.workdir, ignore_errors=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
