//! Withdrawal from the exit side: the person whose device or line this exit
//! is can take it out of the network without anyone's cooperation.
//!
//! `exit-agent opt-out` (or `POST /opt-out` on the local admin listener)
//! stops the agent from taking tunnels at once, ends the open ones, records
//! the withdrawal in the state file (so it survives restarts) and tells the
//! control plane, which revokes the exit's consent and marks it withdrawn.
//! If the control plane cannot be reached the agent keeps refusing tunnels
//! locally and retries until the withdrawal is acknowledged.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use crate::control::ControlClient;
use crate::state::{AgentState, OptOutState, StateError};
use crate::tunnel::TunnelContext;

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// The withdrawal as the state file has it.
pub(crate) fn status(ctx: &TunnelContext) -> Option<OptOutState> {
    ctx.opt_out.lock().ok().and_then(|s| s.clone())
}

/// Withdraws the exit: refuse new tunnels, end open ones, persist. Idempotent.
pub(crate) fn withdraw(ctx: &TunnelContext) -> Result<OptOutState, StateError> {
    ctx.withdrawn.store(true, Ordering::Relaxed);
    ctx.beat_now.notify_one();
    ctx.cut_token().cancel();
    let mut current = ctx.opt_out.lock().map_err(|_| StateError::Poisoned)?;
    if let Some(existing) = current.as_ref() {
        return Ok(existing.clone());
    }
    let state = OptOutState {
        requested_at: now_unix(),
        acknowledged_at: None,
    };
    persist(ctx, Some(state.clone()))?;
    *current = Some(state.clone());
    tracing::warn!(exit = %ctx.identity.exit_id, "exit withdrawn by its owner: no more tunnels");
    Ok(state)
}

/// Undoes this host's own withdrawal (the owner agreed again). The control
/// plane keeps the exit withdrawn until an operator reinstates it with a
/// fresh consent record, so both sides must agree before tunnels flow.
pub(crate) fn undo(ctx: &TunnelContext) -> Result<(), StateError> {
    let mut current = ctx.opt_out.lock().map_err(|_| StateError::Poisoned)?;
    if current.is_none() {
        return Ok(());
    }
    persist(ctx, None)?;
    *current = None;
    if let Ok(mut cut) = ctx.cut_all.lock() {
        *cut = tokio_util::sync::CancellationToken::new();
    }
    ctx.withdrawn.store(false, Ordering::Relaxed);
    ctx.beat_now.notify_one();
    tracing::warn!(exit = %ctx.identity.exit_id, "the owner undid the withdrawal: tunnels resume once the operator reinstates the exit");
    Ok(())
}

fn persist(ctx: &TunnelContext, opted_out: Option<OptOutState>) -> Result<(), StateError> {
    let state = AgentState {
        opted_out,
        ..ctx.identity.clone()
    };
    state.save(&ctx.config.state_file)
}

/// Tells the control plane until it has recorded the withdrawal.
pub(crate) async fn acknowledge_until_done(
    ctx: Arc<TunnelContext>,
    control: ControlClient,
    stop: proxynet_common::tasks::Stop,
) {
    let mut backoff = Duration::from_millis(500);
    loop {
        let pending = status(&ctx).is_some_and(|s| s.acknowledged_at.is_none());
        if pending {
            let Some(answer) = stop
                .run_until_cancelled(control.opt_out(&ctx.identity))
                .await
            else {
                return;
            };
            match answer {
                Ok(()) => {
                    let acked = OptOutState {
                        acknowledged_at: Some(now_unix()),
                        ..status(&ctx).unwrap_or(OptOutState {
                            requested_at: now_unix(),
                            acknowledged_at: None,
                        })
                    };
                    if let Err(e) = persist(&ctx, Some(acked.clone())) {
                        tracing::error!(error = %e, "withdrawal acknowledged but not saved");
                    }
                    if let Ok(mut current) = ctx.opt_out.lock() {
                        *current = Some(acked);
                    }
                    tracing::info!("the control plane recorded the withdrawal");
                    backoff = Duration::from_millis(500);
                }
                Err(e) => {
                    tracing::warn!(error = %e, "withdrawal not yet acknowledged; retrying");
                    backoff = (backoff * 2).min(Duration::from_secs(10));
                }
            }
        }
        let wait = if pending {
            backoff
        } else {
            Duration::from_millis(500)
        };
        if stop
            .run_until_cancelled(tokio::time::sleep(wait))
            .await
            .is_none()
        {
            return;
        }
    }
}

/// Sends `method` to the running agent's `/opt-out` with the admin token;
/// `Ok(None)` when no agent answers there.
async fn ask_running_agent(
    config: &crate::Config,
    method: reqwest::Method,
) -> Result<Option<String>, String> {
    let token = crate::admin_token::read(&config.admin_token_path())
        .map_err(|e| format!("cannot read the admin token: {e}"))?;
    // Dial it on loopback (an unspecified bind answers there too): the
    // agent refuses state changes whose Host is not a loopback address.
    let mut addr = config.admin_listen;
    if addr.ip().is_unspecified() {
        addr.set_ip(if addr.is_ipv4() {
            std::net::Ipv4Addr::LOCALHOST.into()
        } else {
            std::net::Ipv6Addr::LOCALHOST.into()
        });
    }
    let url = format!("http://{addr}/opt-out");
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| e.to_string())?;
    let mut request = client.request(method, &url);
    if let Some(token) = &token {
        request = request.bearer_auth(token.expose());
    }
    match request.send().await {
        Ok(response) if response.status().is_success() => {
            Ok(Some(response.text().await.unwrap_or_default()))
        }
        Ok(response) => Err(format!(
            "the running agent at {url} refused: {} {}",
            response.status(),
            response.text().await.unwrap_or_default().trim()
        )),
        Err(_) => Ok(None),
    }
}

/// `exit-agent opt-in`: undoes this host's withdrawal, through the running
/// agent or, if none answers, in the state file.
pub async fn run_opt_in_cli(config: &crate::Config) -> Result<String, String> {
    if let Some(body) = ask_running_agent(config, reqwest::Method::DELETE).await? {
        return Ok(format!("the running agent undid the withdrawal: {body}"));
    }
    let mut state = AgentState::load(&config.state_file)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| {
            format!(
                "not enrolled: no state file at {}",
                config.state_file.display()
            )
        })?;
    state.opted_out = None;
    state.save(&config.state_file).map_err(|e| e.to_string())?;
    Ok(
        "withdrawal undone on this host; tunnels resume once the operator reinstates the exit"
            .into(),
    )
}

/// `exit-agent opt-out`: asks the running agent (its admin listener, with
/// the admin token); if none answers, records the withdrawal in the state
/// file itself and tells the control plane once (a later agent start keeps
/// retrying).
pub async fn run_cli(config: &crate::Config) -> Result<String, String> {
    match ask_running_agent(config, reqwest::Method::POST).await {
        Ok(Some(body)) => return Ok(format!("the running agent withdrew this exit: {body}")),
        Ok(None) => {}
        // Withdrawing is the owner's right: refused by the running agent
        // (no readable token, say), it is still recorded on disk and told
        // to the control plane below.
        Err(refusal) => {
            eprintln!("exit-agent opt-out: {refusal}; recording the withdrawal on disk")
        }
    }
    // No agent running here: do it on disk.
    let mut state = AgentState::load(&config.state_file)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| {
            format!(
                "not enrolled: no state file at {}",
                config.state_file.display()
            )
        })?;
    if state.opted_out.is_none() {
        state.opted_out = Some(OptOutState {
            requested_at: now_unix(),
            acknowledged_at: None,
        });
        state.save(&config.state_file).map_err(|e| e.to_string())?;
    }
    let control = ControlClient::new(&config.control_api).map_err(|e| e.to_string())?;
    match control.opt_out(&state).await {
        Ok(()) => {
            state.opted_out = Some(OptOutState {
                acknowledged_at: Some(now_unix()),
                ..state.opted_out.clone().unwrap_or(OptOutState {
                    requested_at: now_unix(),
                    acknowledged_at: None,
                })
            });
            state.save(&config.state_file).map_err(|e| e.to_string())?;
            Ok("withdrawn and recorded by the control plane".into())
        }
        Err(e) => Ok(format!(
            "withdrawn locally (the agent will carry nothing); the control plane was not reached ({e}): the agent retries when it runs"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tunnel::tests::context;

    #[tokio::test]
    async fn a_withdrawal_cuts_open_tunnels_persists_and_is_idempotent() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        let open_tunnel = ctx.cut_token();
        let first = withdraw(&ctx).unwrap();
        assert!(ctx.withdrawn.load(Ordering::Relaxed));
        assert!(open_tunnel.is_cancelled());
        assert_eq!(first.acknowledged_at, None);
        let on_disk = AgentState::load(&ctx.config.state_file).unwrap().unwrap();
        assert_eq!(on_disk.exit_id, ctx.identity.exit_id);
        assert_eq!(
            on_disk.opted_out.map(|s| s.requested_at),
            Some(first.requested_at)
        );
        // Withdrawing again keeps the first request.
        let again = withdraw(&ctx).unwrap();
        assert_eq!(again.requested_at, first.requested_at);
        assert_eq!(
            status(&ctx).map(|s| s.requested_at),
            Some(first.requested_at)
        );
    }

    #[tokio::test]
    async fn undoing_a_withdrawal_clears_it_and_gives_new_tunnels_a_fresh_cut() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        withdraw(&ctx).unwrap();
        undo(&ctx).unwrap();
        assert!(!ctx.withdrawn.load(Ordering::Relaxed));
        assert!(status(&ctx).is_none());
        assert!(!ctx.cut_token().is_cancelled());
        let on_disk = AgentState::load(&ctx.config.state_file).unwrap().unwrap();
        assert!(on_disk.opted_out.is_none());
    }

    #[tokio::test]
    async fn undoing_when_nothing_was_withdrawn_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let ctx = context(dir.path());
        undo(&ctx).unwrap();
        assert!(AgentState::load(&ctx.config.state_file).unwrap().is_none());
    }
}
