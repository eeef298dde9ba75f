//! The agent's enrolled identity on disk.

use proxynet_protocol::secret::Secret;
use serde::{Deserialize, Serialize};
use std::path::Path;
use uuid::Uuid;

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AgentState {
    pub exit_id: Uuid,
    pub credential: Secret,
    /// Set when the person behind this exit withdrew it (`exit-agent
    /// opt-out`): from then on the agent carries nothing, across restarts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub opted_out: Option<OptOutState>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct OptOutState {
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
    pub fn load(path: &Path) -> Result<Option<Self>, StateError> {
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
    pub fn save(&self, path: &Path) -> Result<(), StateError> {
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
