//! The agent's enrolled identity on disk.

use proxynet_common::secret::Secret;
use serde::{Deserialize, Serialize};
use std::path::Path;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct AgentState {
    pub exit_id: Uuid,
    pub credential: Secret,
    /// Set when the person behind this exit withdrew it (`exit-agent
    /// opt-out`): from then on the agent carries nothing, across restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opted_out: Option<OptOutState>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub(crate) struct OptOutState {
    /// Unix seconds when the owner withdrew.
    pub requested_at: i64,
    /// Unix seconds when the control plane recorded it (`None`: not yet;
    /// the agent keeps retrying).
    pub acknowledged_at: Option<i64>,
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot read state file {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("state file {path} is corrupt: {source}")]
    Corrupt {
        path: String,
        source: serde_json::Error,
    },
    #[error("cannot write state file {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("the agent's state lock is poisoned")]
    Poisoned,
}

impl AgentState {
    pub(crate) fn load(path: &Path) -> Result<Option<Self>, StateError> {
        let bytes = match std::fs::read(path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(StateError::Read {
                    path: path.display().to_string(),
                    source,
                })
            }
        };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|source| StateError::Corrupt {
                path: path.display().to_string(),
                source,
            })
    }

    /// Writes atomically (temp file + rename) with owner-only permissions.
    pub(crate) fn save(&self, path: &Path) -> Result<(), StateError> {
        let err = |source| StateError::Write {
            path: path.display().to_string(),
            source,
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let json = serde_json::to_vec_pretty(self).map_err(|e| err(std::io::Error::other(e)))?;
        let tmp = path.with_extension("tmp");
        {
            use std::io::Write;
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create(true).truncate(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt;
                options.mode(0o600);
            }
            let mut file = options.open(&tmp).map_err(err)?;
            file.write_all(&json).map_err(err)?;
            file.sync_all().map_err(err)?;
        }
        std::fs::rename(&tmp, path).map_err(err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn enrolled() -> AgentState {
        AgentState {
            exit_id: Uuid::new_v4(),
            credential: Secret::new("exit-credential"),
            opted_out: None,
        }
    }

    #[test]
    fn a_saved_state_loads_back_with_its_withdrawal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("nested").join("exit-agent.json");
        let mut state = enrolled();
        state.opted_out = Some(OptOutState {
            requested_at: 1_700_000_000,
            acknowledged_at: None,
        });
        state.save(&path).unwrap();
        let loaded = AgentState::load(&path).unwrap().unwrap();
        assert_eq!(loaded.exit_id, state.exit_id);
        assert_eq!(loaded.credential, state.credential);
        let opted_out = loaded.opted_out.unwrap();
        assert_eq!(opted_out.requested_at, 1_700_000_000);
        assert_eq!(opted_out.acknowledged_at, None);
        assert!(!path.with_extension("tmp").exists());
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).unwrap().permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn no_state_file_means_not_enrolled() {
        let dir = tempfile::tempdir().unwrap();
        let loaded = AgentState::load(&dir.path().join("exit-agent.json")).unwrap();
        assert!(loaded.is_none());
    }

    #[test]
    fn a_corrupt_state_file_is_reported_and_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("exit-agent.json");
        std::fs::write(&path, b"{not json").unwrap();
        match AgentState::load(&path) {
            Err(StateError::Corrupt { path: reported, .. }) => {
                assert_eq!(reported, path.display().to_string())
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(std::fs::read(&path).unwrap(), b"{not json");
    }

    #[test]
    fn a_state_without_a_withdrawal_leaves_the_field_out_and_old_files_load() {
        let state = enrolled();
        let json = serde_json::to_value(&state).unwrap();
        assert!(json.get("opted_out").is_none(), "{json}");
        assert_eq!(json["credential"], "exit-credential");
        // A state file written before withdrawals existed.
        let old = format!(r#"{{"exit_id":"{}","credential":"c"}}"#, state.exit_id);
        let parsed: AgentState = serde_json::from_str(&old).unwrap();
        assert_eq!(parsed.exit_id, state.exit_id);
        assert!(parsed.opted_out.is_none());
    }
}
