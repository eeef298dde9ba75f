//! Allocation arithmetic without a database: /64 splitting, spreading
//! over exits, path addresses.

use super::free::{round_robin, subnets_64};
use super::*;
use proxynet_common::egress::Cidr;

#[test]
fn a_wide_prefix_splits_into_64s_in_order() {
    let prefix: Cidr = "2001:db8:aa00::/56".parse().unwrap();
    let subnets: Vec<String> = subnets_64(&prefix).take(3).map(|c| c.to_string()).collect();
    assert_eq!(
        subnets,
        [
            "2001:db8:aa00::/64",
            "2001:db8:aa00:1::/64",
            "2001:db8:aa00:2::/64"
        ]
    );
    assert_eq!(subnets_64(&prefix).count(), 256);
    let one: Cidr = "2001:db8:1:2::/64".parse().unwrap();
    assert_eq!(
        subnets_64(&one).map(|c| c.to_string()).collect::<Vec<_>>(),
        ["2001:db8:1:2::/64"]
    );
}

#[test]
fn allocation_spreads_over_exits() {
    let exit = |n: u8, k: usize| -> Vec<Free> {
        (0..k)
            .map(|i| Free {
                exit_id: Uuid::from_u128(u128::from(n)),
                address: format!("192.0.2.{}", usize::from(n) * 10 + i),
                is_prefix: false,
            })
            .collect()
    };
    let picked = round_robin(vec![exit(1, 3), exit(2, 1), exit(3, 2)], 5);
    let order: Vec<&str> = picked.iter().map(|f| f.address.as_str()).collect();
    assert_eq!(
        order,
        [
            "192.0.2.10",
            "192.0.2.20",
            "192.0.2.30",
            "192.0.2.11",
            "192.0.2.31"
        ]
    );
}

#[test]
fn a_path_address_is_normalised_and_a_prefix_may_keep_its_length() {
    assert_eq!(normalise("2001:DB8:0:1::/64").unwrap(), "2001:db8:0:1::");
    assert_eq!(normalise("127.0.0.2").unwrap(), "127.0.0.2");
    assert!(normalise("nope").is_err());
}
