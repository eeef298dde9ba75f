//! Egress reports and their history, and the abuse desk's bounds.

use super::*;

#[tokio::test]
async fn an_egress_report_counts_only_signed_fresh_reflections_and_keeps_history() {
    use proxynet_wire::reflector::Reflection;
    let (app, state) = app_and_state().await;
    let (exit, credential) = enrolled_exit(&app, "198.51.100.7").await;
    let key = proxynet_store::reflector_key(&mut state.redis.clone(), state.projector.keys())
        .await
        .unwrap();
    let now = chrono::Utc::now().timestamp();
    let report = |reflection: Reflection| {
        json!({"observed": [{"egress": "198.51.100.7", "bound": "198.51.100.7", "reflection": reflection}]})
            .to_string()
    };
    let path = format!("/v1/agent/exits/{exit}/egress");
    let seen =
        |address: &str, at: i64| Reflection::signed(&key, address.parse().unwrap(), at, Some(exit));

    // Not the agent's: refused before anything is read.
    let (status, _, _) = call(
        &app,
        Method::POST,
        &path,
        Some("pnexit_wrong"),
        Some(&report(seen("198.51.100.7", now))),
    )
    .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // An agent inventing what the reflector saw: not recorded.
    let forged = Reflection::signed(
        b"a key of its own",
        "198.51.100.7".parse().unwrap(),
        now,
        Some(exit),
    );
    let (status, _, answer) = call(
        &app,
        Method::POST,
        &path,
        Some(&credential),
        Some(&report(forged)),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    assert_eq!(answer["accepted"], 0);
    assert!(
        answer["ignored"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("proof"),
        "{answer}"
    );
    assert_eq!(answer["verification"], "unobserved");

    let (_, _, answer) = call(
        &app,
        Method::POST,
        &path,
        Some(&credential),
        Some(&report(seen("198.51.100.7", now - 60))),
    )
    .await;
    assert_eq!(
        (answer["accepted"].as_i64(), answer["verification"].as_str()),
        (Some(1), Some("verified")),
        "{answer}"
    );
    // The world now sees another address: a new row, and a mismatch.
    let (_, _, answer) = call(
        &app,
        Method::POST,
        &path,
        Some(&credential),
        Some(&report(seen("203.0.113.9", now - 30))),
    )
    .await;
    assert_eq!(answer["verification"], "mismatch", "{answer}");
    // The same address again extends the row; an older report is ignored.
    call(
        &app,
        Method::POST,
        &path,
        Some(&credential),
        Some(&report(seen("203.0.113.9", now))),
    )
    .await;
    let (_, _, late) = call(
        &app,
        Method::POST,
        &path,
        Some(&credential),
        Some(&report(seen("198.51.100.7", now - 120))),
    )
    .await;
    assert_eq!(late["accepted"], 0, "{late}");

    let (_, _, view) = call(
        &app,
        Method::GET,
        &format!("/v1/exits/{exit}"),
        Some(ADMIN),
        None,
    )
    .await;
    let egress = &view["egress"];
    assert_eq!(egress["verification"], "mismatch", "{view}");
    assert_eq!(
        egress["routable"], true,
        "flagged only: the strict policy is off"
    );
    assert_eq!(egress["observed"][0]["observed"], "203.0.113.9");
    assert_eq!(egress["observed"][0]["status"], "mismatch");
    let history = egress["history"].as_array().unwrap();
    assert_eq!(history.len(), 2, "{view}");
    assert_eq!(history[0]["observed"], "203.0.113.9");
    assert_eq!(
        history[0]["first_seen"],
        json!(chrono::DateTime::from_timestamp(now - 30, 0).unwrap())
    );
    assert_eq!(
        history[0]["last_seen"],
        json!(chrono::DateTime::from_timestamp(now, 0).unwrap())
    );
    assert_eq!(history[1]["observed"], "198.51.100.7");

    let (_, _, audit) = call(
        &app,
        Method::GET,
        &format!("/v1/audit?action=exit.egress_verification&subject={exit}"),
        Some(ADMIN),
        None,
    )
    .await;
    let changes: Vec<&str> = audit
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["detail"]["to"].as_str().unwrap())
        .collect();
    assert_eq!(changes, ["mismatch", "verified"], "newest first");
}

#[tokio::test]
async fn a_redial_in_the_same_second_is_the_latest_and_address_changes_are_bounded() {
    use proxynet_wire::reflector::Reflection;
    let (app, state) = app_and_state().await;
    let (exit, credential) = enrolled_exit(&app, "198.51.100.8").await;
    let key = proxynet_store::reflector_key(&mut state.redis.clone(), state.projector.keys())
        .await
        .unwrap();
    let now = chrono::Utc::now().timestamp();
    let path = format!("/v1/agent/exits/{exit}/egress");
    let report = |address: &str| {
        let reflection = Reflection::signed(&key, address.parse().unwrap(), now, Some(exit));
        json!({"observed": [{"egress": "198.51.100.8", "bound": "198.51.100.8", "reflection": reflection}]})
            .to_string()
    };
    // Reflections carry whole seconds: a re-dial within the second is
    // still the newer row.
    for address in ["203.0.113.1", "203.0.113.2"] {
        let (_, _, answer) = call(
            &app,
            Method::POST,
            &path,
            Some(&credential),
            Some(&report(address)),
        )
        .await;
        assert_eq!(answer["accepted"], 1, "{answer}");
    }
    let (_, _, view) = call(
        &app,
        Method::GET,
        &format!("/v1/exits/{exit}"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(
        view["egress"]["observed"][0]["observed"], "203.0.113.2",
        "{view}"
    );
    assert_eq!(view["egress"]["history"][0]["observed"], "203.0.113.2");
    assert_eq!(view["egress"]["history"][1]["observed"], "203.0.113.1");

    // Two valid reflections replayed in turn: each is a change, and the
    // history stops growing at the hourly bound.
    let mut last = serde_json::Value::Null;
    // (The same address as the latest row only extends it, and is taken.)
    for i in 0..=crate::routes::egress::MAX_CHANGES_PER_EXIT_HOUR {
        let address = if i % 2 == 0 {
            "203.0.113.1"
        } else {
            "203.0.113.2"
        };
        last = call(
            &app,
            Method::POST,
            &path,
            Some(&credential),
            Some(&report(address)),
        )
        .await
        .2;
    }
    assert_eq!(last["accepted"], 0, "{last}");
    assert!(
        last["ignored"][0]["reason"]
            .as_str()
            .unwrap()
            .contains("too many"),
        "{last}"
    );
    let (rows,): (i64,) =
        sqlx::query_as("SELECT count(*) FROM exit_egress_observations WHERE exit_id = $1")
            .bind(exit)
            .fetch_one(&state.db)
            .await
            .unwrap();
    assert_eq!(rows, crate::routes::egress::MAX_CHANGES_PER_EXIT_HOUR);
}

#[tokio::test]
async fn the_desk_takes_networks_of_bounded_width_and_exports_bounded_ranges() {
    let app = app().await;
    let lookup = |q: &str| format!("/v1/abuse/lookup?at=2026-11-30T10:00:00Z&egress_ip={q}");
    for ok in ["198.51.100.7", "2001:db8:1:2::/64", "198.51.0.0/16"] {
        let (status, _, rows) = call(&app, Method::GET, &lookup(ok), Some(ADMIN), None).await;
        assert_eq!((status, rows), (StatusCode::OK, json!([])), "{ok}");
    }
    for bad in ["198.0.0.0/8", "2001:db8::/16", "shop.example"] {
        let (status, _, _) = call(&app, Method::GET, &lookup(bad), Some(ADMIN), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let export = |q: &str| format!("/v1/abuse/export?{q}");
    let (status, content_type, rows) = call(
        &app,
        Method::GET,
        &export("from=2026-11-01T00:00:00Z&to=2026-11-30T00:00:00Z"),
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!((status, rows), (StatusCode::OK, json!([])));
    assert_eq!(content_type, "application/json");
    for bad in [
        "from=2026-10-01T00:00:00Z&to=2026-11-30T00:00:00Z",
        "from=2026-11-30T00:00:00Z&to=2026-11-01T00:00:00Z",
        "from=2026-11-01T00:00:00Z&to=2026-11-02T00:00:00Z&format=xml",
    ] {
        let (status, _, _) = call(&app, Method::GET, &export(bad), Some(ADMIN), None).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}");
    }
    let (_, _, audit) = call(
        &app,
        Method::GET,
        "/v1/audit?action=abuse.lookup",
        Some(ADMIN),
        None,
    )
    .await;
    assert_eq!(
        audit.as_array().unwrap().len(),
        3,
        "every lookup answered is audited"
    );
    // The window for clock skew is bounded: up to an hour either side.
    for (window, want) in [
        ("0", StatusCode::OK),
        ("60", StatusCode::OK),
        ("61", StatusCode::BAD_REQUEST),
        ("-1", StatusCode::BAD_REQUEST),
    ] {
        let q = format!("198.51.100.7&window_minutes={window}");
        let (status, _, body) = call(&app, Method::GET, &lookup(&q), Some(ADMIN), None).await;
        assert_eq!(status, want, "window {window}: {body}");
    }
}

#[tokio::test]
async fn an_admin_address_reaches_the_deny_list_only_once_the_reflector_verified_it() {
    use proxynet_wire::reflector::Reflection;
    let (app, state) = app_and_state().await;
    // A public address: every exit's reply lists it once it is protected.
    let (exit, credential) = enrolled_exit(&app, "93.184.216.34").await;
    let claimed = "93.184.216.34:443";
    let heartbeat = format!("/v1/agent/exits/{exit}/heartbeat");
    let beat = json!({"admin_addrs": [claimed]}).to_string();
    let view = || async {
        call(
            &app,
            Method::GET,
            &format!("/v1/exits/{exit}"),
            Some(ADMIN),
            None,
        )
        .await
        .2
    };

    // Declared, never seen: ignored, and shown as such.
    let (status, _, reply) = call(
        &app,
        Method::POST,
        &heartbeat,
        Some(&credential),
        Some(&beat),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert!(
        !reply["protected"]
            .as_array()
            .unwrap()
            .contains(&json!(claimed)),
        "{reply}"
    );
    let shown = view().await;
    assert_eq!(shown["admin_addresses"], json!([]), "{shown}");
    assert_eq!(shown["admin_addresses_unverified"], json!([claimed]));

    // The reflector saw the exit's traffic leave from the address itself.
    let key = proxynet_store::reflector_key(&mut state.redis.clone(), state.projector.keys())
        .await
        .unwrap();
    let reflection = Reflection::signed(
        &key,
        "93.184.216.34".parse().unwrap(),
        chrono::Utc::now().timestamp(),
        Some(exit),
    );
    let report = json!({"observed": [
        {"egress": "93.184.216.34", "bound": "93.184.216.34", "reflection": reflection}
    ]});
    let (_, _, answer) = call(
        &app,
        Method::POST,
        &format!("/v1/agent/exits/{exit}/egress"),
        Some(&credential),
        Some(&report.to_string()),
    )
    .await;
    assert_eq!(answer["accepted"], 1, "{answer}");

    // Past the heartbeat pacing and the reply's reuse: now every exit is
    // told to deny it.
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    let (status, _, reply) = call(
        &app,
        Method::POST,
        &heartbeat,
        Some(&credential),
        Some(&beat),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{reply}");
    assert!(
        reply["protected"]
            .as_array()
            .unwrap()
            .contains(&json!(claimed)),
        "{reply}"
    );
    let shown = view().await;
    assert_eq!(shown["admin_addresses"], json!([claimed]), "{shown}");
    assert_eq!(shown["admin_addresses_unverified"], json!([]));
}
