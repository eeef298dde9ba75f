//! `proxynetctl sessions`: a proxy user's sticky sessions
//! (`/v1/users/{id}/sessions`): read, end, set their remaining time.

use reqwest::Method;
use serde_json::json;

use super::common::{Ctx, Done, View};
use crate::cli::Sessions;
use crate::client::path;
use crate::output::{col, fmt, Col, Fmt};

const SESSIONS: &[Col] = &[
    col("SESSION", "session"),
    col("EXIT", "exit_id"),
    col("EGRESS", "egress_ip"),
    fmt("EXPIRES IN", "expires_in_ms", Fmt::Millis),
    fmt("IDLE EXPIRES IN", "idle_expires_in_ms", Fmt::Millis),
];

pub(super) async fn run(ctx: &Ctx, c: Sessions) -> Done {
    match c {
        Sessions::List { user } => {
            ctx.whole(&path(&["v1", "users", &user, "sessions"])?, &[], SESSIONS)
                .await
        }
        Sessions::Get { user, session } => ctx
            .one(
                Method::GET,
                &path(&["v1", "users", &user, "sessions", &session])?,
                None,
                View::Row(SESSIONS),
            )
            .await
            .map(drop),
        Sessions::End { user, session } => {
            let p = path(&["v1", "users", &user, "sessions", &session])?;
            ctx.no_content(Method::DELETE, &p, None, format!("session {session} ended"))
                .await
        }
        Sessions::SetTime {
            user,
            session,
            minutes,
        } => ctx
            .one(
                Method::PATCH,
                &path(&["v1", "users", &user, "sessions", &session])?,
                Some(json!({ "sesstime_minutes": minutes })),
                View::Row(SESSIONS),
            )
            .await
            .map(drop),
    }
}
