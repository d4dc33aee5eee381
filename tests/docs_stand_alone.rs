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

/// A heading's anchor as GitHub makes it: lower case, spaces to hyphens, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The headings of a Markdown file (outside code blocks), without their `#`s.
fn headings(text: &str) -> Vec<String> {
    let mut in_code = false;
    let mut found = Vec::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
        } else if !in_code && line.starts_with('#') {
            found.push(line.trim_start_matches('#').trim().to_string());
        }
    }
    found
}

/// The relative links of a Markdown text: `[text](target)` and `![alt](target)`, not URLs.
fn relative_links(text: &str) -> Vec<String> {
    // Not inside `code` (a pattern's `](`).
    let prose: String = text.split('`').step_by(2).collect::<Vec<_>>().join(" ");
    prose
        .split("](")
        .skip(1)
        .filter_map(|rest| rest.split_once(')').map(|(target, _)| target.to_string()))
        .filter(|t| !t.contains("://") && !t.starts_with("mailto:") && !t.contains(' '))
        .collect()
}

/// Every relative link of the README and docs/ (docs/how-to/ too) reaches a file, and its `#anchor`
/// a heading there; every page the code, tests and scripts name exists, and every section they
/// cite by name (`docs/X.md, "Section"`) is a heading of that page.
#[test]
fn links_and_cited_sections_reach_what_they_name() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let anchors_of = |path: &Path| -> Option<Vec<String>> {
        let text = std::fs::read_to_string(path).ok()?;
        Some(headings(&text).iter().map(|h| anchor(h)).collect())
    };
    // docs/ and the directories under it (docs/how-to/).
    let mut docs = Vec::new();
    files(&root.join("docs"), &mut docs);
    let mut pages = vec![root.join("README.md")];
    pages.extend(docs.into_iter().filter(|p| p.extension().is_some_and(|e| e == "md")));
    assert!(
        pages.iter().any(|p| p.ends_with("docs/how-to/install.md")),
        "the pages under docs/how-to/ are not read: is the walk right?"
    );
    let mut broken = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        let dir = page.parent().unwrap();
        for link in relative_links(&text) {
            let (file, fragment) = link.split_once('#').unwrap_or((&link, ""));
            let target = if file.is_empty() { page.clone() } else { dir.join(file) };
            let name = page.strip_prefix(&root).unwrap().display().to_string();
            if !target.exists() {
                broken.push(format!("{name}: ({link}): no such file"));
            } else if !fragment.is_empty() && target.extension().is_some_and(|e| e == "md") {
                let anchors = anchors_of(&target).unwrap_or_default();
                if !anchors.iter().any(|a| a == fragment) {
                    broken.push(format!("{name}: ({link}): no such heading"));
                }
            }
        }
    }
    let mut sources = Vec::new();
    for dir in ["src", "tests", "hack", "manifests"] {
        files(&root.join(dir), &mut sources);
    }
    // This file's comments show the form it reads.
    let this_file = root.join(file!());
    for source in sources.iter().filter(|p| **p != this_file) {
        let text = std::fs::read_to_string(source).unwrap();
        for (n, line) in text.lines().enumerate() {
            for (_, rest) in line.match_indices("docs/").map(|(at, _)| ((), &line[at..])) {
                let Some((page, after)) = rest.split_once(".md") else {
                    continue;
                };
                let page = root.join(format!("{page}.md"));
                let at = format!("{}:{}", source.strip_prefix(&root).unwrap().display(), n + 1);
                if !page.exists() {
                    broken.push(format!(
                        "{at}: {} does not exist",
                        page.strip_prefix(&root).unwrap().display()
                    ));
                    continue;
                }
                let quoted = after
                    .strip_prefix(", ")
                    .or_else(|| after.strip_prefix(' '))
                    .map(|a| a.trim_start_matches('\\'))
                    .and_then(|a| a.strip_prefix('"'))
                    .and_then(|a| a.split_once('"'))
                    .map(|(section, _)| section.trim_end_matches('\\'));
                if let Some(section) = quoted {
                    // A heading, or a paragraph's bold lead (`**A roll seen through ....**`).
                    let text = std::fs::read_to_string(&page).unwrap();
                    let leads = text.lines().filter_map(|l| l.strip_prefix("**")).map(str::to_string);
                    let titles: Vec<String> = headings(&text).into_iter().chain(leads).collect();
                    if !titles.iter().any(|t| t.replace('`', "").starts_with(section)) {
                        broken.push(format!(
                            "{at}: no section \"{section}\" in {}",
                            page.strip_prefix(&root).unwrap().display()
                        ));
                    }
                }
            }
        }
    }
    assert!(broken.is_empty(), "links that lead nowhere:\n{}", broken.join("\n"));
}
