//! Talking to the control-api: enrollment once, heartbeats forever.

use proxynet_protocol::secret::Secret;
use proxynet_protocol::store::SuperproxyRecord;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::time::Duration;
use uuid::Uuid;

use crate::state::AgentState;

#[derive(Clone)]
pub struct ControlClient {
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
    hostname: String,
    agent_version: &'static str,
}

#[derive(Deserialize)]
struct EnrollResponse {
    exit_id: Uuid,
    credential: Secret,
}

#[derive(Serialize)]
struct HeartbeatRequest {
    draining: bool,
    active_tunnels: u64,
}

#[derive(Debug, Clone, Deserialize)]
pub struct HeartbeatReply {
    pub heartbeat_interval_ms: u64,
    pub superproxies: Vec<SuperproxyRecord>,
}

#[derive(Deserialize)]
struct Problem {
    detail: Option<String>,
}

impl ControlClient {
    pub fn new(base: &str) -> Result<Self, ControlError> {
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

    pub async fn enroll(
        &self,
        token: &Secret,
        egress_ips: &[IpAddr],
    ) -> Result<AgentState, ControlError> {
        let url = format!("{}/v1/agent/enroll", self.base);
        let hostname = std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_owned())
            .unwrap_or_default();
        let response = self
            .http
            .post(&url)
            .json(&EnrollRequest {
                token,
                egress_ips,
                hostname,
                agent_version: env!("CARGO_PKG_VERSION"),
            })
            .send()
            .await
            .map_err(|source| ControlError::Unreachable {
                url: url.clone(),
                source,
            })?;
        if !response.status().is_success() {
            return Err(ControlError::Refused(format!(
                "enrollment refused ({}): {}",
                response.status(),
                problem_detail(response).await
            )));
        }
        let body: EnrollResponse = response
            .json()
            .await
            .map_err(|source| ControlError::Unreachable { url, source })?;
        Ok(AgentState {
            exit_id: body.exit_id,
            credential: body.credential,
        })
    }

    pub async fn heartbeat(
        &self,
        state: &AgentState,
        draining: bool,
        active_tunnels: u64,
    ) -> Result<HeartbeatReply, ControlError> {
        let url = format!("{}/v1/agent/exits/{}/heartbeat", self.base, state.exit_id);
        let response = self
            .http
            .post(&url)
            .bearer_auth(state.credential.expose())
            .json(&HeartbeatRequest {
                draining,
                active_tunnels,
            })
            .send()
            .await
            .map_err(|source| ControlError::Unreachable {
                url: url.clone(),
                source,
            })?;
        if !response.status().is_success() {
            return Err(ControlError::Refused(format!(
                "heartbeat refused ({}): {}",
                response.status(),
                problem_detail(response).await
            )));
        }
        response
            .json()
            .await
            .map_err(|source| ControlError::Unreachable { url, source })
    }
}

async fn problem_detail(response: reqwest::Response) -> String {
    match response.json::<Problem>().await {
        Ok(Problem { detail: Some(d) }) => d,
        _ => "no detail".to_owned(),
    }
}
