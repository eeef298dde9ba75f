//! Finding free addresses: an exit's egress IPs and the /64s of its IPv6
//! egress prefixes that overlap nothing held, matched to what was asked,
//! spread over exits.

use super::{Free, Wanted, DEDICATED_V6_PREFIX, MAX_PER_CALL, V6_SUBNETS_SCANNED};
use crate::error::ApiError;
use proxynet_common::egress::Cidr;
use std::net::IpAddr;
use uuid::Uuid;

/// An exit as allocation sees it.
#[derive(sqlx::FromRow)]
struct ExitRow {
    id: Uuid,
    egress_ips: Vec<String>,
    egress_prefixes: Vec<String>,
}

/// Exactly the named addresses: each must be an egress IP of an exit, or a
/// /64 inside an exit's egress prefix, and held by nobody.
pub(super) async fn named(
    tx: &mut sqlx::PgConnection,
    ips: &[String],
) -> Result<Vec<Free>, ApiError> {
    if ips.is_empty() || ips.len() > MAX_PER_CALL as usize {
        return Err(ApiError::BadRequest(format!(
            "ips: 1 to {MAX_PER_CALL} addresses"
        )));
    }
    let exits = exits_matching(tx, &Wanted::default()).await?;
    let mut chosen = Vec::new();
    for raw in ips {
        let cidr: Cidr = raw.parse().map_err(|_| {
            ApiError::BadRequest(format!("ips: {raw:?} is not an address or prefix"))
        })?;
        let single = cidr.host_bits() == 0;
        let found = exits.iter().find_map(|exit| {
            if single {
                let ip = cidr.network();
                exit.egress_ips
                    .iter()
                    .any(|e| e.parse::<IpAddr>().ok() == Some(ip))
                    .then(|| Free {
                        exit_id: exit.id,
                        address: ip.to_string(),
                        is_prefix: false,
                    })
            } else {
                let masked = cidr.masked();
                (masked.prefix_len() == DEDICATED_V6_PREFIX && masked.network().is_ipv6())
                    .then_some(())?;
                exit.egress_prefixes
                    .iter()
                    .filter_map(|p| p.parse::<Cidr>().ok())
                    .any(|p| p.covers(&masked))
                    .then(|| Free {
                        exit_id: exit.id,
                        address: masked.to_string(),
                        is_prefix: true,
                    })
            }
        });
        let free = found.ok_or_else(|| {
            ApiError::BadRequest(format!(
                "ips: {raw} is not an egress address of any exit (or an IPv6 /64 inside an exit's egress prefix)"
            ))
        })?;
        chosen.push(free);
    }
    let held = held_addresses(tx).await?;
    if let Some(taken) = chosen.iter().find(|f| held.takes(&f.address)) {
        return Err(ApiError::Conflict(format!(
            "{} is already dedicated to an account",
            taken.address
        )));
    }
    Ok(chosen)
}

/// Every address held now. A candidate is free only when it overlaps none
/// of them: a single IPv6 address inside someone's /64, or a /64 around
/// someone's single address, is taken too.
async fn held_addresses(tx: &mut sqlx::PgConnection) -> Result<Held, sqlx::Error> {
    let rows: Vec<(String,)> =
        sqlx::query_as("SELECT address FROM dedicated_ips WHERE released_at IS NULL")
            .fetch_all(tx)
            .await?;
    Ok(Held(
        rows.into_iter().filter_map(|(a,)| a.parse().ok()).collect(),
    ))
}

struct Held(Vec<Cidr>);

impl Held {
    fn takes(&self, address: &str) -> bool {
        address
            .parse::<Cidr>()
            .map_or(true, |a| self.0.iter().any(|h| h.overlaps(&a)))
    }
}

/// Exits that can carry a dedicated address and match `wanted`, live ones
/// first.
async fn exits_matching(
    tx: &mut sqlx::PgConnection,
    wanted: &Wanted,
) -> Result<Vec<ExitRow>, sqlx::Error> {
    sqlx::query_as(
        "SELECT id, egress_ips, egress_prefixes FROM exits \
          WHERE withdrawn_at IS NULL AND NOT disabled \
            AND ($1::text IS NULL OR country = $1) \
            AND ($2::text IS NULL OR city = $2) \
            AND ($3::text IS NULL OR source_type = $3) \
          ORDER BY last_heartbeat_at DESC NULLS LAST, id",
    )
    .bind(&wanted.country)
    .bind(&wanted.city)
    .bind(&wanted.source_type)
    .fetch_all(tx)
    .await
}

/// Up to `count` free addresses matching `wanted`, spread over exits (one
/// from each in turn), so an account's addresses do not all go down with one
/// host.
pub(super) async fn free_addresses(
    tx: &mut sqlx::PgConnection,
    wanted: &Wanted,
    count: usize,
) -> Result<Vec<Free>, sqlx::Error> {
    let exits = exits_matching(tx, wanted).await?;
    let held = held_addresses(tx).await?;
    let per_exit: Vec<Vec<Free>> = exits
        .iter()
        .map(|exit| free_on(exit, wanted, &held, count))
        .collect();
    Ok(round_robin(per_exit, count))
}

/// The free addresses of one exit (at most `count`).
fn free_on(exit: &ExitRow, wanted: &Wanted, held: &Held, count: usize) -> Vec<Free> {
    let kind_ok = |prefix: bool, v4: bool| wanted.kind.is_none_or(|k| k == (prefix, v4));
    let mut out = Vec::new();
    for ip in exit
        .egress_ips
        .iter()
        .filter_map(|ip| ip.parse::<IpAddr>().ok())
    {
        let address = ip.to_string();
        if kind_ok(false, ip.is_ipv4()) && !held.takes(&address) {
            out.push(Free {
                exit_id: exit.id,
                address,
                is_prefix: false,
            });
        }
    }
    for prefix in exit
        .egress_prefixes
        .iter()
        .filter_map(|p| p.parse::<Cidr>().ok())
    {
        if !prefix.network().is_ipv6()
            || prefix.prefix_len() > DEDICATED_V6_PREFIX
            || !kind_ok(true, false)
        {
            continue;
        }
        for subnet in subnets_64(&prefix).take(V6_SUBNETS_SCANNED as usize) {
            if out.len() >= count {
                break;
            }
            let address = subnet.to_string();
            if !held.takes(&address) {
                out.push(Free {
                    exit_id: exit.id,
                    address,
                    is_prefix: true,
                });
            }
        }
    }
    out.truncate(count);
    out
}

/// The /64s of an IPv6 prefix of /64 or wider, in order.
pub(super) fn subnets_64(prefix: &Cidr) -> impl Iterator<Item = Cidr> {
    let masked = prefix.masked();
    let base = match masked.network() {
        IpAddr::V6(v6) => u128::from(v6),
        IpAddr::V4(_) => 0,
    };
    let bits = u32::from(DEDICATED_V6_PREFIX.saturating_sub(masked.prefix_len()));
    let count: u128 = 1u128.checked_shl(bits).unwrap_or(u128::MAX);
    (0..count).map(move |i| {
        let network = base | (i << 64);
        format!(
            "{}/{DEDICATED_V6_PREFIX}",
            std::net::Ipv6Addr::from(network)
        )
        .parse()
        .unwrap_or(masked)
    })
}

/// One from each list in turn until `count`.
pub(super) fn round_robin(mut lists: Vec<Vec<Free>>, count: usize) -> Vec<Free> {
    let mut out = Vec::new();
    for list in &mut lists {
        list.reverse();
    }
    while out.len() < count {
        let mut took = false;
        for list in &mut lists {
            if out.len() >= count {
                break;
            }
            if let Some(free) = list.pop() {
                out.push(free);
                took = true;
            }
        }
        if !took {
            break;
        }
    }
    out
}
