//! Hand-built parts for the unit tests of the stages: a Redis that is away
//! and an admission over it (from `crate::admission::test_support`), users
//! and the [`Client`] the authorize stage makes of them, and a subscriber
//! that keeps the log lines written while it is the thread's default.

use proxynet_store::UserRecord;
use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};
use uuid::Uuid;

use crate::credentials::Verified;
use crate::request::Client;

use super::authenticate::LoggedIn;
use super::authorize::authorize;

pub(crate) use crate::admission::test_support::{admission, keys, refused, store_away};

/// An enabled user `username` of an account of its own, with no limits,
/// quotas or policies: change its public fields for more.
pub(crate) fn user(username: &str) -> UserRecord {
    serde_json::from_value(serde_json::json!({
        "id": Uuid::new_v4(),
        "account_id": Uuid::new_v4(),
        "username": username,
        "password_hash": "$argon2id$v=19$m=19456,t=2,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA",
        "enabled": true,
        "version": 1,
    }))
    .expect("a user record")
}

/// The client the authorize stage makes of `record` logged in as `login`
/// (the username with its grammar, e.g. `alice-country-de`).
pub(crate) fn client(record: UserRecord, login: &str) -> Client {
    let request = proxynet_wire::username::parse(login).expect("a valid username");
    let logged_in = LoggedIn {
        request,
        verified: Verified {
            record: Arc::new(record),
            credential_digest: [7; 32],
        },
        network: None,
    };
    match authorize(logged_in) {
        Ok(client) => client,
        Err(e) => panic!("not authorized: {e}"),
    }
}

/// A client's address.
pub(crate) fn peer() -> SocketAddr {
    SocketAddr::from(([198, 51, 100, 7], 40_000))
}

/// One event as it was written: its target and its fields, each as text
/// (a string as is, anything else as `Debug` shows it; `message` too).
#[derive(Debug, Clone)]
pub(crate) struct Line {
    pub(crate) target: String,
    pub(crate) fields: BTreeMap<String, String>,
}

impl Line {
    pub(crate) fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

/// Keeps every event written while it is the thread's subscriber
/// ([`Capture::during`]).
#[derive(Clone, Default)]
pub(crate) struct Capture {
    lines: Arc<Mutex<Vec<Line>>>,
}

impl Capture {
    /// Runs `f` with this capture as the thread's subscriber.
    pub(crate) fn during<R>(&self, f: impl FnOnce() -> R) -> R {
        tracing::subscriber::with_default(self.clone(), f)
    }

    /// The lines written on `target` so far.
    pub(crate) fn lines(&self, target: &str) -> Vec<Line> {
        let lines = self.lines.lock().expect("capture lock");
        lines
            .iter()
            .filter(|l| l.target == target)
            .cloned()
            .collect()
    }
}

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        self.0.insert(field.name().to_owned(), format!("{value:?}"));
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }

    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }

    fn record(&self, _: &Id, _: &Record<'_>) {}

    fn record_follows_from(&self, _: &Id, _: &Id) {}

    fn event(&self, event: &Event<'_>) {
        let mut fields = BTreeMap::new();
        event.record(&mut Fields(&mut fields));
        let line = Line {
            target: event.metadata().target().to_owned(),
            fields,
        };
        self.lines.lock().expect("capture lock").push(line);
    }

    fn enter(&self, _: &Id) {}

    fn exit(&self, _: &Id) {}
}
