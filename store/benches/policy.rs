//! Matching a target against a traffic policy of 1,000 entries per list
//! (the most a list may hold), beside a plain scan of the list with
//! `entry_matches` (what matching cost before the lists were compiled).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use criterion::{criterion_group, criterion_main, Criterion};
use proxynet_store::policy::{entry_matches, normalize_list, PolicyTarget, TrafficPolicy};
use std::hint::black_box;
use std::time::Duration;

fn policy() -> TrafficPolicy {
    let mut entries: Vec<String> = (0..900).map(|i| format!("blocked-{i}.example")).collect();
    entries.extend((0..100).map(|i| format!("10.{i}.0.0/16")));
    let list = normalize_list("denied_domains", &entries).unwrap();
    serde_json::from_value(serde_json::json!({ "denied_domains": list })).unwrap()
}

fn matching(c: &mut Criterion) {
    let policy = policy();
    let name = PolicyTarget::Name("www.shop.allowed.example");
    let ip = PolicyTarget::Ip("192.0.2.7".parse().unwrap());
    let mut group = c.benchmark_group("policy_1000_entries");
    group.measurement_time(Duration::from_secs(2));
    group.warm_up_time(Duration::from_millis(500));
    for (label, target) in [("name", &name), ("ip", &ip)] {
        group.bench_function(format!("compiled_{label}"), |b| {
            b.iter(|| black_box(policy.permits(black_box(target)).is_ok()))
        });
        group.bench_function(format!("scan_{label}"), |b| {
            b.iter(|| {
                black_box(
                    !policy
                        .denied_domains
                        .iter()
                        .any(|e| entry_matches(e, black_box(target))),
                )
            })
        });
    }
    group.finish();
}

criterion_group!(benches, matching);
criterion_main!(benches);
