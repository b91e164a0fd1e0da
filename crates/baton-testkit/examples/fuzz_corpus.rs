//! Writes the starting corpus of the AFL++ targets in `fuzz/`: valid
//! inputs of every decoder, made by baton's own encoders.
//! Usage: `cargo run -p baton-testkit --example fuzz_corpus -- <dir>`.

fn main() -> std::io::Result<()> {
    let dir = std::env::args_os().nth(1).unwrap_or_else(|| "fuzz/corpus".into());
    baton_testkit::fuzz::seeds::write_corpus(std::path::Path::new(&dir))
}
