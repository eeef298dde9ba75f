//! Reading a binary's Prometheus exposition in tests and tools.

use std::net::SocketAddr;

/// The `/metrics` text of the admin listener at `admin`.
pub async fn scrape(http: &reqwest::Client, admin: SocketAddr) -> String {
    http.get(format!("http://{admin}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// The sum of the series `name{labels...}` (labels given as `k="v"` parts;
/// none: every series of that name).
pub fn sample(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} ")))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
