//! Binding the egress address a superproxy asked for.
//!
//! An exit sends from its `--egress-ip`s and from any address of its
//! `--egress-prefix`es. A prefix is too large to configure address by
//! address (a /64 holds 2^64), so the host routes it to itself instead
//! (`ip -6 route add local PREFIX dev lo`, the "AnyIP" trick) and the agent
//! binds its addresses with `IP_FREEBIND`: the kernel then accepts a source
//! address no interface carries, and the local route delivers the answers.
//! Listed egress IPs are bound plainly, so one the host lacks still fails
//! the bind (`egress_unavailable`) instead of sending packets nobody answers.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::AsFd;

use crate::config::Config;

/// A UDP socket bound to `ip` (any free port), for a UDP association: `ip`
/// must be one of `config`'s egress addresses (an `--egress-ip`, or inside
/// an `--egress-prefix`, then bound with `IP_FREEBIND`). Needs a tokio
/// runtime (the socket is registered with its reactor).
pub(crate) fn bind_egress_udp(config: &Config, ip: IpAddr) -> io::Result<tokio::net::UdpSocket> {
    if !config.owns_egress(ip) {
        return Err(io::Error::new(
            io::ErrorKind::AddrNotAvailable,
            format!("{ip} is not one of this exit's egress addresses"),
        ));
    }
    let local = SocketAddr::new(ip, 0);
    let socket = socket2::Socket::new(
        socket2::Domain::for_address(local),
        socket2::Type::DGRAM,
        Some(socket2::Protocol::UDP),
    )?;
    if config.egress_needs_freebind(ip) {
        allow_nonlocal_bind(&socket, ip)?;
    }
    socket.set_nonblocking(true)?;
    socket.bind(&local.into())?;
    tokio::net::UdpSocket::from_std(socket.into())
}

/// Sets `IP_FREEBIND` (IPv4) or `IPV6_FREEBIND` (IPv6) on `socket`, so it
/// may bind `ip` although no interface carries it.
#[cfg(any(target_os = "linux", target_os = "android"))]
pub(crate) fn allow_nonlocal_bind(socket: &impl AsFd, ip: IpAddr) -> io::Result<()> {
    let socket = socket2::SockRef::from(socket);
    if ip.is_ipv4() {
        socket.set_freebind_v4(true)
    } else {
        socket.set_freebind_v6(true)
    }
}

/// Other systems have no `IP_FREEBIND`: prefix egress needs Linux.
#[cfg(not(any(target_os = "linux", target_os = "android")))]
pub(crate) fn allow_nonlocal_bind(_socket: &impl AsFd, _ip: IpAddr) -> io::Result<()> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "egress prefixes need IP_FREEBIND (Linux)",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn config(extra: &[&str]) -> Config {
        let base = ["exit-agent", "--control-api", "https://control.example"];
        Config::try_parse_from(base.iter().chain(extra)).unwrap()
    }

    #[tokio::test]
    async fn a_udp_socket_binds_only_an_address_the_exit_owns() {
        let config = config(&[
            "--egress-ip",
            "127.0.0.1",
            "--egress-prefix",
            "127.0.9.0/24",
        ]);
        let listed = bind_egress_udp(&config, "127.0.0.1".parse().unwrap()).unwrap();
        assert_eq!(listed.local_addr().unwrap().ip().to_string(), "127.0.0.1");
        let not_ours = bind_egress_udp(&config, "127.0.0.2".parse().unwrap()).unwrap_err();
        assert_eq!(not_ours.kind(), io::ErrorKind::AddrNotAvailable);
    }

    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn a_prefix_address_binds_without_being_configured() {
        // 2001:db8::/32 is documentation space: no host carries it, so the
        // bind succeeds only through IPV6_FREEBIND (sockets on an IPv6-less
        // host cannot be made at all, which says nothing about the option).
        let config = config(&["--egress-prefix", "2001:db8:77::/48"]);
        let ip: IpAddr = "2001:db8:77::1234".parse().unwrap();
        match bind_egress_udp(&config, ip) {
            Ok(socket) => assert_eq!(socket.local_addr().unwrap().ip(), ip),
            Err(e)
                if e.kind() == io::ErrorKind::Unsupported
                    || e.raw_os_error() == Some(libc::EAFNOSUPPORT) => {}
            Err(e) => panic!("bind {ip}: {e}"),
        }
    }
}
