//! Talking to the control-api: enrollment once, heartbeats forever.

use proxynet_common::egress::Cidr;
use proxynet_common::secret::Secret;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::time::Duration;
use uuid::Uuid;

use crate::state::AgentState;

#[derive(Clone)]
pub(crate) struct ControlClient {
    http: reqwest::Client,
    base: String,
}

#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    #[error("control-api unreachable at {url}: {source}")]
    Unreachable { url: String, source: reqwest::Error },
    #[error("{0}")]
    Refused(String),
}

#[derive(Serialize)]
struct EnrollRequest<'a> {
    token: &'a Secret,
    egress_ips: &'a [IpAddr],
    /// Left out when empty: a control-api older than prefixes refuses
    /// unknown fields, and an exit without prefixes enrolls there still.
    #[serde(skip_serializing_if = "<[Cidr]>::is_empty")]
    egress_prefixes: &'a [Cidr],
    hostname: String,
    agent_version: &'static str,
    /// Left out unless set, like the prefixes: an older control-api refuses
    /// the field it does not know.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    behind_nat: bool,
    /// An upstream exit's partner gateway (never its credentials).
    #[serde(skip_serializing_if = "Option::is_none")]
    upstream: Option<&'a UpstreamDeclaration>,
}

/// What an upstream exit tells the control plane at enrollment: where its
/// partner's gateway is, what it serves and which targeting keys the
/// partner's username template carries.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct UpstreamDeclaration {
    pub scheme: &'static str,
    pub host: String,
    pub port: u16,
    pub countries: Vec<String>,
    pub keys: Vec<&'static str>,
}

#[derive(Deserialize)]
struct EnrollResponse {
    exit_id: Uuid,
    credential: Secret,
}

pub(crate) use proxynet_wire::heartbeat::HeartbeatReply;
use proxynet_wire::heartbeat::HeartbeatRequest;

/// What this agent tells the control plane about itself in each beat.
#[derive(Debug, Clone, Default)]
pub(crate) struct BeatInfo {
    pub admin_addrs: Vec<std::net::SocketAddr>,
    pub internal_targets: bool,
}

#[derive(Deserialize)]
struct Problem {
    detail: Option<String>,
}

impl ControlClient {
    pub(crate) fn new(base: &str) -> Result<Self, ControlError> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .connect_timeout(Duration::from_secs(5))
            .build()
            .map_err(|source| ControlError::Unreachable {
                url: base.to_owned(),
                source,
            })?;
        Ok(Self {
            http,
            base: base.trim_end_matches('/').to_owned(),
        })
    }

    pub(crate) async fn enroll(
        &self,
        token: &Secret,
        egress_ips: &[IpAddr],
        egress_prefixes: &[Cidr],
        behind_nat: bool,
        upstream: Option<&UpstreamDeclaration>,
    ) -> Result<AgentState, ControlError> {
        let hostname = std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default();
        let request = EnrollRequest {
            token,
            egress_ips,
            egress_prefixes,
            hostname,
            agent_version: env!("CARGO_PKG_VERSION"),
            behind_nat,
            upstream,
        };
        let body: EnrollResponse = self
            .post("/v1/agent/enroll", None, &request, "enrollment")
            .await?;
        Ok(AgentState {
            exit_id: body.exit_id,
            credential: body.credential,
            opted_out: None,
        })
    }

    pub(crate) async fn heartbeat(
        &self,
        state: &AgentState,
        draining: bool,
        active_tunnels: u64,
        info: &BeatInfo,
    ) -> Result<HeartbeatReply, ControlError> {
        let path = format!("/v1/agent/exits/{}/heartbeat", state.exit_id);
        let request = HeartbeatRequest {
            draining,
            active_tunnels,
            admin_addrs: info.admin_addrs.clone(),
            internal_targets: info.internal_targets,
        };
        self.post(&path, Some(&state.credential), &request, "heartbeat")
            .await
    }

    /// Reports what the reflectors saw from this exit's egress addresses;
    /// the control-api's verdict on its declared egress comes back.
    pub(crate) async fn report_egress(
        &self,
        state: &AgentState,
        report: &proxynet_wire::reflector::EgressReport,
    ) -> Result<serde_json::Value, ControlError> {
        let path = format!("/v1/agent/exits/{}/egress", state.exit_id);
        self.post(&path, Some(&state.credential), report, "egress report")
            .await
    }

    /// Tells the control plane the owner withdrew this exit (idempotent).
    pub(crate) async fn opt_out(&self, state: &AgentState) -> Result<(), ControlError> {
        let path = format!("/v1/agent/exits/{}/opt-out", state.exit_id);
        let _: serde_json::Value = self
            .post(
                &path,
                Some(&state.credential),
                &serde_json::json!({"reason": "withdrawn by the exit's owner (exit-agent opt-out)"}),
                "opt-out",
            )
            .await?;
        Ok(())
    }

    /// POSTs JSON and decodes the JSON answer; a refusal carries the API's
    /// problem detail, so the operator reads why (token reused, expired, ...).
    async fn post<T: Serialize, R: for<'de> Deserialize<'de>>(
        &self,
        path: &str,
        credential: Option<&Secret>,
        body: &T,
        what: &str,
    ) -> Result<R, ControlError> {
        let url = format!("{}{path}", self.base);
        let mut request = self.http.post(&url).json(body);
        if let Some(credential) = credential {
            request = request.bearer_auth(credential.expose());
        }
        let unreachable = |source| ControlError::Unreachable {
            url: url.clone(),
            source,
        };
        let response = request.send().await.map_err(unreachable)?;
        if !response.status().is_success() {
            let status = response.status();
            return Err(ControlError::Refused(format!(
                "{what} refused ({status}): {}",
                problem_detail(response).await
            )));
        }
        response.json().await.map_err(unreachable)
    }
}

async fn problem_detail(response: reqwest::Response) -> String {
    match response.json::<Problem>().await {
        Ok(Problem { detail: Some(d) }) => d,
        _ => "no detail".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_url_loses_its_trailing_slashes() {
        let client = ControlClient::new("https://control.example//").unwrap();
        assert_eq!(client.base, "https://control.example");
    }

    #[test]
    fn an_enrollment_request_carries_the_token_and_egress_ips() {
        let token = Secret::new("pn_enroll_abc");
        let egress_ips: [IpAddr; 1] = ["192.0.2.1".parse().unwrap()];
        let body = serde_json::to_value(EnrollRequest {
            token: &token,
            egress_ips: &egress_ips,
            egress_prefixes: &[],
            hostname: "exit-1".into(),
            agent_version: "0.1.0",
            behind_nat: false,
            upstream: None,
        })
        .unwrap();
        assert_eq!(
            body,
            serde_json::json!({
                "token": "pn_enroll_abc",
                "egress_ips": ["192.0.2.1"],
                "hostname": "exit-1",
                "agent_version": "0.1.0",
            })
        );
    }

    #[test]
    fn an_enrollment_request_declares_nat_only_when_behind_it() {
        let token = Secret::new("pn_enroll_abc");
        let egress_ips: [IpAddr; 1] = ["10.0.0.7".parse().unwrap()];
        let request = |behind_nat| {
            serde_json::to_value(EnrollRequest {
                token: &token,
                egress_ips: &egress_ips,
                egress_prefixes: &[],
                hostname: "home-router".into(),
                agent_version: "0.1.0",
                behind_nat,
                upstream: None,
            })
            .unwrap()
        };
        assert_eq!(request(true)["behind_nat"], true);
        assert!(request(false).get("behind_nat").is_none());
    }

    #[test]
    fn an_enrollment_request_declares_the_egress_prefixes_it_has() {
        let token = Secret::new("pn_enroll_abc");
        let prefixes: [Cidr; 1] = ["2001:db8:1:2::/64".parse().unwrap()];
        let body = serde_json::to_value(EnrollRequest {
            token: &token,
            egress_ips: &[],
            egress_prefixes: &prefixes,
            hostname: "exit-1".into(),
            agent_version: "0.1.0",
            behind_nat: false,
            upstream: None,
        })
        .unwrap();
        assert_eq!(body["egress_ips"], serde_json::json!([]));
        assert_eq!(
            body["egress_prefixes"],
            serde_json::json!(["2001:db8:1:2::/64"])
        );
    }
}
