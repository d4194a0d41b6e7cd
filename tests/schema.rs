//! Black-box tests of JSON Schema topics (SEMANTICS.md §8, API.md §6.1, §6.4, §6.6, §10.1–10.2):
//! the real binary on a loopback port, spoken to over plain HTTP/1.1. Each test states what it
//! proves.

mod common;

use common::{Client, Server, TempDir};
use serde_json::{json, Value};

fn server(tag: &str) -> (TempDir, Server) {
    let dir = TempDir::new(tag);
    let s = Server::start(&dir);
    (dir, s)
}

fn patch(c: &mut Client, topic: &str, body: &Value) -> common::Resp {
    c.request(
        "PATCH",
        &format!("/v1/topics/{topic}"),
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
}

fn create(c: &mut Client, body: &Value) -> common::Resp {
    c.post_json("/v1/topics", &body.to_string())
}

/// Sum of `next_offset` over the topic's partitions: what the log holds.
fn stored(c: &mut Client, topic: &str) -> u64 {
    let r = c.get(&format!("/v1/topics/{topic}"));
    assert_eq!(r.status, 200, "{}", r.text());
    r.json()["partition_stats"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["next_offset"].as_u64().unwrap())
        .sum()
}

fn produce(c: &mut Client, topic: &str, body: &[u8]) -> common::Resp {
    c.post_client(&format!("/v1/topics/{topic}/produce"), body)
}

fn payments_schema() -> Value {
    json!({"type":"object","required":["id"],
           "properties":{"id":{"type":"string"},"amount":{"type":"integer"}}})
}

#[test]
fn produce_is_validated_and_rejections_store_nothing() {
    // Proves: create with `schema` registers version 1 (describe shows it); valid produces answer
    // 202; invalid ones answer 400 with the exact §8.2 text naming the failing pointer; non-JSON,
    // trailing data and a BOM are refused; none of the refused bodies reaches the log.
    let (_d, s) = server("schema-produce");
    let mut c = s.client();
    let r = create(
        &mut c,
        &json!({"name":"payments","schema":payments_schema()}),
    );
    assert_eq!(r.status, 201, "{}", r.text());
    let d = c.get("/v1/topics/payments").json();
    assert_eq!(d["schema_version"], 1);
    assert_eq!(d["schema"], payments_schema());

    assert_eq!(
        produce(&mut c, "payments", br#"{"id":"p1","amount":5}"#).status,
        202
    );
    assert_eq!(produce(&mut c, "payments", br#"{"id":"p2"}"#).status, 202);
    assert_eq!(stored(&mut c, "payments"), 2);

    let r = produce(&mut c, "payments", br#"{"amount":5}"#);
    assert_eq!(r.status, 400);
    assert_eq!(
        r.error(),
        "invalid argument: schema: jsonschema validation failed with 'narad://schema/payments/1#'\n- at '': missing property 'id'"
    );
    let r = produce(&mut c, "payments", br#"{"id":"p3","amount":"5"}"#);
    assert_eq!(r.status, 400);
    assert_eq!(
        r.error(),
        "invalid argument: schema: jsonschema validation failed with 'narad://schema/payments/1#'\n- at '/amount': got string, want integer"
    );
    for bad in [
        &b"not json"[..],
        br#"{"id":"a"} {"id":"b"}"#,
        b"\xef\xbb\xbf{\"id\":\"a\"}",
        b"{\"id\":\"\xff\"}",
    ] {
        let r = produce(&mut c, "payments", bad);
        assert_eq!(r.status, 400, "{bad:?}: {}", r.text());
        assert!(
            r.error().starts_with("invalid argument: schema: "),
            "{}",
            r.error()
        );
    }
    // Order of API.md §10.1: schema before the partition range.
    let r = c.post_client(
        "/v1/topics/payments/produce?partition=7",
        br#"{"amount":5}"#,
    );
    assert!(
        r.error().ends_with("missing property 'id'"),
        "{}",
        r.error()
    );
    let r = c.post_client("/v1/topics/payments/produce?partition=7", br#"{"id":"x"}"#);
    assert_eq!(r.error(), "invalid argument: partition out of range");
    assert_eq!(
        stored(&mut c, "payments"),
        2,
        "a rejected produce reached the log"
    );
}

#[test]
fn batch_produce_is_all_or_nothing() {
    // Proves: a batch with one invalid message is refused whole with `message <i>: ` and the
    // exact report, nothing stored; format errors (pass one) win over schema errors of earlier
    // messages; base64 payloads are validated after decoding; a valid batch is accepted.
    let (_d, s) = server("schema-batch");
    let mut c = s.client();
    assert_eq!(
        create(
            &mut c,
            &json!({"name":"payments","schema":payments_schema()})
        )
        .status,
        201
    );
    let batch = |msgs: Value| json!({ "messages": msgs }).to_string();
    let r = c.post_client(
        "/v1/topics/payments/produce/batch",
        batch(json!([{"payload":{"id":"a"}},{"payload":{"id":7}},{"payload":{"id":"c"}}]))
            .as_bytes(),
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        r.error(),
        "message 1: invalid argument: schema: jsonschema validation failed with 'narad://schema/payments/1#'\n- at '/id': got integer, want string"
    );
    assert_eq!(stored(&mut c, "payments"), 0);

    let r = c.post_client(
        "/v1/topics/payments/produce/batch",
        batch(json!([{"payload":{"nope":1}},{"payload":"x","payload_encoding":"hex"}])).as_bytes(),
    );
    assert_eq!(r.status, 400);
    assert!(
        r.error().starts_with("message 1: invalid payload_encoding"),
        "{}",
        r.error()
    );

    // base64 of {"amount":1}: decoded, then validated.
    let r = c.post_client(
        "/v1/topics/payments/produce/batch",
        batch(json!([{"payload":"eyJhbW91bnQiOjF9","payload_encoding":"base64"}])).as_bytes(),
    );
    assert_eq!(r.status, 400);
    assert!(
        r.error().ends_with("- at '': missing property 'id'"),
        "{}",
        r.error()
    );
    assert_eq!(stored(&mut c, "payments"), 0);

    let msgs: Vec<Value> = (0..100)
        .map(|i| json!({"key": format!("k{i}"), "payload": {"id": format!("p{i}"), "amount": i}}))
        .collect();
    let r = c.post_client(
        "/v1/topics/payments/produce/batch",
        batch(Value::Array(msgs)).as_bytes(),
    );
    assert_eq!(r.status, 202, "{}", r.text());
    assert_eq!(r.json()["accepted"], 100);
    assert_eq!(stored(&mut c, "payments"), 100);
}

#[test]
fn schema_versions_evolve_compatibly() {
    // Proves PATCH schema rules of §8.4: a compatible change registers version 2 and validation
    // uses it at once; an incompatible one answers 400 naming keyword and location; a stale
    // `schema_base_version` answers 409; re-sending the current document (other formatting, or
    // only annotations changed) registers nothing; `null` is refused; the history endpoint lists
    // every version oldest first; a schema-less topic can get a first schema by PATCH.
    let (_d, s) = server("schema-evolve");
    let mut c = s.client();
    let r = create(
        &mut c,
        &json!({"name":"payments","schema":payments_schema()}),
    );
    assert_eq!(r.status, 201);
    // The create and PATCH answers carry the schema and its version (what SetSchema returns).
    assert_eq!(r.json()["schema_version"], 1);
    assert_eq!(r.json()["schema"], payments_schema());
    let mut v2 = payments_schema();
    v2["properties"]["note"] = json!({"type":"string"});
    v2["properties"]["amount"]["type"] = json!(["integer", "string"]);
    assert_eq!(
        produce(&mut c, "payments", br#"{"id":"a","amount":"5"}"#).status,
        400
    );
    let v2_on_1 = json!({"schema": v2, "schema_base_version": 1});
    let r = patch(&mut c, "payments", &v2_on_1);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["schema_version"], 2);
    assert_eq!(r.json()["schema"], v2);
    assert!(r.json().get("partition_stats").is_none());
    assert_eq!(c.get("/v1/topics/payments").json()["schema_version"], 2);
    assert_eq!(
        produce(&mut c, "payments", br#"{"id":"a","amount":"5"}"#).status,
        202
    );

    let mut narrowed = v2.clone();
    narrowed["properties"]["amount"]["type"] = json!("string");
    let r = patch(&mut c, "payments", &json!({ "schema": narrowed }));
    assert_eq!(r.status, 400);
    assert_eq!(
        r.error(),
        "invalid argument: schema incompatible with version 2: at /properties/amount: type \"integer\" no longer allowed"
    );
    let mut required = v2.clone();
    required["required"] = json!(["id", "note"]);
    let r = patch(&mut c, "payments", &json!({ "schema": required }));
    assert_eq!(r.status, 400);
    assert!(
        r.error()
            .ends_with("at /: property \"note\" is now required"),
        "{}",
        r.error()
    );
    let mut removed = v2.clone();
    removed["properties"]
        .as_object_mut()
        .unwrap()
        .remove("note");
    let r = patch(&mut c, "payments", &json!({ "schema": removed }));
    assert_eq!(r.status, 400);
    assert!(
        r.error().ends_with("property \"note\" removed"),
        "{}",
        r.error()
    );

    let mut v3 = v2.clone();
    v3["properties"]["tag"] = json!({"type":"string"});
    let r = patch(
        &mut c,
        "payments",
        &json!({"schema": v3, "schema_base_version": 1}),
    );
    assert_eq!(
        (r.status, r.error().as_str()),
        (409, "schema version conflict")
    );

    // Same document, other key order and spacing; then an annotation-only change.
    let same = r#"{"schema": {"properties":{"amount":{"type":["integer","string"]},"note":{"type":"string"},"id":{"type":"string"}}, "required":["id"],"type":"object"}}"#;
    let r = c.request(
        "PATCH",
        "/v1/topics/payments",
        &[("Content-Type", "application/json")],
        same.as_bytes(),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    let mut annotated = v2.clone();
    annotated["title"] = json!("Payment");
    annotated["properties"]["note"]["description"] = json!("free text");
    let r = patch(
        &mut c,
        "payments",
        &json!({"schema": annotated, "schema_base_version": 2}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(c.get("/v1/topics/payments").json()["schema_version"], 2);
    // A conditional update retried after its first attempt was applied (v2 was registered on
    // base 1): nothing to register, 200, not a version conflict.
    let r = patch(&mut c, "payments", &v2_on_1);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["schema_version"], 2);

    let r = patch(&mut c, "payments", &json!({ "schema": null }));
    assert_eq!(r.status, 400);
    assert_eq!(
        r.error(),
        "invalid argument: schema cannot be removed (null)"
    );

    let h = c.get("/v1/topics/payments/schema");
    assert_eq!(h.status, 200);
    assert_eq!(
        h.json(),
        json!({"topic":"payments","version":2,"versions":[
            {"version":1,"schema":payments_schema()},{"version":2,"schema":v2}]})
    );

    c.create_topic("plain", 3);
    assert_eq!(
        c.get("/v1/topics/plain/schema").json(),
        json!({"topic":"plain","version":0,"versions":[]})
    );
    assert_eq!(produce(&mut c, "plain", b"not json").status, 202);
    let r = patch(
        &mut c,
        "plain",
        &json!({"schema": {"type":"string"}, "schema_base_version": 0}),
    );
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(produce(&mut c, "plain", b"not json").status, 400);
    assert_eq!(produce(&mut c, "plain", b"\"json\"").status, 202);
    assert_eq!(c.get("/v1/topics/nope/schema").status, 404);
}

#[test]
fn registration_and_payload_limits() {
    // Proves the §8.3/§8.4 limits over HTTP: documents that are not an object or `true`, larger
    // than 256 KiB, nesting deeper than 64, referencing outside the document, with lookaround
    // patterns, patterns costing more than 32 steps per byte, or with exponential shapes are
    // refused with 400 and create nothing; payloads
    // nesting 256 levels pass and 257 get the exact 400 text.
    let (_d, s) = server("schema-limits");
    let mut c = s.client();
    let mut deep = json!({});
    for _ in 0..64 {
        deep = json!({ "not": deep });
    }
    let mut laughs = serde_json::Map::new();
    laughs.insert("a0".into(), json!({"type":"string"}));
    for i in 1..=10 {
        let r = format!("#/$defs/a{}", i - 1);
        laughs.insert(format!("a{i}"), json!({"allOf":[{"$ref":r},{"$ref":r}]}));
    }
    for (i, bad) in [
        json!(false),
        json!([]),
        json!("string"),
        json!({"description": "x".repeat(256 << 10)}),
        deep,
        json!({"$ref":"https://example.com/schema.json"}),
        json!({"$ref":"other.json#/x"}),
        json!({"pattern":"^(?!admin).*$"}),
        // Seconds of CPU per KiB of "aaa…" before it was refused (audit s20).
        json!({"properties":{"v":{"pattern":"^(?:(?:a{1,30}){1,30}){1,30}$"}}}),
        json!({"$defs": laughs, "$ref":"#/$defs/a10"}),
        json!({"type": 12}),
    ]
    .into_iter()
    .enumerate()
    {
        let name = format!("bad{i}");
        let r = create(&mut c, &json!({"name": name, "schema": bad}));
        assert_eq!(r.status, 400, "case {i}: {}", r.text());
        assert_eq!(c.get(&format!("/v1/topics/{name}")).status, 404);
    }
    // Deeper than the document parser goes (128): the nesting limit is named (audit s20 D5).
    let body = format!(
        r#"{{"name":"deep","schema":{}{{}}{}}}"#,
        r#"{"not":"#.repeat(129),
        "}".repeat(129)
    );
    let r = c.post_json("/v1/topics", &body);
    assert_eq!(
        (r.status, r.error().as_str()),
        (400, "invalid argument: schema nests deeper than 64 levels")
    );
    let r = create(
        &mut c,
        &json!({"name":"slow","schema":{"pattern":"^(?:(?:a{1,30}){1,30}){1,30}$"}}),
    );
    assert!(
        r.error()
            .contains("at '/pattern' costs more than 32 steps per byte"),
        "{}",
        r.error()
    );
    let r = create(&mut c, &json!({"name":"any","schema":true}));
    assert_eq!(r.status, 201, "{}", r.text());
    let ok = format!("{}{}", "[".repeat(256), "]".repeat(256));
    assert_eq!(produce(&mut c, "any", ok.as_bytes()).status, 202);
    let deep = format!("{}{}", "[".repeat(257), "]".repeat(257));
    let r = produce(&mut c, "any", deep.as_bytes());
    assert_eq!(
        (r.status, r.error().as_str()),
        (400, "payload nests deeper than 256 levels")
    );
    let r = c.post_client(
        "/v1/topics/any/produce/batch",
        json!({"messages":[{"payload":1},{"payload":"x","payload_encoding":"base64"}]})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(r.status, 400, "{}", r.text());
    assert!(r.error().starts_with("message 1: "), "{}", r.error());
    assert_eq!(produce(&mut c, "any", b"1e1001").status, 400);
    assert_eq!(stored(&mut c, "any"), 1);
}

#[test]
fn history_limits_answer_409() {
    // Proves the 1000-version cap (SCHEMA_VERSIONS_MAX) and the 4 MiB per-topic history budget
    // both answer 409 and leave the history as it was.
    let (_d, s) = server("schema-history");
    let mut c = s.client();
    assert_eq!(
        create(&mut c, &json!({"name":"grow","schema":{"maxLength":1}})).status,
        201
    );
    for v in 2..=1000 {
        let r = patch(&mut c, "grow", &json!({"schema": {"maxLength": v}}));
        assert_eq!(r.status, 200, "version {v}: {}", r.text());
    }
    let r = patch(&mut c, "grow", &json!({"schema": {"maxLength": 1001}}));
    assert_eq!(r.status, 409, "{}", r.text());
    assert_eq!(c.get("/v1/topics/grow/schema").json()["version"], 1000);

    // ~200 KB per version: the 21st version would pass 4 MiB of history.
    let pad = "p".repeat(200_000);
    let doc = |n: usize| json!({"$defs": {"pad": {"const": format!("{n}{pad}")}}});
    assert_eq!(
        create(&mut c, &json!({"name":"big","schema":doc(1)})).status,
        201
    );
    let mut refused = None;
    for n in 2..=30 {
        let r = patch(&mut c, "big", &json!({ "schema": doc(n) }));
        if r.status != 200 {
            assert_eq!(r.status, 409, "{}", r.text());
            assert!(
                r.error().contains("schema budget exceeded"),
                "{}",
                r.error()
            );
            refused = Some(n);
            break;
        }
    }
    let n = refused.expect("the history budget never refused");
    assert!((20..=22).contains(&n), "refused at version {n}");
    assert_eq!(c.get("/v1/topics/big/schema").json()["version"], n - 1);
}

#[test]
fn envelope_schema_of_the_go_sdk() {
    // Proves an SDK envelope schema (§8.6: user schema under `body`, its $defs lifted to the
    // root, $schema kept, $id dropped) works like any schema: envelopes pass, bare messages and
    // envelopes breaking the wrapper rules are refused with the failing pointer.
    let (_d, s) = server("schema-envelope");
    let mut c = s.client();
    let envelope = json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "type": "object",
        "required": ["_narad", "id", "body", "produced_at"],
        "properties": {
            "_narad": {"type": "integer"},
            "id": {"type": "string", "minLength": 1},
            "body": {"$ref": "#/$defs/order"},
            "produced_at": {"type": "integer"},
            "attempts": {"type": "integer", "minimum": 1},
            "last_error": {"type": "string"},
            "headers": {"type": "object", "additionalProperties": {"type": "string"}}
        },
        "additionalProperties": false,
        "$defs": {
            "money": {"type": "integer", "minimum": 0},
            "order": {"type": "object", "required": ["order_id"],
                      "properties": {"order_id": {"type": "string"},
                                     "total": {"$ref": "#/$defs/money"}}}
        }
    });
    let r = create(&mut c, &json!({"name":"orders","schema":envelope}));
    assert_eq!(r.status, 201, "{}", r.text());
    let good = json!({"_narad":1,"id":"0190c8a4-5b2e-7000-8000-000000000001",
        "body":{"order_id":"o-1","total":250},"produced_at":1790623903000u64,"attempts":1,
        "headers":{"trace":"abc"}});
    assert_eq!(
        produce(&mut c, "orders", good.to_string().as_bytes()).status,
        202
    );

    let r = produce(&mut c, "orders", br#"{"order_id":"o-1","total":250}"#);
    assert_eq!(r.status, 400);
    assert!(
        r.error().contains("- at '': missing property '_narad'"),
        "{}",
        r.error()
    );
    let mut bad = good.clone();
    bad["body"]["total"] = json!(-1);
    let r = produce(&mut c, "orders", bad.to_string().as_bytes());
    assert_eq!(r.status, 400);
    assert!(
        r.error()
            .contains("- at '/body/total': minimum: got -1, want 0"),
        "{}",
        r.error()
    );
    let mut bad = good.clone();
    bad["extra"] = json!(1);
    let r = produce(&mut c, "orders", bad.to_string().as_bytes());
    assert_eq!(r.status, 400);
    assert!(
        r.error()
            .contains("additional properties 'extra' not allowed"),
        "{}",
        r.error()
    );
    let mut bad = good.clone();
    bad["headers"]["n"] = json!(5);
    let r = produce(&mut c, "orders", bad.to_string().as_bytes());
    assert!(
        r.error()
            .contains("- at '/headers/n': got integer, want string"),
        "{}",
        r.error()
    );
    assert_eq!(stored(&mut c, "orders"), 1);
}
