//! The CLI against an `https://` server (OPERATIONS.md §1.2: `-s` takes the URL of whatever is in
//! front of the broker, and TLS terminates there, API.md §0). A TLS-terminating relay written
//! here (rustls, a certificate from a throw-away CA made with the openssl CLI) stands in front of
//! a real broker. Proves: pub and sub work through it with the CA trusted via SSL_CERT_FILE, the
//! certificate is verified (an untrusted CA and a wrong name are refused, exit 2, nothing sent),
//! and `narad bench` refuses an https server with a usage error instead of speaking plain HTTP
//! to a TLS port.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{Server, TempDir};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Longest any one CLI run or relayed connection may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl CLI (.ci/run installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Makes `<name>-ca.pem` and a leaf `<name>.pem`/`<name>.key` for `san`, signed by that CA.
fn make_ca_and_leaf(dir: &Path, name: &str, san: &str) {
    let ca_key = format!("{name}-ca.key");
    let ca = format!("{name}-ca.pem");
    let key = format!("{name}.key");
    let csr = format!("{name}.csr");
    let cert = format!("{name}.pem");
    let ext = format!("{name}.ext");
    std::fs::write(
        dir.join(&ext),
        format!(
            "subjectAltName={san}\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
        ),
    )
    .unwrap();
    #[rustfmt::skip]
    openssl(dir, &["req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256",
        "-nodes", "-keyout", &ca_key, "-out", &ca, "-days", "2", "-subj", &format!("/CN={name} test CA")]);
    #[rustfmt::skip]
    openssl(dir, &["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
        "-keyout", &key, "-out", &csr, "-subj", "/CN=narad test server"]);
    #[rustfmt::skip]
    openssl(dir, &["x509", "-req", "-in", &csr, "-CA", &ca, "-CAkey", &ca_key, "-CAcreateserial",
        "-out", &cert, "-days", "2", "-extfile", &ext]);
}

/// A TLS-terminating relay on a loopback port in front of `upstream`, as an ingress would be.
struct Relay {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    /// Connections whose TLS handshake completed.
    handshakes: Arc<AtomicUsize>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Relay {
    fn start(cert: &Path, key: &Path, upstream: SocketAddr) -> Relay {
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .unwrap()
            .map(|c| c.unwrap())
            .collect();
        let key = PrivateKeyDer::from_pem_file(key).unwrap();
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .unwrap();
        let config = Arc::new(config);
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let addr = listener.local_addr().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let handshakes = Arc::new(AtomicUsize::new(0));
        let (s, h) = (stop.clone(), handshakes.clone());
        let accept = std::thread::spawn(move || {
            let start = Instant::now();
            while !s.load(Ordering::Relaxed) && start.elapsed() < 4 * RUN_TIMEOUT {
                match listener.accept() {
                    Ok((sock, _)) => {
                        let (config, s, h) = (config.clone(), s.clone(), h.clone());
                        std::thread::spawn(move || relay_one(sock, config, upstream, &s, &h));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Relay {
            addr,
            stop,
            handshakes,
            accept: Some(accept),
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.accept.take() {
            let _ = h.join();
        }
    }
}

fn quiet(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Pumps one connection both ways until either side closes (bounded by RUN_TIMEOUT).
fn relay_one(
    mut sock: TcpStream,
    config: Arc<rustls::ServerConfig>,
    upstream: SocketAddr,
    stop: &AtomicBool,
    handshakes: &AtomicUsize,
) {
    let Ok(mut conn) = rustls::ServerConnection::new(config) else {
        return;
    };
    let Ok(mut up) = TcpStream::connect(upstream) else {
        return;
    };
    let tick = Some(Duration::from_millis(2));
    sock.set_read_timeout(tick).unwrap();
    up.set_read_timeout(tick).unwrap();
    let mut counted = false;
    let mut buf = vec![0u8; 64 << 10];
    let start = Instant::now();
    while !stop.load(Ordering::Relaxed) && start.elapsed() < RUN_TIMEOUT {
        // Client to broker.
        match conn.read_tls(&mut sock) {
            Ok(0) => return,
            Ok(_) => {
                if conn.process_new_packets().is_err() {
                    // Tell the client why (an alert), then close.
                    let _ = conn.write_tls(&mut sock);
                    return;
                }
                loop {
                    match conn.reader().read(&mut buf) {
                        Ok(0) => return,
                        Ok(n) => {
                            if up.write_all(&buf[..n]).is_err() {
                                return;
                            }
                        }
                        Err(_) => break,
                    }
                }
            }
            Err(e) if quiet(&e) => {}
            Err(_) => return,
        }
        if !counted && !conn.is_handshaking() {
            counted = true;
            handshakes.fetch_add(1, Ordering::Relaxed);
        }
        // Broker to client.
        match up.read(&mut buf) {
            Ok(0) => {
                conn.send_close_notify();
                let _ = conn.write_tls(&mut sock);
                return;
            }
            Ok(n) => {
                if conn.writer().write_all(&buf[..n]).is_err() {
                    return;
                }
            }
            Err(e) if quiet(&e) => {}
            Err(_) => return,
        }
        while conn.wants_write() {
            if conn.write_tls(&mut sock).is_err() {
                return;
            }
        }
    }
}

/// Runs `narad -s <server> <args>` trusting only the CA in the PEM file `ca`: `SSL_CERT_DIR`
/// names the empty directory `none` beside it, so the system's roots never count.
fn narad(server: &str, args: &[&str], stdin: &[u8], ca: &Path) -> common::Out {
    let none = ca.with_file_name("none");
    std::fs::create_dir_all(&none).unwrap();
    common::narad_env(
        server,
        args,
        stdin,
        &[
            ("SSL_CERT_FILE", ca.to_str().unwrap()),
            ("SSL_CERT_DIR", none.to_str().unwrap()),
        ],
    )
}

#[test]
fn cli_speaks_https_through_a_tls_front_and_verifies_the_certificate() {
    let dir = TempDir::new("cli-tls");
    let certs = dir.0.join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    make_ca_and_leaf(&certs, "good", "DNS:localhost,IP:127.0.0.1");
    make_ca_and_leaf(&certs, "other", "DNS:localhost,IP:127.0.0.1");
    make_ca_and_leaf(&certs, "misnamed", "DNS:elsewhere.example");

    let server = Server::start(&dir);
    let relay = Relay::start(
        &certs.join("good.pem"),
        &certs.join("good.key"),
        server.addr(),
    );
    let trusted = certs.join("good-ca.pem");
    let port = relay.addr.port();

    // Create, produce and consume, all through TLS, by name and by address.
    let by_name = format!("https://localhost:{port}");
    let by_ip = format!("https://127.0.0.1:{port}");
    let o = narad(&by_name, &["topic", "add", "tls-orders"], b"", &trusted);
    assert_eq!(o.code, 0, "{}\n{}", o.stdout, o.stderr);
    let o = narad(&by_ip, &["pub", "tls-orders", "over-tls-1"], b"", &trusted);
    assert_eq!(o.code, 0, "{}", o.stderr);
    assert!(o.stderr.contains("accepted"), "{}", o.stderr);
    // A batch from stdin: several requests on one kept-alive TLS connection.
    let lines: String = (2..=50).map(|i| format!("over-tls-{i}\n")).collect();
    let o = narad(
        &by_name,
        &["pub", "tls-orders", "--lines"],
        lines.as_bytes(),
        &trusted,
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    let o = narad(
        &by_name,
        &["sub", "tls-orders", "--count", "50", "--wait", "20s"],
        b"",
        &trusted,
    );
    assert_eq!(o.code, 0, "{}", o.stderr);
    for i in 1..=50 {
        assert!(
            o.stdout.contains(&format!("over-tls-{i}")),
            "message {i} missing from: {}",
            o.stdout
        );
    }
    let handshakes = relay.handshakes.load(Ordering::Relaxed);
    assert!(handshakes >= 4, "{handshakes} TLS handshakes");

    // An untrusted CA: refused before any request is sent (exit 2, transport error).
    let o = narad(
        &by_name,
        &["pub", "tls-orders", "must-not-arrive"],
        b"",
        &certs.join("other-ca.pem"),
    );
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(
        o.stderr.contains("TLS handshake") && o.stderr.contains("certificate"),
        "{}",
        o.stderr
    );
    // A certificate for another name, from a trusted CA: refused too.
    let misnamed = Relay::start(
        &certs.join("misnamed.pem"),
        &certs.join("misnamed.key"),
        server.addr(),
    );
    let o = narad(
        &format!("https://localhost:{}", misnamed.addr.port()),
        &["pub", "tls-orders", "must-not-arrive"],
        b"",
        &certs.join("misnamed-ca.pem"),
    );
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("TLS handshake"), "{}", o.stderr);
    // Nothing of the refused publishes arrived: the partitions hold the 50 messages above.
    assert_eq!(server.client().stored("tls-orders"), 50);

    // Plain HTTP spoken to the TLS port is not what `bench` does: it refuses an https server.
    let o = narad(&by_name, &["bench", "--duration", "1"], b"", &trusted);
    assert_eq!(o.code, 2, "{}", o.stderr);
    assert!(o.stderr.contains("--url http://"), "{}", o.stderr);
    drop(misnamed);
    drop(relay);
}
