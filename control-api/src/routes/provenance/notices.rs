//! Consent notices: the texts the people behind exits saw, stored once per
//! version and served by version with their SHA-256.

use super::*;

#[derive(Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
#[schemars(rename = "Notice")]
pub(crate) struct NoticeBody {
    #[schemars(regex(pattern = "^[A-Za-z0-9._-]{1,64}$"))]
    version: String,
    /// The notice text (at most 200000 bytes).
    body: String,
}

#[derive(Serialize)]
pub(crate) struct Notice {
    version: String,
    sha256: String,
}

pub(crate) async fn create_notice(
    _: Operator,
    State(state): State<AppState>,
    Json(body): Json<NoticeBody>,
) -> Result<(StatusCode, Json<Notice>), ApiError> {
    if body.version.is_empty()
        || body.version.len() > 64
        || !body
            .version
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
    {
        return Err(ApiError::BadRequest(
            "version: 1 to 64 of A-Z a-z 0-9 . _ -".into(),
        ));
    }
    if body.body.trim().is_empty() || body.body.len() > 200_000 {
        return Err(ApiError::BadRequest(
            "body: the notice text, 1 to 200000 bytes".into(),
        ));
    }
    let sha256 = hex::encode(Sha256::digest(body.body.as_bytes()));
    let mut tx = state.db.begin().await?;
    sqlx::query("INSERT INTO consent_notices (version, sha256, body) VALUES ($1, $2, $3)")
        .bind(&body.version)
        .bind(&sha256)
        .bind(&body.body)
        .execute(&mut *tx)
        .await
        .map_err(|e| conflict_on_unique(e, "version: that version (or that exact text) exists"))?;
    audit::record(
        &mut tx,
        "operator",
        "consent_notice.create",
        &body.version,
        serde_json::json!({"sha256": sha256}),
    )
    .await?;
    tx.commit().await?;
    Ok((
        StatusCode::CREATED,
        Json(Notice {
            version: body.version,
            sha256,
        }),
    ))
}

/// `GET /v1/consent-notices/{version}`: the text itself, public, so anyone
/// can check what a person was shown (`Proxynet-Notice-Sha256` names it).
pub(crate) async fn get_notice(
    State(state): State<AppState>,
    Path(version): Path<String>,
) -> Result<Response, ApiError> {
    let row: (String, String) =
        sqlx::query_as("SELECT sha256, body FROM consent_notices WHERE version = $1")
            .bind(&version)
            .fetch_optional(&state.db)
            .await?
            .ok_or(ApiError::NotFound("consent notice"))?;
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    if let Ok(v) = HeaderValue::from_str(&row.0) {
        headers.insert("proxynet-notice-sha256", v);
    }
    Ok((headers, row.1).into_response())
}
