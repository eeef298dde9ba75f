//! Exit selection cost at pool sizes from 1,000 to 100,000 exits: a pick must
//! not grow with the pool (power of two choices over random probes).
//!
//! The candidates share one real mux link handle over an in-memory pipe:
//! selection never touches it, but a `Candidate` carries one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use proxynet_store::{ExitRecord, SourceType};
use proxynet_wire::mux;
use proxynet_wire::username::Targeting;
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Arc;
use std::time::Duration;
use superproxy::selection::{
    choose, Candidate, HealthBook, HealthConfig, Link, LinkSender, MuxLink, PoolView,
};
use uuid::Uuid;

fn link(rt: &tokio::runtime::Runtime) -> Link {
    rt.block_on(async {
        // Selection never touches the link; any live one will do.
        let (client, _server) = tokio::io::duplex(1 << 16);
        let (handle, conn) = mux::start(client, mux::Role::Client, mux::MuxConfig::default());
        tokio::spawn(conn);
        Link {
            id: 1,
            exit_id: Uuid::nil(),
            peer: "127.0.0.1:1".parse().unwrap(),
            sender: LinkSender::Mux(MuxLink {
                handle,
                open_window: true,
                udp: true,
            }),
        }
    })
}

fn view(n: usize, link: &Link) -> PoolView {
    let eligible: Vec<Candidate> = (0..n)
        .map(|i| Candidate {
            record: Arc::new(ExitRecord {
                id: Uuid::new_v4(),
                name: format!("exit-{i}"),
                egress_ips: vec!["203.0.113.1".parse().unwrap()],
                egress_prefixes: Vec::new(),
                source_type: if i % 4 == 0 {
                    SourceType::Res
                } else {
                    SourceType::Dc
                },
                country: if i % 10 == 0 {
                    "DE".into()
                } else {
                    "US".into()
                },
                owner: "bench".into(),
                region: None,
                city: None,
                asn: None,
                draining: false,
                disabled: false,
                credential_sha256: String::new(),
                version: 0,
                channel: None,
                blocked: None,
                consent_expires_at_ms: None,
                verified_egress: Vec::new(),
                dedicated: Vec::new(),
                upstream: None,
            }),
            link: link.clone(),
        })
        .collect();
    let index: HashMap<Uuid, usize> = eligible
        .iter()
        .enumerate()
        .map(|(i, c)| (c.record.id, i))
        .collect();
    PoolView {
        eligible,
        index,
        live: n,
        degraded: false,
        blocked: Vec::new(),
        ..PoolView::default()
    }
}

fn health() -> HealthBook {
    HealthBook::new(HealthConfig {
        probe_interval: Duration::from_secs(2),
        probe_timeout: Duration::from_secs(1),
        healthy_threshold: 2,
        unhealthy_threshold: 3,
        eject_after: 5,
        eject_base: Duration::from_secs(5),
        eject_max: Duration::from_secs(300),
        max_ejected_percent: 50,
        panic_threshold_percent: 30,
        capacity: 4096,
    })
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let link = link(&rt);
    let rotating = Targeting::default();
    let germany = Targeting {
        country: Some("DE".into()),
        ..Default::default()
    };
    let mut group = c.benchmark_group("pick");
    for n in [1_000usize, 10_000, 100_000] {
        let view = view(n, &link);
        let health = health();
        // Touch every exit once so the health map is as full as in production.
        for c in &view.eligible {
            health.exit(c.record.id);
        }
        group.bench_with_input(BenchmarkId::new("rotating", n), &view, |b, view| {
            b.iter(|| black_box(choose(view, &health, &[], &rotating)))
        });
        group.bench_with_input(BenchmarkId::new("country=DE (10%)", n), &view, |b, view| {
            b.iter(|| black_box(choose(view, &health, &[], &germany)))
        });
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
