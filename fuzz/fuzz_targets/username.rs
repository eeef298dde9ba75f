//! The username grammar (`USER-key-value...`): any string gets a parse or
//! a precise error, never a panic; a parse's base user is non-empty.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(text) = std::str::from_utf8(data) {
        if let Ok(parsed) = proxynet_wire::username::parse(text) {
            assert!(!parsed.user.is_empty());
        }
    }
});
