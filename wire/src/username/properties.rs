//! Property tests: the parser never panics, whatever it is given.

use super::*;
use proptest::prelude::*;

proptest! {
    #[test]
    fn parser_never_panics(s in "\\PC{0,300}") {
        let _ = parse(&s);
    }

    #[test]
    fn parser_never_panics_on_near_valid_input(
        parts in prop::collection::vec(prop::sample::select(vec![
            "alice", "session", "sesstime", "sessmode", "country", "city", "asn", "type", "exit",
            "ipversion", "abc", "10", "hard", "de", "res", "", "-", "0", "4", "6", "99999999999",
            "continent", "state", "region", "notexit", "rotate", "sessidle", "eu", "by",
            "tunnel", "request", "0123456789abcdef0123456789abcdef",
        ]), 0..12)
    ) {
        let _ = parse(&parts.join("-"));
    }
}
