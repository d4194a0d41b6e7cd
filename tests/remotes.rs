//! Black-box tests of the remote registry (API.md §14.1–14.5, FEATURES F075): register, list,
//! get, change and delete remote clusters on a secured node, with write-only passwords sealed
//! under a key derived from the cluster secret.

mod common;

use common::{basic_auth, Client, Resp, Server, TempDir};

const ROOT_PW: &str = "root-pw-for-remote-tests";
const SECRET: &str = "a-cluster-secret-for-the-remote-tests";
const PASSWORD: &str = "replicator-password-0123456789";

fn env(secret: &str, hop: bool) -> Vec<(String, String)> {
    vec![
        ("NARAD_ADMIN_PASSWORD".to_string(), ROOT_PW.to_string()),
        ("NARAD_CLUSTER_SECRET".to_string(), secret.to_string()),
        (
            "NARAD_REMOTES_API_HOP_ENCRYPTED".to_string(),
            hop.to_string(),
        ),
        (
            "NARAD_REMOTES_ALLOWED_PORTS".to_string(),
            "443,8443".to_string(),
        ),
    ]
}

fn call(c: &mut Client, method: &str, path: &str, body: &str) -> Resp {
    let auth = basic_auth("admin", ROOT_PW);
    let mut h = vec![("Authorization", auth.as_str())];
    if matches!(method, "POST" | "PATCH") {
        h.push(("Content-Type", "application/json"));
    }
    c.request(method, path, &h, body.as_bytes())
}

fn files_contain(dir: &std::path::Path, needle: &[u8]) -> bool {
    let Ok(rd) = std::fs::read_dir(dir) else {
        return false;
    };
    rd.flatten().any(|e| {
        let p = e.path();
        if p.is_dir() {
            files_contain(&p, needle)
        } else {
            std::fs::read(&p).is_ok_and(|b| b.windows(needle.len()).any(|w| w == needle))
        }
    })
}

#[test]
fn a_remote_is_registered_changed_and_deleted_and_its_password_never_shows() {
    let dir = TempDir::new("remotes");
    let data = dir.0.join("data");
    let s = Server::start_secure(data.clone(), env(SECRET, true));
    let mut c = s.client();
    let body = format!(
        r#"{{"name":"b","url":"HTTPS://192.0.2.10:443/","username":"replicator","password":"{PASSWORD}","limits":{{"max_in_flight":32}}}}"#
    );
    let r = call(&mut c, "POST", "/v1/remotes", &body);
    assert_eq!(r.status, 201, "{}", r.text());
    assert!(!r.text().contains(PASSWORD), "the password never shows");
    assert_eq!(r.header("cache-control"), Some("no-store"));
    assert_eq!(r.header("x-content-type-options"), Some("nosniff"));
    let v = r.json();
    assert_eq!(v["url"], "https://192.0.2.10", "canonical: {v}");
    assert_eq!(v["username"], "replicator");
    assert_eq!(v["limits"]["max_in_flight"], 32);
    assert_eq!(v["limits"]["request_timeout_ms"], 30000, "defaults filled");
    assert_eq!(v["revision"], 1);
    assert_eq!(v["credential_version"], 1);
    assert_eq!(v["id"].as_str().map(str::len), Some(16));
    let fp = v["password"]["fingerprint"]
        .as_str()
        .expect("fingerprint")
        .to_string();
    let key_version = v["password"]["key_version"]
        .as_str()
        .expect("key")
        .to_string();
    assert_eq!(v["password"]["set_by"], "admin");
    assert!(v.get("ca_pem_sha512").is_none());
    // Taken, and refused with the field named and the value never echoed.
    let r = call(&mut c, "POST", "/v1/remotes", &body);
    assert_eq!(r.status, 409, "{}", r.text());
    let r = call(
        &mut c,
        "POST",
        "/v1/remotes",
        r#"{"name":"c","url":"https://192.0.2.12","username":"r","password":"short-secret-value"}"#,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.error().starts_with("invalid password"), "{}", r.error());
    assert!(!r.text().contains("short-secret-value"));
    // The address guard: a host that resolves to loopback is refused, never dialled.
    let r = call(
        &mut c,
        "POST",
        "/v1/remotes",
        &format!(
            r#"{{"name":"lo","url":"https://127.0.0.1","username":"r","password":"{PASSWORD}"}}"#
        ),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(
        r.error().contains("remotes.allow_addresses"),
        "{}",
        r.error()
    );
    for (bad, field) in [
        (r#"{"name":"C","url":"https://192.0.2.12"}"#, "invalid name"),
        (r#"{"name":"c","url":"http://192.0.2.12"}"#, "invalid url"),
        (
            r#"{"name":"c","url":"https://192.0.2.12:9000"}"#,
            "invalid url",
        ),
        (
            r#"{"name":"c","url":"https://192.0.2.12","username":"a b"}"#,
            "invalid username",
        ),
        (
            r#"{"name":"c","url":"https://192.0.2.12","extra":1}"#,
            "unknown field",
        ),
    ] {
        let r = call(&mut c, "POST", "/v1/remotes", bad);
        assert_eq!(r.status, 400, "{bad}: {}", r.text());
        assert!(r.error().starts_with(field), "{bad}: {}", r.error());
    }

    // Listed, with this node able to open the credential; nodes=false leaves the node views.
    let r = call(&mut c, "GET", "/v1/remotes", "");
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("cache-control"), Some("no-store"));
    let l = r.json();
    assert_eq!(l["allowlist"], "none");
    assert_eq!(l["key"]["key_version"], key_version.as_str());
    assert_eq!(l["remotes"][0]["name"], "b");
    assert_eq!(l["remotes"][0]["links"], serde_json::json!([]));
    assert_eq!(l["remotes"][0]["nodes"][0]["state"], "ready", "{l}");
    let l = call(&mut c, "GET", "/v1/remotes?nodes=false", "").json();
    assert!(l["remotes"][0].get("nodes").is_none() && l.get("lingering").is_none());
    assert_eq!(call(&mut c, "GET", "/v1/remotes/b", "").json()["name"], "b");
    assert_eq!(call(&mut c, "GET", "/v1/remotes/zz", "").status, 404);

    // Change: limits alone; a new url needs the password in the same request.
    let r = call(
        &mut c,
        "PATCH",
        "/v1/remotes/b",
        r#"{"limits":{"compression":"zstd"}}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["limits"]["compression"], "zstd");
    assert_eq!(r.json()["revision"], 2);
    assert_eq!(r.json()["credential_version"], 1);
    let r = call(
        &mut c,
        "PATCH",
        "/v1/remotes/b",
        r#"{"url":"https://198.51.100.7:8443"}"#,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let r = call(
        &mut c,
        "PATCH",
        "/v1/remotes/b",
        r#"{"url":"https://198.51.100.7:8443","password":"another-password-0123456789"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["url"], "https://198.51.100.7:8443");
    assert_eq!(v["credential_version"], 2);
    assert_ne!(v["password"]["fingerprint"], fp.as_str(), "a new password");
    let r = call(
        &mut c,
        "PATCH",
        "/v1/remotes/b",
        r#"{"limits":{"max_in_flight":0}}"#,
    );
    assert_eq!(r.status, 400, "{}", r.text());

    // Nowhere on disk in the clear (the Raft log, its snapshot, every file of the node).
    drop(c);
    drop(s);
    assert!(!files_contain(&data, PASSWORD.as_bytes()));
    assert!(!files_contain(&data, b"another-password-0123456789"));

    // Restarted with the same secret, it opens the credential; with another, it cannot.
    let s = Server::start_secure(data.clone(), env(SECRET, true));
    let mut c = s.client();
    let l = call(&mut c, "GET", "/v1/remotes", "").json();
    assert_eq!(l["remotes"][0]["nodes"][0]["state"], "ready", "{l}");
    drop(c);
    drop(s);
    let s = Server::start_secure(data.clone(), env("another-cluster-secret-entirely", false));
    let mut c = s.client();
    let l = call(&mut c, "GET", "/v1/remotes", "").json();
    assert_eq!(l["remotes"][0]["nodes"][0]["state"], "stale", "{l}");
    // No encrypted ingress hop attested: a password change is refused (412).
    let r = call(
        &mut c,
        "PATCH",
        "/v1/remotes/b",
        r#"{"password":"yet-another-password-0123456789"}"#,
    );
    assert_eq!(r.status, 412, "{}", r.text());
    // Delete, then it is gone; a bad force value is a 400.
    assert_eq!(
        call(&mut c, "DELETE", "/v1/remotes/b?force=maybe", "").status,
        400
    );
    assert_eq!(call(&mut c, "DELETE", "/v1/remotes/b", "").status, 204);
    assert_eq!(call(&mut c, "GET", "/v1/remotes/b", "").status, 404);
    assert_eq!(call(&mut c, "DELETE", "/v1/remotes/b", "").status, 404);
}

#[test]
fn registry_writes_are_limited_to_ten_a_minute_per_node() {
    let dir = TempDir::new("remotes-rate");
    let s = Server::start_secure(dir.0.join("data"), env(SECRET, true));
    let mut c = s.client();
    let mut statuses = Vec::new();
    for i in 0..11 {
        let body = format!(
            r#"{{"name":"r{i}","url":"https://192.0.2.{i}0","username":"u","password":"{PASSWORD}"}}"#
        );
        let r = call(&mut c, "POST", "/v1/remotes", &body);
        if r.status == 429 {
            assert!(r.header("retry-after").is_some(), "{}", r.text());
        }
        statuses.push(r.status);
    }
    assert_eq!(&statuses[..10], &[201; 10], "{statuses:?}");
    assert_eq!(statuses[10], 429, "{statuses:?}");
}

#[test]
fn a_secret_rotation_then_reencrypt_keeps_the_credentials_readable() {
    // Proves API.md §14.7 (F080): remotes sealed under secret A; the node restarted with secret
    // B and NARAD_CLUSTER_SECRET_PREVIOUS=A sees them stale until re-encrypted, then ready; a
    // node with neither key can only report them as failed (key_unknown).
    let dir = TempDir::new("remotes-rotate");
    let data = dir.0.join("data");
    let s = Server::start_secure(data.clone(), env(SECRET, true));
    let mut c = s.client();
    let body = format!(
        r#"{{"name":"b","url":"https://192.0.2.10","username":"replicator","password":"{PASSWORD}"}}"#
    );
    assert_eq!(call(&mut c, "POST", "/v1/remotes", &body).status, 201);
    let old_key =
        call(&mut c, "GET", "/v1/remotes/b", "").json()["password"]["key_version"].clone();
    drop(c);
    drop(s);

    const NEW: &str = "the-rotated-cluster-secret-value";
    let mut e = env(NEW, true);
    e.push((
        "NARAD_CLUSTER_SECRET_PREVIOUS".to_string(),
        SECRET.to_string(),
    ));
    let s = Server::start_secure(data.clone(), e);
    let mut c = s.client();
    let l = call(&mut c, "GET", "/v1/remotes", "").json();
    assert_eq!(l["remotes"][0]["nodes"][0]["state"], "stale", "{l}");
    assert_eq!(
        call(
            &mut c,
            "POST",
            "/v1/cluster/reencrypt-remotes",
            r#"{"x":1}"#
        )
        .status,
        400
    );
    let r = call(&mut c, "POST", "/v1/cluster/reencrypt-remotes", "{}");
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["reencrypted"], serde_json::json!(["b"]), "{v}");
    assert_ne!(v["key_version"], old_key);
    let l = call(&mut c, "GET", "/v1/remotes", "").json();
    assert_eq!(l["remotes"][0]["nodes"][0]["state"], "ready", "{l}");
    assert_eq!(l["remotes"][0]["password"]["key_version"], v["key_version"]);
    let again = call(&mut c, "POST", "/v1/cluster/reencrypt-remotes", "").json();
    assert_eq!(
        again["already_current"],
        serde_json::json!(["b"]),
        "{again}"
    );
    drop(c);
    drop(s);

    let s = Server::start_secure(data, env("a-third-secret-nobody-sealed-with", true));
    let mut c = s.client();
    let v = call(&mut c, "POST", "/v1/cluster/reencrypt-remotes", "").json();
    assert_eq!(v["failed"][0]["name"], "b", "{v}");
    assert_eq!(v["failed"][0]["reason"], "key_unknown", "{v}");
}

#[test]
fn the_cli_registers_lists_and_removes_a_remote_on_the_real_node() {
    // The `narad remote` verbs against the real registry: add (password from stdin), ls, rm.
    use std::io::Write;
    use std::process::{Command, Stdio};
    let dir = TempDir::new("remotes-cli");
    let s = Server::start_secure(dir.0.join("data"), env(SECRET, true));
    let cli = |args: &[&str], stdin: &str| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_narad"))
            .args(args)
            .env("NARAD_ADDR", format!("http://{}", s.addr()))
            .env("NARAD_USER", "admin")
            .env("NARAD_PASS", ROOT_PW)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run the CLI");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(stdin.as_bytes())
            .expect("write stdin");
        let out = child.wait_with_output().expect("CLI output");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string()
                + &String::from_utf8_lossy(&out.stderr),
        )
    };
    let (ok, out) = cli(
        &[
            "remote",
            "add",
            "dr",
            "--url",
            "https://198.51.100.9",
            "--username",
            "replicator",
            "--remote-password-stdin",
            "--max-in-flight",
            "8",
        ],
        &format!("{PASSWORD}\n"),
    );
    assert!(ok, "{out}");
    assert!(out.contains("\"dr\"") && !out.contains(PASSWORD), "{out}");
    let (ok, out) = cli(&["remote", "ls"], "");
    assert!(ok && out.contains("https://198.51.100.9"), "{out}");
    assert!(out.contains("\"max_in_flight\": 8"), "{out}");
    let (ok, out) = cli(&["remote", "rm", "dr"], "");
    assert!(ok, "{out}");
    let (ok, out) = cli(&["remote", "ls"], "");
    assert!(ok && !out.contains("https://198.51.100.9"), "{out}");
}
