//! What `kcpshard adopt --dry-run` prints: what an adoption would take, keep and drop, and why it
//! would be refused.
use std::fmt::Write;

use super::flags::{self, Fate};
use super::{AdoptError, Found};
use crate::store::etcd_keys::KCP_PREFIX;

/// The report on `found`, to be adopted into a shard of kcp `version`, ending with the refusals
/// (or that there are none).
pub fn render(found: &Found, version: &str, refusals: &[AdoptError]) -> String {
    let mut out = String::new();
    let p = &found.process;
    let _ = writeln!(out, "kcp on {}", found.root_dir.display());
    let _ = writeln!(
        out,
        "  process   pid {} (uid {}), kcp {} ({}), serving {}",
        p.pid,
        p.uid,
        p.version,
        p.exe.display(),
        p.url
    );
    let _ = writeln!(
        out,
        "  store     {}: {} keys under {KCP_PREFIX} at revision {}; moves to spec.store while kcp serves",
        found.store, found.store_size.keys, found.store_size.revision
    );
    for (i, (name, path)) in found.material.iter().enumerate() {
        let label = if i == 0 { "material" } else { "" };
        let _ = writeln!(out, "  {label:<9} {name:<19} {}", path.display());
    }
    let contexts: Vec<String> = found
        .contexts
        .iter()
        .map(|(context, user)| format!("{context} ({user})"))
        .collect();
    let _ = writeln!(
        out,
        "  tokens    admin.kubeconfig contexts {}, all accepted by every slot; {} static tokens (--token-auth-file)",
        contexts.join(", "),
        found.static_tokens
    );
    for (i, flag) in found.flags.iter().enumerate() {
        let label = if i == 0 { "flags" } else { "" };
        let fate = match flags::fate(flag) {
            Fate::Kept => "kept: every slot gets it (spec.kcp.extraArgs)".to_string(),
            Fate::TakenOver(why) => format!("taken over: {why}"),
            Fate::Dropped(why) => format!("dropped: {why}"),
        };
        let _ = writeln!(out, "  {label:<9} {}  {fate}", flag.argument());
    }
    if refusals.is_empty() {
        let _ = writeln!(out, "adoptable into a shard of kcp {version}");
    } else {
        let _ = writeln!(out, "cannot adopt:");
        for refusal in refusals {
            let _ = writeln!(out, "  - {refusal}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adopt::tests::found;

    #[test]
    fn the_report_says_what_is_taken_kept_and_dropped_and_ends_with_the_verdict() {
        let found = found();
        let report = render(&found, "v0.31.2", &[]);
        let process = format!(
            "process   pid {} (uid 0), kcp v0.31.2 (/usr/bin/kcp), serving https://127.0.0.1:6443",
            found.process.pid
        );
        for line in [
            process.as_str(),
            "812 keys under /registry/ at revision 1234",
            "material  sa.key              /r/sa.key",
            "contexts root (kcp-admin)",
            "--feature-gates=A=true  kept",
            "--root-directory=/r  taken over",
        ] {
            assert!(report.contains(line), "{line:?} not in:\n{report}");
        }
        assert!(report.ends_with("adoptable into a shard of kcp v0.31.2\n"), "{report}");

        let refusals = vec![AdoptError::OtherVersion {
            dir: "/r".into(),
            found: "v0.31.2".into(),
            wanted: "v0.31.0".into(),
        }];
        let refused = render(&found, "v0.31.0", &refusals);
        assert!(
            refused.ends_with(
                "cannot adopt:\n  - kcp v0.31.2 runs on /r, and the shard is to run v0.31.0: adopt it at the release it runs (--version v0.31.2), then roll to v0.31.0 by changing spec.version\n"
            ),
            "{refused}"
        );
    }
}
