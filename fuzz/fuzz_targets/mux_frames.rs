//! The link mux driver reading whatever a peer sends as frames: it ends the
//! connection with a protocol error or keeps going, never panics, and
//! holds no more than its bounds.
#![no_main]
use libfuzzer_sys::fuzz_target;
use proxynet_wire::mux::{self, MuxConfig, Role};
use tokio::io::AsyncWriteExt;

fuzz_target!(|data: &[u8]| {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let (mut peer, ours) = tokio::io::duplex(1 << 16);
        // Both roles: a server accepts the peer's streams, a client does not.
        let role = if data.first().is_some_and(|b| b & 1 == 1) {
            Role::Server
        } else {
            Role::Client
        };
        let (handle, connection) = mux::start(ours, role, MuxConfig::default());
        let driver = tokio::spawn(connection);
        let _ = peer.write_all(data).await;
        let _ = peer.shutdown().await;
        let accept = async {
            while let Some(incoming) = handle.accept().await {
                drop(incoming.reply(bytes::Bytes::from_static(b"ok")));
            }
        };
        let _ = tokio::time::timeout(std::time::Duration::from_millis(200), accept).await;
        drop(handle);
        let _ = tokio::time::timeout(std::time::Duration::from_millis(200), driver).await;
    });
});
