#!/usr/bin/env bash
# Checks the container image of Dockerfile (OPERATIONS.md §7) as far as that is possible without a
# Docker engine (CI has none):
#
# 1. static: Dockerfile and .dockerignore are parsed (line continuations, comments, stages, JSON
#    exec forms) and the runtime stage is held to §7: USER 10001, WORKDIR and VOLUME /var/lib/narad,
#    EXPOSE 7942 7943 6060 and 7942/udp, ENTRYPOINT ["narad"], CMD with exactly the §7 default args;
#    the builder stage, the binary's path, the narad user and group 10001 and the ownership of
#    /var/lib/narad; .dockerignore keeps build output and .git out but every file the build needs in;
# 2. the real binary ($CARGO_TARGET_DIR or target, then debug/narad, built here when older than the sources; NARAD_BIN
#    overrides) run the way the image runs it: as uid/gid 10001 with no supplementary groups, a
#    clean environment, HOME and a data directory owned by 10001, memlock 8 MiB, the ENTRYPOINT and
#    CMD read from the Dockerfile with only --addr moved to loopback, --cluster-port added and the
#    data directory moved to a temporary one; create a topic, produce (202), consume (the payload),
#    ack, then SIGTERM: exit 0 within 10 s;
# 3. the same with memlock 64 KiB: exits non-zero at once with the locked-memory message;
# 4. the same under a seccomp filter that refuses io_uring_setup with EPERM (as Docker's default
#    profile does): exits non-zero at once with the io_uring message. This needs libseccomp's Python
#    bindings (Debian's python3-seccomp, for /usr/bin/python3), installed with apt-get when missing
#    as helm/test.sh does; skipped only if that install fails.
#
# Runs as root (setpriv, prlimit), loopback only; every wait is bounded; the temporary directory and
# any broker it started are removed on exit. Prints ok/FAIL per check; exit status 1 on any FAIL.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

UID_GID=10001
MEMLOCK_OK=8388608   # bytes; what the image needs is >= 512 KiB (README: --ulimit memlock=-1)
MEMLOCK_LOW=65536    # Docker's frequent default
BOOT_WAIT_S=30
STOP_WAIT_S=10
FAIL_WAIT_S=5        # "at once": a refused start must be over within this
MEMLOCK_MSG="the locked-memory limit (ulimit -l) is $MEMLOCK_LOW bytes; Narad needs at least 524288 bytes"
IO_URING_MSG="io_uring is not available (Operation not permitted (os error 1)). Narad needs io_uring"

failed=0
passed=0
ok() { passed=$((passed + 1)); echo "ok   $*"; }
fail() { failed=$((failed + 1)); echo "FAIL $*"; }

if [ "$(id -u)" != 0 ]; then
    echo "FAIL run as root (setpriv and prlimit change the user and limits), as CI does"
    exit 1
fi
for tool in python3 setpriv prlimit curl timeout; do
    command -v "$tool" >/dev/null 2>&1 || { echo "FAIL $tool is missing"; exit 1; }
done

tmp="$(realpath "$(mktemp -d "${TMPDIR:-/tmp}/narad-container-check.XXXXXX")")"
pid=""
cleanup() {
    if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
        kill -KILL "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# uid 10001 must reach its directories in here.
chmod 0755 "$tmp"

# ---- 1. Static checks of Dockerfile and .dockerignore ----

# Writes the runtime stage's ENTRYPOINT + CMD, one argument per line, to $tmp/argv; prints one
# ok/FAIL line per check.
python3 - Dockerfile .dockerignore "$tmp/argv" >"$tmp/static" 2>&1 <<'PY'
import json, os, re, shlex, subprocess, sys

dockerfile, dockerignore, argv_out = sys.argv[1:4]
failures = 0


def check(name, fn):
    global failures
    try:
        detail = fn()
        print(f"ok   {name}" + (f": {detail}" if detail else ""))
    except Exception as e:  # every check runs; an unexpected error is that check's failure
        failures += 1
        print(f"FAIL {name}: {e if isinstance(e, AssertionError) else repr(e)}")


def parse(path):
    """[(instruction, args, line)] as Docker's parser sees them: parser directives, comment lines
    (also inside continuations), backslash continuations; heredocs are refused, not guessed at."""
    lines = open(path, encoding="utf-8").read().splitlines()
    escape = "\\"
    i = 0
    while i < len(lines):  # parser directives: only at the very top
        m = re.match(r"^#\s*([a-zA-Z][a-zA-Z0-9]*)\s*=\s*(.+?)\s*$", lines[i])
        if not m:
            break
        if m.group(1).lower() == "escape":
            escape = m.group(2)
        i += 1
    out, buf, start = [], None, 0
    for n, raw in enumerate(lines[i:], start=i + 1):
        s = raw.strip()
        if not s or s.startswith("#"):  # also inside a continuation, as Docker's parser does
            continue
        if buf is None:
            buf, start = "", n
        if s.endswith(escape):
            buf += s[: -len(escape)] + " "
            continue
        buf += s
        word, _, args = buf.strip().partition(" ")
        assert "<<" not in args or word.upper() not in ("RUN", "COPY"), f"line {start}: heredocs are not parsed by this check"
        out.append((word.upper(), args.strip(), start))
        buf = None
    assert buf is None, "the file ends inside a line continuation"
    return out


def exec_form(args, what):
    try:
        v = json.loads(args)
    except ValueError:
        v = None
    assert isinstance(v, list) and all(isinstance(x, str) for x in v), \
        f"{what} is not in exec form (a JSON array of strings): {args!r}; the shell form would make /bin/sh PID 1, which does not pass SIGTERM on"
    return v


def shell_commands(run):
    """A RUN line as its simple commands (split on && ; ||), each a token list."""
    toks = shlex.split(run, posix=True)
    cmds, cur = [], []
    for t in toks:
        if t in ("&&", ";", "||"):
            cmds.append(cur)
            cur = []
        else:
            cur.append(t)
    cmds.append(cur)
    return [c for c in cmds if c]


def opt(cmd, *names):
    """The value of an option given as --name value, --name=value or -n value."""
    for k, t in enumerate(cmd):
        for n in names:
            if t == n and k + 1 < len(cmd):
                return cmd[k + 1]
            if n.startswith("--") and t.startswith(n + "="):
                return t[len(n) + 1:]
    return None


try:
    instrs = parse(dockerfile)
except (OSError, AssertionError, UnicodeDecodeError) as e:
    print(f"FAIL Dockerfile could not be parsed: {e}")
    sys.exit(1)

stages, stage = [], None
for ins, args, line in instrs:
    if ins == "FROM":
        toks = args.split()
        toks = [t for t in toks if not t.startswith("--platform=")]
        name = toks[2] if len(toks) == 3 and toks[1].lower() == "as" else None
        stage = {"image": toks[0], "name": name, "line": line, "instrs": []}
        stages.append(stage)
    elif stage is None:
        assert ins == "ARG", f"line {line}: {ins} before the first FROM"
    else:
        stage["instrs"].append((ins, args, line))
if not stages:
    print("FAIL Dockerfile has no FROM")
    sys.exit(1)
final = stages[-1]


def of(st, ins):
    return [(a, l) for i, a, l in st["instrs"] if i == ins]


def last(st, ins):
    v = of(st, ins)
    assert v, f"no {ins} in the runtime stage"
    return v[-1][0]


def c_stages():
    assert len(stages) == 2, f"expected 2 stages (builder, runtime), found {len(stages)}"
    b = stages[0]
    assert b["image"] == "rust:1.95-bookworm" and b["name"], f"builder stage: FROM {b['image']} AS {b['name']} (want rust:1.95-bookworm AS <name>)"
    assert final["image"] == "debian:bookworm-slim", f"runtime stage: FROM {final['image']} (want debian:bookworm-slim)"
    return f"{b['image']} AS {b['name']} -> {final['image']}"


def c_build():
    b = stages[0]
    for run, line in of(b, "RUN"):
        for cmd in shell_commands(run):
            if cmd[:2] == ["cargo", "build"]:
                flags = set(cmd[2:])
                assert {"--release", "--locked"} <= flags, f"line {line}: cargo build without --release --locked: {' '.join(cmd)}"
                assert opt(cmd, "--bin") == "narad" and opt(cmd, "-p", "--package") == "narad", f"line {line}: want --bin narad -p narad: {' '.join(cmd)}"
                return " ".join(cmd)
    raise AssertionError("no cargo build in the builder stage")


def c_binary():
    b = stages[0]
    for args, line in of(final, "COPY"):
        toks = args.split()
        frm = [t for t in toks if t.startswith("--from=")]
        paths = [t for t in toks if not t.startswith("--")]
        if frm and paths[-1] in ("/usr/local/bin/narad", "/usr/local/bin/"):
            assert frm[0][len("--from="):] in (b["name"], "0"), f"line {line}: copied from {frm[0]}, not the builder stage"
            return f"COPY {args}"
    raise AssertionError("no COPY --from=<builder> ... /usr/local/bin/narad in the runtime stage")


def c_packages():
    pkgs = []
    for run, line in of(final, "RUN"):
        for cmd in shell_commands(run):
            if cmd[:2] == ["apt-get", "install"]:
                assert "--no-install-recommends" in cmd, f"line {line}: apt-get install without --no-install-recommends"
                pkgs += [t for t in cmd[2:] if not t.startswith("-")]
    assert pkgs == ["ca-certificates"], f"runtime packages {pkgs} (want ca-certificates only)"
    return "ca-certificates only"


def c_account():
    group = user = owned = False
    for run, line in of(final, "RUN"):
        for cmd in shell_commands(run):
            if cmd[0] in ("groupadd", "addgroup"):
                group |= opt(cmd, "--gid", "-g") == "10001" and cmd[-1] == "narad"
            elif cmd[0] in ("useradd", "adduser"):
                user |= (opt(cmd, "--uid", "-u") == "10001" and opt(cmd, "--gid", "-g") in ("10001", "narad")
                         and cmd[-1] == "narad")
            elif cmd[0] == "install" and "-d" in cmd and cmd[-1] == "/var/lib/narad":
                owned |= opt(cmd, "-o", "--owner") in ("10001", "narad") and opt(cmd, "-g", "--group") in ("10001", "narad")
            elif cmd[0] == "chown" and cmd[-1] == "/var/lib/narad":
                owned |= cmd[-2] in ("10001:10001", "narad:narad")
    missing = [w for w, ok in (("group narad with gid 10001", group), ("user narad with uid 10001 in group 10001", user),
                                ("/var/lib/narad owned by 10001:10001", owned)) if not ok]
    assert not missing, "the runtime stage does not create " + ", ".join(missing)
    return "narad 10001:10001 owns /var/lib/narad"


def c_user():
    u = last(final, "USER")
    assert u in ("10001", "10001:10001"), f"USER {u} (want 10001 or 10001:10001, numeric so runAsNonRoot can check it)"
    return f"USER {u}"


def c_workdir():
    w = last(final, "WORKDIR")
    assert w == "/var/lib/narad", f"WORKDIR {w}"
    return f"WORKDIR {w}"


def c_volume():
    vols = []
    for args, _ in of(final, "VOLUME"):
        vols += json.loads(args) if args.startswith("[") else args.split()
    assert vols == ["/var/lib/narad"], f"VOLUME {vols} (want /var/lib/narad only)"
    return "VOLUME /var/lib/narad"


def c_expose():
    ports = set()
    for args, _ in of(final, "EXPOSE"):
        for p in args.split():
            ports.add(p if "/" in p else p + "/tcp")
    want = {"7942/tcp", "7943/tcp", "6060/tcp", "7942/udp"}
    assert ports == want, f"EXPOSE {sorted(ports)} (want {sorted(want)})"
    return "EXPOSE " + " ".join(sorted(ports))


def c_entrypoint():
    e = exec_form(last(final, "ENTRYPOINT"), "ENTRYPOINT")
    assert e == ["narad"], f"ENTRYPOINT {e} (want [\"narad\"])"
    return json.dumps(e)


def c_cmd():
    c = exec_form(last(final, "CMD"), "CMD")
    want = ["serve", "--addr=0.0.0.0:7942", "--data-dir=/var/lib/narad"]
    assert c == want, f"CMD {c} (want {want})"
    argv = exec_form(last(final, "ENTRYPOINT"), "ENTRYPOINT") + c
    with open(argv_out, "w") as f:
        f.write("\n".join(argv) + "\n")
    return json.dumps(c)


def c_env():
    bad = [a for a, _ in of(final, "ENV") if "NARAD_" in a]
    assert not bad, f"the runtime stage sets {bad}: the image must keep the secure defaults"
    return None


def ignore_patterns():
    pats = []
    for raw in open(dockerignore, encoding="utf-8").read().splitlines():
        s = raw.strip()
        if not s or s.startswith("#"):
            continue
        neg = s.startswith("!")
        s = os.path.normpath(s[1:].strip() if neg else s).lstrip("/")
        rx, k = "", 0
        while k < len(s):  # moby/patternmatcher: ** any path, * and ? within a segment
            ch = s[k]
            if s.startswith("**/", k):
                rx, k = rx + "(.*/)?", k + 3
                continue
            if s.startswith("**", k):
                rx, k = rx + ".*", k + 2
                continue
            rx += {"*": "[^/]*", "?": "[^/]"}.get(ch, re.escape(ch))
            k += 1
        pats.append((re.compile("^" + rx + "$"), neg, raw.strip()))
    return pats


def excluded(pats, path):
    """Whether the build context leaves path out: the last pattern matching the path or one of its
    parent directories decides."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: k + 1]) for k in range(len(parts))]
    out = False
    for rx, neg, _ in pats:
        if any(rx.match(p) for p in prefixes):
            out = not neg
    return out


def c_dockerignore():
    pats = ignore_patterns()
    for p in (".git/HEAD", "target/release/narad", "fuzz/target/x/release/http_parse", "bench/target/x"):
        assert excluded(pats, p), f"{p} would be sent to the build (add it to .dockerignore)"
    try:
        import tomllib
        manifest = tomllib.load(open("Cargo.toml", "rb"))
        members = manifest["workspace"]["members"]
        # Path patches (vendor/glommio) are built too, though not members.
        patched = [v["path"] for v in manifest.get("patch", {}).get("crates-io", {}).values() if "path" in v]
    except ImportError:  # Python < 3.11
        text = open("Cargo.toml").read()
        members = re.findall(r'"([^"]+)"', re.search(r"^members\s*=\s*\[(.*?)\]", text, re.M | re.S).group(1))
        patch = re.search(r"^\[patch\.crates-io\](.*?)(?=^\[|\Z)", text, re.M | re.S)
        patched = re.findall(r'path\s*=\s*"([^"]+)"', patch.group(1)) if patch else []
    roots = ["Cargo.toml", "Cargo.lock", "build.rs", "docs"] + [("src" if m == "." else m) for m in members] + patched
    try:
        files = subprocess.run(["git", "ls-files", "--", *roots], capture_output=True, text=True, check=True).stdout.split()
    except (OSError, subprocess.CalledProcessError):
        files = [os.path.join(d, f) for r in roots for d, _, fs in os.walk(r) for f in fs] + [r for r in roots if os.path.isfile(r)]
    assert len(files) > 10, f"found only {len(files)} source files under {roots}"
    left_out = [f for f in files if excluded(pats, f)]
    assert not left_out, f"the build needs {left_out[:5]} but .dockerignore leaves them out"
    return f"{len(pats)} patterns; the {len(files)} files of {', '.join(roots)} stay in"


for name, fn in [("Dockerfile stages", c_stages), ("Dockerfile builder: cargo build", c_build),
                 ("Dockerfile binary at /usr/local/bin/narad", c_binary), ("Dockerfile runtime packages", c_packages),
                 ("Dockerfile user and group", c_account), ("Dockerfile USER", c_user),
                 ("Dockerfile WORKDIR", c_workdir), ("Dockerfile VOLUME", c_volume), ("Dockerfile EXPOSE", c_expose),
                 ("Dockerfile ENTRYPOINT", c_entrypoint), ("Dockerfile CMD", c_cmd),
                 ("Dockerfile sets no NARAD_* environment", c_env), (".dockerignore", c_dockerignore)]:
    check(name, fn)
sys.exit(1 if failures else 0)
PY
static_rc=$?
cat "$tmp/static"
static_ok=$(grep -c '^ok ' "$tmp/static")
static_fail=$(grep -c '^FAIL ' "$tmp/static")
if [ "$static_rc" != 0 ] && [ "$static_fail" = 0 ]; then
    static_fail=1
    echo "FAIL static checks: the checker exited $static_rc"
fi
passed=$((passed + static_ok))
failed=$((failed + static_fail))

# ---- The binary ----

bin="${NARAD_BIN:-${CARGO_TARGET_DIR:-target}/debug/narad}"
if [ -z "${NARAD_BIN:-}" ]; then
    sources=(Cargo.toml Cargo.lock src io shard raft bench docs)
    if [ ! -x "$bin" ] || [ -n "$(find "${sources[@]}" -newer "$bin" -type f -print -quit 2>/dev/null)" ]; then
        echo "     building $bin (older than the sources)"
        if ! timeout 1200 cargo build --quiet --bin narad; then
            echo "FAIL cargo build --bin narad"
            exit 1
        fi
    fi
fi
bin="$(realpath "$bin")"
# The image has it at /usr/local/bin/narad; here uid 10001 must be able to run it where it is, or
# from a copy (a checkout under /root is closed to other users).
if ! setpriv --reuid=$UID_GID --regid=$UID_GID --clear-groups test -x "$bin"; then
    cp "$bin" "$tmp/narad"
    chmod 0755 "$tmp/narad"
    bin="$tmp/narad"
fi
echo "     binary $bin"

if [ -s "$tmp/argv" ]; then
    mapfile -t image_argv <"$tmp/argv"
else
    # The CMD check failed and said why; run the §7 command line regardless.
    image_argv=(narad serve --addr=0.0.0.0:7942 --data-dir=/var/lib/narad)
fi

read -r api_port cluster_port < <(python3 -c '
import socket
socks = [socket.socket() for _ in range(2)]
for s in socks:
    s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in socks])')

# The image's command line with the broker's own paths and loopback ports: ENTRYPOINT narad is
# this binary, --addr moves to loopback, the data directory to $1.
narad_argv() {
    local data="$1" a
    argv=("$bin")
    for a in "${image_argv[@]:1}"; do
        case "$a" in
            --addr=*) argv+=("--addr=127.0.0.1:$api_port") ;;
            --data-dir=*) argv+=("--data-dir=$data") ;;
            *) argv+=("$a") ;;
        esac
    done
    argv+=(--cluster-port "$cluster_port")
}

# A fresh data directory and HOME owned by 10001 (the image's /var/lib/narad).
fresh_dirs() {
    rm -rf "${tmp:?}/${1:?}"
    install -d -o $UID_GID -g $UID_GID -m 0750 "$tmp/$1" "$tmp/$1/data" "$tmp/$1/home"
}

# Becomes (exec) the command in the remaining arguments as the image's user, with a clean
# environment as a container has, HOME $2 and memlock $1 (bytes). Call it in a subshell: ( ... )
# or ... & (then $! is the broker's pid: env, prlimit and setpriv exec in place too).
as_image_user() {
    local memlock="$1" home="$2"
    shift 2
    exec env -i PATH=/usr/local/bin:/usr/bin:/bin HOME="$home" NARAD_SECURITY_ENABLED=false \
        prlimit --memlock="$memlock:$memlock" \
        setpriv --reuid=$UID_GID --regid=$UID_GID --clear-groups "$@"
}

# ---- 2. Serving as uid 10001 ----

base="http://127.0.0.1:$api_port"
CURL=(curl -sS --max-time 10 -H 'X-Narad-Client: container-check')
msg=""
log_tail() { tail -c 1500 "$1" | tr '\n' ' '; }

# Not in a subshell, so that $pid stays known to the cleanup on every path; says why in $msg.
serve_check() {
    local log="$tmp/serve/log" status handle i t0 rc foreign
    fresh_dirs serve
    narad_argv "$tmp/serve/data"
    as_image_user $MEMLOCK_OK "$tmp/serve/home" "${argv[@]}" >"$log" 2>&1 </dev/null &
    pid=$!
    for ((i = 0; i < BOOT_WAIT_S * 10; i++)); do
        if ! kill -0 "$pid" 2>/dev/null; then
            wait "$pid"
            rc=$?
            pid=""
            msg="exited with $rc before it was ready; log: $(log_tail "$log")"
            return 1
        fi
        [ "$("${CURL[@]}" -o /dev/null -w '%{http_code}' "$base/readyz" 2>/dev/null)" = 200 ] && break
        sleep 0.1
    done
    [ "$i" -lt $((BOOT_WAIT_S * 10)) ] || { msg="not ready after ${BOOT_WAIT_S}s; log: $(log_tail "$log")"; return 1; }
    # The pid is the broker itself, as PID 1 is in the container.
    [ "$(readlink "/proc/$pid/exe")" = "$bin" ] || { msg="pid $pid is $(readlink "/proc/$pid/exe"), not the broker"; return 1; }
    if ! grep -Eq "^Uid:\s+$UID_GID\s+$UID_GID\s+$UID_GID\s+$UID_GID\s*$" "/proc/$pid/status" ||
        ! grep -Eq "^Gid:\s+$UID_GID\s+$UID_GID\s+$UID_GID\s+$UID_GID\s*$" "/proc/$pid/status" ||
        ! grep -Eq "^Groups:\s*$" "/proc/$pid/status"; then
        msg="not running as $UID_GID:$UID_GID without groups: $(grep -E '^(Uid|Gid|Groups):' "/proc/$pid/status" | tr '\n\t' '  ')"
        return 1
    fi
    grep -Eq "^Max locked memory\s+$MEMLOCK_OK\s+$MEMLOCK_OK\s+bytes" "/proc/$pid/limits" ||
        { msg="memlock limit: $(grep 'Max locked memory' "/proc/$pid/limits")"; return 1; }

    # The README quickstart: create a topic, produce, consume, ack.
    status="$("${CURL[@]}" -o "$tmp/serve/topic" -w '%{http_code}' -X POST "$base/v1/topics" \
        -H 'Content-Type: application/json' -d '{"name":"orders","partitions":3}')"
    [ "$status" = 201 ] || { msg="create topic: $status $(cat "$tmp/serve/topic")"; return 1; }
    status="$("${CURL[@]}" -o "$tmp/serve/produce" -w '%{http_code}' -X POST \
        "$base/v1/topics/orders/produce?key=customer-42" \
        -H 'Content-Type: application/json' -d '{"order_id":"ord_123","amount":4999}')"
    [ "$status" = 202 ] || { msg="produce: $status $(cat "$tmp/serve/produce")"; return 1; }
    status="$("${CURL[@]}" -o "$tmp/serve/consume" -w '%{http_code}' "$base/v1/topics/orders/consume?wait=5s")"
    [ "$status" = 200 ] || { msg="consume: $status $(cat "$tmp/serve/consume")"; return 1; }
    if ! handle="$(python3 - "$tmp/serve/consume" 2>&1 <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
assert m["payload"] == {"order_id": "ord_123", "amount": 4999}, f"payload {m['payload']!r}"
assert m["key"] == "customer-42", f"key {m['key']!r}"
print(m["receipt_handle"])
PY
)"; then
        msg="consume answered $(cat "$tmp/serve/consume"): $(echo "$handle" | tail -1)"
        return 1
    fi
    status="$("${CURL[@]}" -o /dev/null -w '%{http_code}' -X POST "$base/v1/topics/orders/ack?receipt_handle=$handle")"
    [ "$status" = 204 ] || { msg="ack: $status"; return 1; }
    # Everything the broker wrote belongs to the image user (a volume it could not write would not).
    foreign="$(find "$tmp/serve/data" "$tmp/serve/home" \( ! -uid $UID_GID -o ! -gid $UID_GID \) -print -quit)"
    [ -z "$foreign" ] || { msg="$foreign is not owned by $UID_GID:$UID_GID"; return 1; }

    t0=$(date +%s%N)
    kill -TERM "$pid"
    for ((i = 0; i < STOP_WAIT_S * 10; i++)); do
        kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
        msg="still running ${STOP_WAIT_S}s after SIGTERM; log: $(log_tail "$log")"
        return 1
    fi
    wait "$pid"
    rc=$?
    pid=""
    [ "$rc" = 0 ] || { msg="exit status $rc after SIGTERM; log: $(log_tail "$log")"; return 1; }
    msg="ready, topic created, produce 202, payload consumed and acked; exit 0 $((($(date +%s%N) - t0) / 1000000)) ms after SIGTERM"
}

name="serves as uid/gid $UID_GID, memlock $MEMLOCK_OK, the image's command line"
if serve_check; then ok "$name: $msg"; else fail "$name: $msg"; fi
if [ -n "$pid" ]; then  # a failed check may leave it running
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    pid=""
fi
# glommio registers its I/O buffers in locked memory; as a user without CAP_IPC_LOCK under a small
# memlock limit it may not manage, and goes on without (a warning, not a failure).
# The broker words glommio's warning itself (src/logging.rs); the raw text must not show.
if [ -f "$tmp/serve/log" ] && grep -q 'registering buffers' "$tmp/serve/log"; then
    fail "glommio's raw buffer-registration warning reached the log: $(grep -m1 'registering buffers' "$tmp/serve/log" | cut -c1-200)"
elif [ -f "$tmp/serve/log" ] && grep -q 'buffer registration skipped' "$tmp/serve/log"; then
    echo "     note: WARN \"io_uring buffer registration skipped on this shard\" $(grep -c 'buffer registration skipped' "$tmp/serve/log") time(s); served without registered buffers"
fi

# ---- 3. and 4. Refused starts ----

# Runs the image's command line under memlock $2, through the wrapper in the remaining arguments,
# and expects it to exit non-zero within FAIL_WAIT_S with $3 on stderr; says how in $msg.
refused_check() {
    local dir="$1" memlock="$2" expect="$3" rc t0 elapsed_ms
    shift 3
    fresh_dirs "$dir"
    narad_argv "$tmp/$dir/data"
    t0=$(date +%s%N)
    (as_image_user "$memlock" "$tmp/$dir/home" timeout -k 2 "$FAIL_WAIT_S" "$@" "${argv[@]}") \
        >"$tmp/$dir/stdout" 2>"$tmp/$dir/stderr" </dev/null
    rc=$?
    elapsed_ms=$((($(date +%s%N) - t0) / 1000000))
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        msg="still running after ${FAIL_WAIT_S}s; stderr: $(log_tail "$tmp/$dir/stderr")"
        return 1
    fi
    [ "$rc" != 0 ] || { msg="exit status 0; stderr: $(log_tail "$tmp/$dir/stderr")"; return 1; }
    if ! grep -qF "$expect" "$tmp/$dir/stderr"; then
        msg="exit status $rc but stderr lacks \"$expect\": $(log_tail "$tmp/$dir/stderr")"
        return 1
    fi
    msg="exit status $rc after ${elapsed_ms} ms: $(grep -F "$expect" "$tmp/$dir/stderr" | head -1)"
}

name="refuses memlock $MEMLOCK_LOW"
if refused_check memlock $MEMLOCK_LOW "$MEMLOCK_MSG"; then ok "$name: $msg"; else fail "$name: $msg"; fi

if ! /usr/bin/python3 -c 'import seccomp' >/dev/null 2>&1; then
    { timeout 300 apt-get update -qq &&
        DEBIAN_FRONTEND=noninteractive timeout 300 apt-get install -y -qq python3-seccomp >/dev/null; } ||
        echo "     python3-seccomp is missing and apt-get could not install it"
fi
if /usr/bin/python3 -c 'import seccomp' >/dev/null 2>&1; then
    # A filter that refuses io_uring_setup with EPERM, as Docker's default profile does (its
    # default errno is EPERM), and allows everything else; loaded by the image user's own
    # process, then the broker is exec'd under it.
    cat >"$tmp/no_io_uring.py" <<'PY'
import errno, os, sys
import seccomp
f = seccomp.SyscallFilter(seccomp.ALLOW)
f.add_rule(seccomp.ERRNO(errno.EPERM), "io_uring_setup")
f.load()
os.execv(sys.argv[1], sys.argv[1:])
PY
    chmod 0644 "$tmp/no_io_uring.py"
    name="refuses a seccomp filter without io_uring_setup (memlock $MEMLOCK_OK)"
    if refused_check io_uring $MEMLOCK_OK "$IO_URING_MSG" /usr/bin/python3 "$tmp/no_io_uring.py"; then
        ok "$name: $msg"
    else
        fail "$name: $msg"
    fi
else
    echo "skip refuses a seccomp profile without io_uring: /usr/bin/python3 cannot import seccomp"
fi

echo "$passed/$((passed + failed)) checks passed"
[ "$failed" = 0 ]
