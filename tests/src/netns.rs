//! Exit hosts of their own, per test: Linux network namespaces.
//!
//! Loopback cannot show what an exit does with addresses of its own (an
//! IPv6 prefix routed to it, the source addresses a target sees), so
//! [`ExitHost::create`] builds, for one test, a host for the agent and an
//! "internet" behind it:
//!
//! ```text
//!  root namespace (test, stack)   EXIT (the agent)                TARGET ("the internet")
//!  pnr<i> 10.200.a.b+1/30 <-veth-> uplink 10.200.a.b+2/30
//!                                 (default route via the root)
//!                                 wan 198.18.k.1/30   <-veth->    wan 198.18.k.2/30
//!                                     fd00:i::1/64                    fd00:i::2/64
//!                                 local fd0c:i::/64 dev lo        fd0c:i::/64 via fd00:i::1
//!                                 local 198.19.k.0/28 dev lo      198.19.k.0/28 via 198.18.k.1
//! ```
//!
//! The prefixes are "AnyIP": EXIT routes them to itself, so an agent given
//! `--egress-prefix` can send from any of their addresses, and TARGET routes
//! them back to EXIT, so its servers ([`ExitHost::start_whoami`],
//! [`ExitHost::start_udp_echo`]) answer and report which address they saw.
//! The stack's services listen on the root side of the uplink
//! ([`ExitHost::stack_options`]) so the agent reaches them.
//!
//! Opt-in NAT ([`ExitHost::masquerade_uplink`], nftables): EXIT then
//! masquerades whatever leaves through the uplink, so the root namespace
//! sees every connection from the uplink address, whatever address the
//! agent bound: a home router's view, where the bound address is private
//! and the world sees the ISP's one. Traffic to TARGET is not translated.
//! [`ExitHost::redial`] then moves the NAT to another public address, as a
//! residential line's re-dial does.
//!
//! [`Netns::set_hosts`] gives the programs started in a namespace an
//! `/etc/hosts` of their own, so a test can name TARGET's addresses.
//!
//! Names are unique per test process and instance (`pn<pid>x<n>e`/`…t`),
//! the uplink's /30 is taken from 10.200.0.0/16 by creating its root-side
//! veth (`pnr<i>`: the kernel refuses a second one, so two test processes
//! never share a block) after checking no route of the host overlaps it.
//! Everything is deleted on drop, a panicking test included; namespaces a
//! killed test process left behind are swept at the next creation.
//!
//! Needs root (CAP_NET_ADMIN, CAP_SYS_ADMIN) and iproute2's `ip`; without
//! them creation fails with a message saying so, never a silent skip.

use proxynet_common::egress::Cidr;
use std::collections::HashSet;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex, Once};
use tokio::task::JoinHandle;

/// Namespaces made by this process so far (the `<n>` in their names).
static INSTANCES: AtomicU32 = AtomicU32::new(0);
static SWEEP: Once = Once::new();

/// /30 blocks in 10.200.0.0/16.
const UPLINK_BLOCKS: u32 = 1 << 14;

/// One network namespace, deleted on drop.
pub struct Netns {
    name: String,
}

impl Netns {
    fn create(name: String) -> Self {
        if let Err(e) = run_ip(&["netns", "add", &name]) {
            panic!(
                "cannot create network namespace {name}: {e}\n\
                 the netns tests need root (CAP_SYS_ADMIN, CAP_NET_ADMIN) and iproute2's `ip`"
            );
        }
        let ns = Self { name };
        // Addresses are usable at once (no duplicate address detection
        // holding them tentative), so no test waits for them.
        ns.run(|| {
            for (key, value) in [
                ("net/ipv6/conf/all/disable_ipv6", "0"),
                ("net/ipv6/conf/default/disable_ipv6", "0"),
                ("net/ipv6/conf/all/accept_dad", "0"),
                ("net/ipv6/conf/default/accept_dad", "0"),
            ] {
                std::fs::write(format!("/proc/sys/{key}"), value)
                    .unwrap_or_else(|e| panic!("sysctl {key}={value}: {e}"));
            }
        });
        ns.ip(&["link", "set", "lo", "up"]);
        ns
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The words that run a program in this namespace: `ip netns exec NAME`.
    pub fn wrapper(&self) -> Vec<String> {
        ["ip", "netns", "exec", &self.name]
            .iter()
            .map(|s| (*s).to_owned())
            .collect()
    }

    /// Gives programs started in this namespace ([`Self::wrapper`]) an
    /// `/etc/hosts` of their own: `ip netns exec` bind-mounts
    /// `/etc/netns/NAME/hosts` over it. How a test names a host of its
    /// own networks without a DNS server; removed with the namespace.
    pub fn set_hosts(&self, entries: &[(IpAddr, &str)]) {
        let dir = hosts_dir(&self.name);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {dir}: {e}"));
        let text: String = entries
            .iter()
            .map(|(ip, name)| format!("{ip} {name}\n"))
            .collect();
        std::fs::write(format!("{dir}/hosts"), text)
            .unwrap_or_else(|e| panic!("write {dir}/hosts: {e}"));
    }

    /// `ip -n NAME ARGS...`, panicking with `ip`'s complaint on failure.
    pub fn ip(&self, args: &[&str]) {
        let mut all = vec!["-n", self.name.as_str()];
        all.extend_from_slice(args);
        if let Err(e) = run_ip(&all) {
            panic!("ip {}: {e}", all.join(" "));
        }
    }

    /// Starts `command` inside this namespace (through `ip netns exec`,
    /// which execs it: the child is the program itself), killed on drop.
    pub fn spawn(&self, command: &Command) -> tokio::process::Child {
        let mut wrapped = tokio::process::Command::new("ip");
        wrapped
            .args(["netns", "exec", &self.name])
            .arg(command.get_program())
            .args(command.get_args())
            .kill_on_drop(true);
        for (key, value) in command.get_envs() {
            match value {
                Some(value) => wrapped.env(key, value),
                None => wrapped.env_remove(key),
            };
        }
        if let Some(dir) = command.get_current_dir() {
            wrapped.current_dir(dir);
        }
        wrapped
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {:?} in {}: {e}", command.get_program(), self.name))
    }

    /// Runs `f` on a fresh thread that entered this namespace: sockets it
    /// creates belong to the namespace for good, and keep working when
    /// handed back to the test's runtime in the root namespace.
    pub fn run<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::spawn(move || {
            let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
            enter(&file).unwrap_or_else(|e| panic!("setns {path}: {e}"));
            f()
        })
        .join()
        .unwrap_or_else(|_| panic!("the thread inside {} panicked", self.name))
    }

    /// A TCP listener bound to `addr` inside this namespace.
    pub fn bind_tcp(&self, addr: SocketAddr) -> std::net::TcpListener {
        let listener = self
            .run(move || std::net::TcpListener::bind(addr))
            .unwrap_or_else(|e| panic!("bind tcp {addr} in {}: {e}", self.name));
        listener.set_nonblocking(true).unwrap();
        listener
    }

    /// A UDP socket bound to `addr` inside this namespace.
    pub fn bind_udp(&self, addr: SocketAddr) -> std::net::UdpSocket {
        let socket = self
            .run(move || std::net::UdpSocket::bind(addr))
            .unwrap_or_else(|e| panic!("bind udp {addr} in {}: {e}", self.name));
        socket.set_nonblocking(true).unwrap();
        socket
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = run_ip(&["netns", "del", &self.name]);
        let _ = std::fs::remove_dir_all(hosts_dir(&self.name));
    }
}

/// Where `ip netns exec NAME` finds files it bind-mounts over `/etc`.
fn hosts_dir(name: &str) -> String {
    format!("/etc/netns/{name}")
}

/// Moves the calling thread into the network namespace `ns` refers to.
#[allow(unsafe_code)]
fn enter(ns: &std::fs::File) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    // SAFETY: the fd is an open namespace file that outlives the call;
    // setns changes only the calling thread's network namespace.
    let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// One exit host (namespace `exit`) and the internet behind it (`target`),
/// laid out as the module documentation draws.
pub struct ExitHost {
    pub exit: Netns,
    pub target: Netns,
    /// The root namespace's end of the uplink: where the stack's services
    /// listen for the agent in `exit`.
    pub root_addr: Ipv4Addr,
    /// EXIT's end of the uplink.
    pub uplink_addr: Ipv4Addr,
    /// EXIT's addresses towards TARGET.
    pub exit_wan_v4: Ipv4Addr,
    pub exit_wan_v6: Ipv6Addr,
    /// TARGET's addresses, where its servers listen.
    pub target_v4: Ipv4Addr,
    pub target_v6: Ipv6Addr,
    /// Routed to EXIT (local there) and back from TARGET: egress prefixes.
    pub prefix_v6: Cidr,
    pub prefix_v4: Cidr,
    /// The root side of the uplink veth (`pnr<i>`), which holds the block.
    root_veth: String,
    /// The uplink's /30 is block `block` of 10.200.0.0/16.
    block: u32,
}

impl ExitHost {
    /// Builds the namespaces, links, addresses and routes; panics with the
    /// reason when the host cannot (no root, no iproute2).
    pub fn create() -> Self {
        SWEEP.call_once(sweep_stale_namespaces);
        let pid = std::process::id();
        let n = INSTANCES.fetch_add(1, Ordering::Relaxed);
        let exit = Netns::create(format!("pn{pid}x{n}e"));
        let target = Netns::create(format!("pn{pid}x{n}t"));
        let (block, root_veth) = claim_uplink_block(pid, n, &exit);
        let base = u32::from(Ipv4Addr::new(10, 200, 0, 0)) + block * 4;
        let root_addr = Ipv4Addr::from(base + 1);
        let uplink_addr = Ipv4Addr::from(base + 2);
        run_ip(&["addr", "add", &format!("{root_addr}/30"), "dev", &root_veth])
            .and_then(|()| run_ip(&["link", "set", &root_veth, "up"]))
            .unwrap_or_else(|e| panic!("configure {root_veth}: {e}"));
        exit.ip(&["addr", "add", &format!("{uplink_addr}/30"), "dev", "uplink"]);
        exit.ip(&["link", "set", "uplink", "up"]);
        // Every root address (another host's uplink, a service bound to
        // any of them) is reachable from the exit, as from a real host.
        exit.ip(&["route", "add", "default", "via", &root_addr.to_string()]);

        // The block number names this host's other networks too: only the
        // two namespaces see them, but unique numbers read better in logs.
        let k = (block % 256) as u8;
        let hextet = block as u16;
        let exit_wan_v4 = Ipv4Addr::new(198, 18, k, 1);
        let target_v4 = Ipv4Addr::new(198, 18, k, 2);
        let exit_wan_v6 = Ipv6Addr::new(0xfd00, hextet, 0, 0, 0, 0, 0, 1);
        let target_v6 = Ipv6Addr::new(0xfd00, hextet, 0, 0, 0, 0, 0, 2);
        let prefix_v6: Cidr = format!("fd0c:{hextet:x}::/64").parse().unwrap();
        let prefix_v4: Cidr = format!("198.19.{k}.0/28").parse().unwrap();
        exit.ip(&[
            "link",
            "add",
            "wan",
            "type",
            "veth",
            "peer",
            "name",
            "wan",
            "netns",
            &target.name,
        ]);
        for (ns, v4, v6) in [
            (&exit, exit_wan_v4, exit_wan_v6),
            (&target, target_v4, target_v6),
        ] {
            ns.ip(&["addr", "add", &format!("{v4}/30"), "dev", "wan"]);
            ns.ip(&[
                "-6",
                "addr",
                "add",
                &format!("{v6}/64"),
                "dev",
                "wan",
                "nodad",
            ]);
            ns.ip(&["link", "set", "wan", "up"]);
        }
        for (prefix, via) in [
            (prefix_v6, IpAddr::V6(exit_wan_v6)),
            (prefix_v4, IpAddr::V4(exit_wan_v4)),
        ] {
            let family = if via.is_ipv4() { "-4" } else { "-6" };
            let prefix = prefix.to_string();
            exit.ip(&[family, "route", "add", "local", &prefix, "dev", "lo"]);
            target.ip(&[family, "route", "add", &prefix, "via", &via.to_string()]);
        }
        Self {
            exit,
            target,
            root_addr,
            uplink_addr,
            exit_wan_v4,
            exit_wan_v6,
            target_v4,
            target_v6,
            prefix_v6,
            prefix_v4,
            root_veth,
            block,
        }
    }

    /// Opt-in NAT: EXIT masquerades traffic leaving through the uplink
    /// (towards the root namespace and the stack), so it arrives from
    /// [`Self::uplink_addr`] whichever address was bound, e.g.
    /// [`Self::exit_wan_v4`]. Needs nftables' `nft`; panics with the reason.
    pub fn masquerade_uplink(&self) {
        self.nft(
            "table ip pn_nat {\n\
             chain postrouting {\n\
             type nat hook postrouting priority srcnat; policy accept;\n\
             oifname \"uplink\" masquerade\n\
             }\n\
             }\n",
        );
    }

    /// A residential re-dial behind the NAT of [`Self::masquerade_uplink`]:
    /// from now on EXIT's new connections towards the stack arrive from
    /// another "public" address, the `n`th (1 to 3) of this host's block of
    /// 10.201.0.0/16, which the root namespace routes back over the uplink.
    /// The connections EXIT had open are cut, as a re-dial cuts them (the
    /// old address is gone): the agent's links come back from the new one.
    /// Needs `ss -K` (the kernel's socket-destroy diagnostics). Returns the
    /// new public address.
    pub fn redial(&self, n: u32) -> Ipv4Addr {
        assert!((1..=3).contains(&n), "a host has three re-dial addresses");
        let public = Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 201, 0, 0)) + self.block * 4 + n);
        let host: Cidr = format!("{public}/32").parse().unwrap();
        if let Some(route) = root_ipv4_routes().iter().find(|r| r.overlaps(&host)) {
            panic!("the re-dial address {public} is routed on this host already ({route}): the test networks clash with the host's");
        }
        // EXIT answers ARP for it; the root sends it back over this uplink.
        self.exit
            .ip(&["addr", "add", &format!("{public}/32"), "dev", "uplink"]);
        run_ip(&[
            "route",
            "add",
            &format!("{public}/32"),
            "dev",
            &self.root_veth,
        ])
        .unwrap_or_else(|e| panic!("route {public} to {}: {e}", self.root_veth));
        self.nft(&format!(
            "flush chain ip pn_nat postrouting\n\
             add rule ip pn_nat postrouting oifname \"uplink\" snat to {public}\n"
        ));
        let cut = Command::new("ip")
            .args([
                "netns",
                "exec",
                self.exit.name(),
                "ss",
                "-K",
                "-t",
                "state",
                "established",
            ])
            .output()
            .unwrap_or_else(|e| panic!("run ss -K in {}: {e}", self.exit.name()));
        // ss may complain of the sockets it could not destroy and still exit 0;
        // a kernel without socket-destroy support fails every one of them.
        assert!(
            cut.status.success(),
            "ss -K in {}: {}",
            self.exit.name(),
            String::from_utf8_lossy(&cut.stderr)
        );
        public
    }

    /// Loads `ruleset` with nftables' `nft -f -` inside EXIT; panics with
    /// nft's complaint.
    fn nft(&self, ruleset: &str) {
        let mut nft = Command::new("ip")
            .args(["netns", "exec", self.exit.name(), "nft", "-f", "-"])
            .stdin(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("run nft (nftables) in {}: {e}", self.exit.name()));
        if let Some(mut stdin) = nft.stdin.take() {
            use std::io::Write;
            stdin.write_all(ruleset.as_bytes()).unwrap();
        }
        let out = nft.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "nft in {}: {} (the NAT harness needs nftables' nft)",
            self.exit.name(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }

    /// TARGET's networks: what the agent's and the superproxy's egress
    /// policies must allow (they are special-purpose ranges, denied by
    /// default).
    pub fn target_networks(&self) -> Vec<Cidr> {
        let v4 = Ipv4Addr::from(u32::from(self.target_v4) & !3);
        let v6 = Ipv6Addr::from(u128::from(self.target_v6) & !u128::from(u64::MAX));
        vec![
            format!("{v4}/30").parse().unwrap(),
            format!("{v6}/64").parse().unwrap(),
        ]
    }

    /// `base` with the stack's services (control-api, superproxy link
    /// listener) on [`Self::root_addr`], where the agent in EXIT reaches
    /// them, and the superproxy's egress policy allowing TARGET.
    pub fn stack_options(
        &self,
        mut base: crate::stack::StackOptions,
    ) -> crate::stack::StackOptions {
        base.service_ip = Some(IpAddr::V4(self.root_addr));
        for network in self.target_networks() {
            base.superproxy_args
                .extend(crate::stack::SuperproxyArgs::new().egress_allow(network));
        }
        base
    }

    /// Starts `command` in `ns` (one of this host's namespaces).
    pub fn spawn_in(&self, ns: &Netns, command: &Command) -> tokio::process::Child {
        ns.spawn(command)
    }

    /// The whoami target (`whoami.rs`) inside TARGET, on its IPv4 and its
    /// IPv6 address (one port): it answers each request with the peer address it saw.
    /// Call inside a tokio runtime; served until dropped.
    pub fn start_whoami(&self) -> TargetServer {
        // One port on both addresses, so a name with both (`set_hosts`)
        // reaches it whichever family the exit dials. The namespace is the
        // test's own: the IPv4 port is free on IPv6 too.
        let v4 = self
            .target
            .bind_tcp(SocketAddr::new(IpAddr::V4(self.target_v4), 0));
        let port = v4.local_addr().unwrap().port();
        let v6 = self
            .target
            .bind_tcp(SocketAddr::new(IpAddr::V6(self.target_v6), port));
        let mut addrs = Vec::new();
        let mut tasks = Vec::new();
        for listener in [v4, v6] {
            addrs.push(listener.local_addr().unwrap());
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            tasks.push(tokio::spawn(crate::whoami::serve(listener)));
        }
        TargetServer {
            v4: addrs[0],
            v6: addrs[1],
            tasks,
        }
    }

    /// A UDP echo server inside TARGET, on its IPv4 and its IPv6 address:
    /// every datagram is sent back to where it came from, and the source is
    /// recorded ([`UdpEcho::sources`]). Call inside a tokio runtime.
    pub fn start_udp_echo(&self) -> UdpEcho {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let mut addrs = Vec::new();
        let mut tasks = Vec::new();
        for ip in [IpAddr::V4(self.target_v4), IpAddr::V6(self.target_v6)] {
            let socket = self.target.bind_udp(SocketAddr::new(ip, 0));
            addrs.push(socket.local_addr().unwrap());
            let socket = tokio::net::UdpSocket::from_std(socket).unwrap();
            let seen = seen.clone();
            tasks.push(tokio::spawn(async move {
                let mut buf = vec![0u8; 65_536];
                while let Ok((n, from)) = socket.recv_from(&mut buf).await {
                    seen.lock().unwrap().push(from);
                    let _ = socket.send_to(&buf[..n], from).await;
                }
            }));
        }
        UdpEcho {
            v4: addrs[0],
            v6: addrs[1],
            seen,
            tasks,
        }
    }
}

impl Drop for ExitHost {
    fn drop(&mut self) {
        // The root end first: its peer goes with it, and the block is free
        // at once (a namespace lives on while a socket made in it does).
        let _ = run_ip(&["link", "del", &self.root_veth]);
        // The namespaces are deleted by their own drops.
    }
}

/// A TCP server inside TARGET, on both families; stopped when dropped.
pub struct TargetServer {
    pub v4: SocketAddr,
    pub v6: SocketAddr,
    tasks: Vec<JoinHandle<()>>,
}

impl TargetServer {
    /// `http://ADDR/` for the family of `ipv6`.
    pub fn url(&self, ipv6: bool) -> String {
        format!("http://{}/", if ipv6 { self.v6 } else { self.v4 })
    }
}

impl Drop for TargetServer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// The UDP echo server inside TARGET; stopped when dropped.
pub struct UdpEcho {
    pub v4: SocketAddr,
    pub v6: SocketAddr,
    seen: Arc<Mutex<Vec<SocketAddr>>>,
    tasks: Vec<JoinHandle<()>>,
}

impl UdpEcho {
    /// The source address of every datagram received so far, in order.
    pub fn sources(&self) -> Vec<SocketAddr> {
        self.seen.lock().unwrap().clone()
    }

    /// The distinct source IPs seen so far.
    pub fn source_ips(&self) -> HashSet<IpAddr> {
        self.sources().iter().map(SocketAddr::ip).collect()
    }
}

impl Drop for UdpEcho {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Creates the uplink veth for a free /30 of 10.200.0.0/16: its root end
/// `pnr<block>` (the name is the lock), its other end `uplink` in `exit`.
fn claim_uplink_block(pid: u32, n: u32, exit: &Netns) -> (u32, String) {
    let routes = root_ipv4_routes();
    // Spread processes over the space so they rarely even try one block.
    let start = pid
        .wrapping_mul(2_654_435_761)
        .wrapping_add(n.wrapping_mul(40_503))
        % UPLINK_BLOCKS;
    for step in 0..256 {
        let block = (start + step) % UPLINK_BLOCKS;
        let network: Cidr = format!(
            "{}/30",
            Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 200, 0, 0)) + block * 4)
        )
        .parse()
        .unwrap();
        if routes.iter().any(|r| r.overlaps(&network)) {
            continue;
        }
        let name = format!("pnr{block}");
        match run_ip(&[
            "link",
            "add",
            &name,
            "type",
            "veth",
            "peer",
            "name",
            "uplink",
            "netns",
            exit.name(),
        ]) {
            Ok(()) => return (block, name),
            // Another test process holds this block.
            Err(e) if e.contains("File exists") => continue,
            Err(e) => panic!("cannot create the uplink veth {name}: {e}"),
        }
    }
    panic!("no free /30 in 10.200.0.0/16 for a test exit host (256 tried)");
}

/// Every IPv4 destination the root namespace routes (all tables).
fn root_ipv4_routes() -> Vec<Cidr> {
    let out = Command::new("ip")
        .args(["-4", "route", "show", "table", "all"])
        .output()
        .unwrap_or_else(|e| panic!("run ip (iproute2): {e}"));
    let route_types = [
        "unicast",
        "local",
        "broadcast",
        "anycast",
        "multicast",
        "blackhole",
        "unreachable",
        "prohibit",
        "throw",
        "nat",
    ];
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let mut words = line.split_whitespace();
            let first = words.next()?;
            let destination = if route_types.contains(&first) {
                words.next()?
            } else {
                first
            };
            // `default` covers everything; it is where traffic goes, not
            // an address in use, so it does not take the block.
            destination.parse::<Cidr>().ok()
        })
        .collect()
}

/// Deletes namespaces of test processes that no longer run (killed before
/// their drops ran); their veths go with them.
fn sweep_stale_namespaces() {
    let Ok(out) = Command::new("ip").args(["netns", "list"]).output() else {
        return;
    };
    // Namespaces, and the hosts files of namespaces already gone.
    let names: HashSet<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .chain(
            std::fs::read_dir("/etc/netns")
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|entry| entry.file_name().into_string().ok()),
        )
        .collect();
    for name in &names {
        let name = name.as_str();
        let Some(pid) = name
            .strip_prefix("pn")
            .and_then(|rest| rest.split_once('x'))
            .and_then(|(pid, rest)| {
                let kind_ok = rest.ends_with('e') || rest.ends_with('t');
                let n_ok = rest[..rest.len().saturating_sub(1)]
                    .bytes()
                    .all(|b| b.is_ascii_digit());
                (kind_ok && n_ok).then_some(pid)
            })
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = run_ip(&["netns", "del", name]);
            let _ = std::fs::remove_dir_all(hosts_dir(name));
        }
    }
}

/// Runs `ip ARGS...`; its stderr on failure.
fn run_ip(args: &[&str]) -> Result<(), String> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("cannot run ip (iproute2): {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
    }
}
