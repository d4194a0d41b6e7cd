#!/usr/bin/python3
"""Proves that the chart's seccomp profile (helm/narad/files/narad-seccomp.json) lets the real
broker work and really refuses what it lists. The profile's rules are loaded into a real seccomp
filter (libseccomp, the library runc and crun load Kubernetes profiles with) and:

1. every syscall the profile denies is called under the filter, in a child process of its own with
   arguments that make it a no-op, and must fail with EPERM; the same calls without the filter must
   not (so each EPERM is the filter's, not the kernel's); fork, a plain clone and io_uring_setup
   must still work under it;
2. the real binary (`narad server start --dev`, loopback ports, a temporary data directory) runs
   under the filter (its /proc status must show the filter), serves a bounded workload (create
   topic, produce, batch produce, consume, batch consume, extend, nack, ack, batch ack, describe,
   /metrics) with the expected 2xx answers, and exits 0 on SIGTERM; a second boot on the same data
   directory recovers the log and serves the rest, and exits 0 on SIGTERM too.

The profile is read strictly: any key, action or operator this script does not implement fails
the check, so the filter under test cannot silently differ from the file.

Usage: /usr/bin/python3 helm/seccomp_check.py [PROFILE]
       /usr/bin/python3 helm/seccomp_check.py --exec-under PROFILE -- COMMAND [ARG...]
The second form loads the profile's filter and execs COMMAND under it. Needs libseccomp's Python
bindings: Debian's python3-seccomp, for the system Python (helm/test.sh installs it when missing).
Runs as root, as CI does. NARAD_BIN overrides target/debug/narad. Every wait and loop is bounded;
exit status 1 on failure.
"""

import ctypes
import errno
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from testlib import free_ports

ROOT = pathlib.Path(__file__).resolve().parent.parent
PROFILE = ROOT / "helm" / "narad" / "files" / "narad-seccomp.json"
BIN = pathlib.Path(os.environ.get("NARAD_BIN", ROOT / "target" / "debug" / "narad"))
BOOT_WAIT_S = 30
STOP_WAIT_S = 20
PROBE_WAIT_S = 60
HTTP_TIMEOUT_S = 5
MESSAGES_SINGLE = 20
MESSAGES_BATCH = 100

# ---- The profile, read strictly ----

# The subset of the OCI runtime spec's LinuxSeccomp that Kubernetes hands to runc/crun for a
# Localhost profile, as far as this script implements it. containerd ignores keys it does not
# know (CRI-O reads some of Docker's extra ones, such as includes/excludes): a key outside this
# set could mean different filters on different nodes, so it is refused.
TOP_KEYS = {"defaultAction", "defaultErrnoRet", "architectures", "syscalls"}
RULE_KEYS = {"names", "action", "errnoRet", "args", "comment"}
ARG_KEYS = {"index", "value", "valueTwo", "op"}
ACTIONS = {"SCMP_ACT_ALLOW", "SCMP_ACT_ERRNO"}
OPS = {"SCMP_CMP_NE", "SCMP_CMP_LT", "SCMP_CMP_LE", "SCMP_CMP_EQ", "SCMP_CMP_GE", "SCMP_CMP_GT", "SCMP_CMP_MASKED_EQ"}


class ProfileError(Exception):
    pass


def need(cond, msg):
    if not cond:
        raise ProfileError(msg)


def read_profile(path):
    """The profile as (default action, default errno, architectures, rules); each rule is
    (names, action, errno, args) with args a tuple of (index, op, value, valueTwo)."""
    doc = json.loads(pathlib.Path(path).read_text())
    need(isinstance(doc, dict), "the profile is not a JSON object")
    need(not set(doc) - TOP_KEYS, f"unknown top-level keys {sorted(set(doc) - TOP_KEYS)}")
    default = doc.get("defaultAction")
    need(default in ACTIONS, f"defaultAction {default!r} not one of {sorted(ACTIONS)}")
    default_errno = doc.get("defaultErrnoRet")
    need(default_errno is None or default == "SCMP_ACT_ERRNO", "defaultErrnoRet without SCMP_ACT_ERRNO")
    if default == "SCMP_ACT_ERRNO":
        need(isinstance(default_errno, int) and default_errno > 0, "SCMP_ACT_ERRNO default needs defaultErrnoRet")
    arches = doc.get("architectures", [])
    need(isinstance(arches, list) and all(isinstance(a, str) for a in arches), "architectures is not a list of names")
    rules = []
    syscalls = doc.get("syscalls", [])
    need(isinstance(syscalls, list), "syscalls is not a list")
    for i, r in enumerate(syscalls):
        need(isinstance(r, dict), f"syscalls[{i}] is not an object")
        need(not set(r) - RULE_KEYS, f"syscalls[{i}]: unknown keys {sorted(set(r) - RULE_KEYS)}")
        names = r.get("names")
        need(isinstance(names, list) and names and all(isinstance(n, str) and n for n in names), f"syscalls[{i}]: names must be a non-empty list of names")
        need(len(set(names)) == len(names), f"syscalls[{i}]: a name twice")
        action = r.get("action")
        need(action in ACTIONS, f"syscalls[{i}]: action {action!r} not one of {sorted(ACTIONS)}")
        err = r.get("errnoRet")
        if action == "SCMP_ACT_ERRNO":
            # runc answers EPERM when errnoRet is absent; the profile says it outright.
            need(isinstance(err, int) and err > 0, f"syscalls[{i}]: SCMP_ACT_ERRNO needs a positive errnoRet")
        else:
            need(err is None, f"syscalls[{i}]: errnoRet on {action}")
        need(isinstance(r.get("comment", ""), str), f"syscalls[{i}]: comment is not a string")
        args = []
        raw_args = r.get("args", [])
        need(isinstance(raw_args, list), f"syscalls[{i}]: args is not a list")
        for j, a in enumerate(raw_args):
            need(isinstance(a, dict), f"syscalls[{i}].args[{j}] is not an object")
            need(not set(a) - ARG_KEYS, f"syscalls[{i}].args[{j}]: unknown keys {sorted(set(a) - ARG_KEYS)}")
            index, op = a.get("index"), a.get("op")
            value, value_two = a.get("value"), a.get("valueTwo", 0)
            need(isinstance(index, int) and 0 <= index <= 5, f"syscalls[{i}].args[{j}]: index {index!r}")
            need(op in OPS, f"syscalls[{i}].args[{j}]: op {op!r} not one of {sorted(OPS)}")
            need(all(isinstance(x, int) and 0 <= x < 2**64 for x in (value, value_two)), f"syscalls[{i}].args[{j}]: value/valueTwo must be 64-bit unsigned integers")
            need(op == "SCMP_CMP_MASKED_EQ" or "valueTwo" not in a, f"syscalls[{i}].args[{j}]: valueTwo is only meaningful with SCMP_CMP_MASKED_EQ")
            args.append((index, op, value, value_two))
        # runc ANDs the conditions of one rule only when they name distinct arguments, and makes
        # each a rule of its own (ORs them) otherwise: refuse that surprise.
        need(len({a[0] for a in args}) == len(args), f"syscalls[{i}]: two conditions on one argument (runc would OR them)")
        rules.append((tuple(names), action, err, tuple(args)))
    # A name with rules of different actions (io_uring_enter allowed, and denied further down) is
    # refused: the deny would win without anyone reading the allow rule noticing.
    by_name = {}
    for names, action, _, args in rules:
        for n in names:
            by_name.setdefault(n, set()).add((action, bool(args)))
    for n, kinds in by_name.items():
        need(len({a for a, _ in kinds}) == 1, f"{n}: rules with different actions {sorted(kinds)}")
    return default, default_errno, arches, rules


def denied(profile):
    """{name: errno} of the syscalls denied whatever their arguments, and {name: [(conditions,
    errno)]} of those denied on their arguments."""
    default, _, _, rules = profile
    always, conditional = {}, {}
    for names, action, err, args in rules:
        if action == default:
            continue
        for n in names:
            if args:
                conditional.setdefault(n, []).append((args, err))
            else:
                always[n] = err
    both = set(always) & set(conditional)
    need(not both, f"{sorted(both)} denied both always and on arguments")
    return always, conditional


def build_filter(profile):
    """A libseccomp filter with the profile's semantics as runc builds it: rules whose action is
    the default action are skipped (libseccomp refuses them), every other rule is one
    seccomp_rule_add whose conditions are ANDed, and rules for the same syscall are ORed."""
    import seccomp

    def act(action, err):
        return seccomp.ALLOW if action == "SCMP_ACT_ALLOW" else seccomp.ERRNO(err)

    ops = {
        "SCMP_CMP_NE": seccomp.NE, "SCMP_CMP_LT": seccomp.LT, "SCMP_CMP_LE": seccomp.LE,
        "SCMP_CMP_EQ": seccomp.EQ, "SCMP_CMP_GE": seccomp.GE, "SCMP_CMP_GT": seccomp.GT,
        "SCMP_CMP_MASKED_EQ": seccomp.MASKED_EQ,
    }
    default, default_errno, arches, rules = profile
    f = seccomp.SyscallFilter(act(default, default_errno))
    for a in arches:
        need(a.startswith("SCMP_ARCH_") and hasattr(seccomp.Arch, a[len("SCMP_ARCH_"):]), f"architecture {a!r} unknown to libseccomp")
        arch = getattr(seccomp.Arch, a[len("SCMP_ARCH_"):])
        if arch & 0xFFFFFFFF != seccomp.system_arch():
            f.add_arch(arch)
    for names, action, err, args in rules:
        for n in names:
            nr = seccomp.resolve_syscall(seccomp.Arch.NATIVE, n)
            # runc skips a name it cannot resolve: a typo would deny nothing, silently.
            need(nr != -1, f"{n}: not a syscall name libseccomp knows")
            if nr < 0 or action == default:
                # A name libseccomp knows but this architecture lacks (iopl on arm64) is left out
                # by libseccomp itself; a rule with the default action is skipped by runc.
                continue
            # The profile's value is the mask and valueTwo the datum for MASKED_EQ, as in runc.
            f.add_rule(act(action, err), n, *[seccomp.Arg(i, ops[op], v, v2) for i, op, v, v2 in args])
    return f


def exec_under(profile_path, argv):
    f = build_filter(read_profile(profile_path))
    f.load()
    os.execvp(argv[0], argv)


# ---- Probes: every denied syscall, called with arguments that make it a no-op ----

ADDR = 1  # an unmapped address: a pointer argument the kernel answers with EFAULT
CLONE_NEWUSER = 0x10000000
SIGCHLD = 17

# The syscalls the profile denies whatever their arguments (check_denials holds the file to this
# list), each with arguments for which the kernel does nothing even with no filter loaded (the
# probe also runs unfiltered, as root): an invalid fd, flag, length or address makes it refuse the
# call, or the call is a query or a no-op. Each probe runs in a forked child, so one that succeeds
# (unshare, vhangup without a terminal) changes nothing the next one sees.
PROBE_ARGS = {
    "init_module": (ADDR, 0, ADDR),  # zero-length image: ENOEXEC
    "finit_module": (-1, ADDR, 0),
    "delete_module": (ADDR, 0),
    "create_module": (ADDR, 0),
    "kexec_load": (0, 0, ADDR, 0xDEAD0000),  # unknown flags: EINVAL (flags 0 with no segments would unload)
    "kexec_file_load": (-1, -1, 0, ADDR, 0),
    "reboot": (0, 0, 0, ADDR),  # wrong magic: EINVAL
    "mount": (ADDR, ADDR, ADDR, 0, ADDR),
    "umount2": (ADDR, 0),
    "pivot_root": (ADDR, ADDR),
    "chroot": (ADDR,),
    "fsopen": (ADDR, 0),
    "fsconfig": (-1, 0xFFFF, 0, 0, 0),
    "fsmount": (-1, 0, 0),
    "fspick": (-1, ADDR, 0),
    "move_mount": (-1, ADDR, -1, ADDR, 0),
    "open_tree": (-1, ADDR, 0),
    "mount_setattr": (-1, ADDR, 0, ADDR, 0),
    "unshare": (CLONE_NEWUSER,),  # succeeds unfiltered, in a child that then exits
    "setns": (-1, 0),
    "ptrace": (0x7FFFFFFF, 0, 0, 0),  # unknown request on pid 0 (PTRACE_TRACEME is 0: not that)
    "process_vm_readv": (0, ADDR, 1, ADDR, 1, 0),
    "process_vm_writev": (0, ADDR, 1, ADDR, 1, 0),
    "process_madvise": (-1, ADDR, 1, 0, 0),
    "kcmp": (0, 0, 0, 0, 0),
    "pidfd_getfd": (-1, -1, 0),
    "bpf": (0xFFFF, ADDR, 0),
    "perf_event_open": (ADDR, 0, -1, -1, 0),
    "userfaultfd": (0xFFFFFFFF,),
    "keyctl": (0xFFFF, 0, 0, 0, 0),
    "add_key": (ADDR, ADDR, ADDR, 0, 0),
    "request_key": (ADDR, ADDR, ADDR, 0),
    "open_by_handle_at": (-1, ADDR, 0),
    "name_to_handle_at": (-1, ADDR, ADDR, ADDR, 0),
    "swapon": (ADDR, 0),
    "swapoff": (ADDR,),
    "acct": (ADDR,),  # NULL would switch accounting off
    "quotactl": (0, ADDR, 0, ADDR),
    "quotactl_fd": (-1, 0, 0, ADDR),
    "syslog": (0xFFFF, 0, 0),
    "settimeofday": (0, 0),  # neither time nor zone: a no-op
    "clock_settime": (0xFFFF, ADDR),
    "clock_adjtime": (0xFFFF, ADDR),
    "adjtimex": (ADDR,),
    "personality": (0xFFFFFFFF,),  # the query form
    "iopl": (0,),  # the level every process has
    "ioperm": (0, 0, 0),
    "lookup_dcookie": (0, ADDR, 0),
    "vhangup": (),  # the probe runs in a new session, with no terminal to hang up
    "uselib": (ADDR,),
    "nfsservctl": (0, ADDR, ADDR),
    "fanotify_init": (0xFFFFFFFF, 0),
    "sethostname": (ADDR, 65),  # longer than a host name may be: EINVAL
    "setdomainname": (ADDR, 65),
}


def probe():
    """Run in a child process: calls io_uring_setup, fork, a plain clone and each syscall of
    PROBE_ARGS, each in a forked child, and prints {name: 0 or errno} as JSON."""
    import seccomp

    assert os.getsid(0) == os.getpid(), "the probe must lead its own session (vhangup)"
    try:
        os.close(os.open("/dev/tty", os.O_RDWR))
        raise AssertionError("the probe has a controlling terminal (vhangup would hang it up)")
    except OSError:
        pass
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long

    def call(name, *args):
        nr = seccomp.resolve_syscall(seccomp.Arch.NATIVE, name)
        if nr < 0:
            return None
        try:
            pid = os.fork()
        except OSError as e:
            return e.errno
        if pid == 0:
            try:
                r = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
                if name == "clone" and r == 0:
                    os._exit(0)  # the clone's own child
                e = ctypes.get_errno() if r == -1 else 0
                if name == "clone" and r > 0:
                    os.waitpid(r, 0)
                if name == "io_uring_setup" and r >= 0:
                    os.close(r)
                os._exit(e)
            except BaseException:
                os._exit(255)
        _, status = os.waitpid(pid, 0)
        return os.waitstatus_to_exitcode(status)

    params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
    out = {
        "io_uring_setup": call("io_uring_setup", 4, ctypes.addressof(params)),
        "fork": call("getpid"),  # call() forks: this is whether fork works
        "clone": call("clone", SIGCHLD, 0, 0, 0, 0),
    }
    for flag_name, flag in CLONE_NS_FLAGS.items():
        out[f"clone({flag_name})"] = call("clone", SIGCHLD | flag, 0, 0, 0, 0)
    for name, args in PROBE_ARGS.items():
        out[name] = call(name, *args)
    print(json.dumps(out))


# The namespace flags of clone's first argument (CLONE_NEWTIME, 0x80, is only for unshare and
# clone3: in clone's flags that bit is part of the exit signal).
CLONE_NS_FLAGS = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}


def run_probe(profile_path=None):
    cmd = [sys.executable, __file__, "--probe"]
    if profile_path:
        cmd = [sys.executable, __file__, "--exec-under", str(profile_path), "--"] + cmd
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=PROBE_WAIT_S, start_new_session=True, stdin=subprocess.DEVNULL)
    assert r.returncode == 0, f"probe {'under the filter ' if profile_path else ''}exited {r.returncode}: {r.stderr[-2000:]}"
    return json.loads(r.stdout)


CMP = {
    "SCMP_CMP_NE": lambda x, v, _: x != v, "SCMP_CMP_LT": lambda x, v, _: x < v,
    "SCMP_CMP_LE": lambda x, v, _: x <= v, "SCMP_CMP_EQ": lambda x, v, _: x == v,
    "SCMP_CMP_GE": lambda x, v, _: x >= v, "SCMP_CMP_GT": lambda x, v, _: x > v,
    "SCMP_CMP_MASKED_EQ": lambda x, mask, datum: x & mask == datum,
}


def check_denials(profile_path, profile):
    always, conditional = denied(profile)
    # PROBE_ARGS is the list of what the profile must deny: a rule dropped from the file, or one
    # added without a probe, fails here.
    missing, unprobed = set(PROBE_ARGS) - set(always), set(always) - set(PROBE_ARGS)
    assert not missing, f"the profile no longer denies {sorted(missing)}"
    assert not unprobed, f"denied without a probe in PROBE_ARGS: {sorted(unprobed)} (add harmless arguments for each)"
    assert set(conditional) <= {"clone"}, f"conditional denials this check cannot probe: {sorted(set(conditional) - {'clone'})}"
    # The answer each clone probe must get, from the profile's conditions on the probe's arguments.
    expected = dict(always)
    for flag_name, flag in CLONE_NS_FLAGS.items():
        probe_args = (SIGCHLD | flag, 0, 0, 0, 0, 0)
        hits = [err for conds, err in conditional.get("clone", []) if all(CMP[op](probe_args[i], v, v2) for i, op, v, v2 in conds)]
        assert hits, f"the profile lets clone create a namespace with {flag_name}"
        expected[f"clone({flag_name})"] = hits[0]
    bare = run_probe()
    under = run_probe(profile_path)
    assert under["fork"] == 0, f"fork failed under the filter ({errno.errorcode.get(under['fork'], under['fork'])}); every probe forks, so no other answer means anything"
    fails = []
    for name in ("io_uring_setup", "clone"):
        if under[name] != 0:
            fails.append(f"{name} failed under the filter: {errno.errorcode.get(under[name], under[name])}")
    for key, err in sorted(expected.items()):
        if under[key] is None:
            continue  # absent on this architecture
        if under[key] != err:
            fails.append(f"{key}: expected {errno.errorcode.get(err, err)} under the filter, got {errno.errorcode.get(under[key], under[key])}")
        if bare[key] == err:
            fails.append(f"{key}: {errno.errorcode.get(err, err)} without the filter too, so the probe cannot tell the filter's answer: pick other arguments")
    assert not fails, "\n  ".join(["denials:"] + fails)
    answers = sorted({errno.errorcode.get(e, str(e)) for e in expected.values()})
    print(f"     {len(always)} syscalls and clone with each of {len(CLONE_NS_FLAGS)} namespace flags answered {'/'.join(answers)} "
          f"under the filter and not without it; io_uring_setup, fork and a plain clone work under it")


# ---- The real broker under the filter ----


def http(method, url, body=None, headers=None):
    data = None
    headers = dict(headers or {})
    # The cross-site guard wants it on body-less POSTs (extend, nack, single ack) and batch consume.
    headers.setdefault("X-Narad-Client", "seccomp-check")
    if body is not None:
        if isinstance(body, (bytes, bytearray)):
            data = bytes(body)
            headers.setdefault("Content-Type", "application/octet-stream")
        else:
            data = json.dumps(body).encode()
            headers.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def expect(method, url, status, body=None, headers=None):
    got, text = http(method, url, body, headers)
    assert got == status, f"{method} {url}: expected {status}, got {got}: {text[:300]!r}"
    return json.loads(text) if text else None


def workload(base):
    """Create, produce, batch produce, consume, batch consume, extend, nack, ack, batch ack,
    describe, metrics; leaves MESSAGES_BATCH // 2 messages unconsumed for the recovery boot."""
    expect("POST", f"{base}/v1/topics", 201, {"name": "seccomp", "partitions": 3})
    for i in range(MESSAGES_SINGLE):
        expect("POST", f"{base}/v1/topics/seccomp/produce?key=k{i}", 202, f"single-{i}".encode())
    batch = {"messages": [{"payload": {"n": i}, "key": f"b{i}"} for i in range(MESSAGES_BATCH)]}
    eq(expect("POST", f"{base}/v1/topics/seccomp/produce/batch", 202, batch), {"accepted": MESSAGES_BATCH}, "batch produce")
    m = expect("GET", f"{base}/v1/topics/seccomp/consume?wait=2s", 200)
    expect("POST", f"{base}/v1/topics/seccomp/ack?receipt_handle={m['receipt_handle']}&extend=true", 204)
    expect("POST", f"{base}/v1/topics/seccomp/ack?receipt_handle={m['receipt_handle']}&extend=0", 204)
    consumed = 0
    for _ in range(MESSAGES_SINGLE + MESSAGES_BATCH):  # bounded: one message at least per round
        if consumed >= MESSAGES_SINGLE + MESSAGES_BATCH // 2:
            break
        m = expect("GET", f"{base}/v1/topics/seccomp/consume?wait=2s", 200)
        expect("POST", f"{base}/v1/topics/seccomp/ack?receipt_handle={m['receipt_handle']}", 204)
        consumed += 1
        got = expect("GET", f"{base}/v1/topics/seccomp/consume?wait=2s&max=10", 200)
        handles = [x["receipt_handle"] for x in got["messages"]]
        assert handles, "batch consume returned no messages"
        got = expect("POST", f"{base}/v1/topics/seccomp/ack", 200, {"receipt_handles": handles})
        consumed += len(handles)
    topic = expect("GET", f"{base}/v1/topics/seccomp", 200)
    assert topic["name"] == "seccomp", topic
    status, text = http("GET", f"{base}/metrics")
    eq(status, 200, "/metrics")
    assert b"narad_" in text, text[:300]
    return consumed


def drain(base, expected):
    """The second boot: every message not acked before the restart is served again and acked."""
    consumed = 0
    for _ in range(expected + 1):
        if consumed >= expected:
            break
        got = expect("GET", f"{base}/v1/topics/seccomp/consume?wait=2s&max=50", 200)
        handles = [x["receipt_handle"] for x in got["messages"]]
        expect("POST", f"{base}/v1/topics/seccomp/ack", 200, {"receipt_handles": handles})
        consumed += len(handles)
    eq(consumed, expected, "messages served after the restart")
    status, _ = http("GET", f"{base}/v1/topics/seccomp/consume?wait=100ms")
    eq(status, 204, "consume once all is acked")


def eq(actual, expected, what):
    assert actual == expected, f"{what}: expected {expected!r}, got {actual!r}"


def seccomp_status(pid):
    fields = {}
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        k, _, v = line.partition(":")
        fields[k] = v.strip()
    return fields.get("Seccomp"), fields.get("Seccomp_filters")


def under_filter(profile_path, data, api, cluster, fn):
    """Boots the broker under the profile's filter, runs fn(base), SIGTERMs it; asserts exit 0."""
    env = {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(data.parent),
        "NARAD_CLUSTER_ADDR": f"127.0.0.1:{cluster}",
    }
    log_path = data.parent / "log"
    cmd = [sys.executable, __file__, "--exec-under", str(profile_path), "--",
           str(BIN), "server", "start", "--dev", "--port", str(api), "--data-dir", str(data)]
    with open(log_path, "a") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{api}"
    try:
        deadline = time.monotonic() + BOOT_WAIT_S
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"narad exited with {proc.returncode} before ready")
            try:
                if http("GET", f"{base}/readyz")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, f"not ready after {BOOT_WAIT_S}s"
            time.sleep(0.1)
        # The wrapper exec'd narad in place: this pid is the broker, and its filter is the profile's.
        exe = os.readlink(f"/proc/{proc.pid}/exe")
        eq(pathlib.Path(exe).name, BIN.name, "the process under the filter")
        eq(seccomp_status(proc.pid), ("2", "1"), "/proc/<narad>/status Seccomp, Seccomp_filters")
        result = fn(base)
    except Exception as e:
        # Stop it before reporting, and report both what failed and how it stopped.
        raise AssertionError(f"{e}; then {stop(proc)}; log tail: {log_path.read_text()[-1500:]!r}") from e
    finally:
        if proc.poll() is None and sys.exc_info()[0] is not None:
            proc.kill()  # interrupted: leave nothing running
            proc.wait(timeout=STOP_WAIT_S)
    how = stop(proc)
    assert how == "exit status 0 after SIGTERM", f"{how}; log tail: {log_path.read_text()[-1500:]!r}"
    return result


def stop(proc):
    """SIGTERM, as the kubelet sends it; SIGKILL after STOP_WAIT_S. Says how the process ended."""
    if proc.poll() is not None:
        return f"it had already exited with {proc.returncode}"
    proc.send_signal(signal.SIGTERM)
    try:
        return f"exit status {proc.wait(timeout=STOP_WAIT_S)} after SIGTERM"
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=STOP_WAIT_S)
        return f"it ignored SIGTERM for {STOP_WAIT_S}s and was killed"


def check_broker(profile_path):
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="narad-seccomp-"))
    try:
        data = tmp / "data"
        api, cluster = free_ports(2)
        consumed = under_filter(profile_path, data, api, cluster, workload)
        left = MESSAGES_SINGLE + MESSAGES_BATCH - consumed
        assert left > 0, "the workload left nothing for the restart to recover"
        api, cluster = free_ports(2)
        under_filter(profile_path, data, api, cluster, lambda base: drain(base, left))
        print(f"     narad served {MESSAGES_SINGLE} + {MESSAGES_BATCH} messages under the filter, "
              f"recovered the {left} unacked ones after a restart, and exited 0 on SIGTERM twice")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(argv):
    if argv[:1] == ["--exec-under"]:
        assert len(argv) >= 4 and argv[2] == "--", "usage: --exec-under PROFILE -- COMMAND [ARG...]"
        exec_under(argv[1], argv[3:])
    if argv == ["--probe"]:
        probe()
        return 0
    sys.stdout.reconfigure(line_buffering=True)
    profile_path = pathlib.Path(argv[0]) if argv else PROFILE
    print(f"profile {profile_path}, binary {BIN}")
    if not BIN.exists():
        print(f"FAIL: {BIN} does not exist (cargo build --bin narad, or set NARAD_BIN)")
        return 1
    if os.geteuid() != 0:
        # Unfiltered, the kernel itself would answer EPERM to most probes (capability checks), and
        # the probes could no longer tell the filter's answer from the kernel's.
        print("FAIL: run as root (as CI does)")
        return 1
    failed = 0
    try:
        profile = read_profile(profile_path)
        build_filter(profile)
        always, conditional = denied(profile)
        print(f"ok   profile: default {profile[0]}, {len(always)} syscalls denied, "
              f"{sum(len(c) for c in conditional.values())} conditional denials on {sorted(conditional)}")
    except (ProfileError, ValueError, OSError) as e:
        print(f"FAIL profile: {e}")
        return 1
    for name, fn in [("denied syscalls are refused", lambda: check_denials(profile_path, profile)),
                     ("broker under the filter", lambda: check_broker(profile_path))]:
        t = time.monotonic()
        try:
            fn()
            print(f"ok   {name} ({time.monotonic() - t:.1f}s)")
        except Exception as e:  # both checks run; each failure is reported
            failed += 1
            print(f"FAIL {name}: {e}")
    print(f"{2 - failed}/2 checks passed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
