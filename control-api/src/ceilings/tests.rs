//! Ceilings and entitlements: what an account key may write under them.

use super::*;

fn ceiling() -> Limits {
    Limits {
        max_concurrent_tunnels: Some(1),
        bandwidth_bytes: Some(300_000),
        period: Some("daily".into()),
        allowed_source_types: Some(vec!["dc".into()]),
        allowed_channels: Some(vec!["owned".into(), "leased".into()]),
        ..Limits::default()
    }
}

#[test]
fn an_empty_request_keeps_the_user_ceiling() {
    let mut asked = Limits::default();
    fit_under(&mut asked, &ceiling(), Ceiling::User).unwrap();
    assert_eq!(asked.max_concurrent_tunnels, Some(1));
    assert_eq!(asked.bandwidth_bytes, Some(300_000));
    assert_eq!(asked.period.as_deref(), Some("daily"));
    assert_eq!(asked.allowed_source_types, Some(vec!["dc".to_owned()]));
    assert_eq!(
        asked.max_new_tunnels_per_second, None,
        "no ceiling, no limit"
    );
}

#[test]
fn lowering_passes_and_raising_or_widening_names_the_field() {
    let mut lower = Limits {
        bandwidth_bytes: Some(1000),
        allowed_channels: Some(vec!["owned".into()]),
        ..Limits::default()
    };
    fit_under(&mut lower, &ceiling(), Ceiling::User).unwrap();
    assert_eq!(lower.bandwidth_bytes, Some(1000));
    for (asked, field) in [
        (
            Limits {
                max_concurrent_tunnels: Some(2),
                ..Limits::default()
            },
            "limits.max_concurrent_tunnels",
        ),
        (
            Limits {
                allowed_source_types: Some(vec!["dc".into(), "res".into()]),
                ..Limits::default()
            },
            "limits.allowed_source_types",
        ),
        (
            Limits {
                bandwidth_bytes: Some(10),
                period: Some("monthly".into()),
                ..Limits::default()
            },
            "limits.period",
        ),
    ] {
        let mut asked = asked;
        match fit_under(&mut asked, &ceiling(), Ceiling::User) {
            Err(ApiError::Forbidden(m)) => assert!(m.starts_with(field), "{m}"),
            other => panic!("{field}: {other:?}"),
        }
    }
}

#[test]
fn account_entitlements_are_checked_not_copied() {
    let mut asked = Limits::default();
    fit_under(&mut asked, &ceiling(), Ceiling::Account).unwrap();
    assert_eq!(asked, Limits::default());
    let mut over = Limits {
        max_concurrent_tunnels: Some(5),
        ..Limits::default()
    };
    assert!(matches!(
        fit_under(&mut over, &ceiling(), Ceiling::Account),
        Err(ApiError::Forbidden(_))
    ));
}

#[test]
fn intersections_and_minimums() {
    let a = vec!["dc".to_owned(), "res".to_owned()];
    let b = vec!["res".to_owned(), "isp".to_owned()];
    assert_eq!(intersect(Some(&a), Some(&b)), Some(vec!["res".to_owned()]));
    assert_eq!(intersect(None, Some(&b)), Some(b.clone()));
    assert_eq!(intersect(None, None), None);
    assert_eq!(min_some(Some(3), Some(2)), Some(2));
    assert_eq!(min_some(None, Some(2)), Some(2));
    assert_eq!(min_some::<i32>(None, None), None);
}

#[test]
fn non_positive_numeric_limits_are_refused_naming_the_field() {
    for (limits, field) in [
        (
            Limits {
                max_concurrent_tunnels: Some(0),
                ..Limits::default()
            },
            "limits.max_concurrent_tunnels",
        ),
        (
            Limits {
                max_new_tunnels_per_second: Some(-1),
                ..Limits::default()
            },
            "limits.max_new_tunnels_per_second",
        ),
        (
            Limits {
                bandwidth_bytes: Some(0),
                ..Limits::default()
            },
            "limits.bandwidth_bytes",
        ),
    ] {
        match limits.validate() {
            Err(ApiError::BadRequest(m)) => assert!(m.starts_with(field), "{m}"),
            other => panic!("{field}: {other:?}"),
        }
    }
}

#[test]
fn warn_percent_must_lie_between_1_and_100() {
    let with = |w| Limits {
        warn_percent: Some(w),
        ..Limits::default()
    };
    assert!(with(1).validate().is_ok());
    assert!(with(100).validate().is_ok());
    assert!(matches!(with(0).validate(), Err(ApiError::BadRequest(_))));
    assert!(matches!(with(101).validate(), Err(ApiError::BadRequest(_))));
}

#[test]
fn unknown_source_types_channels_periods_and_country_codes_are_refused() {
    let valid = Limits {
        allowed_source_types: Some(vec!["dc".into(), "mobile".into()]),
        allowed_countries: Some(vec!["DE".into(), "US".into()]),
        allowed_channels: Some(vec!["owned".into(), "reseller".into()]),
        period: Some("daily".into()),
        ..Limits::default()
    };
    valid.validate().unwrap();
    for (limits, field) in [
        (
            Limits {
                allowed_source_types: Some(vec!["datacenter".into()]),
                ..Limits::default()
            },
            "limits.allowed_source_types",
        ),
        (
            Limits {
                allowed_countries: Some(vec!["de".into()]),
                ..Limits::default()
            },
            "limits.allowed_countries",
        ),
        (
            Limits {
                allowed_countries: Some(vec!["DEU".into()]),
                ..Limits::default()
            },
            "limits.allowed_countries",
        ),
        (
            Limits {
                allowed_channels: Some(vec!["stolen".into()]),
                ..Limits::default()
            },
            "limits.allowed_channels",
        ),
        (
            Limits {
                period: Some("weekly".into()),
                ..Limits::default()
            },
            "limits.period",
        ),
    ] {
        match limits.validate() {
            Err(ApiError::BadRequest(m)) => assert!(m.starts_with(field), "{m}"),
            other => panic!("{field}: {other:?}"),
        }
    }
}

#[test]
fn the_quota_period_defaults_to_monthly() {
    assert_eq!(Limits::default().period(), QuotaPeriod::Monthly);
    let daily = Limits {
        period: Some("daily".into()),
        ..Limits::default()
    };
    assert_eq!(daily.period(), QuotaPeriod::Daily);
}

#[test]
fn only_numeric_limits_count_as_account_totals() {
    let restrictions_only = Limits {
        period: Some("daily".into()),
        warn_percent: Some(50),
        allowed_countries: Some(vec!["DE".into()]),
        ..Limits::default()
    };
    assert!(!restrictions_only.has_totals());
    for totals in [
        Limits {
            max_concurrent_tunnels: Some(1),
            ..Limits::default()
        },
        Limits {
            max_new_tunnels_per_second: Some(1),
            ..Limits::default()
        },
        Limits {
            bandwidth_bytes: Some(1),
            ..Limits::default()
        },
    ] {
        assert!(totals.has_totals(), "{totals:?}");
    }
}

#[test]
fn unknown_limit_fields_are_refused_and_absent_ones_are_not_written() {
    assert!(serde_json::from_str::<Limits>(r#"{"max_tunnels": 5}"#).is_err());
    let parsed: Limits =
        serde_json::from_str(r#"{"max_concurrent_tunnels": 5, "period": null}"#).unwrap();
    assert_eq!(
        parsed,
        Limits {
            max_concurrent_tunnels: Some(5),
            ..Limits::default()
        }
    );
    assert_eq!(
        serde_json::to_string(&parsed).unwrap(),
        r#"{"max_concurrent_tunnels":5}"#
    );
}

#[test]
fn allowlisted_networks_wider_than_the_default_prefixes_are_refused() {
    let cidr = |s: &str| s.parse::<proxynet_common::egress::Cidr>().unwrap();
    let rules = AllowlistRules::default();
    assert!(rules.permits(&cidr("8.8.8.0/24")).is_ok());
    assert!(rules.permits(&cidr("8.8.0.0/16")).is_err());
    assert!(rules.permits(&cidr("2a00:1450:4000::/48")).is_ok());
    assert!(rules.permits(&cidr("2a00:1450::/32")).is_err());
    let wider = AllowlistRules {
        min_prefix_v4: Some(16),
        ..AllowlistRules::default()
    };
    assert!(wider.permits(&cidr("8.8.0.0/16")).is_ok());
    assert!(wider.permits(&cidr("8.0.0.0/8")).is_err());
}

#[test]
fn special_purpose_ranges_need_an_explicit_entitlement() {
    let private = "10.1.2.0/24"
        .parse::<proxynet_common::egress::Cidr>()
        .unwrap();
    let refusal = AllowlistRules::default().permits(&private).unwrap_err();
    assert!(refusal.contains("special-purpose"), "{refusal}");
    let allowed = AllowlistRules {
        special_ranges: true,
        ..AllowlistRules::default()
    };
    assert!(allowed.permits(&private).is_ok());
}

#[test]
fn the_network_count_defaults_to_max_networks() {
    assert_eq!(AllowlistRules::default().max_networks(), MAX_NETWORKS);
    let rules = AllowlistRules {
        max_networks: Some(3),
        ..AllowlistRules::default()
    };
    assert_eq!(rules.max_networks(), 3);
}

#[test]
fn entitlement_errors_are_prefixed_and_prefix_lengths_bounded() {
    let bad_limit = Entitlements {
        limits: Limits {
            max_concurrent_tunnels: Some(0),
            ..Limits::default()
        },
        ..Entitlements::default()
    };
    match bad_limit.validate() {
        Err(ApiError::BadRequest(m)) => assert!(
            m.starts_with("entitlements.limits.max_concurrent_tunnels"),
            "{m}"
        ),
        other => panic!("{other:?}"),
    }
    for allowlist in [
        AllowlistRules {
            min_prefix_v4: Some(33),
            ..AllowlistRules::default()
        },
        AllowlistRules {
            min_prefix_v6: Some(129),
            ..AllowlistRules::default()
        },
    ] {
        let entitlements = Entitlements {
            allowlist,
            ..Entitlements::default()
        };
        assert!(matches!(
            entitlements.validate(),
            Err(ApiError::BadRequest(_))
        ));
    }
    let narrowest = Entitlements {
        allowlist: AllowlistRules {
            min_prefix_v4: Some(32),
            min_prefix_v6: Some(128),
            ..AllowlistRules::default()
        },
        ..Entitlements::default()
    };
    narrowest.validate().unwrap();
}

#[test]
fn the_stricter_limits_take_each_smaller_number_and_the_common_restrictions() {
    let a = Limits {
        max_concurrent_tunnels: Some(10),
        bandwidth_bytes: Some(1_000),
        period: Some("monthly".into()),
        allowed_countries: Some(vec!["DE".into(), "FR".into()]),
        ..Limits::default()
    };
    let b = Limits {
        max_concurrent_tunnels: Some(4),
        max_new_tunnels_per_second: Some(2),
        bandwidth_bytes: Some(500),
        warn_percent: Some(90),
        allowed_countries: Some(vec!["FR".into(), "US".into()]),
        allowed_channels: Some(vec!["owned".into()]),
        ..Limits::default()
    };
    let s = stricter(&a, &b);
    assert_eq!(s.max_concurrent_tunnels, Some(4));
    assert_eq!(s.max_new_tunnels_per_second, Some(2));
    assert_eq!(s.bandwidth_bytes, Some(500));
    assert_eq!(s.period.as_deref(), Some("monthly"));
    assert_eq!(s.warn_percent, Some(90));
    assert_eq!(s.allowed_countries, Some(vec!["FR".to_owned()]));
    assert_eq!(s.allowed_channels, Some(vec!["owned".to_owned()]));
    assert_eq!(s.allowed_source_types, None);
}

#[test]
fn stricter_keeps_a_bandwidth_quota_of_another_period_as_it_is() {
    let monthly = Limits {
        bandwidth_bytes: Some(1_000_000),
        period: Some("monthly".into()),
        ..Limits::default()
    };
    let daily = Limits {
        bandwidth_bytes: Some(10),
        period: Some("daily".into()),
        ..Limits::default()
    };
    let s = stricter(&monthly, &daily);
    assert_eq!(s.bandwidth_bytes, Some(1_000_000));
    assert_eq!(s.period.as_deref(), Some("monthly"));
    // Where only the second sets a quota, its period comes with it.
    let s = stricter(&Limits::default(), &daily);
    assert_eq!(s.bandwidth_bytes, Some(10));
    assert_eq!(s.period.as_deref(), Some("daily"));
}

#[test]
fn an_account_total_of_another_period_does_not_bound_a_user_quota() {
    let account = Limits {
        bandwidth_bytes: Some(100),
        period: Some("daily".into()),
        ..Limits::default()
    };
    let mut monthly = Limits {
        bandwidth_bytes: Some(1_000_000),
        period: Some("monthly".into()),
        ..Limits::default()
    };
    fit_under(&mut monthly, &account, Ceiling::Account).unwrap();
    assert_eq!(monthly.bandwidth_bytes, Some(1_000_000));
    assert_eq!(monthly.period.as_deref(), Some("monthly"));
    let mut daily = Limits {
        bandwidth_bytes: Some(101),
        period: Some("daily".into()),
        ..Limits::default()
    };
    match fit_under(&mut daily, &account, Ceiling::Account) {
        Err(ApiError::Forbidden(m)) => assert!(m.starts_with("limits.bandwidth_bytes"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_user_quota_without_a_period_takes_the_ceilings_period() {
    let mut asked = Limits {
        bandwidth_bytes: Some(1_000),
        ..Limits::default()
    };
    fit_under(&mut asked, &ceiling(), Ceiling::User).unwrap();
    assert_eq!(asked.bandwidth_bytes, Some(1_000));
    assert_eq!(asked.period.as_deref(), Some("daily"));
}
