//! `kcpshard crd`: prints the CRD generated from the Rust types, byte for byte, so that
//! `kcpshard crd > crds/kcpshards.kcpshard.io.yaml` reproduces the checked-in file.
use std::io::Write;

pub fn run() -> anyhow::Result<()> {
    let yaml = crate::api::crd_yaml();
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(yaml.as_bytes())?;
    stdout.flush()?;
    Ok(())
}
