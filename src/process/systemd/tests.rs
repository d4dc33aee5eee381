use super::*;

#[test]
fn a_bare_program_name_is_found_on_path_and_a_missing_one_is_an_error() {
    let sh = resolve(Path::new("sh")).unwrap();
    assert!(sh.is_absolute(), "{sh:?}");
    assert!(resolve(Path::new("/no/such/kcp")).is_err());
    let plain = tempfile::NamedTempFile::new().unwrap();
    assert!(resolve(plain.path()).is_err(), "not executable");
}

fn property<'a>(properties: &'a [(String, OwnedVariant)], key: &str) -> Option<&'a Variant<'static>> {
    properties.iter().find(|(k, _)| k == key).map(|(_, v)| &**v)
}

#[test]
fn a_slot_is_left_to_the_controller_and_a_front_is_restarted_with_its_socket() {
    let dir = tempfile::tempdir().unwrap();
    let kcp = ProcessSpec::new(
        "slot-a",
        UnitName::slot("dev", "a"),
        "/opt/kcp",
        vec!["start".into()],
        dir.path().join("kcp.log"),
        dir.path().join("process.json"),
    );
    let slot = unit_properties(&kcp, Path::new("/opt/kcp"), None, Scope::User).unwrap();
    assert_eq!(property(&slot, "Restart"), Some(&Variant::new("no")));
    assert!(property(&slot, "RemainAfterExit").is_none());
    assert_eq!(property(&slot, "Type"), Some(&Variant::new("exec")));
    assert_eq!(property(&slot, "KillSignal"), Some(&Variant::new(libc::SIGTERM)));
    assert!(property(&slot, "FileDescriptorStoreMax").is_none());
    assert!(property(&slot, "StandardInputFileDescriptor").is_none());

    let mut front = kcp.clone();
    front.restart = Restart::Always;
    front.notify = true;
    front.stdin = Some(std::sync::Arc::new(std::net::TcpListener::bind("127.0.0.1:0").unwrap()));
    let front = unit_properties(&front, Path::new("/opt/kcpshard"), None, Scope::User).unwrap();
    assert_eq!(property(&front, "Restart"), Some(&Variant::new("always")));
    assert_eq!(property(&front, "Type"), Some(&Variant::new("notify")));
    assert_eq!(property(&front, "NotifyAccess"), Some(&Variant::new("all")));
    assert_eq!(property(&front, "Delegate"), Some(&Variant::new(true)));
    assert_eq!(
        property(&front, "FileDescriptorStoreMax"),
        Some(&Variant::new(FD_STORE_MAX))
    );
    assert!(matches!(
        property(&front, "StandardInputFileDescriptor"),
        Some(Variant::Fd(_))
    ));
    assert_eq!(property(&front, "StandardOutput"), Some(&Variant::new("journal")));

    // A job's unit stays after its process exits, so that its exit status can be read.
    let mut job = kcp.clone();
    job.keep_exit_status = true;
    let job = unit_properties(&job, Path::new("/usr/bin/pg_dump"), None, Scope::User).unwrap();
    assert_eq!(property(&job, "RemainAfterExit"), Some(&Variant::new(true)));
}

#[test]
fn postgres_stops_on_sigint_and_runs_as_its_user_only_under_the_system_manager() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ProcessSpec::new(
        "postgres",
        UnitName::postgres("dev"),
        "/usr/lib/postgresql/15/bin/postgres",
        vec![],
        dir.path().join("postgres.log"),
        dir.path().join("postgres.json"),
    );
    spec.stop_signal = Signal::SIGINT;
    spec.run_as = Some(crate::process::RunAs {
        user: "postgres".into(),
        uid: 100,
        gid: 100,
    });
    let program = spec.program.clone();
    let system = unit_properties(&spec, &program, None, Scope::System).unwrap();
    assert_eq!(property(&system, "KillSignal"), Some(&Variant::new(libc::SIGINT)));
    assert_eq!(property(&system, "User"), Some(&Variant::new("postgres")));
    let user = unit_properties(&spec, &program, None, Scope::User).unwrap();
    assert!(
        property(&user, "User").is_none(),
        "a user's manager runs everything as that user"
    );
}

#[test]
fn the_environment_file_quotes_what_systemd_would_expand() {
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ProcessSpec::new(
        "kine",
        UnitName::shard_kine("dev"),
        "kine",
        vec![],
        dir.path().join("kine.log"),
        dir.path().join("kine.json"),
    );
    spec.env = vec![("PGPASSWORD".into(), r#"a"b\c$d"#.into())];
    let file = write_env_file(&spec).unwrap();
    assert_eq!(file, dir.path().join("kine.env"));
    assert_eq!(
        std::fs::read_to_string(&file).unwrap(),
        "PGPASSWORD=\"a\\\"b\\\\c\\$d\"\n"
    );
    spec.env = vec![("X".into(), "two\nlines".into())];
    assert!(write_env_file(&spec).is_err());
}
