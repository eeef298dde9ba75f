//! The bodies peers send as JSON: the agent's link hello (length-prefixed
//! frame) and stream requests, and its heartbeat body. Any bytes give a
//! value or an error, never a panic.
#![no_main]
use libfuzzer_sys::fuzz_target;
use proxynet_wire::heartbeat::HeartbeatRequest;
use proxynet_wire::link::{read_frame, AgentHello, HelloReply, StreamRequest};

fuzz_target!(|data: &[u8]| {
    let _ = serde_json::from_slice::<HeartbeatRequest>(data);
    let _ = serde_json::from_slice::<StreamRequest>(data);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let mut reader = data;
        let _ = read_frame::<&[u8], AgentHello>(&mut reader).await;
        let mut reader = data;
        let _ = read_frame::<&[u8], HelloReply>(&mut reader).await;
    });
});
