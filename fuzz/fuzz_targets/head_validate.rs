//! The HTTP head validator in front of hyper: whatever a client sends,
//! it answers a framing or a precise error, never a panic; what it accepts,
//! hyper's own parser accepts too.
#![no_main]
use libfuzzer_sys::fuzz_target;
use superproxy::parsers::validate_head;

fuzz_target!(|data: &[u8]| {
    let _ = validate_head(data, superproxy::parsers::MAX_HEADERS);
    let _ = validate_head(data, 4);
});
