//! Shared harness of the black-box tests: starts the real `narad` binary on a free loopback port
//! with a temporary data directory, and speaks HTTP/1.1 to it over a plain socket, as a user would.
#![allow(dead_code)]

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub mod cluster;
pub mod tls_front;

/// Longest a server may take to become ready.
const READY_WAIT_MAX: Duration = Duration::from_secs(60);

pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let base = std::env::var_os("NARAD_TEST_TMP")
            .map(PathBuf::from)
            .unwrap_or_else(std::env::temp_dir);
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_nanos();
        let p = base.join(format!("narad-test-{tag}-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&p).unwrap();
        TempDir(p)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        // Keep the data of a failed test for a post-mortem.
        if std::thread::panicking() {
            eprintln!("test data kept in {}", self.0.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Two consecutive free loopback ports (API and Raft), below the kernel's ephemeral port range
/// when it leaves room: there no outgoing connection of another test can take the port between
/// this check and the server's bind, and a readiness probe that connects before the server
/// listens can never connect to itself (a self-connected socket, and its TIME_WAIT, would
/// keep the server from binding). Each call of a test process tries the next pair.
pub fn free_port_pair() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    const LOW: u32 = 10_000;
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|r| r.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32_768);
    if ephemeral_low > LOW + 2_000 {
        let span = (ephemeral_low - LOW) / 2;
        let seed = std::process::id().wrapping_mul(7_919);
        for _ in 0..400 {
            let n = NEXT.fetch_add(1, Ordering::Relaxed);
            let p = (LOW + 2 * (seed.wrapping_add(n) % span)) as u16;
            if TcpListener::bind(("127.0.0.1", p)).is_ok()
                && TcpListener::bind(("127.0.0.1", p + 1)).is_ok()
            {
                return p;
            }
        }
    }
    for _ in 0..200 {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let p = l.local_addr().unwrap().port();
        if p < 65000 && TcpListener::bind(("127.0.0.1", p + 1)).is_ok() {
            return p;
        }
    }
    panic!("no free port pair on loopback");
}

pub struct Server {
    pub port: u16,
    pub data_dir: PathBuf,
    child: Option<Child>,
    pub extra_env: Vec<(String, String)>,
}

impl Server {
    /// Starts `narad server start --dev` on a fresh data directory with 2 shards.
    pub fn start(dir: &TempDir) -> Server {
        Server::start_with(dir.0.join("data"), vec![])
    }

    pub fn start_with(data_dir: PathBuf, extra_env: Vec<(String, String)>) -> Server {
        let mut s = Server {
            port: free_port_pair(),
            data_dir,
            child: None,
            extra_env,
        };
        s.spawn();
        s
    }

    /// [`Server::start_with`] with the environment given as string pairs.
    pub fn start_env(data_dir: PathBuf, env: &[(&str, &str)]) -> Server {
        Server::start_with(
            data_dir,
            env.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        )
    }

    /// Like [`Server::start_with`], but returns as soon as the process runs, before it is
    /// ready (for tests that watch start-up); [`Server::wait_ready`] then waits for it.
    pub fn spawn_starting(data_dir: PathBuf, extra_env: Vec<(String, String)>) -> Server {
        let mut s = Server {
            port: free_port_pair(),
            data_dir,
            child: None,
            extra_env,
        };
        s.spawn_process();
        s
    }

    fn spawn(&mut self) {
        self.spawn_process();
        self.wait_ready();
    }

    fn spawn_process(&mut self) {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_narad"));
        cmd.args([
            "server",
            "start",
            "--dev",
            "--port",
            &self.port.to_string(),
            "--data-dir",
        ])
        .arg(&self.data_dir)
        .env("NARAD_SHARDS", "2")
        .env("NARAD_LOG_LEVEL", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
        cmd.envs(self.extra_env.iter().map(|(k, v)| (k, v)));
        self.child = Some(cmd.spawn().expect("start narad"));
    }

    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// Waits (at most a minute) until `/readyz` answers `200`.
    pub fn wait_ready(&mut self) {
        let start = Instant::now();
        loop {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("narad exited during start-up: {status}");
            }
            if let Ok(mut c) = Client::connect(self.addr()) {
                if let Ok(r) = c.try_request("GET", "/readyz", &[], b"") {
                    if r.status == 200 {
                        return;
                    }
                }
            }
            assert!(
                start.elapsed() < READY_WAIT_MAX,
                "narad not ready after {READY_WAIT_MAX:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn client(&self) -> Client {
        Client::connect(self.addr()).expect("connect to narad")
    }

    /// `kill -9`: nothing is flushed, nothing is closed.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends SIGTERM and returns at once (the process drains and exits on its own).
    pub fn signal_term(&self) {
        let c = self.child.as_ref().expect("running");
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
    }

    /// SIGTERM and wait for the exit status.
    pub fn terminate(&mut self) -> std::process::ExitStatus {
        self.signal_term();
        let mut c = self.child.take().expect("running");
        let start = Instant::now();
        loop {
            if let Some(s) = c.try_wait().unwrap() {
                return s;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "narad did not exit after SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Waits at most `limit` for the process to exit (after a signal): its status, or `None`
    /// if it still runs.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let start = Instant::now();
        loop {
            if let Some(s) = self.child.as_mut().expect("running").try_wait().unwrap() {
                self.child = None;
                return Some(s);
            }
            if start.elapsed() >= limit {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn restart(&mut self) {
        self.kill9();
        self.spawn();
    }

    /// The broker's process id (while it runs).
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill9();
    }
}

#[derive(Debug)]
pub struct Resp {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Resp {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {:?}", self.text()))
    }
    pub fn error(&self) -> String {
        self.json()["error"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    }
}

/// A keep-alive HTTP/1.1 client on a blocking socket.
pub struct Client {
    stream: BufReader<TcpStream>,
    addr: SocketAddr,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> std::io::Result<Client> {
        let s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        s.set_nodelay(true)?;
        s.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Client {
            stream: BufReader::new(s),
            addr,
        })
    }

    pub fn raw(&mut self) -> &mut TcpStream {
        self.stream.get_mut()
    }

    pub fn try_request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> std::io::Result<Resp> {
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n");
        for (k, v) in headers {
            req.push_str(&format!("{k}: {v}\r\n"));
        }
        if !body.is_empty() || matches!(method, "POST" | "PUT" | "PATCH") {
            req.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        req.push_str("\r\n");
        let s = self.stream.get_mut();
        s.write_all(req.as_bytes())?;
        // A server may answer (413) and close before reading a large body: like real clients,
        // read the answer even when the body write fails.
        let wrote = s.write_all(body);
        match self.read_response(method == "HEAD") {
            Ok(r) => Ok(r),
            Err(e) => Err(wrote.err().unwrap_or(e)),
        }
    }

    pub fn read_response(&mut self, head: bool) -> std::io::Result<Resp> {
        let mut line = String::new();
        if self.stream.read_line(&mut line)? == 0 {
            return Err(std::io::Error::new(
                std::io::ErrorKind::UnexpectedEof,
                "connection closed",
            ));
        }
        let status: u16 = line
            .split_whitespace()
            .nth(1)
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| std::io::Error::other(format!("bad status line {line:?}")))?;
        let mut headers = Vec::new();
        loop {
            let mut h = String::new();
            self.stream.read_line(&mut h)?;
            let h = h.trim_end();
            if h.is_empty() {
                break;
            }
            if let Some((k, v)) = h.split_once(':') {
                headers.push((k.trim().to_string(), v.trim().to_string()));
            }
        }
        let len: usize = headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case("content-length"))
            .and_then(|(_, v)| v.parse().ok())
            .unwrap_or(0);
        let mut body = vec![
            0;
            if head || status == 204 || status == 100 {
                0
            } else {
                len
            }
        ];
        self.stream.read_exact(&mut body)?;
        if status == 100 {
            return self.read_response(head);
        }
        Ok(Resp {
            status,
            headers,
            body,
        })
    }

    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Resp {
        self.try_request(method, path, headers, body)
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    pub fn get(&mut self, path: &str) -> Resp {
        self.request("GET", path, &[], b"")
    }

    /// A POST with `Content-Type: application/json`.
    pub fn post_json(&mut self, path: &str, body: &str) -> Resp {
        self.request(
            "POST",
            path,
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        )
    }

    pub fn patch_json(&mut self, path: &str, body: &str) -> Resp {
        self.request(
            "PATCH",
            path,
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        )
    }

    pub fn post_client(&mut self, path: &str, body: &[u8]) -> Resp {
        self.request("POST", path, &[("X-Narad-Client", "narad-tests/0")], body)
    }

    /// Reconnects (after the server closed this connection).
    pub fn reconnect(&mut self) {
        *self = Client::connect(self.addr).expect("reconnect");
    }

    /// Messages stored in `topic`: the sum of its partitions' high watermarks.
    pub fn stored(&mut self, topic: &str) -> u64 {
        let r = self.get(&format!("/v1/topics/{topic}"));
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["partition_stats"]
            .as_array()
            .expect("partition_stats")
            .iter()
            .map(|p| p["high_watermark"].as_u64().expect("high_watermark"))
            .sum()
    }

    pub fn create_topic(&mut self, name: &str, partitions: u32) -> serde_json::Value {
        let r = self.post_json(
            "/v1/topics",
            &format!(r#"{{"name":"{name}","partitions":{partitions}}}"#),
        );
        assert_eq!(r.status, 201, "create {name}: {}", r.text());
        r.json()
    }
}

impl Server {
    /// Starts `narad serve` with security on (the production default) on loopback, 2 shards, a
    /// fresh port pair, and `extra_env` (e.g. `NARAD_ADMIN_PASSWORD`). `restart` of such a
    /// server starts it in dev mode: use `start_secure` again on the same data directory.
    pub fn start_secure(data_dir: PathBuf, extra_env: Vec<(String, String)>) -> Server {
        Server::start_secure_logged(data_dir, extra_env, None)
    }

    /// [`Server::start_secure`] with the server's stderr (its log) appended to `log`, if given.
    pub fn start_secure_logged(
        data_dir: PathBuf,
        extra_env: Vec<(String, String)>,
        log: Option<&Path>,
    ) -> Server {
        let port = free_port_pair();
        let mut cmd = serve_command(port, &data_dir);
        cmd.env("NARAD_LOG_LEVEL", "warn")
            .env_remove("NARAD_SECURITY_ENABLED")
            .env_remove("NARAD_ADMIN_PASSWORD")
            .stderr(Stdio::inherit());
        if let Some(log) = log {
            let f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(log)
                .expect("open the server log");
            cmd.stderr(Stdio::from(f));
        }
        cmd.envs(extra_env.iter().map(|(k, v)| (k, v)));
        let mut s = Server {
            port,
            data_dir,
            child: Some(cmd.spawn().expect("start narad serve")),
            extra_env,
        };
        s.wait_ready();
        s
    }
}

/// `narad serve` on loopback `port` (its cluster port the next one) over `data_dir`, 2 shards,
/// stdin and stdout closed; callers add their environment and where stderr goes.
fn serve_command(port: u16, data_dir: &Path) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_narad"));
    cmd.args([
        "serve",
        "--addr",
        &format!("127.0.0.1:{port}"),
        "--data-dir",
    ])
    .arg(data_dir)
    .env("NARAD_SHARDS", "2")
    .env("NARAD_CLUSTER_ADDR", format!("127.0.0.1:{}", port + 1))
    .stdin(Stdio::null())
    .stdout(Stdio::null());
    cmd
}

/// The `Authorization` header value for HTTP Basic credentials.
pub fn basic_auth(user: &str, password: &str) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let input = format!("{user}:{password}");
    let mut out = String::from("Basic ");
    for chunk in input.as_bytes().chunks(3) {
        let b = [
            chunk[0],
            *chunk.get(1).unwrap_or(&0),
            *chunk.get(2).unwrap_or(&0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Runs `cmd` (stdin and stdout closed, stderr captured) until it exits or `limit` passes, when
/// it is killed: its exit status (`None` when it had to be killed) and its stderr.
pub fn run_to_exit(
    mut cmd: Command,
    limit: Duration,
) -> (Option<std::process::ExitStatus>, String) {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let t0 = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break Some(s);
        }
        if t0.elapsed() > limit {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let out = child.wait_with_output().expect("wait");
    (status, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// Starts `narad serve` (security off) with extra arguments and env; stderr lines go to a channel.
pub struct Serve {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
    pub port: u16,
}

impl Serve {
    pub fn start(dir: &TempDir, args: &[&str], env: &[(&str, &str)]) -> Serve {
        let port = free_port_pair();
        let mut cmd = serve_command(port, &dir.0.join("data"));
        cmd.args(args)
            .env("NARAD_SECURITY_ENABLED", "false")
            .env_remove("NARAD_LOG")
            .env_remove("NARAD_LOG_FORMAT")
            .stderr(Stdio::piped());
        cmd.envs(env.iter().copied());
        let mut child = cmd.spawn().expect("start narad serve");
        let stderr = child.stderr.take().unwrap();
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(stderr).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Serve { child, lines, port }
    }

    /// Waits (bounded) for a stderr line satisfying `f`.
    pub fn wait_line(&self, what: &str, f: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = Vec::new();
        while let Some(left) = deadline.checked_duration_since(Instant::now()) {
            match self.lines.recv_timeout(left) {
                Ok(l) if f(&l) => return l,
                Ok(l) => seen.push(l),
                Err(_) => break,
            }
        }
        panic!("no {what} line on stderr; saw: {seen:#?}");
    }

    pub fn client(&self) -> Client {
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        let start = Instant::now();
        loop {
            if let Ok(mut c) = Client::connect(addr) {
                if c.try_request("GET", "/readyz", &[], b"")
                    .is_ok_and(|r| r.status == 200)
                {
                    return c;
                }
            }
            assert!(start.elapsed() < READY_WAIT_MAX, "not ready");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Longest any one CLI run may take in the tests.
pub const CLI_RUN_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Out {
    pub code: i32,
    pub stdout: String,
    pub stderr: String,
}

/// A config directory that never exists, so that no test reads the user's real contexts.json
/// (tests of contexts pass their own NARAD_CONFIG_DIR or HOME).
pub fn no_config_dir() -> String {
    std::env::temp_dir()
        .join(format!("narad-cli-test-no-config-{}", std::process::id()))
        .display()
        .to_string()
}

/// Reads `r` to its end on a thread of its own (a child's pipe, read while the test waits).
fn read_all_in_background(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
    std::thread::spawn(move || {
        let mut s = String::new();
        let _ = r.read_to_string(&mut s);
        s
    })
}

/// Runs `narad <args>` with no `-s` added, the connection variables removed and the config
/// directory pointed at an empty place unless `env` says otherwise.
pub fn narad_raw(args: &[&str], stdin: &[u8], env: &[(&str, &str)]) -> Out {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_narad"));
    cmd.args(args)
        .env("NARAD_CONFIG_DIR", no_config_dir())
        .env_remove("NARAD_ADDR")
        .env_remove("NARAD_USER")
        .env_remove("NARAD_PASS")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd.envs(env.iter().copied());
    let mut child = cmd.spawn().expect("run narad");
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let writer = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let ro = read_all_in_background(child.stdout.take().unwrap());
    let re = read_all_in_background(child.stderr.take().unwrap());
    let start = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if start.elapsed() > CLI_RUN_TIMEOUT {
            let _ = child.kill();
            panic!("narad {args:?} did not finish within {CLI_RUN_TIMEOUT:?}");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    writer.join().unwrap();
    Out {
        code: status.code().unwrap_or(-1),
        stdout: ro.join().unwrap(),
        stderr: re.join().unwrap(),
    }
}

/// Runs `narad <args>` against `server` (a URL), feeding `stdin`, bounded by CLI_RUN_TIMEOUT.
pub fn narad_env(server: &str, args: &[&str], stdin: &[u8], env: &[(&str, &str)]) -> Out {
    let mut pre = vec!["-s", server];
    pre.extend_from_slice(args);
    narad_raw(&pre, stdin, env)
}

// ---- Queue flow helpers: single produce, batch consume, batch ack, drain (used by the crash and
// disk-full tests). Payloads are unique strings, so a drain names exactly what came back.

/// Longest any drain or catch-up loop of the queue helpers (and of the tests using them) runs.
pub const LOOP_MAX: Duration = Duration::from_secs(15);
/// Most requests any drain loop sends.
pub const LOOP_REQUESTS_MAX: usize = 500;

/// A single produce of `id` as raw text (consumed back as a JSON string of the same text).
pub fn try_produce_one(c: &mut Client, topic: &str, id: &str) -> std::io::Result<Resp> {
    c.try_request(
        "POST",
        &format!("/v1/topics/{topic}/produce"),
        &[("Content-Type", "application/octet-stream")],
        id.as_bytes(),
    )
}

/// [`try_produce_one`]'s status, or `None` when the connection failed.
pub fn produce_one(c: &mut Client, topic: &str, id: &str) -> Option<u16> {
    try_produce_one(c, topic, id).ok().map(|r| r.status)
}

/// A batch produce of `ids` as JSON string payloads (stored with their quotes, consumed back as
/// the same JSON string).
pub fn try_produce_batch(c: &mut Client, topic: &str, ids: &[String]) -> std::io::Result<Resp> {
    let body = serde_json::json!({
        "messages": ids.iter().map(|id| serde_json::json!({ "payload": id })).collect::<Vec<_>>()
    })
    .to_string();
    c.try_request(
        "POST",
        &format!("/v1/topics/{topic}/produce/batch"),
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    )
}

/// One batch consume of up to 100 records under lease: (payload, receipt handle) pairs.
pub fn consume(c: &mut Client, topic: &str, wait: &str) -> Vec<(String, String)> {
    let r = c.request(
        "GET",
        &format!("/v1/topics/{topic}/consume?max=100&wait={wait}"),
        &[("X-Narad-Client", "narad-tests/0")],
        b"",
    );
    match r.status {
        204 => Vec::new(),
        200 => r.json()["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["payload"].as_str().expect("string payload").to_string(),
                    m["receipt_handle"].as_str().unwrap().to_string(),
                )
            })
            .collect(),
        s => panic!("consume {topic} answered {s}: {}", r.text()),
    }
}

/// A batch ack (or, with `extend`, extend/nack) of `handles`: each handle's status.
pub fn ack(c: &mut Client, topic: &str, handles: &[String], extend: Option<&str>) -> Vec<u64> {
    let mut all = Vec::new();
    for chunk in handles.chunks(100) {
        let body = serde_json::json!({ "receipt_handles": chunk }).to_string();
        let path = match extend {
            Some(e) => format!("/v1/topics/{topic}/ack?extend={e}"),
            None => format!("/v1/topics/{topic}/ack"),
        };
        let r = c.request(
            "POST",
            &path,
            &[
                ("Content-Type", "application/json"),
                ("X-Narad-Client", "narad-tests/0"),
            ],
            body.as_bytes(),
        );
        assert_eq!(r.status, 200, "ack: {}", r.text());
        all.extend(
            r.json()["results"]
                .as_array()
                .unwrap()
                .iter()
                .map(|x| x["status"].as_u64().unwrap()),
        );
    }
    assert_eq!(all.len(), handles.len());
    all
}

/// Consumes and acks `topic` until `done` says every wanted payload was seen, or two empty polls
/// in a row once `min_polls` polls were made, within [`LOOP_MAX`] and [`LOOP_REQUESTS_MAX`].
/// Returns every payload delivered with its delivery count.
pub fn drain(
    c: &mut Client,
    topic: &str,
    done: impl Fn(&HashMap<String, usize>) -> bool,
) -> HashMap<String, usize> {
    let start = Instant::now();
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut empty = 0;
    for _ in 0..LOOP_REQUESTS_MAX {
        if done(&seen) || empty >= 2 || start.elapsed() > LOOP_MAX {
            break;
        }
        let got = consume(c, topic, "500ms");
        if got.is_empty() {
            empty += 1;
            continue;
        }
        empty = 0;
        let handles: Vec<String> = got.iter().map(|(_, h)| h.clone()).collect();
        let st = ack(c, topic, &handles, None);
        assert!(st.iter().all(|&s| s == 204), "acks while draining: {st:?}");
        for (p, _) in got {
            *seen.entry(p).or_default() += 1;
        }
    }
    seen
}

/// A few names of `set`, sorted, for failure messages.
pub fn sample<'a>(set: impl IntoIterator<Item = &'a String>) -> Vec<&'a String> {
    let mut v: Vec<&String> = set.into_iter().collect();
    v.sort();
    v.truncate(8);
    v
}
