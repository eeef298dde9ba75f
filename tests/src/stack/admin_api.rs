//! The control API as the operator: [`AdminApi`] (`stack.admin()`), the
//! requests every admin call is made of, and the stack's named helpers on
//! top of it (accounts, users, keys, entitlements, sources, enrollment
//! tokens, the usage ledger).

use serde::Serialize;
use serde_json::json;
use std::fmt::Display;
use std::time::Duration;
use uuid::Uuid;

use super::{Stack, ADMIN_TOKEN};
use crate::process::eventually;

/// The control API with the admin token ([`ADMIN_TOKEN`]): requests sent,
/// answers returned unread, for the test to assert on.
#[derive(Clone, Copy)]
pub struct AdminApi<'a> {
    http: &'a reqwest::Client,
    api_url: &'a str,
}

impl AdminApi<'_> {
    /// `METHOD path` with the admin token, to finish and send.
    pub fn request(&self, method: reqwest::Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}{path}", self.api_url))
            .bearer_auth(ADMIN_TOKEN)
    }

    pub async fn get(&self, path: &str) -> reqwest::Response {
        self.request(reqwest::Method::GET, path)
            .send()
            .await
            .unwrap()
    }

    /// `GET path`, as JSON.
    pub async fn get_json(&self, path: &str) -> serde_json::Value {
        self.get(path).await.json().await.unwrap()
    }

    /// `POST path` with the JSON `body`.
    pub async fn post<B: Serialize + ?Sized>(&self, path: &str, body: &B) -> reqwest::Response {
        self.send_json(reqwest::Method::POST, path, body).await
    }

    /// `PUT path` with the JSON `body`.
    pub async fn put<B: Serialize + ?Sized>(&self, path: &str, body: &B) -> reqwest::Response {
        self.send_json(reqwest::Method::PUT, path, body).await
    }

    /// `PATCH path` with the JSON `body`.
    pub async fn patch<B: Serialize + ?Sized>(&self, path: &str, body: &B) -> reqwest::Response {
        self.send_json(reqwest::Method::PATCH, path, body).await
    }

    pub async fn delete(&self, path: &str) -> reqwest::Response {
        self.request(reqwest::Method::DELETE, path)
            .send()
            .await
            .unwrap()
    }

    /// `POST /v1/accounts/{account}/users` with `body` (username, password,
    /// limits, allow-listed networks, …).
    pub async fn create_user_with<B: Serialize + ?Sized>(
        &self,
        account: Uuid,
        body: &B,
    ) -> reqwest::Response {
        self.post(&format!("/v1/accounts/{account}/users"), body)
            .await
    }

    /// `PATCH /v1/users/{user}` with `body` (enabled, password, limits,
    /// policy, rules, …).
    pub async fn patch_user<B: Serialize + ?Sized>(
        &self,
        user: impl Display,
        body: &B,
    ) -> reqwest::Response {
        self.patch(&format!("/v1/users/{user}"), body).await
    }

    async fn send_json<B: Serialize + ?Sized>(
        &self,
        method: reqwest::Method,
        path: &str,
        body: &B,
    ) -> reqwest::Response {
        self.request(method, path).json(body).send().await.unwrap()
    }
}

impl Stack {
    /// The control API as the operator.
    pub fn admin(&self) -> AdminApi<'_> {
        AdminApi {
            http: &self.http,
            api_url: &self.api_url,
        }
    }

    /// `GET path` on the control API with the admin token, as JSON.
    pub async fn admin_get_json(&self, path: &str) -> serde_json::Value {
        self.admin().get_json(path).await
    }

    /// `GET path` on the control API with the bearer `key`, as JSON.
    pub async fn get_json_as(&self, key: &str, path: &str) -> serde_json::Value {
        self.http
            .get(self.api(path))
            .bearer_auth(key)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap()
    }

    pub async fn create_account(&self, name: &str) -> Uuid {
        let r = self
            .admin()
            .post("/v1/accounts", &json!({ "name": name }))
            .await;
        created_id(r, "create account").await
    }

    /// An API key for `account`, minted by the operator: (key, key id).
    pub async fn account_key(&self, account: Uuid) -> (String, Uuid) {
        let r = self
            .admin()
            .post(
                &format!("/v1/accounts/{account}/api-keys"),
                &json!({ "name": "customer" }),
            )
            .await;
        assert_eq!(r.status(), 201, "mint an account key");
        let body: serde_json::Value = r.json().await.unwrap();
        (
            body["key"].as_str().unwrap().to_owned(),
            body["id"].as_str().unwrap().parse().unwrap(),
        )
    }

    /// Replaces an account's entitlements (operator), asserting success.
    pub async fn set_entitlements(&self, account: Uuid, entitlements: serde_json::Value) {
        let r = self
            .admin()
            .put(
                &format!("/v1/accounts/{account}/entitlements"),
                &entitlements,
            )
            .await;
        let status = r.status();
        assert_eq!(
            status,
            200,
            "entitlements: {}",
            r.text().await.unwrap_or_default()
        );
    }

    /// Lets an account allow-list loopback networks as wide as a /8: the
    /// test clients all come from 127.0.0.1.
    pub async fn allow_loopback_allowlists(&self, account: Uuid) {
        self.set_entitlements(
            account,
            json!({"allowlist": {"min_prefix_v4": 8, "special_ranges": true}}),
        )
        .await;
    }

    pub async fn create_user(&self, account: Uuid, username: &str, password: &str) -> Uuid {
        let r = self
            .admin()
            .create_user_with(
                account,
                &json!({ "username": username, "password": password }),
            )
            .await;
        created_id(r, "create user").await
    }

    /// A source that answers all four provenance questions: datacenter
    /// addresses we own. Created once per stack, on first use.
    pub async fn complete_dc_source(&self) -> Uuid {
        if let Some(id) = *self.dc_source.lock().unwrap() {
            return id;
        }
        let id = self
            .create_source(json!({
                "name": "proxynet-tests-dc",
                "source_type": "dc",
                "channel": "owned",
                "supplier": "proxynet-tests",
                "agreement_ref": "internal: test racks",
                "notice_description": "addresses of our own hosts; no third party involved",
                "opt_out": "not applicable: operator-owned hardware",
                "liable_party": "proxynet-tests operator",
                "abuse_contact": "abuse@example.test",
                "countries": ["DE", "US", "FR"],
            }))
            .await;
        *self.dc_source.lock().unwrap() = Some(id);
        id
    }

    /// `POST /v1/sources` with `body`; the new source's id.
    pub async fn create_source(&self, body: serde_json::Value) -> Uuid {
        let r = self.admin().post("/v1/sources", &body).await;
        created_id(r, "create source").await
    }

    pub async fn enrollment_token(&self, name: &str) -> String {
        let source = self.complete_dc_source().await;
        self.enrollment_token_for(name, source, "DE").await
    }

    pub async fn enrollment_token_for(&self, name: &str, source: Uuid, country: &str) -> String {
        self.enrollment_token_granting(name, source, country, false)
            .await
    }

    /// A token whose exit the operator declares behind NAT (or not).
    pub async fn enrollment_token_granting(
        &self,
        name: &str,
        source: Uuid,
        country: &str,
        behind_nat: bool,
    ) -> String {
        let r = self
            .admin()
            .post(
                "/v1/enrollment-tokens",
                &json!({ "name": name, "source_id": source, "country": country, "behind_nat": behind_nat }),
            )
            .await;
        assert_eq!(r.status(), 201, "create enrollment token");
        r.json::<serde_json::Value>().await.unwrap()["token"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// The account's ledger grouped by user.
    pub async fn usage_by_user(&self, account: Uuid) -> Vec<serde_json::Value> {
        self.admin()
            .get(&format!("/v1/accounts/{account}/usage?group_by=user"))
            .await
            .json::<Vec<serde_json::Value>>()
            .await
            .unwrap_or_default()
    }

    /// Waits until the ledger shows exactly `up`/`down` bytes for `user`
    /// (failing at once if it ever shows more).
    pub async fn wait_for_usage(&self, account: Uuid, user: Uuid, up: u64, down: u64) {
        eventually(
            &format!("ledger to show {up}/{down} bytes for {user}"),
            Duration::from_secs(20),
            || async {
                let rows = self.usage_by_user(account).await;
                let row = rows.iter().find(|r| r["user_id"] == user.to_string())?;
                let seen = (row["bytes_up"].as_u64()?, row["bytes_down"].as_u64()?);
                assert!(
                    seen.0 <= up && seen.1 <= down,
                    "over-counted: {seen:?} > {up}/{down}"
                );
                (seen == (up, down)).then_some(())
            },
        )
        .await;
    }
}

/// The `id` of what a `201 Created` answer made; anything else fails the
/// test, naming `what` and the body.
pub async fn created_id(r: reqwest::Response, what: &str) -> Uuid {
    let status = r.status();
    let body = r.text().await.unwrap();
    assert_eq!(status, 201, "{what}: {body}");
    serde_json::from_str::<serde_json::Value>(&body).unwrap()["id"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}
