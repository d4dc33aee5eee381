//! The repository stands alone: its README, docs, code and scripts cite only what is in it or
//! public (kcp's source, kcp's docs), never notes a user of the repository does not have, and name
//! no package registry's host (module metadata comes through the go command).
use std::path::{Path, PathBuf};

/// What must not appear, each with why. Built from pieces so that this file does not match itself.
fn forbidden() -> Vec<(String, &'static str)> {
    vec![
        (["..", "/shared"].concat(), "a directory outside the repository"),
        (
            ["DESIGN", ".md"].concat(),
            "a design brief that is not in the repository",
        ),
        (
            ["proxy", ".golang.org"].concat(),
            "a registry host (use `go mod download -json`)",
        ),
    ]
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if path.is_dir() {
            if !["target", "bin", ".git", "corpus", "artifacts"].contains(&name.as_ref()) {
                files(&path, out);
            }
        } else if [".rs", ".md", ".sh", ".yaml", ".toml", ".env", ".service"]
            .iter()
            .any(|ext| name.ends_with(ext))
        {
            out.push(path);
        }
    }
}

/// "issue 7", "Issue 12": a tracker the repository's readers cannot see.
fn cites_an_issue(line: &str) -> bool {
    let lower = line.to_lowercase();
    lower.match_indices("issue ").any(|(at, word)| {
        lower[at + word.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    })
}

#[test]
fn readme_docs_code_and_scripts_name_nothing_outside_the_repository() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let mut all = vec![root.join("README.md")];
    for dir in [
        "docs",
        "src",
        "tests",
        "hack",
        "manifests",
        "crds",
        "examples",
        "fuzz",
        ".ci",
    ] {
        if root.join(dir).is_dir() {
            files(&root.join(dir), &mut all);
        }
    }
    let mut found = Vec::new();
    // This file names what it looks for, in its examples.
    let this_file = root.join(file!());
    for path in all.iter().filter(|p| **p != this_file) {
        let Ok(text) = std::fs::read_to_string(path) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            let at = format!("{}:{}", path.strip_prefix(&root).unwrap().display(), n + 1);
            for (needle, why) in forbidden() {
                if line.contains(&needle) {
                    found.push(format!("{at}: {needle} ({why})"));
                }
            }
            if cites_an_issue(line) {
                found.push(format!("{at}: cites an issue number: {}", line.trim()));
            }
        }
    }
    assert!(all.len() > 50, "found only {} files: is the walk right?", all.len());
    assert!(
        found.is_empty(),
        "restate what these rely on in docs/ instead:\n{}",
        found.join("\n")
    );
}

#[test]
fn an_issue_citation_is_told_from_ordinary_words() {
    assert!(cites_an_issue("as issue 6 asks"));
    assert!(cites_an_issue("(Issue 12)"));
    assert!(!cites_an_issue("a known issue with caddy"));
    assert!(!cites_an_issue("no issues"));
}

/// The README's tour is what `hack/up.sh` prints once the shard is Ready (its heredoc, with the
/// default state dir, manifests/dev.yaml's front and the pins filled in), so that it works by copy
/// and paste.
#[test]
fn the_readme_tour_is_what_up_sh_prints() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let read = |path: &str| std::fs::read_to_string(root.join(path)).unwrap();
    let pin = |name: &str| {
        read("hack/versions.env")
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{name}=")).map(str::to_string))
            .unwrap_or_else(|| panic!("no {name} in hack/versions.env"))
    };
    let up = read("hack/up.sh");
    let printed = up
        .split_once("    cd $root\n")
        .and_then(|(_, rest)| rest.split_once("\nEOT\n"))
        .map(|(tour, _)| tour.trim_end())
        .expect("hack/up.sh prints the tour in a heredoc starting with `    cd $root`");
    let printed = printed
        .replace("\\$", "$")
        .replace("$rel_state", ".kcpshard")
        .replace("$front", "127.0.0.1:6443")
        .replace("$KCP_VERSION_OLDER", &pin("KCP_VERSION_OLDER"));
    assert!(
        read("manifests/dev.yaml").contains("listen: 127.0.0.1:6443"),
        "manifests/dev.yaml's front moved: update this test and the README"
    );
    let readme = read("README.md");
    let tour = readme
        .split_once("What `hack/up.sh` prints once the shard is Ready (after `cd` to the checkout):\n\n")
        .and_then(|(_, rest)| rest.split_once("\n\n    hack/down.sh"))
        .map(|(tour, down)| format!("{tour}\n\n    hack/down.sh{}", down.lines().next().unwrap_or("")))
        .expect("README.md has the tour under \"A short tour\"");
    assert_eq!(
        tour, printed,
        "README.md's tour differs from what hack/up.sh prints: copy the script's output into the README"
    );
}
