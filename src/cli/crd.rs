//! `kcpshard crd`: prints the CRD generated from the Rust types, byte for byte, so that
//! `kcpshard crd > crds/kcpshards.kcpshard.io.yaml` reproduces the checked-in file; with
//! `--reference`, the field reference generated from it (docs/reference.md).
use std::io::Write;

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Print every field's type, default and description as Markdown instead (docs/reference.md).
    #[arg(long)]
    reference: bool,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let text = match args.reference {
        true => crate::api::reference_markdown(),
        false => crate::api::crd_yaml(),
    };
    let mut stdout = std::io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    Ok(())
}
