//! The TLS server-name reader (a client's first bytes through a tunnel to
//! an address): any bytes get a record state and a name or none, never a
//! panic; a name is ASCII and at most 255 bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;
use superproxy::parsers::sni;

fuzz_target!(|data: &[u8]| {
    let _ = sni::first_record(data);
    if let Some(name) = sni::server_name(data) {
        assert!(!name.is_empty() && name.len() <= 255 && name.is_ascii());
    }
});
