//! The SOCKS5 server handshake (RFC 1928/1929, fast-socks5 as the ingress
//! drives it) over whatever a client sends: it fails or finishes, never
//! panics or hangs past its deadline.
#![no_main]
use fast_socks5::server::{PasswordAuthentication, Socks5ServerProtocol};
use fast_socks5::util::target_addr::TargetAddr;
use libfuzzer_sys::fuzz_target;
use tokio::io::AsyncWriteExt;

fuzz_target!(|data: &[u8]| {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let (mut client, server) = tokio::io::duplex(1 << 16);
        let _ = client.write_all(data).await;
        let _ = client.shutdown().await;
        let run = async {
            let auth = Socks5ServerProtocol::start(server)
                .negotiate_auth(&[PasswordAuthentication])
                .await
                .ok()?;
            let (_user, _pass, pending) = auth.read_username_password().await.ok()?;
            let accepted = pending.accept().await.ok()?;
            let (_proto, _cmd, target) = Socks5ServerProtocol::finish_auth(accepted)
                .read_command()
                .await
                .ok()?;
            let _ = match target {
                TargetAddr::Ip(addr) => {
                    superproxy::parsers::Target::new(&addr.ip().to_string(), addr.port())
                }
                TargetAddr::Domain(name, port) => superproxy::parsers::Target::new(&name, port),
            };
            Some(())
        };
        let _ = tokio::time::timeout(std::time::Duration::from_secs(1), run).await;
    });
});
