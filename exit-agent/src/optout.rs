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
pub fn status(ctx: &TunnelContext) -> Option<OptOutState> {
    ctx.opt_out.lock().ok().and_then(|s| s.clone())
}

/// Withdraws the exit: refuse new tunnels, end open ones, persist. Idempotent.
pub fn withdraw(ctx: &TunnelContext) -> Result<OptOutState, StateError> {
    ctx.withdrawn.store(true, Ordering::Relaxed);
    ctx.cut_all.cancel();
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

fn persist(ctx: &TunnelContext, opted_out: Option<OptOutState>) -> Result<(), StateError> {
    let state = AgentState {
        opted_out,
        ..ctx.identity.clone()
    };
    state.save(&ctx.config.state_file)
}

/// Tells the control plane until it has recorded the withdrawal.
pub async fn acknowledge_until_done(ctx: Arc<TunnelContext>, control: ControlClient) {
    let mut backoff = Duration::from_millis(500);
    loop {
        let pending = status(&ctx).is_some_and(|s| s.acknowledged_at.is_none());
        if pending {
            match control.opt_out(&ctx.identity).await {
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
        tokio::time::sleep(if pending {
            backoff
        } else {
            Duration::from_millis(500)
        })
        .await;
    }
}

/// `exit-agent opt-out`: asks the running agent (its admin listener); if
/// none answers, records the withdrawal in the state file itself and tells
/// the control plane once (a later agent start keeps retrying).
pub async fn run_cli(config: &crate::Config) -> Result<String, String> {
    let url = format!("http://{}/opt-out", config.admin_listen);
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(5))
        .build()
        .map_err(|e| e.to_string())?;
    if let Ok(response) = client.post(&url).send().await {
        if response.status().is_success() {
            let body = response.text().await.unwrap_or_default();
            return Ok(format!("the running agent withdrew this exit: {body}"));
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
