use super::*;
use crate::api::kcpshard::*;

fn shard(yaml: &str) -> KcpShard {
    serde_yaml::from_str(yaml).expect("test object parses")
}

fn dev() -> KcpShard {
    shard(
        "apiVersion: kcpshard.io/v1alpha1\nkind: KcpShard\nmetadata: {name: dev}\nspec:\n  version: v0.32.3\n  store: {type: KineSqlite}\n",
    )
}

fn fields(causes: &[FieldCause]) -> Vec<&str> {
    causes.iter().map(|c| c.field.as_str()).collect()
}

#[test]
fn the_defaults_are_valid() {
    assert_eq!(validate(&dev()), vec![]);
}

#[test]
fn the_checked_in_manifests_are_valid() {
    for path in ["manifests/dev.yaml", "manifests/postgres.yaml"] {
        let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let obj: KcpShard = serde_yaml::from_str(&text).unwrap_or_else(|e| panic!("{path}: {e}"));
        assert_eq!(validate(&obj), vec![], "{path}");
    }
}

fn with_shard(shard: ShardSpec) -> KcpShard {
    let mut obj = dev();
    obj.spec.shard = Some(shard);
    obj
}

fn spec(name: &str, root: Option<&str>, external: Option<&str>, cache: Option<&str>) -> ShardSpec {
    ShardSpec {
        name: name.into(),
        root_shard: root.map(Into::into),
        external_url: external.map(Into::into),
        cache_kubeconfig: cache.map(Into::into),
    }
}

#[test]
fn a_root_shard_names_the_front_proxy_and_no_root_or_cache() {
    let ok = with_shard(spec("root", None, Some("https://127.0.0.1:6443"), None));
    assert_eq!(validate(&ok), vec![]);
    let causes = validate(&with_shard(spec("root", Some("other"), None, Some("/c"))));
    assert_eq!(
        fields(&causes),
        [
            "spec.shard.rootShard",
            "spec.shard.cacheKubeconfig",
            "spec.shard.externalURL"
        ]
    );
    let causes = validate(&with_shard(spec("root", None, Some("http://127.0.0.1:6443"), None)));
    assert_eq!(fields(&causes), ["spec.shard.externalURL"]);
}

#[test]
fn another_shard_names_its_root_and_not_the_front_proxy() {
    let ok = with_shard(spec("shard-2", Some("root"), None, Some("/etc/kcp/cache.kubeconfig")));
    assert_eq!(validate(&ok), vec![]);
    let causes = validate(&with_shard(spec("shard-2", None, Some("https://x:1"), None)));
    assert_eq!(fields(&causes), ["spec.shard.rootShard", "spec.shard.externalURL"]);
    assert_eq!(causes[0].reason, "FieldValueRequired");
    let causes = validate(&with_shard(spec("shard-2", Some("dev"), None, None)));
    assert!(causes[0].message.contains("this KcpShard itself"), "{causes:?}");
}

#[test]
fn the_sharding_flags_are_spec_shard_s_not_extra_args() {
    let mut obj = dev();
    obj.spec.kcp.extra_args = vec!["--shard-name=x".into(), "--cache-kubeconfig=/c".into()];
    let causes = validate(&obj);
    assert_eq!(fields(&causes), ["spec.kcp.extraArgs[0]", "spec.kcp.extraArgs[1]"]);
    assert!(causes[0].message.contains("set spec.shard instead"), "{causes:?}");
}

#[test]
fn store_settings_must_match_the_type() {
    let mut obj = dev();
    obj.spec.store.etcd = Some(EtcdStore {
        endpoints: vec!["https://127.0.0.1:2379".into()],
        ca_file: None,
        cert_file: None,
        key_file: None,
    });
    let causes = validate(&obj);
    assert_eq!(fields(&causes), ["spec.store.etcd"]);
    assert_eq!(causes[0].reason, "FieldValueForbidden");
    assert!(causes[0].message.contains("set type: Etcd"), "{}", causes[0].message);

    obj.spec.store.type_ = StoreType::KinePostgres;
    let causes = validate(&obj);
    assert_eq!(fields(&causes), ["spec.store.etcd", "spec.store.kinePostgres"]);
    assert_eq!(causes[1].reason, "FieldValueRequired");
}

fn postgres() -> KcpShard {
    shard(
        "apiVersion: kcpshard.io/v1alpha1\nkind: KcpShard\nmetadata: {name: pg}\nspec:\n  version: v0.32.3\n  store:\n    type: KinePostgres\n    kinePostgres: {host: 127.0.0.1, passwordFrom: {file: /etc/pgpass}}\n",
    )
}

/// `obj` as the controller leaves it once a slot started on its store.
fn holding_data(mut obj: KcpShard) -> KcpShard {
    let since = "2026-12-04T10:00:00Z".parse().unwrap();
    obj.status = Some(crate::api::KcpShardStatus {
        store: Some(crate::api::StoreStatus {
            type_: obj.spec.store.type_,
            endpoints: vec![],
            ready: true,
            message: None,
            data_since: Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(since)),
        }),
        ..Default::default()
    });
    obj
}

#[test]
fn a_store_that_holds_the_data_is_swapped_only_for_one_kcpshard_can_move_it_into() {
    let old = holding_data(dev());
    let mut etcd = dev();
    etcd.spec.store.type_ = StoreType::Etcd;
    etcd.spec.store.etcd = Some(crate::api::EtcdStore {
        endpoints: vec!["https://a:2379".into()],
        ca_file: None,
        cert_file: None,
        key_file: None,
    });
    // KineSqlite -> KinePostgres or Etcd is a move of the data (controller/plan/migration.rs).
    assert_eq!(validate_update(&old, &postgres()), vec![]);
    assert_eq!(validate_update(&old, &etcd), vec![]);
    // One managed PostgreSQL to another: both would keep their cluster in the store directory.
    let managed = |port: u16| {
        let mut obj = postgres();
        let settings = obj.spec.store.kine_postgres.as_mut().unwrap();
        (settings.managed, settings.port) = (true, port);
        obj
    };
    let causes = validate_update(&holding_data(managed(5432)), &managed(5433));
    assert_eq!(fields(&causes), ["spec.store.kinePostgres.port"]);
    assert_eq!(causes[0].reason, "FieldValueForbidden");
    let message = &causes[0].message;
    for needed in [
        "managed PostgreSQL at 127.0.0.1:5432) (since 2026-12-04T10:00:00Z)",
        "cannot move a shard's data from one managed PostgreSQL to another",
        "would serve an empty kcp",
        "Put spec.store back",
        "shards/pg/store) aside",
    ] {
        assert!(message.contains(needed), "{needed:?} not in {message}");
    }
    // The same store with other settings, and anything else, may change.
    let mut same = old.clone();
    same.spec.version = "v0.32.4".into();
    assert_eq!(validate_update(&old, &same), vec![]);
    // Before a slot started on it, the store may change: there is no data to leave behind.
    assert_eq!(validate_update(&dev(), &etcd), vec![]);
}

#[test]
fn a_postgres_server_or_database_is_where_the_data_is_and_credentials_are_not() {
    let old = postgres().spec.store;
    let moved = |change: fn(&mut crate::api::KinePostgresStore)| {
        let mut new = old.clone();
        change(new.kine_postgres.as_mut().unwrap());
        new.moved_at(&old)
    };
    assert_eq!(
        moved(|pg| pg.host = "db.example".into()),
        Some("spec.store.kinePostgres.host")
    );
    assert_eq!(moved(|pg| pg.port = 5433), Some("spec.store.kinePostgres.port"));
    assert_eq!(
        moved(|pg| pg.database = "other".into()),
        Some("spec.store.kinePostgres.database")
    );
    assert_eq!(moved(|pg| pg.managed = true), Some("spec.store.kinePostgres.managed"));
    assert_eq!(moved(|pg| pg.user = "admin".into()), None);
    assert_eq!(moved(|pg| pg.password_from = None), None);
    assert_eq!(moved(|pg| pg.ssl_mode = SslMode::Require), None);
}

#[test]
fn a_move_between_postgresql_servers_is_made_unless_both_are_managed() {
    let mut old = holding_data(postgres());
    let mut other_server = postgres();
    other_server.spec.store.kine_postgres.as_mut().unwrap().port = 5433;
    assert_eq!(validate_update(&old, &other_server), vec![], "a move of the data");

    for shard in [&mut old, &mut other_server] {
        shard.spec.store.kine_postgres.as_mut().unwrap().managed = true;
    }
    let causes = validate_update(&old, &other_server);
    assert_eq!(fields(&causes), ["spec.store.kinePostgres.port"]);
    assert!(
        causes[0].message.contains("from one managed PostgreSQL to another"),
        "{}",
        causes[0].message
    );
    let mut other_database = old.clone();
    other_database.spec.store.kine_postgres.as_mut().unwrap().database = "other".into();
    assert_eq!(
        validate_update(&old, &other_database),
        vec![],
        "the same managed server"
    );
}

#[test]
fn etcd_members_are_a_set() {
    let etcd = |endpoints: &[&str]| {
        let mut obj = dev();
        obj.spec.store.type_ = StoreType::Etcd;
        obj.spec.store.etcd = Some(crate::api::EtcdStore {
            endpoints: endpoints.iter().map(|e| e.to_string()).collect(),
            ca_file: None,
            cert_file: None,
            key_file: None,
        });
        obj
    };
    let old = etcd(&["https://a:2379", "https://b:2379"]).spec.store;
    // The same cluster in another order is no move; another cluster is one.
    assert_eq!(
        old.moved_at(&etcd(&["https://b:2379", "https://a:2379"]).spec.store),
        None
    );
    assert_eq!(
        old.moved_at(&etcd(&["https://c:2379"]).spec.store),
        Some("spec.store.etcd.endpoints")
    );
}

#[test]
fn a_postgres_ca_file_needs_an_sslmode_that_verifies() {
    let mut obj = postgres();
    let pg = obj.spec.store.kine_postgres.as_mut().unwrap();
    pg.ca_file = Some("/etc/kcpshard/pg-ca.pem".into());
    assert_eq!(
        fields(&validate(&obj)),
        ["spec.store.kinePostgres.caFile"],
        "sslMode disable"
    );
    for mode in [SslMode::Require, SslMode::VerifyCa, SslMode::VerifyFull] {
        obj.spec.store.kine_postgres.as_mut().unwrap().ssl_mode = mode;
        assert_eq!(validate(&obj), vec![], "{mode:?}");
    }
    obj.spec.store.kine_postgres.as_mut().unwrap().ca_file = Some(" ".into());
    assert_eq!(
        fields(&validate(&obj)),
        ["spec.store.kinePostgres.caFile"],
        "an empty path"
    );
}

#[test]
fn postgres_passwords_come_from_a_file_or_env_only() {
    assert_eq!(validate(&postgres()), vec![]);

    let mut obj = postgres();
    obj.spec.store.kine_postgres.as_mut().unwrap().host = "postgres://kcp:secret@db:5432/kcp".into();
    assert_eq!(fields(&validate(&obj)), ["spec.store.kinePostgres.host"]);

    let mut obj = postgres();
    obj.spec.store.kine_postgres.as_mut().unwrap().user = "kcp:secret".into();
    assert_eq!(fields(&validate(&obj)), ["spec.store.kinePostgres.user"]);

    let mut obj = postgres();
    obj.spec.store.kine_postgres.as_mut().unwrap().password_from = Some(PasswordSource {
        file: Some("/x".into()),
        env: Some("PW".into()),
    });
    assert_eq!(fields(&validate(&obj)), ["spec.store.kinePostgres.passwordFrom"]);

    let mut obj = postgres();
    obj.spec.store.kine_postgres.as_mut().unwrap().password_from = Some(PasswordSource::default());
    assert_eq!(fields(&validate(&obj)), ["spec.store.kinePostgres.passwordFrom"]);

    let mut obj = postgres();
    obj.spec.store.kine_postgres.as_mut().unwrap().password_from = Some(PasswordSource {
        file: None,
        env: Some("hunter2!".into()),
    });
    assert_eq!(fields(&validate(&obj)), ["spec.store.kinePostgres.passwordFrom.env"]);
}

#[test]
fn a_managed_postgres_runs_on_loopback() {
    let mut obj = postgres();
    let pg = obj.spec.store.kine_postgres.as_mut().unwrap();
    pg.managed = true;
    assert_eq!(validate(&obj), vec![]);
    obj.spec.store.kine_postgres.as_mut().unwrap().host = "db.example.com".into();
    assert_eq!(fields(&validate(&obj)), ["spec.store.kinePostgres.host"]);
}

#[test]
fn etcd_endpoints_are_urls_and_client_certs_come_in_pairs() {
    let mut obj = dev();
    obj.spec.store.type_ = StoreType::Etcd;
    obj.spec.store.etcd = Some(EtcdStore {
        endpoints: vec![
            "https://127.0.0.1:2379".into(),
            "http://etcd-0.local:2379/".into(),
            "[::1]:2379".into(),
            "127.0.0.1:2379".into(),
            "unix:///run/etcd.sock".into(),
            "https://user:pw@127.0.0.1:2379".into(),
            "https://127.0.0.1".into(),
            "https://127.0.0.1:2379/v3".into(),
        ],
        ca_file: None,
        cert_file: Some("/etc/etcd/client.crt".into()),
        key_file: None,
    });
    assert_eq!(
        fields(&validate(&obj)),
        [
            "spec.store.etcd.endpoints[2]",
            "spec.store.etcd.endpoints[3]",
            "spec.store.etcd.endpoints[4]",
            "spec.store.etcd.endpoints[5]",
            "spec.store.etcd.endpoints[6]",
            "spec.store.etcd.endpoints[7]",
            "spec.store.etcd.keyFile",
        ]
    );
}

#[test]
fn listen_must_be_an_ip_and_a_fixed_port() {
    for (listen, ok) in [
        ("127.0.0.1:6443", true),
        ("0.0.0.0:443", true),
        ("[::1]:6443", true),
        ("localhost:6443", false),
        ("127.0.0.1:0", false),
        ("127.0.0.1:70000", false),
    ] {
        let mut obj = dev();
        obj.spec.front.listen = listen.into();
        let causes = validate(&obj);
        assert_eq!(causes.is_empty(), ok, "{listen}: {causes:?}");
    }
}

#[test]
fn caddy_settings_go_with_the_caddy_type() {
    let mut obj = dev();
    obj.spec.front.type_ = FrontType::Caddy;
    assert_eq!(fields(&validate(&obj)), ["spec.front.caddy"]);
    obj.spec.front.caddy = Some(CaddyFront {
        admin_address: "localhost:2019".into(),
        upstream_id: "kcp-proxy".into(),
    });
    assert_eq!(validate(&obj), vec![]);
    obj.spec.front.caddy.as_mut().unwrap().upstream_id = "kcp/proxy".into();
    assert_eq!(fields(&validate(&obj)), ["spec.front.caddy.upstreamId"]);
    obj.spec.front.type_ = FrontType::Tcp;
    assert_eq!(fields(&validate(&obj)), ["spec.front.caddy"]);
}

#[test]
fn durations_parse_and_stay_within_bounds() {
    let mut obj = dev();
    obj.spec.rollout.readiness_timeout = "2h".into();
    obj.spec.rollout.drain_timeout = "0s".into();
    obj.spec.kcp.shutdown_delay = "1.5s".into();
    assert_eq!(
        fields(&validate(&obj)),
        [
            "spec.rollout.readinessTimeout",
            "spec.rollout.drainTimeout",
            "spec.kcp.shutdownDelay"
        ]
    );

    let mut obj = dev();
    obj.spec.kcp.shutdown_delay = "30s".into();
    let causes = validate(&obj);
    assert_eq!(fields(&causes), ["spec.kcp.shutdownDelay"]);
    assert!(causes[0].message.contains("drainTimeout"), "{}", causes[0].message);
}

#[test]
fn the_binary_template_knows_one_placeholder() {
    for (binary, ok) in [
        ("bin/kcp-{version}", true),
        ("/opt/kcp/{version}/bin/kcp", true),
        ("/usr/local/bin/kcp", true),
        ("bin/kcp-{ver}", false),
        ("bin/", false),
        ("  ", false),
    ] {
        let mut obj = dev();
        obj.spec.kcp.binary = binary.into();
        assert_eq!(validate(&obj).is_empty(), ok, "{binary}");
    }
    assert_eq!(dev().spec.kcp.binary_for("v0.32.3"), "bin/kcp-v0.32.3");
}

#[test]
fn extra_args_may_not_set_the_flags_kcpshard_owns() {
    let mut obj = dev();
    obj.spec.kcp.extra_args = vec![
        "--v=2".into(),
        "--etcd-servers=http://x:2379".into(),
        "--secure-port".into(),
        "7000".into(),
    ];
    let causes = validate(&obj);
    assert_eq!(fields(&causes), ["spec.kcp.extraArgs[1]", "spec.kcp.extraArgs[2]"]);
    assert!(causes[0].message.contains("spec.store"), "{}", causes[0].message);
}

/// Every flag a slot's start would refuse in extraArgs (slot/args.rs) is refused at admission
/// already, with a message that says what to do.
#[test]
fn every_flag_kcpshard_owns_is_refused_at_admission() {
    for flag in OWNED_KCP_FLAGS {
        let mut obj = dev();
        obj.spec.kcp.extra_args = vec![format!("--{flag}=x")];
        let causes = validate(&obj);
        assert_eq!(fields(&causes), ["spec.kcp.extraArgs[0]"], "--{flag}");
        assert!(
            causes[0].message.contains("instead") || causes[0].message.contains("remove it"),
            "--{flag}: {}",
            causes[0].message
        );
    }
}

#[test]
fn an_adoption_names_an_absolute_root_directory_a_caddy_host_and_port_and_no_sharding() {
    let adopting = |root: &str, caddy: Option<&str>| {
        let mut obj = dev();
        obj.spec.adopt = Some(AdoptSpec {
            root_directory: root.into(),
            caddy_admin_address: caddy.map(str::to_string),
        });
        obj
    };
    assert_eq!(validate(&adopting("/var/lib/kcp", Some("127.0.0.1:2019"))), vec![]);
    assert_eq!(fields(&validate(&adopting(".kcp", None))), ["spec.adopt.rootDirectory"]);
    assert_eq!(
        fields(&validate(&adopting("/var/lib/kcp", Some("localhost")))),
        ["spec.adopt.caddyAdminAddress"]
    );
    let mut sharded = adopting("/var/lib/kcp", None);
    sharded.spec.shard = Some(spec("root", None, Some("https://127.0.0.1:6443"), None));
    assert_eq!(fields(&validate(&sharded)), ["spec.adopt"]);
}
