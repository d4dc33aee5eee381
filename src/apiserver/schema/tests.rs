use super::*;

fn kcpshard_schema() -> StructuralSchema {
    let crd = crate::api::crd();
    let props = crd.spec.versions[0].schema.clone().unwrap().open_api_v3_schema.unwrap();
    StructuralSchema::try_new(&props).expect("the KcpShard schema compiles")
}

fn dev() -> Value {
    json!({
        "apiVersion": "kcpshard.io/v1alpha1",
        "kind": "KcpShard",
        "metadata": {"name": "dev", "labels": {"team": "a"}},
        "spec": {"version": "v0.32.3", "store": {"type": "KineSqlite"}},
    })
}

fn check(obj: &mut Value, unknown: UnknownFields) -> Result<Vec<String>, Vec<FieldCause>> {
    kcpshard_schema().check(obj, unknown)
}

fn only_cause(mut obj: Value) -> FieldCause {
    let causes = check(&mut obj, UnknownFields::Strict).expect_err("the object is refused");
    assert_eq!(causes.len(), 1, "{causes:?}");
    causes.into_iter().next().unwrap()
}

#[test]
fn a_minimal_shard_passes_and_gets_every_default() {
    let mut obj = dev();
    assert_eq!(check(&mut obj, UnknownFields::Strict), Ok(vec![]));
    let spec = &obj["spec"];
    assert_eq!(
        spec["kcp"],
        json!({"binary": "bin/kcp-{version}", "shutdownDelay": "0s"})
    );
    assert_eq!(spec["front"], json!({"type": "Tcp", "listen": "127.0.0.1:6443"}));
    assert_eq!(spec["rollout"]["readinessTimeout"], "120s");
    assert_eq!(spec["rollout"]["snapshotBeforeVersionChange"], true);
    assert_eq!(obj["metadata"]["labels"]["team"], "a", "metadata is left to the server");
    let typed: crate::api::KcpShard = serde_json::from_value(obj).unwrap();
    assert_eq!(typed.spec.rollout, crate::api::RolloutSpec::default());
}

#[test]
fn checking_a_checked_object_changes_nothing() {
    // The server's no-op rule depends on it: a re-applied object must come out byte-identical.
    let mut postgres = dev();
    postgres["spec"]["store"] =
        json!({"type": "KinePostgres", "kinePostgres": {"host": "db", "passwordFrom": {"env": "PW"}}});
    postgres["status"] = json!({"phase": "Ready", "slots": [{"name": "blue", "version": "v0.32.3", "ready": true}]});
    for mut obj in [dev(), postgres] {
        check(&mut obj, UnknownFields::Strict).unwrap();
        let once = obj.clone();
        assert_eq!(check(&mut obj, UnknownFields::Strict), Ok(vec![]));
        assert_eq!(obj, once);
    }
}

#[test]
fn nested_defaults_fill_partial_objects() {
    let mut obj = dev();
    obj["spec"]["front"] = json!({"type": "Caddy", "caddy": {"upstreamId": "kcp-proxy"}});
    obj["spec"]["store"] = json!({"type": "KinePostgres", "kinePostgres": {"host": "127.0.0.1"}});
    obj["spec"]["rollout"] = json!({"drainTimeout": "10s"});
    assert_eq!(check(&mut obj, UnknownFields::Strict), Ok(vec![]));
    let spec = &obj["spec"];
    assert_eq!(spec["front"]["listen"], "127.0.0.1:6443");
    assert_eq!(spec["front"]["caddy"]["adminAddress"], "127.0.0.1:2019");
    assert_eq!(
        spec["store"]["kinePostgres"],
        json!({"host": "127.0.0.1", "port": 5432, "database": "kcp", "user": "kcp", "sslMode": "disable", "managed": false})
    );
    assert_eq!(spec["rollout"]["drainTimeout"], "10s");
    assert_eq!(spec["rollout"]["readinessTimeout"], "120s");
}

#[test]
fn null_in_a_non_nullable_field_means_missing() {
    let mut obj = dev();
    obj["spec"]["front"] = Value::Null;
    obj["spec"]["kcp"] = json!({"binary": null});
    obj["status"] = json!({"phase": null});
    assert_eq!(check(&mut obj, UnknownFields::Strict), Ok(vec![]));
    assert_eq!(obj["spec"]["front"]["listen"], "127.0.0.1:6443");
    assert_eq!(obj["spec"]["kcp"]["binary"], "bin/kcp-{version}");
    assert_eq!(obj["status"]["phase"], Value::Null, "status.phase is nullable");

    let mut obj = dev();
    obj["spec"]["version"] = Value::Null;
    let cause = only_cause(obj);
    assert_eq!(
        (cause.reason, cause.field.as_str()),
        ("FieldValueRequired", "spec.version")
    );
}

#[test]
fn unknown_fields_are_pruned_and_reported_by_mode() {
    let with_unknown = || {
        let mut obj = dev();
        obj["spec"]["foo"] = json!(1);
        obj["spec"]["store"]["kineSqlite"] = json!({"path": "/tmp/x"});
        obj["status"] = json!({"slots": [{"name": "blue", "version": "v0.32.3", "ready": true, "colour": "blue"}]});
        obj
    };
    let expected = ["spec.foo", "spec.store.kineSqlite.path", "status.slots[0].colour"];

    let mut obj = with_unknown();
    assert_eq!(check(&mut obj, UnknownFields::Ignore), Ok(vec![]));
    assert!(obj["spec"].get("foo").is_none());
    assert_eq!(obj["spec"]["store"]["kineSqlite"], json!({}));
    assert!(obj["status"]["slots"][0].get("colour").is_none());

    let mut obj = with_unknown();
    let warnings = check(&mut obj, UnknownFields::Warn).unwrap();
    let want: Vec<String> = expected.iter().map(|p| format!("unknown field \"{p}\"")).collect();
    assert_eq!(warnings, want);
    assert!(obj["spec"].get("foo").is_none());

    let obj = with_unknown();
    assert_eq!(kcpshard_schema().unknown_fields(&obj), expected);
    assert_eq!(obj, with_unknown(), "unknown_fields leaves the object alone");
    assert_eq!(
        strict_decoding_error(
            "KcpShard",
            "v1alpha1",
            &expected[..1].iter().map(|s| s.to_string()).collect::<Vec<_>>()
        ),
        r#"KcpShard in version "v1alpha1" cannot be handled as a KcpShard: strict decoding error: unknown field "spec.foo""#
    );

    let mut obj = with_unknown();
    let causes = check(&mut obj, UnknownFields::Strict).unwrap_err();
    assert_eq!(
        causes,
        expected.iter().map(|p| FieldCause::unknown(*p)).collect::<Vec<_>>()
    );
}

#[test]
fn an_unknown_enum_value_lists_the_supported_ones() {
    let mut obj = dev();
    obj["spec"]["store"]["type"] = json!("Mysql");
    let cause = only_cause(obj);
    assert_eq!(cause.reason, "FieldValueNotSupported");
    assert_eq!(cause.field, "spec.store.type");
    assert_eq!(
        cause.message,
        r#"Unsupported value: "Mysql": supported values: "KineSqlite", "KinePostgres", "Etcd""#
    );
}

#[test]
fn a_bad_version_fails_the_pattern() {
    let mut obj = dev();
    obj["spec"]["version"] = json!("0.32.3");
    let cause = only_cause(obj);
    assert_eq!(
        (cause.reason, cause.field.as_str()),
        ("FieldValueInvalid", "spec.version")
    );
    assert!(
        cause
            .message
            .starts_with(r#"Invalid value: "0.32.3": spec.version in body should match '^v"#),
        "{}",
        cause.message
    );
}

#[test]
fn required_fields_are_named() {
    let mut obj = dev();
    obj["spec"].as_object_mut().unwrap().remove("store");
    let cause = only_cause(obj);
    assert_eq!(
        (cause.reason, cause.field.as_str(), cause.message.as_str()),
        ("FieldValueRequired", "spec.store", "Required value")
    );

    let mut obj = dev();
    obj.as_object_mut().unwrap().remove("spec");
    assert_eq!(only_cause(obj).field, "spec");

    let mut obj = dev();
    obj["spec"]["store"] = json!({"type": "KinePostgres", "kinePostgres": {}});
    assert_eq!(only_cause(obj).field, "spec.store.kinePostgres.host");
}

#[test]
fn wrong_types_and_out_of_range_numbers_are_refused() {
    let mut obj = dev();
    obj["spec"]["store"] = json!({"type": "KinePostgres", "kinePostgres": {"host": "db", "port": "5432"}});
    let cause = only_cause(obj);
    assert_eq!(
        (cause.reason, cause.field.as_str()),
        ("FieldValueTypeInvalid", "spec.store.kinePostgres.port")
    );
    assert_eq!(
        cause.message,
        r#"Invalid value: "string": spec.store.kinePostgres.port in body must be of type integer: "string""#
    );

    let mut obj = dev();
    obj["spec"]["store"] = json!({"type": "KinePostgres", "kinePostgres": {"host": "db", "port": 0}});
    let cause = only_cause(obj);
    assert_eq!(
        cause.message,
        "Invalid value: 0: spec.store.kinePostgres.port in body should be greater than or equal to 1"
    );

    let mut obj = dev();
    obj["spec"]["store"] = json!({"type": "Etcd", "etcd": {"endpoints": []}});
    let cause = only_cause(obj);
    assert_eq!(cause.field, "spec.store.etcd.endpoints");
    assert!(
        cause.message.contains("should have at least 1 items"),
        "{}",
        cause.message
    );

    let mut obj = dev();
    obj["spec"]["kcp"] = json!({"extraArgs": "--v=2"});
    assert_eq!(only_cause(obj).field, "spec.kcp.extraArgs");

    let mut obj = dev();
    obj["spec"]["store"]["type"] = json!(3);
    let cause = only_cause(obj);
    assert_eq!(
        (cause.reason, cause.field.as_str()),
        ("FieldValueTypeInvalid", "spec.store.type")
    );
}

#[test]
fn every_error_is_reported_at_once() {
    let mut obj = dev();
    obj["spec"]["version"] = json!("latest");
    obj["spec"]["front"] = json!({"type": "Nginx", "listen": "6443"});
    obj["spec"]["rollout"] = json!({"drainTimeout": "30 seconds"});
    let causes = check(&mut obj, UnknownFields::Strict).unwrap_err();
    let mut fields: Vec<&str> = causes.iter().map(|c| c.field.as_str()).collect();
    fields.sort();
    assert_eq!(
        fields,
        [
            "spec.front.listen",
            "spec.front.type",
            "spec.rollout.drainTimeout",
            "spec.version"
        ]
    );
}

#[test]
fn conditions_are_unique_by_type_and_times_are_timestamps() {
    let condition = |status: &str| json!({"type": "Ready", "status": status, "reason": "R", "message": "", "lastTransitionTime": "2026-11-29T16:00:00Z"});
    let mut obj = dev();
    obj["status"] = json!({"conditions": [condition("True")]});
    assert_eq!(check(&mut obj, UnknownFields::Strict), Ok(vec![]));

    let mut obj = dev();
    obj["status"] = json!({"conditions": [condition("True"), condition("False")]});
    let cause = only_cause(obj);
    assert_eq!(
        (cause.reason, cause.field.as_str()),
        ("FieldValueDuplicate", "status.conditions[1]")
    );
    assert_eq!(cause.message, r#"Duplicate value: {"type":"Ready"}"#);

    let mut obj = dev();
    obj["status"] =
        json!({"slots": [{"name": "blue", "version": "v0.32.3", "ready": false, "startedAt": "yesterday"}]});
    assert_eq!(only_cause(obj).field, "status.slots[0].startedAt");
}

#[test]
fn preserve_unknown_fields_and_embedded_resources_keep_their_content() {
    let props: JSONSchemaProps = serde_json::from_value(json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "properties": {
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                             "properties": {"known": {"type": "object", "properties": {}}}},
                    "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                                 "properties": {"replicas": {"type": "integer", "default": 1}}},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                    "port": {"x-kubernetes-int-or-string": true},
                    "ratio": {"type": "number", "maximum": 1, "exclusiveMaximum": true},
                },
            },
        },
    }))
    .unwrap();
    let schema = StructuralSchema::try_new(&props).unwrap();
    let mut obj = json!({
        "apiVersion": "x/v1", "kind": "X", "metadata": {"name": "x"},
        "spec": {
            "free": {"anything": [1, 2], "known": {"dropped": true}},
            "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "other": 1},
            "labels": {"a": "b"},
            "port": "https",
            "ratio": 0.5,
        },
    });
    let warnings = schema.check(&mut obj, UnknownFields::Warn).unwrap();
    assert_eq!(
        warnings,
        [
            r#"unknown field "spec.free.known.dropped""#,
            r#"unknown field "spec.template.other""#
        ]
    );
    assert_eq!(obj["spec"]["free"]["anything"], json!([1, 2]));
    assert_eq!(
        obj["spec"]["template"],
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "replicas": 1})
    );
    assert_eq!(obj["spec"]["labels"], json!({"a": "b"}));

    obj["spec"]["port"] = json!(true);
    obj["spec"]["ratio"] = json!(1);
    obj["spec"]["labels"]["n"] = json!(1);
    let mut fields: Vec<String> = schema
        .check(&mut obj, UnknownFields::Strict)
        .unwrap_err()
        .into_iter()
        .map(|c| c.field)
        .collect();
    fields.sort();
    assert_eq!(fields, ["spec.labels.n", "spec.port", "spec.ratio"]);
}
