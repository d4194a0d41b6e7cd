//! Security black-box tests: `narad serve` with security on (the default), spoken to over HTTP
//! on loopback as a user would. Authentication (401 + challenge), root seeding (environment and
//! generated file), users and grants (texts of API.md §11/§13), RBAC (403) and grants taking
//! effect without restart, topic ownership, the failed-login throttle (429), the per-identity
//! consume cap (429), and dev mode staying open on loopback only.

mod common;

use std::time::Duration;

use common::{basic_auth, Client, Resp, Server, TempDir};

const ROOT_PW: &str = "root-pw-for-tests";

fn secure(dir: &TempDir, extra: &[(&str, &str)]) -> Server {
    let mut env = vec![("NARAD_ADMIN_PASSWORD".to_string(), ROOT_PW.to_string())];
    env.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Server::start_secure(dir.0.join("data"), env)
}

/// A request as `user` (JSON body for POST/PUT/PATCH).
fn call(c: &mut Client, method: &str, path: &str, user: (&str, &str), body: &str) -> Resp {
    let auth = basic_auth(user.0, user.1);
    let mut h = vec![("Authorization", auth.as_str())];
    if matches!(method, "POST" | "PUT" | "PATCH") {
        h.push(("Content-Type", "application/json"));
    }
    c.request(method, path, &h, body.as_bytes())
}

const ROOT: (&str, &str) = ("admin", ROOT_PW);

fn create_user(c: &mut Client, as_user: (&str, &str), name: &str, pw: &str, grants: &str) -> Resp {
    call(
        c,
        "POST",
        "/v1/users",
        as_user,
        &format!(r#"{{"username":"{name}","password":"{pw}","grants":{grants}}}"#),
    )
}

/// Creates user `bob` (password `bob-pw`), who may create topics named `bob.*`.
fn create_bob_the_creator(c: &mut Client) {
    let r = create_user(
        c,
        ROOT,
        "bob",
        "bob-pw",
        r#"[{"action":"create","patterns":["bob.*"]}]"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
}

#[test]
fn anonymous_and_wrong_credentials_get_401_with_challenge() {
    // Proves API.md §2 and §1.4: no credentials, unknown users and wrong passwords all get 401
    // with `WWW-Authenticate: Basic realm="narad"`, before the guard (415) and the router (404);
    // health probes need nothing; the root admin seeded from NARAD_ADMIN_PASSWORD gets in and no
    // password file is written.
    let dir = TempDir::new("sec-401");
    let s = secure(&dir, &[]);
    let mut c = s.client();
    for (method, path) in [
        ("GET", "/v1/topics"),
        ("GET", "/v1/no-such-route"),
        ("POST", "/v1/topics"),
    ] {
        let r = c.request(method, path, &[], b"");
        assert_eq!(r.status, 401, "{method} {path}: {}", r.text());
        assert_eq!(r.header("WWW-Authenticate"), Some("Basic realm=\"narad\""));
        assert_eq!(r.error(), "authentication required");
    }
    let r = call(&mut c, "GET", "/v1/topics", ("nobody", "x"), "");
    assert_eq!(r.status, 401);
    let r = call(&mut c, "GET", "/v1/topics", ("admin", "wrong"), "");
    assert_eq!(r.status, 401);
    assert_eq!(r.header("WWW-Authenticate"), Some("Basic realm=\"narad\""));
    assert_eq!(c.get("/healthz").status, 200);
    assert_eq!(c.get("/readyz").status, 200);
    let r = call(&mut c, "GET", "/v1/topics", ROOT, "");
    assert_eq!(r.status, 200, "{}", r.text());
    // Authenticated, the guard and router answer as usual.
    let auth = basic_auth(ROOT.0, ROOT.1);
    let r = c.request("POST", "/v1/topics", &[("Authorization", &auth)], b"");
    assert_eq!(r.status, 415);
    let r = call(&mut c, "GET", "/v1/no-such-route", ROOT, "");
    assert_eq!(r.status, 404);
    assert!(!s.data_dir.join("admin-password").exists());
    let users = call(&mut c, "GET", "/v1/users", ROOT, "").json();
    assert_eq!(users[0]["username"], "admin");
    assert_eq!(users[0]["root"], true);
    assert!(users[0].get("password_hash").is_none());
}

#[test]
fn root_password_generated_into_file_once() {
    // Proves SEMANTICS.md §15 seeding without NARAD_ADMIN_PASSWORD: the password is written to
    // `admin-password` (mode 0600) and works; a restart seeds nothing again (no second file)
    // and the same password still works.
    use std::os::unix::fs::PermissionsExt;
    let dir = TempDir::new("sec-seed");
    let data = dir.0.join("data");
    let mut s = Server::start_secure(data.clone(), vec![]);
    let file = data.join("admin-password");
    let pw = std::fs::read_to_string(&file).expect("admin-password written");
    let pw = pw.trim().to_string();
    assert!(pw.len() >= 16, "a generated password of some strength");
    let mode = std::fs::metadata(&file).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let mut c = s.client();
    assert_eq!(
        call(&mut c, "GET", "/v1/users", ("admin", &pw), "").status,
        200
    );
    s.kill9();
    let s = Server::start_secure(data.clone(), vec![]);
    let others: Vec<_> = std::fs::read_dir(&data)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with("admin-password.")
        })
        .collect();
    assert!(others.is_empty(), "seeded only once");
    let mut c = s.client();
    assert_eq!(
        call(&mut c, "GET", "/v1/users", ("admin", &pw), "").status,
        200
    );
}

#[test]
fn grants_give_403_and_take_effect_without_restart() {
    // Proves API.md §16: produce/consume/create grants with trailing-`*` patterns, 403 texts,
    // grant changes applying on the next request, topic ownership (owner manages, others
    // cannot, a client-sent owner is ignored) and the grant-filtered topic list.
    let dir = TempDir::new("sec-rbac");
    let s = secure(&dir, &[]);
    let mut c = s.client();
    let bob = ("bob", "bob-pw");
    let r = create_user(
        &mut c,
        ROOT,
        "bob",
        "bob-pw",
        r#"[{"action":"produce","patterns":["in.*"]},{"action":"create","patterns":["bob.*"]}]"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(
        call(&mut c, "POST", "/v1/topics", ROOT, r#"{"name":"in.x"}"#).status,
        201
    );
    assert_eq!(
        call(&mut c, "POST", "/v1/topics", ROOT, r#"{"name":"other"}"#).status,
        201
    );

    let r = call(&mut c, "POST", "/v1/topics/in.x/produce", bob, r#"{"a":1}"#);
    assert_eq!(r.status, 202, "{}", r.text());
    let r = call(
        &mut c,
        "POST",
        "/v1/topics/other/produce",
        bob,
        r#"{"a":1}"#,
    );
    assert_eq!(
        (r.status, r.error()),
        (403, "produce not allowed on this topic".into())
    );
    let r = call(&mut c, "GET", "/v1/topics/in.x/consume", bob, "");
    assert_eq!(
        (r.status, r.error()),
        (403, "consume not allowed on this topic".into())
    );
    let r = call(&mut c, "POST", "/v1/topics", bob, r#"{"name":"nope"}"#);
    assert_eq!(
        (r.status, r.error()),
        (403, "create not allowed on this topic".into())
    );
    let r = call(&mut c, "GET", "/v1/topics/other", bob, "");
    assert_eq!(
        (r.status, r.error()),
        (403, "no grant on this topic".into())
    );
    assert_eq!(call(&mut c, "GET", "/v1/topics/in.x", bob, "").status, 200);
    let r = call(&mut c, "GET", "/v1/users", bob, "");
    assert_eq!(
        (r.status, r.error()),
        (403, "admin privileges required".into())
    );
    for (method, path) in [
        ("GET", "/v1/cluster/members"),
        ("GET", "/v1/cluster/moves"),
        ("POST", "/v1/cluster/members/n1/decommission?dry_run=true"),
    ] {
        let r = call(&mut c, method, path, bob, "");
        assert_eq!(
            (r.status, r.error()),
            (403, "admin privileges required".into()),
            "{path}"
        );
    }
    assert_eq!(
        call(&mut c, "GET", "/v1/cluster/members", ROOT, "").status,
        200
    );

    // Ownership: bob's own topic, whatever owner the body claims.
    let r = call(
        &mut c,
        "POST",
        "/v1/topics",
        bob,
        r#"{"name":"bob.t","owner":"admin"}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    assert_eq!(r.json()["owner"], "bob");
    let listed = call(&mut c, "GET", "/v1/topics", bob, "").text();
    // The filtered page is written like an admin's: the page's fields and each topic's in the
    // order of API.md §6.2 / §7 (not re-serialised with sorted keys).
    assert!(
        listed.starts_with(r#"{"topics":[{"name":"bob.t","id":"#),
        "{listed}"
    );
    assert!(
        listed.trim_end().ends_with(r#""next_page_token":""}"#),
        "{listed}"
    );
    let names: Vec<String> = serde_json::from_str::<serde_json::Value>(&listed).unwrap()["topics"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        names,
        vec!["bob.t", "in.x"],
        "list filtered to readable topics"
    );
    let r = call(&mut c, "DELETE", "/v1/topics/other", bob, "");
    assert_eq!(
        (r.status, r.error()),
        (
            403,
            "only the topic owner or an admin may modify this topic".into()
        )
    );

    // Grant consume: effective on the next request, no restart.
    let r = call(
        &mut c,
        "PUT",
        "/v1/users/bob/grants",
        ROOT,
        r#"{"grants":[{"action":"produce","patterns":["in.*"]},{"action":"consume","patterns":["in.x"]}]}"#,
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["grants"][1]["action"], "consume");
    let r = call(&mut c, "GET", "/v1/topics/in.x/consume?wait=1s", bob, "");
    assert_eq!(r.status, 200, "{}", r.text());
    // bob lost `create`, yet still owns and may delete bob.t.
    let r = call(&mut c, "DELETE", "/v1/topics/bob.t", bob, "");
    assert_eq!(r.status, 204, "{}", r.text());
}

#[test]
fn user_routes_enforce_texts_and_root_rules() {
    // Proves API.md §11/§13 statuses and texts: validation, duplicates, no escalation, the
    // root admin's protections, self-service password change with current_password, password
    // changes cutting access at once, and deletion.
    let dir = TempDir::new("sec-users");
    let s = secure(&dir, &[]);
    let mut c = s.client();
    let r = create_user(&mut c, ROOT, "bad name", "x", "[]");
    assert_eq!(
        (r.status, r.error()),
        (400, "username must match ^[A-Za-z0-9._-]{1,64}$".into())
    );
    let r = call(&mut c, "POST", "/v1/users", ROOT, r#"{"username":"nopw"}"#);
    assert_eq!((r.status, r.error()), (400, "password required".into()));
    let r = create_user(
        &mut c,
        ROOT,
        "g",
        "x",
        r#"[{"action":"x","patterns":["a"]}]"#,
    );
    assert_eq!(
        (r.status, r.error()),
        (400, r#"unknown grant action "x""#.into())
    );
    let r = create_user(&mut c, ROOT, "g", "x", r#"[{"action":"produce"}]"#);
    assert_eq!(
        (r.status, r.error()),
        (
            400,
            r#"grant "produce" requires at least one topic pattern"#.into()
        )
    );
    let r = call(
        &mut c,
        "POST",
        "/v1/users",
        ROOT,
        r#"{"username":"u","password":"p","x":1}"#,
    );
    assert_eq!(
        (r.status, r.error()),
        (400, r#"invalid json: json: unknown field "x""#.into())
    );

    let ops = ("ops", "ops-pw");
    let r = create_user(&mut c, ROOT, "ops", "ops-pw", r#"[{"action":"admin"}]"#);
    assert_eq!(r.status, 201, "{}", r.text());
    let u = r.json();
    assert_eq!(u["username"], "ops");
    assert!(u.get("root").is_none() && u.get("password").is_none());
    assert!(u["created_at_ms"].as_u64().unwrap() > 0);
    assert_eq!(create_user(&mut c, ROOT, "ops", "x", "[]").status, 409);
    let r = create_user(&mut c, ops, "ops2", "x", r#"[{"action":"admin"}]"#);
    assert_eq!(
        (r.status, r.error()),
        (403, "cannot grant permissions you do not hold".into())
    );
    let r = create_user(
        &mut c,
        ops,
        "carol",
        "carol-pw",
        r#"[{"action":"consume","patterns":["*"]}]"#,
    );
    assert_eq!(
        r.status,
        201,
        "a non-root admin gives scoped grants: {}",
        r.text()
    );

    let r = call(
        &mut c,
        "PUT",
        "/v1/users/ops/grants",
        ops,
        r#"{"grants":[]}"#,
    );
    assert_eq!(
        (r.status, r.error()),
        (403, "cannot modify your own grants".into())
    );
    let r = call(
        &mut c,
        "PUT",
        "/v1/users/admin/grants",
        ops,
        r#"{"grants":[]}"#,
    );
    assert_eq!(
        (r.status, r.error()),
        (403, "the root admin's grants are immutable".into())
    );
    let r = call(&mut c, "DELETE", "/v1/users/admin", ops, "");
    assert_eq!(
        (r.status, r.error()),
        (403, "the root admin cannot be deleted".into())
    );
    let r = call(&mut c, "DELETE", "/v1/users/ops", ops, "");
    assert_eq!(
        (r.status, r.error()),
        (403, "cannot delete your own account".into())
    );
    let r = call(
        &mut c,
        "PUT",
        "/v1/users/admin/password",
        ops,
        r#"{"new_password":"z"}"#,
    );
    assert_eq!(
        (r.status, r.error()),
        (
            403,
            "only the root admin may change the root password".into()
        )
    );

    // Self-service password change.
    let carol = ("carol", "carol-pw");
    let r = call(
        &mut c,
        "PUT",
        "/v1/users/ops/password",
        carol,
        r#"{"new_password":"z"}"#,
    );
    assert_eq!(r.status, 403);
    let r = call(
        &mut c,
        "PUT",
        "/v1/users/carol/password",
        carol,
        r#"{"new_password":"new-pw","current_password":"wrong"}"#,
    );
    assert_eq!(
        (r.status, r.error()),
        (403, "current password is incorrect".into())
    );
    let r = call(
        &mut c,
        "PUT",
        "/v1/users/carol/password",
        carol,
        r#"{"current_password":"carol-pw"}"#,
    );
    assert_eq!((r.status, r.error()), (400, "new_password required".into()));
    let r = call(
        &mut c,
        "PUT",
        "/v1/users/carol/password",
        carol,
        r#"{"new_password":"new-pw","current_password":"carol-pw"}"#,
    );
    assert_eq!(r.status, 204, "{}", r.text());
    assert_eq!(call(&mut c, "GET", "/v1/topics", carol, "").status, 401);
    assert_eq!(
        call(&mut c, "GET", "/v1/topics", ("carol", "new-pw"), "").status,
        200
    );

    // List, get, delete.
    let list = call(&mut c, "GET", "/v1/users", ops, "").json();
    let names: Vec<&str> = list
        .as_array()
        .unwrap()
        .iter()
        .map(|u| u["username"].as_str().unwrap())
        .collect();
    assert_eq!(names, vec!["admin", "carol", "ops"]);
    assert_eq!(
        call(&mut c, "GET", "/v1/users/carol", ops, "").json()["grants"][0]["action"],
        "consume"
    );
    let r = call(&mut c, "GET", "/v1/users/zed", ops, "");
    assert_eq!((r.status, r.error()), (404, "user not found".into()));
    assert_eq!(
        call(&mut c, "DELETE", "/v1/users/carol", ops, "").status,
        204
    );
    assert_eq!(
        call(&mut c, "GET", "/v1/topics", ("carol", "new-pw"), "").status,
        401
    );
    assert_eq!(
        call(&mut c, "DELETE", "/v1/users/carol", ops, "").status,
        404
    );
}

#[test]
fn repeated_bad_passwords_are_throttled() {
    // Proves the failed-login throttle of API.md §2: 5 failed checks per username, then 429 with
    // the spec text (even for the right password); a repeated wrong password is an instant 401
    // from the negative cache and draws nothing; unknown usernames are never throttled; other
    // users are unaffected.
    let dir = TempDir::new("sec-throttle");
    let s = secure(&dir, &[]);
    let mut c = s.client();
    assert_eq!(
        create_user(&mut c, ROOT, "dave", "dave-pw", "[]").status,
        201
    );
    for i in 0..5 {
        let r = call(
            &mut c,
            "GET",
            "/v1/topics",
            ("dave", &format!("bad{i}")),
            "",
        );
        assert_eq!(r.status, 401, "attempt {i}");
    }
    for _ in 0..3 {
        let r = call(&mut c, "GET", "/v1/topics", ("dave", "bad0"), "");
        assert_eq!(
            r.status, 401,
            "negative cache answers a repeated wrong password"
        );
    }
    let r = call(&mut c, "GET", "/v1/topics", ("dave", "bad5"), "");
    assert_eq!(
        (r.status, r.error()),
        (429, "too many failed authentication attempts".into())
    );
    let r = call(&mut c, "GET", "/v1/topics", ("dave", "dave-pw"), "");
    assert_eq!(r.status, 429, "the bucket is empty for every password");
    for i in 0..10 {
        let r = call(&mut c, "GET", "/v1/topics", ("ghost", &format!("g{i}")), "");
        assert_eq!(r.status, 401, "unknown usernames are not throttled");
    }
    assert_eq!(call(&mut c, "GET", "/v1/topics", ROOT, "").status, 200);
}

#[test]
fn consume_cap_per_identity_answers_429() {
    // Proves the per-identity consume cap of API.md §4 with a cap of 2: two long-polls of one
    // user hold the cap for their whole wait, a third gets 429 with the spec text, a batch
    // consume counts as its `max`, another user is unaffected, and the cap frees afterwards.
    let dir = TempDir::new("sec-cap");
    let s = secure(
        &dir,
        &[("NARAD_HTTP_MAX_CONSUME_IN_FLIGHT_PER_IDENTITY", "2")],
    );
    let mut c = s.client();
    assert_eq!(
        call(&mut c, "POST", "/v1/topics", ROOT, r#"{"name":"q"}"#).status,
        201
    );
    assert_eq!(
        create_user(
            &mut c,
            ROOT,
            "eve",
            "eve-pw",
            r#"[{"action":"consume","patterns":["q"]}]"#
        )
        .status,
        201
    );
    let addr = s.addr();
    let polls: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(move || {
                let mut c = Client::connect(addr).unwrap();
                call(&mut c, "GET", "/v1/topics/q/consume?wait=3s", ROOT, "").status
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(700));
    let r = call(&mut c, "GET", "/v1/topics/q/consume?wait=1s", ROOT, "");
    assert_eq!(
        (r.status, r.error()),
        (
            429,
            "too many in-flight consume requests for this identity (limit 2 per node)".into()
        )
    );
    let r = call(&mut c, "GET", "/v1/topics/q/consume", ("eve", "eve-pw"), "");
    assert_eq!(
        r.status,
        204,
        "another identity has its own cap: {}",
        r.text()
    );
    for p in polls {
        assert_eq!(p.join().unwrap(), 204);
    }
    // A batch of 5 clamps to the cap of 2 and fits alone, but not beside a long-poll.
    let poll = std::thread::spawn(move || {
        let mut c = Client::connect(addr).unwrap();
        call(&mut c, "GET", "/v1/topics/q/consume?wait=2s", ROOT, "").status
    });
    std::thread::sleep(Duration::from_millis(700));
    let auth = basic_auth(ROOT.0, ROOT.1);
    let r = c.request(
        "GET",
        "/v1/topics/q/consume?max=5",
        &[("Authorization", &auth), ("X-Narad-Client", "t")],
        b"",
    );
    assert_eq!(r.status, 429, "{}", r.text());
    assert_eq!(poll.join().unwrap(), 204);
    let r = c.request(
        "GET",
        "/v1/topics/q/consume?max=5",
        &[("Authorization", &auth), ("X-Narad-Client", "t")],
        b"",
    );
    assert_eq!(
        r.status,
        204,
        "an empty batch fits once the cap is free: {}",
        r.text()
    );
}

#[test]
fn dev_mode_is_open_on_loopback_only() {
    // Proves OPERATIONS.md §2/§5: `server start --dev` needs no credentials, creates topics
    // without an owner, and listens on 127.0.0.1 only (another loopback address is refused).
    let dir = TempDir::new("sec-dev");
    let s = Server::start(&dir);
    let mut c = s.client();
    assert_eq!(c.get("/v1/topics").status, 200);
    let r = c.post_json("/v1/topics", r#"{"name":"open","owner":"mallory"}"#);
    assert_eq!(r.status, 201, "{}", r.text());
    assert!(r.json().get("owner").is_none());
    assert_eq!(c.get("/v1/users").status, 200);
    let other = std::net::SocketAddr::from(([127, 0, 0, 2], s.port));
    assert!(
        std::net::TcpStream::connect_timeout(&other, Duration::from_secs(2)).is_err(),
        "dev mode must not listen beyond 127.0.0.1"
    );
}

#[test]
fn fanout_children_routes_need_ownership() {
    // Proves API.md §16 for the fan-out routes: attaching needs ownership of parent and child,
    // listing children needs a grant on the parent, detaching needs ownership of either; the
    // owner of both may attach.
    let dir = TempDir::new("sec-children");
    let s = secure(&dir, &[]);
    let mut c = s.client();
    let bob = ("bob", "bob-pw");
    create_bob_the_creator(&mut c);
    assert_eq!(
        call(&mut c, "POST", "/v1/topics", bob, r#"{"name":"bob.p"}"#).status,
        201
    );
    assert_eq!(
        call(&mut c, "POST", "/v1/topics", bob, r#"{"name":"bob.c"}"#).status,
        201
    );
    assert_eq!(
        call(&mut c, "POST", "/v1/topics", ROOT, r#"{"name":"theirs"}"#).status,
        201
    );
    const NOT_OWNER: &str = "only the topic owner or an admin may modify this topic";
    let r = call(
        &mut c,
        "POST",
        "/v1/topics/bob.p/children",
        bob,
        r#"{"child":"theirs"}"#,
    );
    assert_eq!((r.status, r.error()), (403, NOT_OWNER.into()));
    let r = call(
        &mut c,
        "POST",
        "/v1/topics/theirs/children",
        bob,
        r#"{"child":"bob.c"}"#,
    );
    assert_eq!((r.status, r.error()), (403, NOT_OWNER.into()));
    let r = call(&mut c, "GET", "/v1/topics/theirs/children", bob, "");
    assert_eq!(
        (r.status, r.error()),
        (403, "no grant on this topic".into())
    );
    let r = call(
        &mut c,
        "DELETE",
        "/v1/topics/theirs/children/theirs",
        bob,
        "",
    );
    assert_eq!((r.status, r.error()), (403, NOT_OWNER.into()));
    let r = call(
        &mut c,
        "POST",
        "/v1/topics/bob.p/children",
        bob,
        r#"{"child":"bob.c"}"#,
    );
    assert_ne!(r.status, 403, "the owner of both may attach: {}", r.text());
    assert_eq!(
        call(&mut c, "GET", "/v1/topics/bob.p/children", bob, "").status,
        200
    );
}

#[test]
fn audit_lines_and_no_passwords_in_logs() {
    // Proves SEMANTICS.md §15 audit and API.md §2 secrecy: user create, grants, password and
    // delete changes, failed logins and the cluster changes (decommission, cancel, forget, move
    // abort; refused here, a denied one included) write `component=audit` lines with event,
    // actor, target, status and outcome, and no password (root's, a user's, a wrong one) appears
    // in the log or in any answer.
    let dir = TempDir::new("sec-audit");
    let log = dir.0.join("server.log");
    let env = vec![
        ("NARAD_ADMIN_PASSWORD".to_string(), ROOT_PW.to_string()),
        ("NARAD_LOG_LEVEL".to_string(), "info".to_string()),
    ];
    let s = Server::start_secure_logged(dir.0.join("data"), env, Some(&log));
    let mut c = s.client();
    let secrets = ["Frank-Secret-1", "Frank-Secret-2", "Wrong-Secret-3"];
    let r = create_user(&mut c, ROOT, "frank", secrets[0], "[]");
    assert_eq!(r.status, 201);
    let r = call(
        &mut c,
        "PUT",
        "/v1/users/frank/grants",
        ROOT,
        r#"{"grants":[{"action":"consume","patterns":["x"]}]}"#,
    );
    assert_eq!(r.status, 200);
    let body = format!(r#"{{"new_password":"{}"}}"#, secrets[1]);
    assert_eq!(
        call(&mut c, "PUT", "/v1/users/frank/password", ROOT, &body).status,
        204
    );
    let r = call(&mut c, "GET", "/v1/topics", ("frank", secrets[2]), "");
    assert_eq!(r.status, 401);
    assert!(!r.text().contains(secrets[2]));
    let listed = call(&mut c, "GET", "/v1/users", ROOT, "").text();
    assert!(
        !listed.contains("$2"),
        "no bcrypt hash in answers: {listed}"
    );
    let members = call(&mut c, "GET", "/v1/cluster/members", ROOT, "").json();
    let node = members["members"][0]["id"]
        .as_str()
        .expect("node id")
        .to_string();
    assert_eq!(
        call(&mut c, "POST", "/v1/topics", ROOT, r#"{"name":"orders"}"#).status,
        201
    );
    let frank = ("frank", secrets[1]);
    let decommission = format!("/v1/cluster/members/{node}/decommission");
    for (method, path, user, want) in [
        ("POST", decommission.as_str(), frank, 403),
        ("POST", decommission.as_str(), ROOT, 409),
        ("DELETE", decommission.as_str(), ROOT, 204),
        ("POST", "/v1/cluster/members/ghost/forget", ROOT, 404),
        ("POST", "/v1/cluster/moves/orders/0/abort", ROOT, 409),
    ] {
        assert_eq!(
            call(&mut c, method, path, user, "").status,
            want,
            "{method} {path}"
        );
    }
    assert_eq!(
        call(&mut c, "DELETE", "/v1/users/frank", ROOT, "").status,
        204
    );
    drop(c);
    drop(s);
    let text = std::fs::read_to_string(&log).unwrap();
    let audit: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(r#""component":"audit""#))
        .collect();
    for event in [
        "user.create",
        "user.grants",
        "user.password",
        "user.delete",
        "auth.failure",
    ] {
        assert!(
            audit
                .iter()
                .any(|l| l.contains(&format!(r#""event":"{event}""#)) && l.contains("frank")),
            "no audit line for {event} in:\n{text}"
        );
    }
    assert!(audit.iter().any(|l| l.contains(r#""actor":"admin""#)));
    let cluster: Vec<serde_json::Value> = audit
        .iter()
        .filter(|l| l.contains(r#""event":"cluster."#))
        .map(|l| serde_json::from_str(l).expect("JSON audit line"))
        .collect();
    let seen: Vec<(&str, &str, &str, u64, &str)> = cluster
        .iter()
        .map(|v| {
            (
                v["event"].as_str().unwrap_or(""),
                v["actor"].as_str().unwrap_or(""),
                v["target"].as_str().unwrap_or(""),
                v["status"].as_u64().unwrap_or(0),
                v["outcome"].as_str().unwrap_or(""),
            )
        })
        .collect();
    let node = node.as_str();
    assert_eq!(
        seen,
        [
            ("cluster.decommission", "frank", node, 403, "denied"),
            ("cluster.decommission", "admin", node, 409, "rejected"),
            ("cluster.decommission.cancel", "admin", node, 204, "ok"),
            ("cluster.forget", "admin", "ghost", 404, "rejected"),
            ("cluster.move.abort", "admin", "orders/0", 409, "rejected"),
        ]
    );
    // Each audit line parses as JSON with `target` = the audited user, not the logging module:
    // JSON readers keep the last of duplicate keys, so a line must carry `target` once.
    for line in &audit {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert_eq!(line.matches(r#""target":"#).count(), 1, "{line}");
        if v["actor"] == "system" {
            assert_eq!(v["target"], "admin", "root seeding: {line}");
        } else if !line.contains(r#""event":"cluster."#) {
            assert_eq!(v["target"], "frank", "{line}");
        }
    }
    for secret in secrets.iter().chain([&ROOT_PW]) {
        assert!(!text.contains(secret), "a password reached the log");
    }
}

#[test]
fn remote_child_attach_answers_by_security_and_plane() {
    // Proves API.md §9.1 for a remote-child attach: on a secured node an admin naming a remote
    // that is not registered gets `400` (with or without `dry_run`); a non-admin owner of both
    // topics gets `403 remotes require security`; with security off (dev) every caller gets that
    // `403`. The same `403` for every route of the remote plane (§9.4-9.6, §14).
    const NEED_SECURITY: &str = "remotes require security";
    let dir = TempDir::new("sec-remote");
    let s = secure(&dir, &[]);
    let mut c = s.client();
    create_bob_the_creator(&mut c);
    assert_eq!(
        call(&mut c, "POST", "/v1/topics", ROOT, r#"{"name":"rp"}"#).status,
        201
    );
    for body in [
        r#"{"child":"rp-to-b","remote":"b"}"#,
        r#"{"child":"rp-to-b","remote":"b","dry_run":true,"lanes":2,"from":"earliest"}"#,
    ] {
        let r = call(&mut c, "POST", "/v1/topics/rp/children", ROOT, body);
        assert_eq!(r.status, 400, "{body}: {}", r.text());
        assert_eq!(r.error(), "invalid argument: unknown remote \"b\"");
    }
    assert_eq!(
        call(
            &mut c,
            "POST",
            "/v1/topics",
            ("bob", "bob-pw"),
            r#"{"name":"bob.p"}"#
        )
        .status,
        201
    );
    let r = call(
        &mut c,
        "POST",
        "/v1/topics/bob.p/children",
        ("bob", "bob-pw"),
        r#"{"child":"bob.p-to-b","remote":"b"}"#,
    );
    assert_eq!((r.status, r.error()), (403, NEED_SECURITY.into()));
    // Nothing was created by the refusals.
    assert_eq!(
        call(&mut c, "GET", "/v1/topics/rp-to-b", ROOT, "").status,
        404
    );
    // The remote-plane routes (§9.4-9.6, §14) answer an admin (a register without a url is a
    // 400, an unknown remote or remote child a 404); anyone else gets the 403.
    let routes = [
        ("POST", "/v1/remotes", r#"{"name":"b"}"#, 400),
        ("GET", "/v1/remotes", "", 200),
        ("GET", "/v1/remotes/b", "", 404),
        ("PATCH", "/v1/remotes/b", "{}", 404),
        ("DELETE", "/v1/remotes/b", "", 404),
        ("POST", "/v1/remotes/b/test", r#"{"topic":"t"}"#, 404),
        ("POST", "/v1/cluster/reencrypt-remotes", "", 412),
        ("POST", "/v1/topics/rp/children/rp-to-b/pause", "", 404),
        ("POST", "/v1/topics/rp/children/rp-to-b/resume", "", 404),
        (
            "POST",
            "/v1/topics/rp/children/rp-to-b/skip",
            r#"{"partition":0,"offset":0}"#,
            404,
        ),
    ];
    for (method, path, body, status) in routes {
        let r = call(&mut c, method, path, ROOT, body);
        assert_eq!(r.status, status, "{method} {path}: {}", r.text());
        // §14: remotes answers are never cached; writes say nosniff too.
        if !path.starts_with("/v1/topics/") {
            assert_eq!(
                r.header("cache-control"),
                Some("no-store"),
                "{method} {path}"
            );
            let nosniff = r.header("x-content-type-options");
            assert_eq!(nosniff.is_some(), method != "GET", "{method} {path}");
        }
        let r = call(&mut c, method, path, ("bob", "bob-pw"), body);
        assert_eq!(
            (r.status, r.error()),
            (403, NEED_SECURITY.into()),
            "{method} {path}"
        );
    }
    assert_eq!(
        call(&mut c, "PUT", "/v1/remotes", ROOT, "").status,
        405,
        "wrong method"
    );
    drop(c);
    drop(s);

    let dev_dir = TempDir::new("dev-remote");
    let dev = Server::start(&dev_dir);
    let mut c = dev.client();
    c.create_topic("rp", 3);
    let r = c.post_json("/v1/topics/rp/children", r#"{"child":"x","remote":"b"}"#);
    assert_eq!((r.status, r.error()), (403, NEED_SECURITY.into()));
    let r = c.post_json("/v1/remotes", r#"{"name":"b"}"#);
    assert_eq!((r.status, r.error()), (403, NEED_SECURITY.into()));
    let r = c.get("/v1/remotes");
    assert_eq!((r.status, r.error()), (403, NEED_SECURITY.into()));
}

/// Sends `head` then `body` raw on a new connection (the body write may fail when the server
/// answers and closes first) and reads the answer.
fn raw_answer(s: &Server, head: &str, body: &[u8]) -> Resp {
    use std::io::Write;
    let mut c = Client::connect(s.addr()).expect("connect");
    c.raw().write_all(head.as_bytes()).expect("head");
    let _ = c.raw().write_all(body);
    c.read_response(false).expect("answer")
}

#[test]
fn produce_authorization_comes_before_query_and_body_size() {
    // Proves API.md §1.4 and §10.1's order for produce: authentication (401), then the grant
    // (403), then the query (400) and the body's size (413). A user with only a consume grant
    // gets `403 produce not allowed on this topic` for a bad query, a batch `?key=`, or a body
    // over the cap (Content-Length or chunked), also on the first, uncached use of its
    // credential; a wrong password gets 401 whatever the body; a user with the grant gets the
    // 400 and 413 the same requests deserve.
    let dir = TempDir::new("sec-order");
    let s = secure(&dir, &[]);
    let mut c = s.client();
    let consume_only = ("carol", "carol-pw");
    let producer = ("dave", "dave-pw");
    for (user, action) in [(consume_only, "consume"), (producer, "produce")] {
        let grants = format!(r#"[{{"action":"{action}","patterns":["t.*"]}}]"#);
        let r = create_user(&mut c, ROOT, user.0, user.1, &grants);
        assert_eq!(r.status, 201, "{}", r.text());
    }
    let r = call(&mut c, "POST", "/v1/topics", ROOT, r#"{"name":"t.x"}"#);
    assert_eq!(r.status, 201, "{}", r.text());

    let big = vec![b'a'; 2 << 20];
    let denied = (403, "produce not allowed on this topic".to_string());
    let head = |user: (&str, &str), path: &str, framing: &str| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nX-Narad-Client: t\r\nAuthorization: {}\r\n{framing}\r\n",
            basic_auth(user.0, user.1)
        )
    };
    let length = format!("Content-Length: {}\r\n", big.len());
    // First use of carol's credential (no cache knows it yet): a 2 MiB body.
    let r = raw_answer(
        &s,
        &head(consume_only, "/v1/topics/t.x/produce", &length),
        &big,
    );
    assert_eq!((r.status, r.error()), denied);
    // A wrong password is 401, before any grant or size check.
    let r = raw_answer(
        &s,
        &head(("carol", "wrong"), "/v1/topics/t.x/produce", &length),
        &big,
    );
    assert_eq!(r.status, 401, "{}", r.text());
    // Cached credential: bad query, batch key, over-cap bodies.
    let mut c = s.client();
    for path in [
        "/v1/topics/t.x/produce?partition=abc",
        "/v1/topics/t.x/produce?key=a&key=b",
        "/v1/topics/t.x/produce/batch?key=a",
    ] {
        let r = call(&mut c, "POST", path, consume_only, r#"{"a":1}"#);
        assert_eq!((r.status, r.error()), denied, "{path}");
    }
    let r = raw_answer(
        &s,
        &head(consume_only, "/v1/topics/t.x/produce", &length),
        &big,
    );
    assert_eq!((r.status, r.error()), denied);
    let mut chunked = format!("{:x}\r\n", big.len()).into_bytes();
    chunked.extend_from_slice(&big);
    chunked.extend_from_slice(b"\r\n0\r\n\r\n");
    let te = "Transfer-Encoding: chunked\r\n";
    let r = raw_answer(
        &s,
        &head(consume_only, "/v1/topics/t.x/produce", te),
        &chunked,
    );
    assert_eq!((r.status, r.error()), denied);

    // The user with the grant gets the query's 400 and the size's 413.
    let r = call(
        &mut c,
        "POST",
        "/v1/topics/t.x/produce?partition=abc",
        producer,
        r#"{"a":1}"#,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    let r = call(
        &mut c,
        "POST",
        "/v1/topics/t.x/produce/batch?key=a",
        producer,
        r#"[{"a":1}]"#,
    );
    assert_eq!(r.status, 400, "{}", r.text());
    for framing in [length.as_str(), te] {
        let body = if framing == te { &chunked } else { &big };
        let r = raw_answer(&s, &head(producer, "/v1/topics/t.x/produce", framing), body);
        assert_eq!(
            (r.status, r.error()),
            (413, "request body too large".to_string()),
            "{framing}"
        );
    }
    // None of the refused requests produced anything.
    let r = call(&mut c, "GET", "/v1/topics/t.x/consume", ROOT, "");
    assert_eq!(r.status, 204, "{}", r.text());
}

/// Sends a batch-produce head for topic `t` declaring `len` body bytes with `Expect:
/// 100-continue` as `user`; returns the first answer's status code and the open stream.
fn large_head(port: u16, t: &str, user: (&str, &str), len: usize) -> (u16, std::net::TcpStream) {
    use std::io::{BufRead, Write};
    let s = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut w = s.try_clone().unwrap();
    write!(
        w,
        "POST /v1/topics/{t}/produce/batch HTTP/1.1\r\nHost: x\r\nAuthorization: {}\r\nContent-Type: application/json\r\nContent-Length: {len}\r\nExpect: 100-continue\r\n\r\n",
        basic_auth(user.0, user.1)
    )
    .unwrap();
    let mut r = std::io::BufReader::new(s.try_clone().unwrap());
    let mut status = String::new();
    r.read_line(&mut status).unwrap();
    (
        status.split_whitespace().nth(1).unwrap().parse().unwrap(),
        s,
    )
}

#[test]
fn a_wrong_password_holds_no_batch_body_budget() {
    // Proves authentication comes before a large body takes batch-body budget (API.md §1.4, §4):
    // heads of 10 MiB batches with a real user's wrong password are answered 401 without
    // `100 Continue`, so four of them held open (the failed-login throttle answers 429 from
    // the sixth) leave the 24 MiB budget whole and the right
    // password still gets its `100 Continue` twice. Before (audit s21 limits L1) they got
    // `100 Continue` and a share of the budget while the check waited for the body: two of them
    // were enough to refuse the real user 503.
    let dir = TempDir::new("budget-auth");
    let s = secure(
        &dir,
        &[("NARAD_HTTP_MAX_BATCH_BODY_BYTES_IN_FLIGHT", "25165824")],
    );
    let mut c = s.client();
    let r = create_user(
        &mut c,
        ROOT,
        "writer",
        "writer-password-1",
        r#"[{"action":"produce","patterns":["*"]},{"action":"create","patterns":["*"]}]"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let r = call(
        &mut c,
        "POST",
        "/v1/topics",
        ("writer", "writer-password-1"),
        r#"{"name":"big","partitions":3}"#,
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let mut bad = Vec::new();
    for i in 0..4 {
        let (code, stream) = large_head(s.port, "big", ("writer", &format!("wrong-{i}")), 10 << 20);
        assert_eq!(code, 401, "wrong password {i}");
        bad.push(stream);
    }
    let mut good = Vec::new();
    for _ in 0..2 {
        let (code, stream) = large_head(s.port, "big", ("writer", "writer-password-1"), 10 << 20);
        assert_eq!(code, 100);
        good.push(stream);
    }
}
