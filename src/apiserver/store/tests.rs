use super::*;
use serde_json::json;

fn key(name: &str) -> Key {
    Key {
        resource: "things",
        namespace: None,
        name: name.into(),
    }
}

fn put(store: &Store, name: &str, value: Value) -> Value {
    match store
        .modify::<StoreError>(&key(name), |_| Ok(Action::Put(value)))
        .unwrap()
    {
        Outcome::Written(v) => v,
        other => panic!("expected a write, got {other:?}"),
    }
}

#[test]
fn objects_and_the_counter_survive_a_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &["things"]).unwrap();
    put(&store, "a", json!({"metadata": {"name": "a"}}));
    put(&store, "b", json!({"metadata": {"name": "b"}}));
    store.modify::<StoreError>(&key("b"), |_| Ok(Action::Delete)).unwrap();
    assert_eq!(store.current_resource_version(), 3);
    drop(store);

    let store = Store::open(dir.path(), &["things"]).unwrap();
    assert_eq!(
        store.current_resource_version(),
        3,
        "a delete's version must not be reused"
    );
    assert!(store.get(&key("a")).is_some());
    assert!(store.get(&key("b")).is_none());
    assert_eq!(resource_version_of(&put(&store, "c", json!({"metadata": {}}))), 4);
}

#[test]
fn a_write_killed_before_its_rename_leaves_the_old_object() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &["things"]).unwrap();
    put(&store, "a", json!({"metadata": {"name": "a"}, "v": 1}));
    drop(store);
    let tmp = dir.path().join("things/_cluster/a.tmp");
    fs::write(&tmp, b"{\"metadata\": {\"na").unwrap();

    let store = Store::open(dir.path(), &["things"]).unwrap();
    assert_eq!(store.get(&key("a")).unwrap()["v"], 1);
    assert!(!tmp.exists(), "the leftover temp file is cleaned up");
}

#[test]
fn a_corrupt_object_file_stops_open_with_its_name_and_is_left_in_place() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &["things"]).unwrap();
    put(&store, "a", json!({"metadata": {"name": "a"}}));
    put(&store, "b", json!({"metadata": {"name": "b"}}));
    drop(store);
    let b = dir.path().join("things/_cluster/b.json");
    for garbage in [&b"garbage"[..], b"[1, 2]", b"{\"metadata\": {\"na"] {
        fs::write(&b, garbage).unwrap();
        let message = match Store::open(dir.path(), &["things"]) {
            Err(e @ StoreError::Corrupt { .. }) => e.to_string(),
            Err(e) => panic!("another error: {e}"),
            Ok(_) => panic!("a store with a corrupt object file opened"),
        };
        assert!(message.contains(&b.display().to_string()), "{message}");
        assert!(message.contains("move it out of the state directory"), "{message}");
        assert_eq!(fs::read(&b).unwrap(), garbage, "the file is left as it was, for repair");
    }
    // Moved away by the operator: the rest loads.
    fs::rename(&b, dir.path().join("b.json.bad")).unwrap();
    let store = Store::open(dir.path(), &["things"]).unwrap();
    assert!(store.get(&key("a")).is_some());
    assert!(store.get(&key("b")).is_none());
}

#[test]
fn a_corrupt_counter_stops_open() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &["things"]).unwrap();
    put(&store, "a", json!({"metadata": {"name": "a"}}));
    store.modify::<StoreError>(&key("a"), |_| Ok(Action::Delete)).unwrap();
    drop(store);
    fs::write(dir.path().join("resource-version"), b"\0\0garbage").unwrap();
    assert!(matches!(
        Store::open(dir.path(), &["things"]),
        Err(StoreError::Corrupt { .. })
    ));
}

#[test]
fn a_253_character_name_is_stored_and_loaded_under_a_shorter_file_name() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &["things"]).unwrap();
    let long = format!("{}.b", "a".repeat(251));
    let other = format!("{}.c", "a".repeat(251));
    for name in [&long, &other] {
        put(&store, name, json!({"metadata": {"name": name}}));
    }
    drop(store);
    let store = Store::open(dir.path(), &["things"]).unwrap();
    assert!(store.get(&key(&long)).is_some() && store.get(&key(&other)).is_some());
    assert_ne!(file_name(&long), file_name(&other));
    assert!(file_name(&long).len() < 255);
}

#[test]
fn a_full_disk_is_told_apart_from_other_write_errors() {
    let full = StoreError::io(
        "write",
        Path::new("/s/x.json"),
        std::io::Error::from_raw_os_error(libc::ENOSPC),
    );
    assert!(full.is_no_space());
    assert!(full.to_string().contains("no space left") && full.to_string().contains("Free space"));
    let other = StoreError::io(
        "write",
        Path::new("/s/x.json"),
        std::io::Error::from_raw_os_error(libc::EACCES),
    );
    assert!(!other.is_no_space());
}

#[test]
fn a_no_op_write_persists_nothing_and_notifies_nobody() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &["things"]).unwrap();
    put(&store, "a", json!({"metadata": {"name": "a"}}));
    let mut sub = store.subscribe(1).unwrap();
    let outcome = store.modify::<StoreError>(&key("a"), |_| Ok(Action::Nothing)).unwrap();
    assert!(matches!(outcome, Outcome::Unchanged(Some(_))));
    assert_eq!(store.current_resource_version(), 1);
    assert!(sub.live.try_recv().is_err());
}

#[test]
fn a_watch_resumes_after_its_version_and_refuses_one_from_before_the_restart() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::open(dir.path(), &["things"]).unwrap();
    put(&store, "a", json!({"metadata": {}}));
    put(&store, "b", json!({"metadata": {}}));
    put(&store, "a", json!({"metadata": {}, "x": 1}));
    let sub = store.subscribe(1).unwrap();
    let versions: Vec<u64> = sub.backlog.iter().map(|c| c.resource_version).collect();
    assert_eq!(versions, vec![2, 3]);
    drop(store);

    let store = Store::open(dir.path(), &["things"]).unwrap();
    assert!(store.subscribe(1).is_err(), "history from before the restart is gone");
    assert!(store.subscribe(3).is_ok());
}
