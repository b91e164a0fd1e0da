//! The `baton` binary; everything is in the library.

fn main() -> std::process::ExitCode {
    baton_server::main()
}
