//! docs/troubleshooting.md lists every reason the controller writes, in conditions and events,
//! and no reason it does not: read from the code's string literals, so that a new event or
//! condition reason cannot ship undocumented, and a documented one cannot outlive its code.
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The Rust files under `dir`, without unit tests (`tests.rs`, `*_tests.rs`, the simulation).
fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            sources(&path, out);
        } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") && name != "simulation.rs"
        {
            out.push(path);
        }
    }
}

/// The code of `path` before its `#[cfg(test)]` module.
fn code(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap();
    text.split("#[cfg(test)]").next().unwrap_or_default().to_string()
}

/// A CamelCase word of two parts or more ("SlotReady", not "Idle" or "kcp"): how reasons are
/// spelled, and little else in the code is.
fn is_camel_case(word: &str) -> bool {
    let mut chars = word.chars();
    chars.next().is_some_and(|c| c.is_ascii_uppercase())
        && chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && word.chars().all(|c| c.is_ascii_alphanumeric())
        && word.chars().filter(char::is_ascii_uppercase).count() >= 2
}

/// The string literals of `text` that are CamelCase words.
fn camel_case_literals(text: &str) -> BTreeSet<String> {
    text.split('"')
        .skip(1)
        .step_by(2)
        .filter(|word| is_camel_case(word))
        .map(str::to_string)
        .collect()
}

/// What the controller writes as reasons: CamelCase literals of its code (and of the store's disk
/// watermark and `serve --manifests`), less the names of its steps (`Step::name`, in metrics and
/// logs) and the kind its events are about.
fn written_reasons() -> BTreeSet<String> {
    let mut files = Vec::new();
    for dir in ["src/controller", "src/gitops"] {
        sources(&root().join(dir), &mut files);
    }
    files.push(root().join("src/store/disk.rs"));
    let mut literals = BTreeSet::new();
    for file in &files {
        literals.extend(camel_case_literals(&code(file)));
    }
    let mut not_reasons = camel_case_literals(&code(&root().join("src/controller/plan/step.rs")));
    not_reasons.insert("KcpShard".to_string());
    literals.difference(&not_reasons).cloned().collect()
}

/// The reasons docs/troubleshooting.md names: in backquotes, or as a section's title.
fn documented(doc: &str) -> BTreeSet<String> {
    let quoted = doc.split('`').skip(1).step_by(2).map(str::to_string);
    let titles = doc
        .lines()
        .filter_map(|l| l.strip_prefix("### "))
        .flat_map(|t| t.split(", ").map(str::to_string).collect::<Vec<_>>());
    quoted.chain(titles).collect()
}

#[test]
fn every_reason_the_controller_writes_is_in_troubleshooting_and_only_those() {
    let doc = std::fs::read_to_string(root().join("docs/troubleshooting.md")).unwrap();
    let written = written_reasons();
    let explained = documented(&doc);
    let undocumented: Vec<&String> = written.difference(&explained).collect();
    assert!(
        undocumented.is_empty(),
        "reasons the controller writes that docs/troubleshooting.md does not explain: {undocumented:?}"
    );
    // A table row per reason: each must still be written somewhere in the code.
    let mut everywhere = Vec::new();
    sources(&root().join("src"), &mut everywhere);
    let all: BTreeSet<String> = everywhere.iter().flat_map(|f| camel_case_literals(&code(f))).collect();
    let rows: BTreeSet<String> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split('`').next())
        .map(str::to_string)
        .collect();
    let stale: Vec<&String> = rows.iter().filter(|r| is_camel_case(r) && !all.contains(*r)).collect();
    assert!(
        stale.is_empty(),
        "docs/troubleshooting.md explains reasons no code writes: {stale:?}"
    );
    assert!(written.len() > 80, "too few reasons found: {written:?}");
}
