//! docs/cli-reference.md is what clap says of the command: every subcommand, flag, default and
//! environment variable, from the same definitions `kcpshard --help` prints.
//! `KCPSHARD_WRITE_REFERENCE=1 cargo test --test cli_reference` rewrites it.

const PATH: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/cli-reference.md");

fn generated() -> String {
    let options = clap_markdown::MarkdownOptions::new()
        .title("`kcpshard` command-line reference".into())
        .show_footer(false);
    let body = clap_markdown::help_markdown_command_custom(&kcpshard::cli::command(), &options);
    format!(
        "<!-- Generated from the command's definitions (src/cli): KCPSHARD_WRITE_REFERENCE=1 cargo test --test cli_reference -->\n\n{}\n",
        body.trim_end()
    )
}

#[test]
fn the_cli_reference_is_what_the_command_says_of_itself() {
    let generated = generated();
    if std::env::var_os("KCPSHARD_WRITE_REFERENCE").is_some() {
        std::fs::write(PATH, &generated).expect("docs/cli-reference.md is writable");
    }
    let checked_in = std::fs::read_to_string(PATH).unwrap_or_default();
    assert!(
        checked_in == generated,
        "docs/cli-reference.md differs from what the command's definitions (src/cli) generate.\n\
         Regenerate it with:\n    KCPSHARD_WRITE_REFERENCE=1 cargo test --test cli_reference\n\
         and commit the result."
    );
    // Every subcommand a user runs, and none that serve runs for itself.
    for section in [
        "## `kcpshard serve`",
        "## `kcpshard snapshot restore`",
        "## `kcpshard adopt`",
    ] {
        assert!(checked_in.contains(section), "no section {section}");
    }
    assert!(
        !checked_in.contains("kcpshard job"),
        "the hidden `job` subcommand is documented"
    );
}
