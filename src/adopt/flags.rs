//! The flags a running kcp was started with, read from its argv, and what an adoption does with
//! each: keep it for every slot, take it over (kcpshard sets it), or drop it with the store it
//! configured.
//!
//! kcp parses its flags with pflag (`kcp start` takes no positional arguments), so a flag is
//! `--name=value`, `--name value`, or a bare `--name` (a boolean); a word after a flag is its value.
use crate::api::validation::OWNED_KCP_FLAGS;

/// One flag as the process had it: its name without `--` and its value (None for a bare boolean).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flag {
    pub name: String,
    pub value: Option<String>,
}

impl Flag {
    /// The flag as one argument, `--name=value` or `--name`.
    pub fn argument(&self) -> String {
        match &self.value {
            Some(value) => format!("--{}={value}", self.name),
            None => format!("--{}", self.name),
        }
    }
}

/// What an adoption does with a flag of the old process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fate {
    /// Every slot gets it too (spec.kcp.extraArgs).
    Kept,
    /// kcpshard sets it for each slot; says what takes its place.
    TakenOver(&'static str),
    /// It configured what the adoption replaces (the embedded etcd, whose data moves to spec.store).
    Dropped(&'static str),
}

/// The flags of a `kcp start` argv (argv\[0\] the binary, then `start`), in order. A flag given
/// twice keeps its last value, as pflag does.
pub fn parse(argv: &[String]) -> Vec<Flag> {
    let mut flags: Vec<Flag> = Vec::new();
    let mut args = argv.iter().skip(1).filter(|a| a.as_str() != "start").peekable();
    while let Some(arg) = args.next() {
        let Some(flag) = arg.strip_prefix("--").or_else(|| arg.strip_prefix('-')) else {
            continue;
        };
        let (name, value) = match flag.split_once('=') {
            Some((name, value)) => (name.to_string(), Some(value.to_string())),
            None => {
                let value = args.next_if(|next| !next.starts_with('-')).cloned();
                (flag.to_string(), value)
            }
        };
        flags.retain(|f| f.name != name);
        flags.push(Flag { name, value });
    }
    flags
}

/// The value of flag `name` among `flags`.
pub fn value<'a>(flags: &'a [Flag], name: &str) -> Option<&'a str> {
    flags.iter().find(|f| f.name == name)?.value.as_deref()
}

/// What the adoption does with `flag`.
pub fn fate(flag: &Flag) -> Fate {
    let name = flag.name.as_str();
    if name.starts_with("embedded-etcd-") {
        return Fate::Dropped("the embedded etcd's data moves to spec.store");
    }
    if !OWNED_KCP_FLAGS.contains(&name) {
        return Fate::Kept;
    }
    Fate::TakenOver(match name {
        "root-directory" => "each slot has its own root directory, seeded with this one's key material",
        "bind-address" | "secure-port" | "shard-base-url" | "shard-external-url" => {
            "clients reach the shard through the front (spec.front.listen)"
        }
        "etcd-servers" | "etcd-cafile" | "etcd-certfile" | "etcd-keyfile" => "its data moves to spec.store",
        "token-auth-file" => "its tokens are accepted by every slot (the shard's token file)",
        "kubeconfig-path" | "authentication-admin-token-path" => {
            "the admin kubeconfig and token hash become the shard's shared material"
        }
        "shutdown-delay-duration" => "spec.kcp.shutdownDelay",
        _ => "kcpshard sets it for each slot",
    })
}

/// The flags an adopted shard keeps, as spec.kcp.extraArgs.
pub fn kept(flags: &[Flag]) -> Vec<String> {
    flags
        .iter()
        .filter(|f| fate(f) == Fate::Kept)
        .map(Flag::argument)
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn argv(args: &str) -> Vec<String> {
        args.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn every_form_pflag_takes_is_read_and_the_last_of_a_repeated_flag_wins() {
        let flags = parse(&argv(
            "/usr/bin/kcp start --root-directory=/var/lib/kcp --secure-port 6443 --enable-leader-election \
             -v=2 --feature-gates=A=true,B=false --secure-port=7443",
        ));
        assert_eq!(value(&flags, "root-directory"), Some("/var/lib/kcp"));
        assert_eq!(value(&flags, "secure-port"), Some("7443"));
        assert_eq!(value(&flags, "feature-gates"), Some("A=true,B=false"));
        assert_eq!(value(&flags, "v"), Some("2"));
        let bare = flags.iter().find(|f| f.name == "enable-leader-election").unwrap();
        assert_eq!(bare.value, None);
        assert_eq!(bare.argument(), "--enable-leader-election");
        assert_eq!(flags.iter().filter(|f| f.name == "secure-port").count(), 1);
    }

    #[test]
    fn the_store_address_and_identity_flags_are_taken_over_and_the_rest_kept() {
        let flags = parse(&argv(
            "kcp start --root-directory=/r --bind-address=127.0.0.1 --secure-port=6443 \
             --etcd-servers=http://127.0.0.1:23791 --token-auth-file /r/tokens.csv \
             --embedded-etcd-client-port=2379 --feature-gates=WorkspaceMounts=true \
             --audit-policy-file=/etc/kcp/audit.yaml --audit-log-path=/var/log/kcp/audit.log",
        ));
        let fates: BTreeMap<_, _> = flags.iter().map(|f| (f.name.as_str(), fate(f))).collect();
        for taken in [
            "root-directory",
            "bind-address",
            "secure-port",
            "etcd-servers",
            "token-auth-file",
        ] {
            assert!(
                matches!(fates[taken], Fate::TakenOver(_)),
                "{taken}: {:?}",
                fates[taken]
            );
        }
        assert!(matches!(fates["embedded-etcd-client-port"], Fate::Dropped(_)));
        assert_eq!(
            kept(&flags),
            [
                "--feature-gates=WorkspaceMounts=true",
                "--audit-policy-file=/etc/kcp/audit.yaml",
                "--audit-log-path=/var/log/kcp/audit.log"
            ]
        );
    }
}
