//! A DNS server of the test's own (UDP, on loopback): answers `A` queries
//! for any name with the addresses it was given, in order — the first query
//! gets the first, each later one the next, the last repeated — with TTL 0,
//! and `AAAA` queries with no address. What a rebinding attacker's name
//! server does.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::net::UdpSocket;

pub struct TestDns {
    pub addr: SocketAddr,
    /// `A` queries answered so far.
    pub a_queries: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl TestDns {
    pub async fn start(answers: Vec<Ipv4Addr>) -> Self {
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let addr = socket.local_addr().unwrap();
        let a_queries = Arc::new(AtomicUsize::new(0));
        let counter = a_queries.clone();
        let task = tokio::spawn(async move {
            let mut buf = [0u8; 1500];
            while let Ok((n, from)) = socket.recv_from(&mut buf).await {
                if let Some(reply) = answer(&buf[..n], &answers, &counter) {
                    let _ = socket.send_to(&reply, from).await;
                }
            }
        });
        Self {
            addr,
            a_queries,
            task,
        }
    }

    pub fn a_queries(&self) -> usize {
        self.a_queries.load(Ordering::Relaxed)
    }
}

impl Drop for TestDns {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The reply to one query: its id and question echoed, one `A` answer (or
/// none for other types).
fn answer(query: &[u8], answers: &[Ipv4Addr], counter: &AtomicUsize) -> Option<Vec<u8>> {
    if query.len() < 12 {
        return None;
    }
    // The question: labels up to the zero byte, then QTYPE and QCLASS.
    let mut end = 12;
    while *query.get(end)? != 0 {
        end += 1 + usize::from(query[end]);
    }
    let qtype = u16::from_be_bytes([*query.get(end + 1)?, *query.get(end + 2)?]);
    let question = &query[12..end + 5];
    let address = (qtype == 1).then(|| {
        let i = counter.fetch_add(1, Ordering::Relaxed);
        answers[i.min(answers.len() - 1)]
    });
    let mut reply = Vec::with_capacity(64);
    reply.extend_from_slice(&query[..2]); // id
    reply.extend_from_slice(&[0x81, 0x80]); // response, recursion desired + available, NOERROR
    reply.extend_from_slice(&1u16.to_be_bytes()); // one question
    reply.extend_from_slice(&u16::from(address.is_some()).to_be_bytes());
    reply.extend_from_slice(&[0, 0, 0, 0]); // no authority, no additional
    reply.extend_from_slice(question);
    if let Some(ip) = address {
        reply.extend_from_slice(&[0xc0, 0x0c]); // the question's name
        reply.extend_from_slice(&1u16.to_be_bytes()); // A
        reply.extend_from_slice(&1u16.to_be_bytes()); // IN
        reply.extend_from_slice(&0u32.to_be_bytes()); // TTL 0: ask again next time
        reply.extend_from_slice(&4u16.to_be_bytes());
        reply.extend_from_slice(&ip.octets());
    }
    Some(reply)
}
