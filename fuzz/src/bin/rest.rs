//! AFL++ target: the rest decoder (see baton_fuzz::rest).

fn main() {
    afl::fuzz!(|data: &[u8]| baton_fuzz::rest(data));
}
