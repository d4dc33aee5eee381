fn main() -> std::process::ExitCode {
    kcpshard::cli::main()
}
