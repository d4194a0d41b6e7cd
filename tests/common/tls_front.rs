//! A TLS front for the black-box tests: a throw-away CA and leaf certificates made with the
//! openssl CLI, and a TLS-terminating relay on a loopback port in front of a real broker, as an
//! ingress would be (the CLI's https:// tests, the target cluster of remote children).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Longest any one CLI run or relayed connection may take.
pub const RUN_TIMEOUT: Duration = Duration::from_secs(60);

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
pub fn make_ca_and_leaf(dir: &Path, name: &str, san: &str) {
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
pub struct Relay {
    pub addr: SocketAddr,
    pub stop: Arc<AtomicBool>,
    /// Connections whose TLS handshake completed.
    pub handshakes: Arc<AtomicUsize>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Relay {
    pub fn start(cert: &Path, key: &Path, upstream: SocketAddr) -> Relay {
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
