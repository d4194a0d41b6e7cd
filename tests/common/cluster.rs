//! Several `narad serve` processes on loopback forming one cluster: each node's API port, its
//! cluster port (the next one), its data directory and its log file; start, kill -9, restart.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::{basic_auth, free_port_pair, Client, Resp, TempDir};

pub const ADMIN_PASSWORD: &str = "cluster-admin-pw";
pub const SECRET: &str = "the-cluster-secret";

pub struct Node {
    pub id: String,
    pub port: u16,
    pub data_dir: PathBuf,
    pub log: PathBuf,
    /// Extra environment of this node (a different secret, say).
    pub env: Vec<(String, String)>,
    child: Option<Child>,
}

impl Node {
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    pub fn cluster_addr(&self) -> String {
        format!("127.0.0.1:{}", self.port + 1)
    }

    pub fn running(&self) -> bool {
        self.child.is_some()
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Sends SIGTERM (a graceful stop) and returns at once.
    pub fn term(&self) {
        if let Some(c) = &self.child {
            let _ = Command::new("kill")
                .args(["-TERM", &c.id().to_string()])
                .status();
        }
    }

    /// Waits up to `limit` for the process to exit; its status.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<std::process::ExitStatus> {
        let t0 = Instant::now();
        while t0.elapsed() < limit {
            if let Some(st) = self.child.as_mut()?.try_wait().ok().flatten() {
                self.child = None;
                return Some(st);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// An admin client of this node.
    pub fn admin(&self) -> Admin {
        Admin {
            client: Client::connect(self.addr()).expect("connect"),
            auth: basic_auth("admin", ADMIN_PASSWORD),
        }
    }

    /// `/readyz` status now (0 when nothing answers).
    pub fn readyz(&self) -> u16 {
        Client::connect(self.addr())
            .ok()
            .and_then(|mut c| c.try_request("GET", "/readyz", &[], b"").ok())
            .map_or(0, |r| r.status)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A client that sends the root admin's credentials with every request.
pub struct Admin {
    pub client: Client,
    pub auth: String,
}

impl Admin {
    pub fn req(&mut self, method: &str, path: &str, body: &str) -> Resp {
        let mut headers = vec![("Authorization", self.auth.as_str())];
        if !body.is_empty() || method != "GET" {
            headers.push(("Content-Type", "application/json"));
        }
        match self
            .client
            .try_request(method, path, &headers, body.as_bytes())
        {
            Ok(r) => r,
            Err(_) => {
                self.client.reconnect();
                self.client.request(method, path, &headers, body.as_bytes())
            }
        }
    }

    pub fn get(&mut self, path: &str) -> Resp {
        self.req("GET", path, "")
    }

    pub fn post(&mut self, path: &str, body: &str) -> Resp {
        self.req("POST", path, body)
    }
}

pub struct Cluster {
    pub nodes: Vec<Node>,
    /// Nodes added with [`Cluster::add_joiner`] (the last ones; not in the peer list).
    joiners: usize,
    _dir: TempDir,
}

impl Cluster {
    /// Starts `n` nodes (ids `n1`..) with security on, each listing all as peers, and waits
    /// until every one is ready.
    pub fn start(tag: &str, n: usize) -> Cluster {
        let mut c = Cluster::spawn(tag, n, |_| Vec::new());
        c.wait_ready(Duration::from_secs(60));
        c
    }

    /// Starts `n` nodes with per-node extra environment, without waiting.
    pub fn spawn(tag: &str, n: usize, env: impl Fn(usize) -> Vec<(String, String)>) -> Cluster {
        let dir = TempDir::new(tag);
        let nodes: Vec<Node> = (0..n)
            .map(|i| Node {
                id: format!("n{}", i + 1),
                port: free_port_pair(),
                data_dir: dir.0.join(format!("n{}", i + 1)),
                log: dir.0.join(format!("n{}.log", i + 1)),
                env: env(i),
                child: None,
            })
            .collect();
        let mut c = Cluster {
            nodes,
            joiners: 0,
            _dir: dir,
        };
        for i in 0..n {
            c.start_node(i);
        }
        c
    }

    pub fn peers(&self) -> String {
        self.nodes[..self.nodes.len() - self.joiners]
            .iter()
            .map(|n| format!("{}@{}", n.id, n.cluster_addr()))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Adds a node outside the peer list (it joins: CLUSTER.md §7) with extra environment, and
    /// starts it; does not wait. Its index is returned.
    pub fn add_joiner(&mut self, env: Vec<(String, String)>) -> usize {
        let i = self.nodes.len();
        let dir = self._dir.0.clone();
        self.nodes.push(Node {
            id: format!("n{}", i + 1),
            port: free_port_pair(),
            data_dir: dir.join(format!("n{}", i + 1)),
            log: dir.join(format!("n{}.log", i + 1)),
            env,
            child: None,
        });
        self.joiners += 1;
        self.start_node(i);
        i
    }

    /// Starts (or restarts) node `i` on its data directory; does not wait for readiness.
    pub fn start_node(&mut self, i: usize) {
        let peers = self.peers();
        let n = &mut self.nodes[i];
        n.kill9();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&n.log)
            .expect("open node log");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_narad"));
        cmd.args([
            "serve",
            "--addr",
            &format!("127.0.0.1:{}", n.port),
            "--data-dir",
        ])
        .arg(&n.data_dir)
        .env_remove("NARAD_SECURITY_ENABLED")
        .env("NARAD_SHARDS", "2")
        .env("NARAD_LOG_LEVEL", "info")
        .env("NARAD_LOG_FORMAT", "text")
        .env("NARAD_NODE_ID", &n.id)
        .env("NARAD_CLUSTER_ADDR", n.cluster_addr())
        .env("NARAD_CLUSTER_PEERS", &peers)
        .env("NARAD_CLUSTER_SECRET", SECRET)
        .env("NARAD_ADMIN_PASSWORD", ADMIN_PASSWORD)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::from(log));
        if !peers.contains(&format!("{}@", n.id)) {
            cmd.env("NARAD_CLUSTER_ADVERTISE_ADDR", n.cluster_addr());
        }
        cmd.envs(n.env.iter().map(|(k, v)| (k, v)));
        n.child = Some(cmd.spawn().expect("start narad serve"));
    }

    /// Waits until every running node answers `/readyz` 200.
    pub fn wait_ready(&mut self, limit: Duration) {
        let t0 = Instant::now();
        for n in &mut self.nodes {
            if !n.running() {
                continue;
            }
            loop {
                if let Some(c) = n.child.as_mut() {
                    if let Some(st) = c.try_wait().expect("try_wait") {
                        panic!("node {} exited: {st}\n{}", n.id, n.log_text());
                    }
                }
                if n.readyz() == 200 {
                    break;
                }
                assert!(
                    t0.elapsed() < limit,
                    "node {} not ready in {limit:?}\n{}",
                    n.id,
                    n.log_text()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// The index of the node that currently leads the metadata group (from its metrics), if a
    /// running node says it leads.
    pub fn leader(&self) -> Option<usize> {
        self.nodes.iter().position(|n| {
            n.running()
                && Client::connect(n.addr())
                    .ok()
                    .and_then(|mut c| {
                        let auth = basic_auth("admin", ADMIN_PASSWORD);
                        c.try_request("GET", "/metrics", &[("Authorization", &auth)], b"")
                            .ok()
                    })
                    .is_some_and(|r| r.text().contains("narad_raft_state{state=\"leader\"} 1"))
        })
    }
}

/// A throw-away CA in `dir` and one certificate it signs for 127.0.0.1 (server and client
/// use, shared by every node of a test cluster), made with the openssl command line: the
/// `NARAD_CLUSTER_TLS_*` settings for it. `None` (the reason printed) without openssl.
pub fn test_tls_env(dir: &std::path::Path) -> Option<Vec<(String, String)>> {
    if Command::new("openssl").arg("version").output().is_err() {
        eprintln!("skipped: no openssl command to make test certificates");
        return None;
    }
    std::fs::create_dir_all(dir).expect("pki dir");
    let run = |args: &[&str]| {
        let out = Command::new("openssl")
            .args(args)
            .current_dir(dir)
            .output()
            .expect("run openssl");
        assert!(
            out.status.success(),
            "openssl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
    ];
    let ca_req = ["req", "-x509", "-keyout", "ca.key", "-out", "ca.pem"];
    let ca_tail = ["-days", "2", "-subj", "/CN=narad-test-ca"];
    run(&[&ca_req[..], &ec, &ca_tail].concat());
    let node_req = ["req", "-keyout", "node.key", "-out", "node.csr"];
    run(&[&node_req[..], &ec, &["-subj", "/CN=narad-node"]].concat());
    std::fs::write(
        dir.join("node.ext"),
        "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n",
    )
    .expect("write ext");
    run(&[
        "x509",
        "-req",
        "-in",
        "node.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "node.pem",
        "-days",
        "2",
        "-extfile",
        "node.ext",
    ]);
    let path = |f: &str| dir.join(f).to_string_lossy().into_owned();
    Some(vec![
        ("NARAD_CLUSTER_TLS_CERT_FILE".into(), path("node.pem")),
        ("NARAD_CLUSTER_TLS_KEY_FILE".into(), path("node.key")),
        ("NARAD_CLUSTER_TLS_CA_FILE".into(), path("ca.pem")),
    ])
}
