//! AFL++ target: the manifest decoder (see baton_fuzz::manifest).

fn main() {
    afl::fuzz!(|data: &[u8]| baton_fuzz::manifest(data));
}
