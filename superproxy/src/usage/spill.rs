//! The spill file: usage batches that could not reach Redis, kept on disk
//! (one append-only JSON-lines file per superproxy instance, fsync'd per
//! append) and replayed oldest first when Redis answers again, by this
//! instance or the next one started on the same directory.

use std::path::PathBuf;
use uuid::Uuid;

use super::collect::Pending;

/// The spill directory: one append-only JSON-lines file per superproxy
/// instance (`usage-<id>.jsonl`), each line a [`Pending`] batch.
pub(super) struct Spill {
    pub(super) dir: PathBuf,
}

impl Spill {
    pub(super) async fn append(
        &self,
        superproxy: Uuid,
        batches: &[Pending],
    ) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        tokio::fs::create_dir_all(&self.dir).await?;
        let mut text = String::new();
        for b in batches {
            text.push_str(&serde_json::to_string(b).map_err(std::io::Error::other)?);
            text.push('\n');
        }
        let mut file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join(format!("usage-{superproxy}.jsonl")))
            .await?;
        file.write_all(text.as_bytes()).await?;
        file.sync_data().await
    }

    /// Sets a file aside that cannot be replayed (`<name>.bad`), so it
    /// neither blocks later flushes nor is lost: an operator can look at it.
    pub(super) async fn quarantine(&self, file: &std::path::Path, why: &str) {
        let aside = file.with_extension("jsonl.bad");
        match tokio::fs::rename(file, &aside).await {
            Ok(()) => {
                tracing::error!(file = %file.display(), aside = %aside.display(), %why, "spill file set aside: it cannot be replayed")
            }
            Err(e) => {
                tracing::error!(file = %file.display(), error = %e, %why, "cannot set an unreadable spill file aside")
            }
        }
    }

    pub(super) async fn files(&self) -> std::io::Result<Vec<PathBuf>> {
        let mut out = Vec::new();
        let mut entries = match tokio::fs::read_dir(&self.dir).await {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(e),
        };
        while let Some(entry) = entries.next_entry().await? {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.starts_with("usage-") && name.ends_with(".jsonl") {
                out.push(entry.path());
            }
        }
        out.sort();
        Ok(out)
    }
}
