//! kcp release versions (`v0.32.3`, `v0.33.0-rc.1`) and the rule `spec.rollout` sets on changing
//! them. The controller asks [`RolloutSpec::version_change`] before a roll that changes the version
//! (docs/background.md section 6: refuse a change the spec does not allow).
use std::cmp::Ordering;
use std::fmt;

use super::kcpshard::RolloutSpec;

/// A parsed `vMAJOR.MINOR.PATCH[-PRE]` tag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KcpVersion {
    pub major: u64,
    pub minor: u64,
    pub patch: u64,
    /// The pre-release part after `-`, if any (`rc.1`).
    pub pre: Option<String>,
}

impl KcpVersion {
    /// Parses a tag as `spec.version` carries it.
    pub fn parse(text: &str) -> Result<Self, String> {
        let bad = || format!("{text:?} is not a kcp release tag: write one such as v0.32.3");
        let rest = text.strip_prefix('v').ok_or_else(bad)?;
        let (core, pre) = match rest.split_once('-') {
            Some((core, pre)) if !pre.is_empty() => (core, Some(pre.to_string())),
            Some(_) => return Err(bad()),
            None => (rest, None),
        };
        let mut parts = core.split('.').map(|p| {
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                Err(bad())
            } else {
                p.parse::<u64>().map_err(|_| bad())
            }
        });
        let (major, minor, patch) = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(a), Some(b), Some(c), None) => (a?, b?, c?),
            _ => return Err(bad()),
        };
        Ok(Self {
            major,
            minor,
            patch,
            pre,
        })
    }
}

impl fmt::Display for KcpVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}.{}.{}", self.major, self.minor, self.patch)?;
        if let Some(pre) = &self.pre {
            write!(f, "-{pre}")?;
        }
        Ok(())
    }
}

impl PartialOrd for KcpVersion {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

/// Semver precedence: a pre-release sorts before its release; pre-releases compare as strings
/// dot-part by dot-part, numbers numerically.
impl Ord for KcpVersion {
    fn cmp(&self, other: &Self) -> Ordering {
        (self.major, self.minor, self.patch)
            .cmp(&(other.major, other.minor, other.patch))
            .then_with(|| match (&self.pre, &other.pre) {
                (None, None) => Ordering::Equal,
                (None, Some(_)) => Ordering::Greater,
                (Some(_), None) => Ordering::Less,
                (Some(a), Some(b)) => {
                    let key = |s: &str| -> Vec<(u64, String)> {
                        s.split('.')
                            .map(|p| {
                                p.parse::<u64>()
                                    .map_or((u64::MAX, p.to_string()), |n| (n, String::new()))
                            })
                            .collect()
                    };
                    key(a).cmp(&key(b))
                }
            })
    }
}

impl RolloutSpec {
    /// Whether a roll from `from` to `to` is allowed: patch changes always; minor changes with
    /// `allowMinorVersionChange`; major changes never; going back with `allowDowngrade`. The error
    /// says what to change.
    pub fn version_change(&self, from: &str, to: &str) -> Result<(), String> {
        let (old, new) = (KcpVersion::parse(from)?, KcpVersion::parse(to)?);
        if old.major != new.major {
            return Err(format!(
                "a roll from {old} to {new} changes the major version, which kcpshard never does in place: move the data to a new shard"
            ));
        }
        if new < old && !self.allow_downgrade {
            return Err(format!(
                "{new} is older than {old}, which last served the data: set spec.rollout.allowDowngrade: true to roll back anyway, or restore the snapshot taken before the upgrade"
            ));
        }
        if old.minor != new.minor && !self.allow_minor_version_change {
            return Err(format!(
                "a roll from {old} to {new} changes the minor version: set spec.rollout.allowMinorVersionChange: true to allow it"
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_release_and_pre_release_tags() {
        assert_eq!(
            KcpVersion::parse("v0.32.3"),
            Ok(KcpVersion {
                major: 0,
                minor: 32,
                patch: 3,
                pre: None
            })
        );
        assert_eq!(KcpVersion::parse("v1.0.0-rc.1").unwrap().to_string(), "v1.0.0-rc.1");
        for bad in ["0.32.3", "v0.32", "v0.32.3.1", "v0.32.x", "v0.32.3-", "v+1.2.3", ""] {
            assert!(KcpVersion::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn orders_like_semver() {
        let v = |s| KcpVersion::parse(s).unwrap();
        assert!(v("v0.32.3") > v("v0.32.2"));
        assert!(v("v0.33.0") > v("v0.32.9"));
        assert!(v("v0.33.0") > v("v0.33.0-rc.2"));
        assert!(v("v0.33.0-rc.10") > v("v0.33.0-rc.2"));
    }

    #[test]
    fn the_rollout_spec_decides_which_changes_are_allowed() {
        let mut rollout = RolloutSpec::default();
        assert_eq!(rollout.version_change("v0.32.2", "v0.32.3"), Ok(()));
        assert_eq!(rollout.version_change("v0.32.3", "v0.32.3"), Ok(()));
        assert!(
            rollout
                .version_change("v0.32.3", "v0.32.2")
                .unwrap_err()
                .contains("allowDowngrade")
        );
        assert!(
            rollout
                .version_change("v0.31.0", "v0.32.3")
                .unwrap_err()
                .contains("allowMinorVersionChange")
        );
        assert!(
            rollout
                .version_change("v0.32.3", "v1.0.0")
                .unwrap_err()
                .contains("major")
        );
        rollout.allow_minor_version_change = true;
        assert_eq!(rollout.version_change("v0.31.0", "v0.32.3"), Ok(()));
        assert!(rollout.version_change("v0.32.3", "v0.31.0").is_err());
        rollout.allow_downgrade = true;
        assert_eq!(rollout.version_change("v0.32.3", "v0.31.0"), Ok(()));
    }
}
