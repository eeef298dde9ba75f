//! Unit tests of the pipeline's own helpers (the stages have theirs).

use super::recorded_name;

#[test]
fn datagram_names_are_recorded_as_policies_match_them() {
    assert_eq!(recorded_name("VM."), "vm");
    assert_eq!(recorded_name("Www.Example.TEST"), "www.example.test");
    assert_eq!(recorded_name("0x7f.1"), "127.0.0.1");
    // Not a host name: folded all the same.
    assert_eq!(recorded_name("A..B."), "a..b");
}
