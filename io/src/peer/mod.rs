//! Node-to-node connections on the cluster port (DESIGN.md §4, CLUSTER.md §12–13).
//!
//! - [`proof`]: the cluster-secret challenge-response that opens every connection (pure).
//! - [`wire`]: frame reading with a bound, the coalescing outbox, the handshake drivers.
//! - [`link`]: [`PeerLink`], a shard's connection to one peer (dial, calls, backoff).
//! - [`serve`]: the cluster port's accept loop and request dispatch to a handler.
//! - [`stats`]: the per-thread tally of requests sent, by operation and outcome.
//! - [`tls`]: mutual TLS on every connection when the cluster has certificates.
//!
//! A request's body is one operation byte and the operation's bytes, opaque here; a reply's is
//! one status byte and the answer. What the operations are is the node's business (`src/`).
//! Never trusts a byte before its frame's checksum and bound are checked; never shares a
//! connection between shards.

pub mod link;
pub mod ops;
pub mod proof;
pub mod serve;
pub mod stats;
pub mod tls;
pub mod wire;

pub use link::{PeerError, PeerLink};
pub use proof::Secret;
pub use serve::{serve, Admit, Handler, HandlerFuture, Inbound, Outcome};
pub use tls::PeerTls;
pub use wire::Identity;

#[cfg(test)]
mod tests {
    use std::rc::Rc;
    use std::time::{Duration, Instant};

    use futures_lite::AsyncWriteExt;

    use std::cell::Cell;
    use std::path::PathBuf;
    use std::sync::Arc;

    use futures_lite::AsyncReadExt;

    use super::*;
    use crate::rt::{self, ShutdownSignal, TcpListener, TcpStream};

    fn ident(id: &str, secret: &str) -> Identity {
        Identity {
            node_id: id.into(),
            secret: Secret::new(secret.as_bytes().to_vec()),
            tls: None,
        }
    }

    /// Echo (op 1), slow echo (op 2, sleeps 300 ms), error (op 3), very slow echo (op 4,
    /// sleeps 3.5 s); other ops (the link's ping too) unsupported.
    fn handler() -> Handler {
        Rc::new(|req: Inbound| {
            Box::pin(async move {
                match req.op {
                    1 => Outcome::Ok(req.body().to_vec()),
                    2 => {
                        rt::sleep(Duration::from_millis(300)).await;
                        Outcome::Ok(req.body().to_vec())
                    }
                    4 => {
                        rt::sleep(Duration::from_millis(3500)).await;
                        Outcome::Ok(req.body().to_vec())
                    }
                    3 => Outcome::Error(format!("no from {}", req.from)),
                    _ => Outcome::Unsupported,
                }
            }) as HandlerFuture
        })
    }

    fn start_server(secret: &str, shutdown: &ShutdownSignal) -> String {
        let l = TcpListener::bind("127.0.0.1:0".parse().unwrap()).expect("bind");
        let addr = l.local_addr().unwrap().to_string();
        let admit: Admit = Rc::new(|id: &str| {
            if id == "tombstoned" {
                Err("node id tombstoned".into())
            } else {
                Ok(())
            }
        });
        rt::spawn(serve(
            l,
            ident("server", secret),
            handler(),
            admit,
            shutdown.clone(),
        ))
        .detach();
        addr
    }

    #[test]
    fn calls_replies_errors_and_timeouts_over_one_connection() {
        // Proves a link dials lazily, proves the secret, multiplexes concurrent calls on one
        // connection with the right reply per request id, relays handler errors and unknown
        // operations, times out a slow call (and the connection stays usable), and learns the
        // peer's id.
        rt::block_on(async {
            let stop = ShutdownSignal::new();
            let addr = start_server("s3cret", &stop);
            let link = PeerLink::new(addr, ident("client", "s3cret"));
            assert!(!link.connected());
            let calls: Vec<_> = (0..50u32)
                .map(|i| {
                    let l = link.clone();
                    rt::spawn(
                        async move { l.call(1, &i.to_le_bytes(), Duration::from_secs(5)).await },
                    )
                })
                .collect();
            for (i, c) in calls.into_iter().enumerate() {
                assert_eq!(c.await, Ok((i as u32).to_le_bytes().to_vec()));
            }
            assert_eq!(link.peer_id().as_deref(), Some("server"));
            assert_eq!(
                link.call(3, b"", Duration::from_secs(5)).await,
                Err(PeerError::Remote("no from client".into()))
            );
            assert_eq!(
                link.call(99, b"", Duration::from_secs(5)).await,
                Err(PeerError::Unsupported)
            );
            let t = Instant::now();
            assert_eq!(
                link.call(2, b"x", Duration::from_millis(50)).await,
                Err(PeerError::Timeout)
            );
            assert!(t.elapsed() < Duration::from_millis(250));
            assert_eq!(
                link.call(1, b"again", Duration::from_secs(5)).await,
                Ok(b"again".to_vec())
            );
            let big = vec![7u8; 4 << 20];
            assert_eq!(link.call(1, &big, Duration::from_secs(10)).await, Ok(big));
            stop.trigger();
        });
    }

    #[test]
    fn wrong_secret_and_refused_ids_are_told_apart_and_never_connect() {
        // Proves a dialer holding another secret is refused with a message naming the secret,
        // as is a proved but refused (tombstoned) id, and that a failed dial backs off: the next
        // call fails at once without dialling.
        rt::block_on(async {
            let stop = ShutdownSignal::new();
            let addr = start_server("s3cret", &stop);
            let wrong = PeerLink::new(addr.clone(), ident("client", "other"));
            let e = wrong
                .call(1, b"x", Duration::from_secs(5))
                .await
                .unwrap_err();
            assert!(
                matches!(&e, PeerError::Unreachable(m) if m.contains("NARAD_CLUSTER_SECRET")),
                "{e}"
            );
            let t = Instant::now();
            let again = wrong
                .call(1, b"x", Duration::from_secs(5))
                .await
                .unwrap_err();
            assert!(
                again.not_sent() && t.elapsed() < Duration::from_millis(50),
                "{again}"
            );
            let tomb = PeerLink::new(addr.clone(), ident("tombstoned", "s3cret"));
            let e = tomb
                .call(1, b"x", Duration::from_secs(5))
                .await
                .unwrap_err();
            assert!(
                matches!(&e, PeerError::Unreachable(m) if m.contains("tombstoned")),
                "{e}"
            );
            // The server still serves a good peer.
            let good = PeerLink::new(addr, ident("client", "s3cret"));
            assert_eq!(
                good.call(1, b"ok", Duration::from_secs(5)).await,
                Ok(b"ok".to_vec())
            );
            stop.trigger();
        });
    }

    #[test]
    fn garbage_and_truncated_peers_are_dropped_without_hurting_others() {
        // Proves a connection sending garbage, an oversized handshake, or nothing at all is
        // closed by the listener while an authenticated link keeps being served, and a dead
        // address answers Unreachable within the dial timeout.
        rt::block_on(async {
            let stop = ShutdownSignal::new();
            let addr = start_server("s3cret", &stop);
            let good = PeerLink::new(addr.clone(), ident("client", "s3cret"));
            assert_eq!(
                good.call(1, b"a", Duration::from_secs(5)).await,
                Ok(b"a".to_vec())
            );
            let sa: std::net::SocketAddr = addr.parse().unwrap();
            let mut garbage = TcpStream::connect(sa).await.unwrap();
            garbage.write_all(b"GET / HTTP/1.1\r\n\r\n").await.unwrap();
            let mut huge = TcpStream::connect(sa).await.unwrap();
            let mut f = Vec::new();
            crate::frame::encode(crate::frame::FrameKind::OneWay, 0, 0, &[0u8; 4096], &mut f);
            huge.write_all(&f).await.unwrap();
            let _silent = TcpStream::connect(sa).await.unwrap();
            for _ in 0..20 {
                assert_eq!(
                    good.call(1, b"b", Duration::from_secs(5)).await,
                    Ok(b"b".to_vec())
                );
            }
            // The listener hung up on the garbage and the oversized handshake.
            rt::sleep(Duration::from_millis(100)).await;
            assert!(garbage.peer_probe().peer_closed());
            assert!(huge.peer_probe().peer_closed());
            stop.trigger();
            let dead = PeerLink::new("127.0.0.1:1".into(), ident("client", "s3cret"));
            let e = dead
                .call(1, b"x", Duration::from_secs(5))
                .await
                .unwrap_err();
            assert!(e.not_sent(), "{e}");
        });
    }

    #[test]
    fn a_restarted_peer_is_dialled_again() {
        // Proves calls in flight when the peer goes away end as Lost (not hang), and that once
        // it listens again the link reconnects after its backoff.
        rt::block_on(async {
            let stop = ShutdownSignal::new();
            let l = TcpListener::bind("127.0.0.1:0".parse().unwrap()).expect("bind");
            let addr = l.local_addr().unwrap();
            let admit: Admit = Rc::new(|_: &str| Ok(()));
            rt::spawn(serve(
                l,
                ident("server", "k"),
                handler(),
                admit.clone(),
                stop.clone(),
            ))
            .detach();
            let link = PeerLink::new(addr.to_string(), ident("client", "k"));
            assert_eq!(
                link.call(1, b"1", Duration::from_secs(5)).await,
                Ok(b"1".to_vec())
            );
            let slow = {
                let l = link.clone();
                rt::spawn(async move { l.call(2, b"s", Duration::from_secs(5)).await })
            };
            rt::sleep(Duration::from_millis(50)).await;
            stop.trigger();
            let r = slow.await;
            assert!(
                matches!(r, Err(PeerError::Lost(_)) | Ok(_)),
                "in-flight call ends: {r:?}"
            );
            rt::sleep(Duration::from_millis(50)).await;
            let stop2 = ShutdownSignal::new();
            let l2 = TcpListener::bind(addr).expect("rebind");
            rt::spawn(serve(
                l2,
                ident("server", "k"),
                handler(),
                admit,
                stop2.clone(),
            ))
            .detach();
            let t = Instant::now();
            let mut ok = false;
            while t.elapsed() < Duration::from_secs(5) {
                if link.call(1, b"2", Duration::from_secs(1)).await == Ok(b"2".to_vec()) {
                    ok = true;
                    break;
                }
                rt::sleep(Duration::from_millis(50)).await;
            }
            assert!(ok, "link reconnected: {:?}", link.last_error());
            stop2.trigger();
        });
    }

    /// A TCP relay to `to` that forwards both ways until `cut` is set, then swallows every byte
    /// while keeping both connections open (a path a network cut blackholed).
    fn start_relay(to: std::net::SocketAddr, cut: Rc<Cell<bool>>) -> String {
        let l = TcpListener::bind("127.0.0.1:0".parse().unwrap()).expect("bind relay");
        let addr = l.local_addr().unwrap().to_string();
        rt::spawn(async move {
            while let Ok((client, _)) = l.accept().await {
                let server = TcpStream::connect(to).await.expect("relay connect");
                let (cr, cw) = futures_lite::io::split(client);
                let (sr, sw) = futures_lite::io::split(server);
                for (mut r, mut w) in [(cr, sw), (sr, cw)] {
                    let cut = cut.clone();
                    rt::spawn(async move {
                        let mut buf = vec![0u8; 16 << 10];
                        loop {
                            let n = match r.read(&mut buf).await {
                                Ok(0) | Err(_) => return,
                                Ok(n) => n,
                            };
                            if !cut.get() && w.write_all(&buf[..n]).await.is_err() {
                                return;
                            }
                        }
                    })
                    .detach();
                }
            }
        })
        .detach();
        addr
    }

    #[test]
    fn a_call_on_a_blackholed_path_fails_long_before_its_deadline() {
        // Proves the silence watchdog: a call waiting on a connection whose path went silent
        // (every byte swallowed, no reset) ends as Lost after a ping goes unanswered, within
        // about SILENCE_PING_AFTER + PING_ANSWER_WITHIN, not at its own 30 s deadline; while
        // the path works, a call slower than the ping delay is not cut short.
        rt::block_on(async {
            let stop = ShutdownSignal::new();
            let l = TcpListener::bind("127.0.0.1:0".parse().unwrap()).expect("bind");
            let server = l.local_addr().unwrap();
            let admit: Admit = Rc::new(|_: &str| Ok(()));
            rt::spawn(serve(
                l,
                ident("server", "k"),
                handler(),
                admit,
                stop.clone(),
            ))
            .detach();
            let cut = Rc::new(Cell::new(false));
            let relay = start_relay(server, cut.clone());
            let link = PeerLink::new(relay, ident("client", "k"));
            assert_eq!(
                link.call(1, b"up", Duration::from_secs(5)).await,
                Ok(b"up".to_vec())
            );
            // A healthy but slow call (op 4 sleeps 3.5 s): pings are answered meanwhile.
            assert_eq!(
                link.call(4, b"slow", Duration::from_secs(30)).await,
                Ok(b"slow".to_vec())
            );
            cut.set(true);
            let t = Instant::now();
            let r = link.call(1, b"lost", Duration::from_secs(30)).await;
            let took = t.elapsed();
            assert!(matches!(r, Err(PeerError::Lost(_))), "{r:?}");
            assert!(
                took < link::SILENCE_PING_AFTER + link::PING_ANSWER_WITHIN + Duration::from_secs(3),
                "ended after {took:?}"
            );
            stop.trigger();
        });
    }

    /// A throw-away CA and a certificate it signs for 127.0.0.1 (server and client use), made
    /// with the openssl command line in `dir`: (cert, key, ca) paths.
    fn test_pki(dir: &std::path::Path, name: &str) -> (PathBuf, PathBuf, PathBuf) {
        let run = |args: &[&str]| {
            let out = std::process::Command::new("openssl")
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
        let (ca_key, ca, key, csr, cert, ext) = (
            format!("{name}-ca.key"),
            format!("{name}-ca.pem"),
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
            format!("{name}.ext"),
        );
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ];
        run(&[
            &["req", "-x509"][..],
            &ec,
            &[
                "-keyout",
                &ca_key,
                "-out",
                &ca,
                "-days",
                "2",
                "-subj",
                &format!("/CN={name}-ca"),
            ],
        ]
        .concat());
        run(&[
            &["req"][..],
            &ec,
            &[
                "-keyout",
                &key,
                "-out",
                &csr,
                "-subj",
                &format!("/CN={name}"),
            ],
        ]
        .concat());
        std::fs::write(
            dir.join(&ext),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nkeyUsage=digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n",
        )
        .expect("write ext");
        run(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &cert,
            "-days",
            "2",
            "-extfile",
            &ext,
        ]);
        (dir.join(cert), dir.join(key), dir.join(ca))
    }

    #[test]
    fn tls_connections_need_a_certificate_of_the_cluster_ca() {
        // Proves mutual TLS on the cluster port: two nodes holding certificates of the same CA
        // talk (the secret's proof runs inside TLS); a dialler whose certificate another CA
        // signed is refused before any request runs, and so is one without TLS at all.
        if std::process::Command::new("openssl")
            .arg("version")
            .output()
            .is_err()
        {
            eprintln!("skipped: no openssl command to make test certificates");
            return;
        }
        let dir = std::env::temp_dir().join(format!("narad-peer-tls-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key, ca) = test_pki(&dir, "cluster");
        let (other_cert, other_key, other_ca) = test_pki(&dir, "other");
        let tls = Arc::new(PeerTls::from_files(&cert, &key, &ca).expect("load"));
        // The certificates were made for 2 days: their expiry reads as about now + 2 days.
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        for (path, earliest) in [(&cert, false), (&ca, true)] {
            let at = tls::pem_not_after(path, earliest).expect("an expiry");
            assert!((at - (now + 2 * 86_400)).abs() < 3600, "{at} vs {now}");
        }
        assert_eq!(tls::pem_not_after(&key, false), None, "a key has no expiry");
        let foreign =
            Arc::new(PeerTls::from_files(&other_cert, &other_key, &other_ca).expect("load"));
        assert!(
            PeerTls::from_files(&key, &key, &ca).is_err(),
            "a key is not a certificate"
        );
        rt::block_on(async move {
            let stop = ShutdownSignal::new();
            let l = TcpListener::bind("127.0.0.1:0".parse().unwrap()).expect("bind");
            let addr = l.local_addr().unwrap().to_string();
            let mut server = ident("server", "s3cret");
            server.tls = Some(tls.clone());
            let admit: Admit = Rc::new(|_: &str| Ok(()));
            rt::spawn(serve(l, server, handler(), admit, stop.clone())).detach();
            let mut me = ident("client", "s3cret");
            me.tls = Some(tls);
            let link = PeerLink::new(addr.clone(), me);
            assert_eq!(
                link.call(1, b"over tls", Duration::from_secs(5)).await,
                Ok(b"over tls".to_vec())
            );
            let mut stranger = ident("client", "s3cret");
            stranger.tls = Some(foreign);
            let refused = PeerLink::new(addr.clone(), stranger)
                .call(1, b"x", Duration::from_secs(5))
                .await;
            assert!(
                matches!(refused, Err(PeerError::Unreachable(_) | PeerError::Lost(_))),
                "{refused:?}"
            );
            let plain = PeerLink::new(addr, ident("client", "s3cret"))
                .call(1, b"x", Duration::from_secs(3))
                .await;
            assert!(plain.is_err(), "a dialler without TLS: {plain:?}");
            stop.trigger();
        });
        let _ = std::fs::remove_dir_all(dir);
    }
}
