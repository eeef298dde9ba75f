//! Acting in place: operator sessions only, from this origin, with the
//! session's CSRF token, through the REST handlers themselves (so the
//! checks, the audit entry with the operator as actor, the projection and
//! the webhooks are theirs). Destructive actions first answer a
//! confirmation page; its button posts again with `confirm=yes`.

use super::*;

#[derive(Deserialize)]
pub(crate) struct ActionForm {
    #[serde(default)]
    csrf: String,
    #[serde(default)]
    confirm: String,
    #[serde(default)]
    reason: String,
}

impl ActionForm {
    fn confirmed(&self) -> bool {
        self.confirm == "yes"
    }
}

/// The confirmation page: what will happen, a button that does it and a
/// way back.
fn confirm_page(
    v: &Viewer,
    action_path: &str,
    back: &str,
    question: &str,
    consequence: &str,
    label: &str,
    form: &ActionForm,
) -> Response {
    let reason = if form.reason.is_empty() {
        String::new()
    } else {
        format!(
            "<p>Reason: <q>{r}</q></p><input type=\"hidden\" name=\"reason\" value=\"{r}\">",
            r = esc(&form.reason)
        )
    };
    let body = format!(
        "<div class=\"confirm\" role=\"alertdialog\" aria-labelledby=\"confirm-q\"><p id=\"confirm-q\"><b>{q}</b></p><p>{c}</p>\
<form method=\"post\" action=\"{path}\"><input type=\"hidden\" name=\"csrf\" value=\"{csrf}\">\
<input type=\"hidden\" name=\"confirm\" value=\"yes\">{reason}\
<button type=\"submit\" id=\"confirm\" class=\"danger\" autofocus>{label}</button> \
<a href=\"{back}\" id=\"cancel\" class=\"button\">Cancel</a></form></div>",
        q = esc(question),
        c = esc(consequence),
        path = esc(action_path),
        csrf = esc(&v.csrf),
        label = esc(label),
        back = esc(back),
    );
    page_for(v, "Confirm", &body, &[]).into_response()
}

/// What the handler answered: back to `back`, or its error as a page.
fn done<T>(v: &Viewer, result: Result<T, ApiError>, back: &str) -> Response {
    match result {
        Ok(_) => Redirect::to(back).into_response(),
        Err(e) => {
            let message = e.to_string();
            let status = e.into_response().status();
            let body = format!(
                "<p class=\"error\" id=\"action-error\">{}</p><p><a href=\"{}\">Back</a></p>",
                esc(&message),
                esc(back)
            );
            (status, page_for(v, "Not done", &body, &[])).into_response()
        }
    }
}

async fn operator(
    state: &AppState,
    headers: &HeaderMap,
    form: &ActionForm,
) -> Result<Viewer, Response> {
    operator_action(state, headers, &form.csrf).await
}

/// `POST /dashboard/exits/{id}/{action}`: `drain`, `undrain`, `disable`,
/// `enable` or `revoke-consent` (with `reason`).
pub(crate) async fn exit_action(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, action)): Path<(Uuid, String)>,
    Form(form): Form<ActionForm>,
) -> Response {
    let v = match operator(&state, &headers, &form).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let back = format!("/dashboard/exits/{id}");
    let name = state
        .observer
        .exit(id)
        .map_or_else(|| id.to_string(), |(now, _, _)| now.name);
    let ask = |q: String, c: &str, label: &str| {
        confirm_page(
            &v,
            &format!("/dashboard/exits/{id}/{action}"),
            &back,
            &q,
            c,
            label,
            &form,
        )
    };
    let (op, st, path) = (crate::auth::Operator, State(state.clone()), Path(id));
    use crate::routes::exits;
    match action.as_str() {
        "drain" if !form.confirmed() => ask(
            format!("Drain exit {name}?"),
            "No new tunnels go through it; open ones finish. Undrain puts it back.",
            "Drain",
        ),
        "drain" => done(&v, exits::drain(op, st, path).await, &back),
        "undrain" => done(&v, exits::undrain(op, st, path).await, &back),
        "disable" if !form.confirmed() => ask(
            format!("Disable exit {name}?"),
            "It leaves rotation until an operator enables it again.",
            "Disable",
        ),
        "disable" => done(&v, exits::disable(op, st, path).await, &back),
        "enable" => done(&v, exits::enable(op, st, path).await, &back),
        "revoke-consent" if !form.confirmed() => ask(
            format!("Revoke consent for exit {name}?"),
            "A revoked consent record is appended and the exit stops carrying traffic at once; only a new grant brings it back.",
            "Revoke consent",
        ),
        "revoke-consent" => {
            let body = serde_json::from_value(serde_json::json!({ "reason": form.reason }));
            let result = match body {
                Ok(body) => {
                    crate::routes::provenance::revoke_consent(
                        crate::auth::Operator,
                        State(state.clone()),
                        Path(id),
                        Json(body),
                    )
                    .await
                }
                Err(e) => Err(ApiError::BadRequest(e.to_string())),
            };
            done(&v, result, &back)
        }
        _ => done::<()>(&v, Err(ApiError::NotFound("dashboard action")), &back),
    }
}

/// `POST /dashboard/api-keys/{id}/revoke`: the key and every key it minted.
pub(crate) async fn key_revoke(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path(id): Path<Uuid>,
    Form(form): Form<ActionForm>,
) -> Response {
    let v = match operator(&state, &headers, &form).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let owner: Option<(Option<Uuid>, String)> =
        sqlx::query_as("SELECT account_id, name FROM api_keys WHERE id = $1")
            .bind(id)
            .fetch_optional(&state.db)
            .await
            .unwrap_or_default();
    let back = match owner.as_ref().and_then(|(a, _)| *a) {
        Some(a) => format!("/dashboard/accounts/{a}"),
        None => "/dashboard/accounts".to_owned(),
    };
    if !form.confirmed() {
        let name = owner.map(|(_, n)| n).unwrap_or_default();
        return confirm_page(
            &v,
            &format!("/dashboard/api-keys/{id}/revoke"),
            &back,
            &format!("Revoke key {} ({id})?", if name.is_empty() { "–" } else { &name }),
            "The key and every key it minted stop working at once, and their dashboard sessions end. This cannot be undone.",
            "Revoke key",
            &form,
        );
    }
    let result =
        crate::routes::api_keys::revoke(Caller::Operator, State(state.clone()), Path(id)).await;
    done(&v, result, &back)
}

/// `POST /dashboard/users/{id}/disable` and `/enable`.
pub(crate) async fn user_action(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((id, action)): Path<(Uuid, String)>,
    Form(form): Form<ActionForm>,
) -> Response {
    let v = match operator(&state, &headers, &form).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let user = crate::routes::users::fetch(&state, Caller::Operator, id)
        .await
        .ok()
        .and_then(|u| serde_json::to_value(u).ok())
        .unwrap_or_default();
    let back = user["account_id"].as_str().map_or_else(
        || "/dashboard/accounts".to_owned(),
        |a| format!("/dashboard/accounts/{a}"),
    );
    let enabled = match action.as_str() {
        "disable" => false,
        "enable" => true,
        _ => return done::<()>(&v, Err(ApiError::NotFound("dashboard action")), &back),
    };
    if !enabled && !form.confirmed() {
        return confirm_page(
            &v,
            &format!("/dashboard/users/{id}/disable"),
            &back,
            &format!("Disable user {}?", user["username"].as_str().unwrap_or("?")),
            "Its new tunnels are refused and open ones cut; only an operator can enable it again.",
            "Disable user",
            &form,
        );
    }
    let result = match serde_json::from_value(serde_json::json!({ "enabled": enabled })) {
        Ok(body) => {
            crate::routes::users::update(
                Caller::Operator,
                State(state.clone()),
                Path(id),
                Json(body),
            )
            .await
        }
        Err(e) => Err(ApiError::BadRequest(e.to_string())),
    };
    done(&v, result, &back)
}

/// `POST /dashboard/users/{id}/sessions/{session}/end`.
pub(crate) async fn session_end(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((user, session)): Path<(Uuid, String)>,
    Form(form): Form<ActionForm>,
) -> Response {
    let v = match operator(&state, &headers, &form).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let back = format!("/dashboard/users/{user}/sessions");
    if !form.confirmed() {
        return confirm_page(
            &v,
            &format!("/dashboard/users/{user}/sessions/{session}/end"),
            &back,
            &format!("End session {session}?"),
            "Its pin is deleted: the next tunnel with this session id picks an exit afresh.",
            "End session",
            &form,
        );
    }
    // Audited by the handler, like every other way of ending a session.
    let result = crate::routes::sessions::end(
        Caller::Operator,
        State(state.clone()),
        Path((user, session)),
    )
    .await;
    done(&v, result, &back)
}

/// `POST /dashboard/sites/{site}/cooldowns/{exit_id}/lift`: not
/// destructive (the exit is only offered to the site again), so no
/// confirmation; announced and audited by the handler.
pub(crate) async fn site_lift(
    State(state): State<AppState>,
    headers: HeaderMap,
    Path((site, exit)): Path<(String, Uuid)>,
    Form(form): Form<ActionForm>,
) -> Response {
    let v = match operator(&state, &headers, &form).await {
        Ok(v) => v,
        Err(r) => return r,
    };
    let result = crate::routes::sites::lift(
        crate::auth::Operator,
        State(state.clone()),
        Path((site, exit)),
    )
    .await;
    done(&v, result, "/dashboard/sites")
}
