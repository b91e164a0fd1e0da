//! The role an answer names in a rollout (baton's `baton-role` response
//! header or gRPC metadata), kept in a request's record as one byte.

/// No role named: the server says none, or is not baton.
pub const NONE: u8 = 0;
/// The stable version answered.
pub const STABLE: u8 = 1;
/// The rollout's candidate answered.
pub const CANDIDATE: u8 = 2;
/// A kept previous version answered (a request naming it).
pub const PREVIOUS: u8 = 3;
/// A role this drill does not know.
pub const OTHER: u8 = 4;

/// The names of the roles, indexed by their codes.
pub const NAMES: [&str; 5] = ["none", "stable", "candidate", "previous", "other"];

/// The header (REST) and metadata key (gRPC) naming the role.
pub const HEADER: &str = "baton-role";

/// The code of a role as the server names it.
pub fn parse(value: &[u8]) -> u8 {
    match value.trim_ascii() {
        b"" => NONE,
        b"stable" => STABLE,
        b"candidate" => CANDIDATE,
        b"previous" => PREVIOUS,
        _ => OTHER,
    }
}

/// The name of a role code.
pub fn name(code: u8) -> &'static str {
    NAMES.get(usize::from(code)).copied().unwrap_or("other")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_round_trip() {
        for code in [STABLE, CANDIDATE, PREVIOUS] {
            assert_eq!(parse(name(code).as_bytes()), code);
        }
        assert_eq!(parse(b" candidate "), CANDIDATE);
        assert_eq!(parse(b""), NONE);
        assert_eq!(parse(b"shadow"), OTHER);
        assert_eq!(name(9), "other");
    }
}
