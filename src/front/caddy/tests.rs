use super::*;

fn config() -> CaddyConfig {
    CaddyConfig {
        listen: "127.0.0.1:6443".parse().unwrap(),
        admin_address: "127.0.0.1:2019".into(),
        upstream_id: "kcp-proxy".into(),
        cert_file: "/state/shards/dev/shared/apiserver.crt".into(),
        key_file: "/state/shards/dev/shared/apiserver.key".into(),
        ca_file: "/state/shards/dev/shared/apiserver.crt".into(),
        upstreams: vec!["127.0.0.1:7001".parse().unwrap(), "127.0.0.1:7002".parse().unwrap()],
        storage_dir: "/var/lib/caddy/kcpshard".into(),
    }
}

fn proxy(rendered: &Value) -> &Value {
    &rendered["apps"]["http"]["servers"]["kcpshard"]["routes"][0]["handle"][0]
}

#[test]
fn the_config_never_installs_a_ca_and_never_automates_certificates() {
    let rendered = render_config(&config()).unwrap();
    assert_eq!(
        rendered["apps"]["pki"]["certificate_authorities"]["local"]["install_trust"],
        false
    );
    assert!(rendered["apps"]["tls"].get("automation").is_none());
    let server = &rendered["apps"]["http"]["servers"]["kcpshard"];
    assert_eq!(server["automatic_https"]["disable"], true);
    assert_eq!(server["listen"], json!(["127.0.0.1:6443"]));
    assert_eq!(
        rendered["apps"]["tls"]["certificates"]["load_files"][0]["key"],
        "/state/shards/dev/shared/apiserver.key"
    );
    assert_eq!(rendered["storage"]["root"], "/var/lib/caddy/kcpshard");
    assert_eq!(rendered["admin"]["listen"], "127.0.0.1:2019");
}

#[test]
fn the_proxy_carries_the_id_and_verifies_slots_with_kcps_ca() {
    let rendered = render_config(&config()).unwrap();
    let proxy = proxy(&rendered);
    assert_eq!(proxy["handler"], "reverse_proxy");
    assert_eq!(proxy["@id"], "kcp-proxy");
    assert_eq!(
        proxy["upstreams"],
        json!([{ "dial": "127.0.0.1:7001" }, { "dial": "127.0.0.1:7002" }])
    );
    assert_eq!(proxy["health_checks"]["active"]["uri"], "/readyz");
    assert_eq!(proxy["load_balancing"]["selection_policy"]["policy"], "least_conn");
    assert_eq!(proxy["transport"]["versions"], json!(["1.1"]));
    assert_eq!(
        proxy["transport"]["tls"]["root_ca_pem_files"],
        json!(["/state/shards/dev/shared/apiserver.crt"])
    );
    assert_eq!(proxy["transport"]["tls"]["server_name"], "127.0.0.1");
    // caddy 2.6 cancels every request in flight at a reload when flush_interval is -1.
    assert!(proxy.get("flush_interval").is_none());
}

#[test]
fn without_a_known_slot_the_upstreams_start_empty_but_present() {
    let mut config = config();
    config.upstreams = Vec::new();
    let rendered = render_config(&config).unwrap();
    // PATCH replaces an existing value only: the key must be there for the first switch.
    assert_eq!(proxy(&rendered)["upstreams"], json!([]));
}

#[test]
fn a_redirect_moves_every_reverse_proxy_upstream_that_dials_the_old_address_and_nothing_else() {
    let mut servers = json!({ "kcp": { "routes": [
        { "handle": [{ "handler": "reverse_proxy", "upstreams": [{ "dial": "127.0.0.1:6443" }, { "dial": "10.0.0.2:6443" }] }] },
        { "handle": [{ "handler": "subroute", "routes": [{ "handle": [
            { "handler": "reverse_proxy", "upstreams": [{ "dial": "127.0.0.1:6443" }] }] }] }] },
        { "handle": [{ "handler": "static_response", "upstreams": [{ "dial": "127.0.0.1:6443" }] }] },
    ] } });
    assert_eq!(redirect_upstreams(&mut servers, "127.0.0.1:6443", "127.0.0.1:7443"), 2);
    let routes = &servers["kcp"]["routes"];
    assert_eq!(routes[0]["handle"][0]["upstreams"][0]["dial"], "127.0.0.1:7443");
    assert_eq!(routes[0]["handle"][0]["upstreams"][1]["dial"], "10.0.0.2:6443");
    assert_eq!(
        routes[1]["handle"][0]["routes"][0]["handle"][0]["upstreams"][0]["dial"],
        "127.0.0.1:7443"
    );
    assert_eq!(
        routes[2]["handle"][0]["upstreams"][0]["dial"], "127.0.0.1:6443",
        "not a proxy"
    );
}

#[test]
fn ids_that_do_not_fit_in_one_url_segment_are_refused() {
    for id in ["", "kcp/proxy", "a b", "x?y", "x#y", "x%2f"] {
        assert!(matches!(check_id(id), Err(CaddyError::InvalidId { .. })), "{id:?}");
    }
    assert!(check_id("kcp-proxy").is_ok());
    let mut config = config();
    config.upstream_id = "kcp/proxy".into();
    assert!(render_config(&config).is_err());
}

#[test]
fn caddys_refusals_become_messages_that_say_what_to_fix() {
    let admin = CaddyAdmin::new("127.0.0.1:2019");
    let unknown = admin.refusal(
        "kcp-proxy",
        "GET /id/kcp-proxy",
        StatusCode::NOT_FOUND,
        br#"{"error":"unknown object ID 'kcp-proxy'"}"#,
    );
    assert!(
        unknown
            .to_string()
            .contains("add \"@id\": \"kcp-proxy\" to the reverse_proxy handler"),
        "{unknown}"
    );
    let host = admin.refusal(
        "kcp-proxy",
        "GET /id/kcp-proxy",
        StatusCode::FORBIDDEN,
        br#"{"error":"host not allowed: 127.0.0.1:2019"}"#,
    );
    assert!(matches!(host, CaddyError::HostNotAllowed { .. }), "{host}");
    let other = admin.refusal(
        "kcp-proxy",
        "PATCH /id/kcp-proxy/upstreams",
        StatusCode::BAD_REQUEST,
        b"boom",
    );
    assert_eq!(
        other.to_string(),
        "caddy's admin API at 127.0.0.1:2019 refused PATCH /id/kcp-proxy/upstreams with 400: boom"
    );
}
