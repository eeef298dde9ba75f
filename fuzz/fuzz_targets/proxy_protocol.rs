//! The PROXY protocol header parser (the first bytes of a trusted
//! balancer's connections): any bytes get a header, a refusal or a request
//! for more, never a panic; a header never claims more bytes than it was
//! given, nor more than the bounds allow, and asking for more never reads
//! past a header.
#![no_main]
use libfuzzer_sys::fuzz_target;
use superproxy::parsers::proxy_protocol::{parse, Parsed, V1_MAX, V2_FIXED, V2_MAX_PAYLOAD};

fuzz_target!(|data: &[u8]| {
    match parse(data) {
        Ok(Parsed::Complete(_, used)) => {
            assert!(used <= data.len());
            assert!(used <= V1_MAX.max(V2_FIXED + V2_MAX_PAYLOAD));
            // The header is what its own bytes say, whatever follows.
            assert!(matches!(parse(&data[..used]), Ok(Parsed::Complete(_, n)) if n == used));
        }
        Ok(Parsed::Incomplete(more)) => {
            assert!(more >= 1);
            assert!(data.len() + more <= V2_FIXED + V2_MAX_PAYLOAD);
        }
        Err(_) => {}
    }
});
