//! The CLI against an `https://` server (OPERATIONS.md §1.2: `-s` takes the URL of whatever is in
//! front of the broker, and TLS terminates there, API.md §0). A TLS-terminating relay written
//! here (rustls, a certificate from a throw-away CA made with the openssl CLI) stands in front of
//! a real broker. Proves: pub and sub work through it with the CA trusted via SSL_CERT_FILE, the
//! certificate is verified (an untrusted CA and a wrong name are refused, exit 2, nothing sent),
//! and `narad bench` refuses an https server with a usage error instead of speaking plain HTTP
//! to a TLS port.

mod common;

use std::path::Path;
use std::sync::atomic::Ordering;

use common::tls_front::{make_ca_and_leaf, Relay};
use common::{Server, TempDir};

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
