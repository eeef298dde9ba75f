//! Exit agents: their arguments, starting them (on loopback or in a network
//! namespace), restarting them from their state files, and speaking to the
//! control API as an agent the test enrolled by hand.

use serde::Deserialize;
use serde_json::json;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use uuid::Uuid;

use super::{redis_service_addr, Stack};
use crate::process::Proc;

/// What an agent's ready line reports.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct AgentAddrs {
    pub admin: SocketAddr,
    pub exit_id: Uuid,
}

pub struct Agent {
    pub proc: Proc,
    pub addrs: AgentAddrs,
    /// Its first egress IP, or its first prefix's network when it has none.
    pub egress_ip: IpAddr,
    /// How an agent not started from [`Stack::agent_args`] starts again.
    relaunch: Option<Relaunch>,
}

/// An agent's own start: its wrapper (e.g. `ip netns exec NAME`) and its
/// arguments without the enrollment token.
struct Relaunch {
    wrapper: Vec<String>,
    args: Vec<String>,
}

impl Stack {
    /// Arguments for an agent serving `egress_ip`, with the test widening of loopback.
    pub fn agent_args(&self, egress_ip: IpAddr, state_file: &Path) -> Vec<String> {
        self.agent_args_via(&self.api_url, egress_ip, state_file)
    }

    /// The same, reaching the control-api at `api_url` (e.g. through a
    /// link the test can break).
    pub fn agent_args_via(
        &self,
        api_url: &str,
        egress_ip: IpAddr,
        state_file: &Path,
    ) -> Vec<String> {
        let mut args = self.agent_args_without_egress(api_url, state_file);
        args.splice(4..4, ["--egress-ip".to_owned(), egress_ip.to_string()]);
        args
    }

    /// [`Self::agent_args_via`] without any `--egress-ip`: the caller adds
    /// the agent's egress addresses. Starts with the control-api URL and
    /// the state file (four words).
    fn agent_args_without_egress(&self, api_url: &str, state_file: &Path) -> Vec<String> {
        vec![
            "--control-api".into(),
            api_url.to_owned(),
            "--state-file".into(),
            state_file.display().to_string(),
            "--admin-listen".into(),
            "127.0.0.1:0".into(),
            "--egress-allow".into(),
            "127.0.0.0/8".into(),
            "--drain-announce-ms".into(),
            "500".into(),
            // The test control-api speaks plain http on loopback.
            "--allow-insecure-control-api".into(),
        ]
        .into_iter()
        .chain(
            redis_service_addr()
                .map(|r| vec!["--egress-protected".into(), r])
                .unwrap_or_default(),
        )
        .chain(
            self.options
                .protected
                .iter()
                .flat_map(|a| ["--egress-protected".to_owned(), a.clone()]),
        )
        .chain(self.options.agent_args.iter().cloned())
        .collect()
    }

    pub async fn add_agent(&mut self, egress_ip: IpAddr) -> usize {
        self.add_agent_with_ips(&[egress_ip]).await
    }

    /// An agent serving several egress IPs (the first names it).
    pub async fn add_agent_with_ips(&mut self, egress_ips: &[IpAddr]) -> usize {
        let token = self
            .enrollment_token(&format!("exit-{}", egress_ips[0]))
            .await;
        self.add_agent_with_token(egress_ips, token).await
    }

    /// An agent enrolled with `token` (e.g. of a particular source).
    pub async fn add_agent_with_token(&mut self, egress_ips: &[IpAddr], token: String) -> usize {
        let api = self.api_url.clone();
        self.add_agent_via(&api, egress_ips, token).await
    }

    /// An agent that reaches the control-api at `api_url`.
    pub async fn add_agent_via(
        &mut self,
        api_url: &str,
        egress_ips: &[IpAddr],
        token: String,
    ) -> usize {
        let api_url = api_url.to_owned();
        self.add_agent_with_args(&api_url, egress_ips, token, &[])
            .await
    }

    /// [`Self::add_agent_via`] with flags of its own (e.g. `--upstream`).
    pub async fn add_agent_with_args(
        &mut self,
        api_url: &str,
        egress_ips: &[IpAddr],
        token: String,
        extra: &[String],
    ) -> usize {
        let egress_ip = egress_ips[0];
        let state = self.dir.path().join(format!("agent-{egress_ip}.json"));
        let mut args = self.agent_args_via(api_url, egress_ip, &state);
        for more in &egress_ips[1..] {
            args.extend(["--egress-ip".into(), more.to_string()]);
        }
        args.extend(extra.iter().cloned());
        args.extend(["--enroll-token".into(), token]);
        let log = self
            .options
            .log_dir
            .as_ref()
            .map(|d| d.join(format!("exit-agent-{egress_ip}.log")));
        let (proc, addrs) = crate::process::spawn_ready_logged::<AgentAddrs>(
            "exit-agent",
            &args,
            &[],
            log.as_deref(),
        )
        .await;
        self.agents.push(Agent {
            proc,
            addrs,
            egress_ip,
            relaunch: None,
        });
        self.agents.len() - 1
    }

    /// An agent on `host`'s EXIT namespace, serving `egress_ips` and
    /// `prefixes` (at least one of either), its egress policy allowing
    /// `host`'s TARGET networks, with `extra` arguments. The stack must have
    /// been started with `host.stack_options(..)`, so the agent reaches the
    /// control-api and the link listener. Its admin listener is on EXIT's
    /// loopback (not reachable from the test).
    pub async fn add_agent_in(
        &mut self,
        host: &crate::netns::ExitHost,
        egress_ips: &[IpAddr],
        prefixes: &[proxynet_common::egress::Cidr],
        extra: &[&str],
    ) -> usize {
        assert!(
            !egress_ips.is_empty() || !prefixes.is_empty(),
            "an agent needs an egress IP or prefix"
        );
        let name = host.exit.name().to_owned();
        // The operator grants NAT on the token; the agent's flag alone does not.
        let behind_nat = extra.contains(&"--behind-nat");
        let source = self.complete_dc_source().await;
        let token = self
            .enrollment_token_granting(&format!("exit-{name}"), source, "DE", behind_nat)
            .await;
        let state = self.dir.path().join(format!("agent-{name}.json"));
        let api_url = self.api_url.clone();
        let mut args = self.agent_args_without_egress(&api_url, &state);
        for ip in egress_ips {
            args.extend(["--egress-ip".into(), ip.to_string()]);
        }
        for prefix in prefixes {
            args.extend(["--egress-prefix".into(), prefix.to_string()]);
        }
        for network in host.target_networks() {
            args.extend(["--egress-allow".into(), network.to_string()]);
        }
        args.extend(extra.iter().map(|a| (*a).to_owned()));
        let wrapper = host.exit.wrapper();
        let mut first_start = args.clone();
        first_start.extend(["--enroll-token".into(), token]);
        let log = self
            .options
            .log_dir
            .as_ref()
            .map(|d| d.join(format!("exit-agent-{name}.log")));
        let (proc, addrs) = crate::process::spawn_ready_via::<AgentAddrs>(
            &wrapper,
            "exit-agent",
            &first_start,
            &[],
            log.as_deref(),
        )
        .await;
        let egress_ip = egress_ips
            .first()
            .copied()
            .unwrap_or_else(|| prefixes[0].network());
        self.agents.push(Agent {
            proc,
            addrs,
            egress_ip,
            relaunch: Some(Relaunch { wrapper, args }),
        });
        self.agents.len() - 1
    }

    /// Kills agent `i` (SIGKILL) and starts it again from its state file.
    pub async fn restart_agent(&mut self, i: usize) {
        self.agents[i].proc.kill().await;
        let egress_ip = self.agents[i].egress_ip;
        let relaunch = self.agents[i].relaunch.take();
        let (wrapper, args) = match &relaunch {
            Some(r) => (r.wrapper.clone(), r.args.clone()),
            None => {
                let state = self.dir.path().join(format!("agent-{egress_ip}.json"));
                (Vec::new(), self.agent_args(egress_ip, &state))
            }
        };
        let log = self
            .options
            .log_dir
            .as_ref()
            .map(|d| d.join(format!("exit-agent-{i}-restarted.log")));
        let (proc, addrs) = crate::process::spawn_ready_via::<AgentAddrs>(
            &wrapper,
            "exit-agent",
            &args,
            &[],
            log.as_deref(),
        )
        .await;
        self.agents[i] = Agent {
            proc,
            addrs,
            egress_ip,
            relaunch,
        };
    }

    /// An exit enrolled by the test itself, with no agent behind it
    /// (`POST /v1/agent/enroll` with a fresh token of the complete
    /// datacenter source): its id and credential, so the test can speak
    /// as its agent, honest or not ([`Self::beat_as`], [`crate::reflector`]).
    pub async fn enroll_by_hand(&self, name: &str, egress_ips: &[IpAddr]) -> (Uuid, String) {
        let token = self.enrollment_token(name).await;
        let r = self
            .http
            .post(self.api("/v1/agent/enroll"))
            .json(&json!({ "token": token, "egress_ips": egress_ips, "hostname": name }))
            .send()
            .await
            .unwrap();
        let status = r.status();
        let body: serde_json::Value = r.json().await.unwrap();
        assert_eq!(status, 201, "enroll {name}: {body}");
        (
            body["exit_id"].as_str().unwrap().parse().unwrap(),
            body["credential"].as_str().unwrap().to_owned(),
        )
    }

    /// One heartbeat as `exit`'s agent with `credential`: the status and
    /// the reply (`null` unless 200). Beats closer than a quarter interval
    /// apart are answered 429.
    pub async fn beat_as(
        &self,
        exit: Uuid,
        credential: &str,
        body: serde_json::Value,
    ) -> (u16, serde_json::Value) {
        let r = self
            .http
            .post(self.api(&format!("/v1/agent/exits/{exit}/heartbeat")))
            .bearer_auth(credential)
            .json(&body)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        let reply = if status == 200 {
            r.json().await.unwrap()
        } else {
            serde_json::Value::Null
        };
        (status, reply)
    }
}
