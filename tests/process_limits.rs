//! Process limits at start: the broker raises its soft open-files limit to the hard one (as the
//! original's Go runtime does), so a shell's low default does not cap its connections.

mod common;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn soft_and_hard_open_files(pid: u32) -> (String, String) {
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap()
        .to_string();
    let f: Vec<&str> = line.split_whitespace().collect();
    (f[3].to_string(), f[4].to_string())
}

#[test]
fn a_low_soft_open_files_limit_is_raised_and_connections_beyond_it_are_served() {
    // Proves that started under `ulimit -Sn 64`, the broker's soft limit equals its hard limit,
    // and 120 connections held open at once are all served (before: accept failed with EMFILE
    // past ~60 descriptors and those connections waited).
    let dir = common::TempDir::new("nofile");
    let port = common::free_port_pair();
    let script =
        format!("ulimit -Sn 64 && exec \"$0\" server start --dev --port {port} --data-dir \"$1\"");
    let child = Command::new("sh")
        .args(["-c", &script, env!("CARGO_BIN_EXE_narad")])
        .arg(dir.0.join("data"))
        .env("NARAD_SHARDS", "2")
        .env("NARAD_LOG_LEVEL", "error")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let child = KillOnDrop(child);
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    let t0 = Instant::now();
    while std::net::TcpStream::connect(addr).is_err() {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "narad did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let (soft, hard) = soft_and_hard_open_files(child.0.id());
    assert_eq!(soft, hard, "soft open-files limit not raised");
    let mut conns: Vec<std::net::TcpStream> = (0..120)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    for (i, c) in conns.iter_mut().enumerate() {
        c.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        c.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            .unwrap();
        let mut buf = [0u8; 12];
        c.read_exact(&mut buf)
            .unwrap_or_else(|e| panic!("connection {i}: {e}"));
        assert_eq!(&buf, b"HTTP/1.1 200", "connection {i}");
    }
}

/// Stops the broker however the test ends (a panic included), so that it never outlives it.
struct KillOnDrop(std::process::Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
