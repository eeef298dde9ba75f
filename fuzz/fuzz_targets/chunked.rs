//! The chunked-body tracker: fed any bytes, in any split, it finds the end
//! or an error, never a panic, and never claims more than it was given.
#![no_main]
use libfuzzer_sys::fuzz_target;
use superproxy::parsers::Chunked;

fuzz_target!(|data: &[u8]| {
    let split = data.first().map_or(0, |b| usize::from(*b)).min(data.len());
    let mut tracker = Chunked::START;
    for part in [&data[..split], &data[split..]] {
        match tracker.feed(part) {
            Ok(used) => assert!(used <= part.len()),
            Err(_) => return,
        }
    }
});
