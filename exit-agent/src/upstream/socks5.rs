//! The SOCKS5 handshake (RFC 1928, username/password per RFC 1929) with a
//! partner's gateway, and what its replies mean for the tunnel.

use super::{gateway_failed, Target};
use proxynet_wire::link::Outcome;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

pub(super) async fn socks5_connect(
    stream: &mut TcpStream,
    username: &str,
    password: &str,
    target: &Target,
    port: u16,
    sent: &AtomicBool,
) -> Result<(), Outcome> {
    // RFC 1929: each 1 to 255 bytes. Checked before a byte is sent: a
    // credential we cannot send is our side's (the exit's) problem.
    let (Ok(user_len), Ok(password_len)) =
        (u8::try_from(username.len()), u8::try_from(password.len()))
    else {
        return Err(Outcome::UpstreamRefused);
    };
    if user_len == 0 || password_len == 0 {
        return Err(Outcome::UpstreamRefused);
    }

    // Greeting: version 5, one method, username/password (0x02) only.
    stream.write_all(&[5, 1, 2]).await.map_err(gateway_failed)?;
    let mut choice = [0u8; 2];
    stream
        .read_exact(&mut choice)
        .await
        .map_err(gateway_failed)?;
    if choice != [5, 2] {
        return Err(Outcome::UpstreamRefused); // 0xFF: no acceptable method
    }

    let mut auth = Vec::with_capacity(3 + username.len() + password.len());
    auth.extend_from_slice(&[1, user_len]);
    auth.extend_from_slice(username.as_bytes());
    auth.push(password_len);
    auth.extend_from_slice(password.as_bytes());
    stream.write_all(&auth).await.map_err(gateway_failed)?;
    let mut verdict = [0u8; 2];
    stream
        .read_exact(&mut verdict)
        .await
        .map_err(gateway_failed)?;
    if verdict[1] != 0 {
        return Err(Outcome::UpstreamRefused);
    }

    let mut request = vec![5, 1, 0];
    match target {
        Target::Ip(IpAddr::V4(v4)) => {
            request.push(1);
            request.extend_from_slice(&v4.octets());
        }
        Target::Ip(IpAddr::V6(v6)) => {
            request.push(4);
            request.extend_from_slice(&v6.octets());
        }
        Target::Name(name) => {
            let len = u8::try_from(name.len()).map_err(|_| Outcome::DnsError)?;
            request.extend_from_slice(&[3, len]);
            request.extend_from_slice(name.as_bytes());
        }
    }
    request.extend_from_slice(&port.to_be_bytes());
    stream.write_all(&request).await.map_err(gateway_failed)?;
    sent.store(true, Ordering::Relaxed);

    let mut reply = [0u8; 4];
    stream
        .read_exact(&mut reply)
        .await
        .map_err(gateway_failed)?;
    if reply[0] != 5 {
        return Err(Outcome::UpstreamRefused);
    }
    match reply[1] {
        0x00 => {}
        0x02 => return Err(Outcome::PolicyDenied),
        0x03 | 0x04 => return Err(Outcome::Unreachable),
        0x05 => return Err(Outcome::Refused),
        0x06 => return Err(Outcome::TimedOut),
        // 0x01 general failure, 0x07/0x08 unsupported command/address type.
        _ => return Err(Outcome::UpstreamRefused),
    }
    // The bound address, read in full so the tunnel starts at its first byte.
    let bound = match reply[3] {
        1 => 4 + 2,
        4 => 16 + 2,
        3 => usize::from(stream.read_u8().await.map_err(gateway_failed)?) + 2,
        _ => return Err(Outcome::UpstreamRefused),
    };
    let mut skip = [0u8; 255 + 2];
    stream
        .read_exact(&mut skip[..bound])
        .await
        .map_err(gateway_failed)?;
    Ok(())
}
