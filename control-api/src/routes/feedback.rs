//! Customers' reports on what the gateway cannot see into (docs/health.md,
//! "Customer feedback and the sites API"): `POST /v1/feedback` says an exit
//! (or the exit a sticky session is pinned to) is `blocked`, `slow` or `ok`
//! for a site.
//!
//! A `blocked` report cools the exit for the site in the reporting
//! account's own routing at once (an account-scoped cooldown). It cools it
//! for everybody only when corroborated: [`CORROBORATING_ACCOUNTS`]
//! distinct accounts reporting the pair blocked within an hour. So one
//! account — however many reports, keys or users it has — can never take
//! an exit out of the fleet's rotation for a site; several customers
//! seeing the same refusal can. An operator's report is the operator's
//! decision and cools the fleet at once. An account's `ok` lifts its own
//! cooldown of the pair; `slow` is recorded only.
//!
//! Every report is kept in Postgres (`site_reports`), which is what
//! corroboration counts and what an operator audits. Reports are charged to
//! the key that sent them ([`crate::auth::FeedbackRates`], far tighter than
//! the key's API rate): past it, `429` with `Retry-After`.

use std::collections::BTreeSet;

use axum::extract::State;
use axum::http::StatusCode;
use chrono::{DateTime, Utc};
// How long a `blocked` report cools the exit for the reporting account and
// the bounds on account-scoped cooldowns are the contract's: the
// superproxies write the same for the `Proxynet-Report` request header.
use proxynet_store::session_pin::PinValue;
use proxynet_store::site_cooldowns::{
    self as contract, AccountAnnouncement, ACCOUNT_COOLDOWNS_PER_ACCOUNT, ACCOUNT_COOLDOWNS_TOTAL,
    ACCOUNT_COOL_MS,
};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

use super::sites::{announce_payload, cool_fleet, site_param, unavailable, FleetCooldown};
use crate::auth::{Caller, KeyCaller};
use crate::error::ApiError;
use crate::extract::Json;
use crate::AppState;

/// Distinct accounts whose `blocked` reports of one (exit, site) pair
/// within [`CORROBORATION_WINDOW`] cool it for the whole fleet.
pub(crate) const CORROBORATING_ACCOUNTS: i64 = 3;
/// How far back corroborating reports count (a Postgres interval).
const CORROBORATION_WINDOW: &str = "1 hour";
/// Users searched for a session when the report names none.
const MAX_USERS_SEARCHED: usize = 1_000;

#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub(super) enum Verdict {
    Blocked,
    Slow,
    Ok,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Verdict::Blocked => "blocked",
            Verdict::Slow => "slow",
            Verdict::Ok => "ok",
        }
    }
}

/// Name the exit by `exit_id` or by `session` (its pinned exit; `user_id`
/// narrows the search to one user, required of operators), not both
/// (docs/health.md).
#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct Feedback {
    /// The exit (e.g. from a `Proxynet-Exit` answer header)…
    #[serde(default)]
    exit_id: Option<Uuid>,
    /// …or a sticky session, for the exit it is pinned to.
    #[serde(default)]
    #[schemars(regex(pattern = "^[A-Za-z0-9]{1,64}$"))]
    session: Option<String>,
    /// The session's proxy user; without it, the account's users are
    /// searched (required of operators).
    #[serde(default)]
    user_id: Option<Uuid>,
    /// A host name, URL, address or address block; counted as its
    /// registrable domain, IPv4 /24 or IPv6 /64.
    site: String,
    verdict: Verdict,
}

#[derive(Serialize)]
pub(super) struct Remaining {
    remaining_ms: u64,
}

#[derive(Serialize)]
pub(super) struct FeedbackAnswer {
    id: i64,
    exit_id: Uuid,
    /// The site as cooldowns are keyed (registrable domain, or block).
    site: String,
    verdict: &'static str,
    created_at: DateTime<Utc>,
    /// The reporting account's own cooldown of the pair (`blocked`).
    #[serde(skip_serializing_if = "Option::is_none")]
    account_cooldown: Option<Remaining>,
    /// Distinct accounts that reported the pair blocked within the hour.
    corroborating_accounts: i64,
    /// The fleet's cooldown of the pair, once reports agree (or an
    /// operator reported).
    #[serde(skip_serializing_if = "Option::is_none")]
    fleet_cooldown: Option<FleetCooldown>,
}

/// `POST /v1/feedback`.
pub(super) async fn report(
    who: KeyCaller,
    State(state): State<AppState>,
    Json(body): Json<Feedback>,
) -> Result<(StatusCode, Json<FeedbackAnswer>), ApiError> {
    // Charged before any work: a flood costs a limiter check per request.
    if let Some(key) = who.key_id {
        state.feedback_rates.charge(key)?;
    }
    // And the account, whatever key it uses: minting keys does not multiply
    // its reports (key and account ids are distinct UUIDs in one limiter).
    if let Caller::Account(account) = who.caller {
        state.feedback_rates.charge(account)?;
    }
    let site = site_param(&body.site)?;
    let exit = match (body.exit_id, body.session.as_deref()) {
        (Some(exit), None) => {
            if body.user_id.is_some() {
                return Err(ApiError::BadRequest(
                    "user_id names a session's user: give it with session, not exit_id".into(),
                ));
            }
            known_exit(&state, exit).await?;
            exit
        }
        (None, Some(session)) => session_exit(&state, who.caller, session, body.user_id).await?,
        _ => {
            return Err(ApiError::BadRequest(
                "name the exit: exit_id or session (one of them)".into(),
            ))
        }
    };
    let verdict = body.verdict;
    let (id, created_at): (i64, DateTime<Utc>) = sqlx::query_as(
        "INSERT INTO site_reports (account_id, key_id, exit_id, site, verdict)
         VALUES ($1, $2, $3, $4, $5) RETURNING id, created_at",
    )
    .bind(who.caller.scope())
    .bind(who.key_id)
    .bind(exit)
    .bind(&site)
    .bind(verdict.as_str())
    .fetch_one(&state.db)
    .await?;
    metrics::counter!("proxynet_site_reports_total", "verdict" => verdict.as_str()).increment(1);
    let mut answer = FeedbackAnswer {
        id,
        exit_id: exit,
        site,
        verdict: verdict.as_str(),
        created_at,
        account_cooldown: None,
        corroborating_accounts: 0,
        fleet_cooldown: None,
    };
    match (verdict, who.caller) {
        (Verdict::Blocked, Caller::Account(account)) => {
            let remaining_ms = cool_for_account(&state, account, exit, &answer.site).await?;
            answer.account_cooldown = Some(Remaining { remaining_ms });
            answer.corroborating_accounts = corroborating(&state, exit, &answer.site).await?;
            if answer.corroborating_accounts >= CORROBORATING_ACCOUNTS {
                let cooled = cool_fleet(&state, exit, &answer.site).await?;
                if cooled.new {
                    audit_fleet_cool(&state, who.caller, exit, &answer, cooled).await;
                }
                answer.fleet_cooldown = Some(cooled);
            }
        }
        (Verdict::Blocked, Caller::Operator) => {
            answer.corroborating_accounts = corroborating(&state, exit, &answer.site).await?;
            let cooled = cool_fleet(&state, exit, &answer.site).await?;
            if cooled.new {
                audit_fleet_cool(&state, who.caller, exit, &answer, cooled).await;
            }
            answer.fleet_cooldown = Some(cooled);
        }
        (Verdict::Ok, Caller::Account(account)) => {
            lift_for_account(&state, account, exit, &answer.site).await?;
        }
        (Verdict::Ok | Verdict::Slow, _) => {}
    }
    Ok((StatusCode::CREATED, Json(answer)))
}

/// 404 unless the exit was ever enrolled (reports of made-up ids would
/// only fill the table).
async fn known_exit(state: &AppState, exit: Uuid) -> Result<(), ApiError> {
    let found: Option<(Uuid,)> = sqlx::query_as("SELECT id FROM exits WHERE id = $1")
        .bind(exit)
        .fetch_optional(&state.db)
        .await?;
    match found {
        Some(_) => Ok(()),
        None => Err(ApiError::NotFound("exit")),
    }
}

/// The exit a live sticky session is pinned to: of `user` (which the
/// caller must own), else of whichever of the account's users holds the
/// session id. 404 when no live pin has it; 400 when several users'
/// sessions of that id sit on different exits.
async fn session_exit(
    state: &AppState,
    caller: Caller,
    session: &str,
    user: Option<Uuid>,
) -> Result<Uuid, ApiError> {
    super::sessions::valid_session(session)?;
    let users: Vec<Uuid> = match (user, caller) {
        (Some(user), _) => {
            super::users::fetch(state, caller, user).await?;
            vec![user]
        }
        (None, Caller::Account(account)) => {
            let rows: Vec<(Uuid,)> = sqlx::query_as(
                "SELECT id FROM proxy_users WHERE account_id = $1 AND deleted_at IS NULL
                  ORDER BY id LIMIT $2",
            )
            .bind(account)
            .bind(i64::try_from(MAX_USERS_SEARCHED + 1).unwrap_or(i64::MAX))
            .fetch_all(&state.db)
            .await?;
            if rows.len() > MAX_USERS_SEARCHED {
                return Err(ApiError::BadRequest(format!(
                    "this account has more than {MAX_USERS_SEARCHED} users: name the session's user (user_id)"
                )));
            }
            rows.into_iter().map(|(id,)| id).collect()
        }
        (None, Caller::Operator) => {
            return Err(ApiError::BadRequest(
                "an operator names the session's user: user_id".into(),
            ))
        }
    };
    let keys = state.projector.keys();
    let reads: Vec<redis::Cmd> = users
        .iter()
        .map(|user| {
            let mut get = redis::cmd("GET");
            get.arg(keys.session(*user, session));
            get
        })
        .collect();
    let pins: Vec<Option<String>> = state
        .redis
        .query_batch(reads)
        .await
        .map_err(|e| ApiError::Unavailable(format!("sessions unavailable: {e}")))?;
    // Redis' clock, as the superproxies judge idle pins by it.
    let (secs, micros): (i64, i64) = redis::cmd("TIME")
        .query_async(&mut state.redis.clone())
        .await
        .map_err(|e| ApiError::Unavailable(format!("sessions unavailable: {e}")))?;
    let now_ms = secs * 1000 + micros / 1000;
    let exits: BTreeSet<Uuid> = pins
        .iter()
        .flatten()
        .filter_map(|value| PinValue::parse(value))
        .filter(|pin| !pin.idle_expired(now_ms))
        .map(|pin| pin.exit)
        .collect();
    let mut exits = exits.into_iter();
    match (exits.next(), exits.next()) {
        (Some(exit), None) => Ok(exit),
        (None, _) => Err(ApiError::NotFound("session")),
        (Some(_), Some(_)) => Err(ApiError::BadRequest(
            "several of the account's users hold this session on different exits: name the user (user_id)".into(),
        )),
    }
}

/// Distinct accounts that reported `(exit, site)` blocked within the
/// window and sent traffic to the site through the exit within the last
/// day (the ledger says so): an account that never used the pair cannot
/// corroborate anything, so a few accounts made for the purpose cannot cool
/// an exit for a site they do not use.
async fn corroborating(state: &AppState, exit: Uuid, site: &str) -> Result<i64, ApiError> {
    let (n,): (i64,) = sqlx::query_as(&format!(
        "SELECT count(DISTINCT r.account_id) FROM site_reports r
          WHERE r.exit_id = $1 AND r.site = $2 AND r.verdict = 'blocked' AND r.account_id IS NOT NULL
            AND r.created_at > now() - interval '{CORROBORATION_WINDOW}'
            AND EXISTS (SELECT 1 FROM usage_ledger u
                         WHERE u.account_id = r.account_id AND u.exit_id = r.exit_id
                           AND u.domain = r.site AND u.minute > now() - interval '24 hours')"
    ))
    .bind(exit)
    .bind(site)
    .fetch_one(&state.db)
    .await?;
    Ok(n)
}

/// Cools `exit` for `site` in `account`'s routing (Redis, announced); the
/// milliseconds it lasts.
async fn cool_for_account(
    state: &AppState,
    account: Uuid,
    exit: Uuid,
    site: &str,
) -> Result<u64, ApiError> {
    let keys = state.projector.keys();
    let mut redis = state.redis.clone();
    let (remaining_ms, evicted): (i64, Vec<String>) =
        redis::Script::new(contract::ACCOUNT_COOL_SCRIPT)
            .key(keys.site_account_cooldowns())
            .key(keys.site_account_cooldowns_by_until())
            .key(keys.site_account_cooldowns_of_account(account))
            .arg(contract::account_field(account, exit, site))
            .arg(contract::field(exit, site))
            .arg(ACCOUNT_COOL_MS)
            .arg(ACCOUNT_COOLDOWNS_PER_ACCOUNT)
            .arg(ACCOUNT_COOLDOWNS_TOTAL)
            .arg(account.to_string())
            .invoke_async(&mut redis)
            .await
            .map_err(unavailable)?;
    let remaining_ms = u64::try_from(remaining_ms).unwrap_or(0);
    announce_payload(
        state,
        AccountAnnouncement::Cooled {
            account,
            exit,
            site: site.to_owned(),
            remaining_ms,
        }
        .encode(),
    )
    .await;
    for field in &evicted {
        if let Some((account, exit, site)) = contract::parse_account_field(field) {
            announce_payload(
                state,
                AccountAnnouncement::Lifted {
                    account,
                    exit,
                    site: site.to_owned(),
                }
                .encode(),
            )
            .await;
        }
    }
    Ok(remaining_ms)
}

/// Lifts `account`'s own cooldown of the pair, if it has one (announced).
async fn lift_for_account(
    state: &AppState,
    account: Uuid,
    exit: Uuid,
    site: &str,
) -> Result<(), ApiError> {
    let keys = state.projector.keys();
    let mut redis = state.redis.clone();
    let lifted: i64 = redis::Script::new(contract::ACCOUNT_LIFT_SCRIPT)
        .key(keys.site_account_cooldowns())
        .key(keys.site_account_cooldowns_by_until())
        .key(keys.site_account_cooldowns_of_account(account))
        .arg(contract::account_field(account, exit, site))
        .arg(contract::field(exit, site))
        .invoke_async(&mut redis)
        .await
        .map_err(unavailable)?;
    if lifted == 1 {
        announce_payload(
            state,
            AccountAnnouncement::Lifted {
                account,
                exit,
                site: site.to_owned(),
            }
            .encode(),
        )
        .await;
    }
    Ok(())
}

/// A fleet cooldown the reports caused, in the audit log (the cooldown is
/// in Redis already: a failure is logged, not undone).
async fn audit_fleet_cool(
    state: &AppState,
    caller: Caller,
    exit: Uuid,
    answer: &FeedbackAnswer,
    cooled: FleetCooldown,
) {
    let recorded = async {
        let mut tx = state.db.begin().await?;
        crate::audit::record(
            &mut tx,
            &super::users::actor(caller),
            "site.cool",
            &exit.to_string(),
            serde_json::json!({
                "site": answer.site,
                "cause": "feedback",
                "report": answer.id,
                "accounts": answer.corroborating_accounts,
                "level": cooled.level,
                "remaining_ms": cooled.remaining_ms,
            }),
        )
        .await?;
        tx.commit().await
    }
    .await;
    if let Err(e) = recorded {
        tracing::warn!(error = %e, exit = %exit, "fleet cooldown from feedback not audited");
    }
}
