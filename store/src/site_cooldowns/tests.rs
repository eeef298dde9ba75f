//! Tests of the site cooldowns' fields, values, announcements and sites.

use super::*;

#[test]
fn fields_cooldowns_and_announcements_round_trip() {
    let exit = Uuid::new_v4();
    for site in ["example.com", "198.51.100.0/24", "2001:db8:1:2::/64"] {
        assert_eq!(parse_field(&field(exit, site)), Some((exit, site)));
        for a in [
            Announcement::Cooled {
                exit,
                site: site.into(),
                remaining_ms: 60_000,
                level: 2,
            },
            Announcement::Lifted {
                exit,
                site: site.into(),
            },
        ] {
            assert_eq!(Announcement::parse(&a.encode()), Some(a));
        }
    }
    let c = Cooldown {
        until_ms: 1_700_000_000_000,
        level: 3,
    };
    assert_eq!(Cooldown::parse(&c.encode()), Some(c));
    for bad in [
        "cool:",
        "cool:x y 1 1",
        "uncool:",
        "exit:abc",
        "cool:{exit} a 1 1 1",
    ] {
        assert_eq!(Announcement::parse(bad), None, "{bad}");
    }
    assert_eq!(parse_field(&format!("{exit} ")), None);
}

#[test]
fn the_exit_index_stem_is_what_each_exits_key_starts_with() {
    let keys = Keys::new("pn:".to_owned());
    let exit = Uuid::new_v4();
    assert_eq!(
        keys.site_cooldowns_of_exit(exit),
        format!("{}{exit}", keys.site_cooldowns_of_exit_stem())
    );
}

#[test]
fn account_fields_and_announcements_round_trip() {
    let (account, exit) = (Uuid::new_v4(), Uuid::new_v4());
    for site in ["example.com", "198.51.100.0/24", "2001:db8:1:2::/64"] {
        let f = account_field(account, exit, site);
        assert_eq!(parse_account_field(&f), Some((account, exit, site)));
        for a in [
            AccountAnnouncement::Cooled {
                account,
                exit,
                site: site.into(),
                remaining_ms: 1_800_000,
            },
            AccountAnnouncement::Lifted {
                account,
                exit,
                site: site.into(),
            },
        ] {
            let payload = a.encode();
            assert_eq!(AccountAnnouncement::parse(&payload), Some(a));
            // A receiver that knows only the fleet's announcements
            // never takes an account's for one.
            assert_eq!(Announcement::parse(&payload), None, "{payload}");
        }
    }
    assert_eq!(
        AccountAnnouncement::parse(&format!("acool:{account} {exit} example.com 5")),
        Some(AccountAnnouncement::Cooled {
            account,
            exit,
            site: "example.com".into(),
            remaining_ms: 5
        })
    );
    for bad in [
        "acool:".to_owned(),
        format!("acool:{account} {exit} example.com"),
        format!("acool:{account} {exit} example.com x"),
        format!("acool:x {exit} example.com 5"),
        format!("auncool:{account} {exit}"),
        format!("auncool:{account} {exit} a b"),
        format!("cool:{exit} example.com 5 0"),
    ] {
        assert_eq!(AccountAnnouncement::parse(&bad), None, "{bad}");
    }
    assert_eq!(parse_account_field(&format!("{account} {exit} ")), None);
}

#[test]
fn sites_are_registrable_domains_and_address_blocks() {
    for (raw, site) in [
        ("example.com", "example.com"),
        ("WWW.Shop.Example.co.uk.", "example.co.uk"),
        ("https://user@www.example.com:8443/a?b#c", "example.com"),
        ("http://[2001:db8:1:2::5]:80/", "2001:db8:1:2::/64"),
        ("198.51.100.77", "198.51.100.0/24"),
        ("::ffff:198.51.100.1", "198.51.100.0/24"),
        ("2001:db8:1:2:3::9", "2001:db8:1:2::/64"),
        ("198.51.100.7/24", "198.51.100.0/24"),
        ("2001:db8:1:2::/64", "2001:db8:1:2::/64"),
        ("localhost", "localhost"),
    ] {
        assert_eq!(site_of(raw).as_deref(), Ok(site), "{raw}");
    }
    for bad in [
        "",
        "  ",
        "https:///path",
        "198.51.100.0/16",
        "2001:db8::/48",
        "example.com/24",
        "a..b",
    ] {
        assert!(site_of(bad).is_err(), "{bad:?}");
    }
    assert_eq!(site_of_ip("192.0.2.77".parse().unwrap()), "192.0.2.0/24");
}
