//! Each subcommand: the operation it calls (only those of the control API's
//! `operations()` table) and how its answer is shown.

use std::cell::Cell;
use std::io::Read;

use reqwest::Method;
use serde_json::{json, Map, Value};

use crate::cli::*;
use crate::client::{path, Client, Paging, Rows};
use crate::error::Failure;
use crate::output::{self, col, custom, fmt, Col, Fmt};

mod dedicated;

/// One invocation's client and output format.
pub(crate) struct Ctx {
    pub(crate) client: Client,
    pub(crate) output: Output,
    /// Stdin feeds at most one input.
    stdin_used: Cell<bool>,
}

type Done = Result<(), Failure>;

impl From<PageArgs> for Paging {
    fn from(p: PageArgs) -> Self {
        Paging {
            limit: p.limit,
            all: p.all,
            page_size: p.page_size,
        }
    }
}

/// How a single answer is shown in table mode.
enum View<'a> {
    /// `field  value` lines.
    Fields,
    /// A one-row table.
    Row(&'a [Col]),
}

impl Ctx {
    pub(crate) fn new(client: Client, output: Output) -> Self {
        Self {
            client,
            output,
            stdin_used: Cell::new(false),
        }
    }

    fn json(&self) -> bool {
        self.output == Output::Json
    }

    /// A list, shown as a table (or its JSON).
    async fn list(
        &self,
        p: &str,
        query: &[(String, String)],
        paging: Paging,
        cols: &[Col],
    ) -> Done {
        let rows = self.client.list(p, query, paging).await?;
        self.show_rows(&rows, cols)
    }

    fn show_rows(&self, rows: &Rows, cols: &[Col]) -> Done {
        if self.json() {
            output::print_json_text(&rows.raw)?;
        } else {
            output::print_lines(&output::table(cols, &rows.rows))?;
        }
        if rows.more {
            eprintln!(
                "(more rows than shown: --all for every row, or --limit N; {} shown)",
                rows.rows.len()
            );
        }
        Ok(())
    }

    /// A list that has no pages (the API answers it whole).
    async fn whole(&self, p: &str, query: &[(String, String)], cols: &[Col]) -> Done {
        let answer = self.client.send(Method::GET, p, query, None).await?;
        let value = answer.json()?;
        if self.json() {
            return output::print_json_text(&answer.text());
        }
        let rows = match value {
            Value::Array(rows) => rows,
            other => vec![other],
        };
        output::print_lines(&output::table(cols, &rows))
    }

    /// One request whose answer is one object.
    async fn one(
        &self,
        method: Method,
        p: &str,
        body: Option<Value>,
        view: View<'_>,
    ) -> Result<Value, Failure> {
        let answer = self
            .client
            .send(method, p, &[], body.map(crate::client::Body::Json))
            .await?;
        let value = answer.json()?;
        if self.json() {
            output::print_json_text(&answer.text())?;
        } else {
            let lines = match view {
                View::Fields => output::fields(&value),
                View::Row(cols) => output::table(cols, std::slice::from_ref(&value)),
            };
            output::print_lines(&lines)?;
        }
        Ok(value)
    }

    /// A request answered 204: a confirmation line for people, nothing for scripts.
    async fn no_content(&self, method: Method, p: &str, body: Option<Value>, said: String) -> Done {
        self.client.call(method, p, body).await?;
        if !self.json() {
            output::print_lines(&[said])?;
        }
        Ok(())
    }

    /// A value derived from an answer (not the answer itself), as JSON in both modes.
    fn derived_json(&self, v: &Value) -> Done {
        output::print_json(v)
    }

    fn take_stdin(&self, what: &str) -> Result<String, Failure> {
        if self.stdin_used.replace(true) {
            return Err(Failure::usage(format!(
                "{what}: stdin already feeds another input; give a file instead"
            )));
        }
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map_err(|e| Failure::usage(format!("{what}: reading stdin: {e}")))?;
        Ok(text)
    }

    /// A file's text, or stdin's for `-`.
    fn read_file(&self, what: &str, file: &str) -> Result<String, Failure> {
        if file == "-" {
            return self.take_stdin(what);
        }
        std::fs::read_to_string(file).map_err(|e| Failure::usage(format!("{what}: {file}: {e}")))
    }

    /// A JSON document from a file (or `-`, stdin).
    fn json_file(&self, what: &str, file: &str) -> Result<Value, Failure> {
        let text = self.read_file(what, file)?;
        parse_json(what, &text)
    }

    /// A JSON argument: inline, `@FILE`, or `-` for stdin.
    fn json_arg(&self, what: &str, arg: &str) -> Result<Value, Failure> {
        match arg.strip_prefix('@') {
            Some(file) => self.json_file(what, file),
            None if arg == "-" => self.json_file(what, "-"),
            None => parse_json(what, arg),
        }
    }

    /// The first line of stdin, for a password.
    fn password(&self) -> Result<String, Failure> {
        let text = self.take_stdin("--password-stdin")?;
        let line = text.lines().next().unwrap_or("").trim_end_matches('\r');
        if line.is_empty() {
            return Err(Failure::usage("--password-stdin: stdin held no password"));
        }
        Ok(line.to_owned())
    }
}

fn parse_json(what: &str, text: &str) -> Result<Value, Failure> {
    serde_json::from_str(text).map_err(|e| Failure::usage(format!("{what}: not JSON: {e}")))
}

/// Query pairs from optional values.
fn query(pairs: &[(&str, Option<&str>)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .filter_map(|(k, v)| v.map(|v| ((*k).to_owned(), v.to_owned())))
        .collect()
}

/// An object from optional fields (absent ones left out).
fn object(fields: Vec<(&str, Option<Value>)>) -> Value {
    let map: Map<String, Value> = fields
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v)))
        .collect();
    Value::Object(map)
}

// ---- columns ------------------------------------------------------------------

const ACCOUNTS: &[Col] = &[
    col("ID", "id"),
    col("NAME", "name"),
    col("PLAN", "plan_id"),
    fmt("CREATED", "created_at", Fmt::Time),
];

const USERS: &[Col] = &[
    col("ID", "id"),
    col("USERNAME", "username"),
    fmt("ENABLED", "enabled", Fmt::YesNo),
    col("TUNNELS", "max_concurrent_tunnels"),
    col("NEW/S", "max_new_tunnels_per_second"),
    fmt("BANDWIDTH", "bandwidth_bytes", Fmt::Bytes),
    col("PERIOD", "quota_period"),
    fmt("UPDATED", "updated_at", Fmt::Time),
];

const KEYS: &[Col] = &[
    col("ID", "id"),
    col("NAME", "name"),
    col("ACCOUNT", "account_id"),
    col("MINTED BY", "minted_by"),
    fmt("CREATED", "created_at", Fmt::Time),
    fmt("LAST USED", "last_used_at", Fmt::Time),
    fmt("REVOKED", "revoked_at", Fmt::Time),
];

const PLANS: &[Col] = &[
    col("ID", "id"),
    col("NAME", "name"),
    custom("PRICES (CENTS/GB)", |v| {
        match v.get("prices").and_then(Value::as_object) {
            Some(p) if !p.is_empty() => p
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" "),
            _ => "-".into(),
        }
    }),
];

const SOURCES: &[Col] = &[
    col("ID", "id"),
    col("NAME", "name"),
    col("TYPE", "source_type"),
    col("CHANNEL", "channel"),
    col("COUNTRIES", "countries"),
    fmt("CONSENT", "consent_required", Fmt::YesNo),
    fmt("COMPLETE", "complete", Fmt::YesNo),
    col("MISSING", "missing"),
];

/// An exit's state as an operator reads it: what keeps it out of rotation
/// first, else whether it is live (and not ejected by a superproxy).
fn exit_state(v: &Value) -> String {
    let yes = |k: &str| output::lookup(v, k).as_bool() == Some(true);
    let state = if yes("disabled") {
        "disabled"
    } else if yes("admin_draining") {
        "draining"
    } else if yes("draining") {
        "draining (agent)"
    } else if !yes("live") {
        "down"
    } else if output::lookup(v, "health.superproxies_ejecting_it").as_u64() > Some(0) {
        "ejected"
    } else {
        "live"
    };
    state.to_owned()
}

fn exit_egress(v: &Value) -> String {
    let mut all: Vec<String> = Vec::new();
    for key in ["egress_ips", "egress_prefixes"] {
        if let Some(items) = v.get(key).and_then(Value::as_array) {
            all.extend(items.iter().filter_map(Value::as_str).map(str::to_owned));
        }
    }
    if all.is_empty() {
        "-".into()
    } else {
        all.join(",")
    }
}

pub(crate) const EXITS: &[Col] = &[
    col("ID", "id"),
    col("NAME", "name"),
    col("COUNTRY", "country"),
    col("TYPE", "source_type"),
    custom("STATE", exit_state),
    custom("EGRESS", exit_egress),
    fmt("SCORE", "health.score", Fmt::Num2),
];

const SESSIONS: &[Col] = &[
    col("SESSION", "session"),
    col("EXIT", "exit_id"),
    col("EGRESS", "egress_ip"),
    fmt("EXPIRES IN", "expires_in_ms", Fmt::Millis),
    fmt("IDLE EXPIRES IN", "idle_expires_in_ms", Fmt::Millis),
];

/// A site's fleet cooldowns as `EXIT (TIME LEFT)`, the longest first.
fn cooled_exits(v: &Value) -> String {
    let cooled: Vec<String> = v
        .get("cooled_exits")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|c| {
            let exit = c.get("exit_id").and_then(Value::as_str).unwrap_or("-");
            let left = c
                .get("remaining_ms")
                .and_then(Value::as_i64)
                .map_or_else(|| "-".to_owned(), output::millis);
            format!("{exit} ({left})")
        })
        .collect();
    if cooled.is_empty() {
        "-".into()
    } else {
        cooled.join(", ")
    }
}

const SITES: &[Col] = &[
    col("SITE", "site"),
    col("COOLED", "cooled"),
    custom("FOR ONE ACCOUNT", |v| {
        v.get("account_cooled_exits")
            .and_then(Value::as_array)
            .map_or(0, Vec::len)
            .to_string()
    }),
    custom("EXITS (TIME LEFT)", cooled_exits),
];

const CONSENT: &[Col] = &[
    col("VERSION", "version"),
    col("STATE", "state"),
    col("METHOD", "method"),
    col("NOTICE", "notice_version"),
    fmt("GRANTED", "granted_at", Fmt::Time),
    fmt("EXPIRES", "expires_at", Fmt::Time),
    fmt("REVOKED", "revoked_at", Fmt::Time),
    col("RECORDED BY", "recorded_by"),
];

/// Usage dimensions (their `group_by` names), shown when asked for or
/// when the answer has them.
const USAGE_DIMENSIONS: &[(&str, Col)] = &[
    ("user", col("USER", "user_id")),
    ("exit", col("EXIT", "exit_id")),
    ("day", fmt("DAY", "day", Fmt::Time)),
    ("minute", fmt("MINUTE", "minute", Fmt::Time)),
    ("source_type", col("TYPE", "source_type")),
    ("domain", col("DOMAIN", "domain")),
    ("country", col("COUNTRY", "country")),
];

const USAGE_BYTES: &[Col] = &[
    fmt("UP", "bytes_up", Fmt::Bytes),
    fmt("DOWN", "bytes_down", Fmt::Bytes),
    custom("TOTAL", |v| {
        let n = |k: &str| v.get(k).and_then(Value::as_f64).unwrap_or(0.0);
        output::bytes(n("bytes_up") + n("bytes_down"))
    }),
];

fn cents(v: &Value, key: &str) -> String {
    match v.get(key).and_then(Value::as_i64) {
        Some(c) => format!("{}.{:02}", c / 100, (c % 100).abs()),
        None => "-".into(),
    }
}

const INVOICE_LINES: &[Col] = &[
    col("SOURCE TYPE", "source_type"),
    fmt("UP", "bytes_up", Fmt::Bytes),
    fmt("DOWN", "bytes_down", Fmt::Bytes),
    col("GB", "gb"),
    col("CENTS/GB", "cents_per_gb"),
    custom("AMOUNT", |v| cents(v, "amount_cents")),
];

/// An invoice's dedicated addresses: one line per allocation interval in
/// the month (docs/dedicated.md).
const INVOICE_DEDICATED: &[Col] = &[
    col("DEDICATED", "ip"),
    col("EXIT", "exit_id"),
    fmt("FROM", "from", Fmt::Time),
    fmt("TO", "to", Fmt::Time),
    col("DAYS", "address_days"),
    col("CENTS/MONTH", "cents_per_month"),
    custom("AMOUNT", |v| cents(v, "amount_cents")),
];

const ABUSE: &[Col] = &[
    fmt("MINUTE", "minute", Fmt::Time),
    col("EGRESS", "egress_ip"),
    col("OBSERVED", "observed_ip"),
    col("EXIT", "exit_name"),
    col("SOURCE", "source_name"),
    col("ACCOUNT", "account_name"),
    col("USER", "username"),
    custom("TARGET", |v| {
        let host = v.get("target_host").and_then(Value::as_str).unwrap_or("-");
        match v.get("target_port").and_then(Value::as_i64) {
            Some(port) => format!("{host}:{port}"),
            None => host.to_owned(),
        }
    }),
    col("TUNNELS", "tunnels"),
];

const WEBHOOKS: &[Col] = &[
    col("ID", "id"),
    col("ACCOUNT", "account_id"),
    col("URL", "url"),
    col("EVENTS", "events"),
    fmt("ENABLED", "enabled", Fmt::YesNo),
    col("FAILED IN A ROW", "failed_deliveries_in_row"),
    fmt("CREATED", "created_at", Fmt::Time),
];

const DELIVERIES: &[Col] = &[
    col("ID", "id"),
    col("EVENT", "event"),
    col("STATUS", "status"),
    col("ATTEMPTS", "attempts"),
    col("CODE", "last_status_code"),
    fmt("CREATED", "created_at", Fmt::Time),
    fmt("DELIVERED", "delivered_at", Fmt::Time),
    col("ERROR", "last_error"),
];

const AUDIT: &[Col] = &[
    col("ID", "id"),
    fmt("AT", "at", Fmt::Time),
    col("ACTOR", "actor"),
    col("ACTION", "action"),
    col("SUBJECT", "subject"),
    custom("DETAIL", |v| {
        let text = v.get("detail").map(Value::to_string).unwrap_or_default();
        if text.chars().count() > 80 {
            format!("{}...", text.chars().take(77).collect::<String>())
        } else {
            text
        }
    }),
];

// ---- dispatch -----------------------------------------------------------------

pub(crate) async fn run(ctx: &Ctx, command: Command) -> Done {
    match command {
        Command::Accounts(c) => accounts(ctx, c).await,
        Command::Users(c) => users(ctx, c).await,
        Command::Keys(c) => keys(ctx, c).await,
        Command::Plans(c) => plans(ctx, c).await,
        Command::Entitlements(c) => entitlements(ctx, c).await,
        Command::Policy(c) => policy(ctx, c).await,
        Command::Sources(c) => sources(ctx, c).await,
        Command::Consent(c) => consent(ctx, c).await,
        Command::Exits(c) => exits(ctx, c).await,
        Command::EnrollmentTokens(c) => enrollment_tokens(ctx, c).await,
        Command::Dedicated(c) => dedicated::run(ctx, c).await,
        Command::Sessions(c) => sessions(ctx, c).await,
        Command::Sites(c) => sites(ctx, c).await,
        Command::Feedback {
            exit,
            session,
            user,
            site,
            verdict,
        } => {
            let body = object(vec![
                ("exit_id", exit.map(Value::String)),
                ("session", session.map(Value::String)),
                ("user_id", user.map(Value::String)),
                ("site", Some(Value::String(site))),
                ("verdict", Some(Value::String(verdict))),
            ]);
            ctx.one(Method::POST, "/v1/feedback", Some(body), View::Fields)
                .await
                .map(drop)
        }
        Command::Usage(a) => usage(ctx, a).await,
        Command::Invoices(a) => invoices(ctx, a).await,
        Command::Abuse(c) => abuse(ctx, c).await,
        Command::Webhooks(c) => webhooks(ctx, c).await,
        Command::Audit(a) => audit(ctx, a).await,
        Command::Health => health(ctx).await,
        Command::Api(a) => api(ctx, a).await,
        // Handled before a client exists.
        Command::Completion { .. } => Ok(()),
    }
}

async fn accounts(ctx: &Ctx, c: Accounts) -> Done {
    match c {
        Accounts::List(page) => ctx.list("/v1/accounts", &[], page.into(), ACCOUNTS).await,
        Accounts::Get { id } => ctx
            .one(
                Method::GET,
                &path(&["v1", "accounts", &id])?,
                None,
                View::Fields,
            )
            .await
            .map(drop),
        Accounts::Create { name } => ctx
            .one(
                Method::POST,
                "/v1/accounts",
                Some(json!({ "name": name })),
                View::Fields,
            )
            .await
            .map(drop),
        Accounts::Delete { id } => {
            let p = path(&["v1", "accounts", &id])?;
            ctx.no_content(Method::DELETE, &p, None, format!("account {id} deleted"))
                .await
        }
        Accounts::SetEntitlements { id, file } => set_entitlements(ctx, &id, &file).await,
        Accounts::SetPolicy { id, file } => {
            let policy = ctx.json_file("policy", &file)?;
            let p = path(&["v1", "accounts", &id])?;
            ctx.one(
                Method::PATCH,
                &p,
                Some(json!({ "policy": policy })),
                View::Fields,
            )
            .await
            .map(drop)
        }
        Accounts::SetPlan { id, plan } => {
            let p = path(&["v1", "accounts", &id, "plan"])?;
            ctx.no_content(
                Method::PUT,
                &p,
                Some(json!({ "plan_id": plan })),
                format!("account {id} is on plan {plan}"),
            )
            .await
        }
    }
}

async fn set_entitlements(ctx: &Ctx, account: &str, file: &str) -> Done {
    let body = ctx.json_file("entitlements", file)?;
    let p = path(&["v1", "accounts", account, "entitlements"])?;
    ctx.one(Method::PUT, &p, Some(body), View::Fields)
        .await
        .map(drop)
}

async fn users(ctx: &Ctx, c: Users) -> Done {
    match c {
        Users::List { account, page } => {
            let p = path(&["v1", "accounts", &account, "users"])?;
            ctx.list(&p, &[], page.into(), USERS).await
        }
        Users::Get { id } => ctx
            .one(
                Method::GET,
                &path(&["v1", "users", &id])?,
                None,
                View::Fields,
            )
            .await
            .map(drop),
        Users::Create {
            account,
            username,
            password_stdin,
            limits,
            allowed_source_cidrs,
            allowlist_options,
        } => {
            if !password_stdin {
                return Err(Failure::usage(
                    "a new user needs a password: pipe it in with --password-stdin \
                     (e.g. printf '%s\\n' \"$PASSWORD\" | proxynetctl users create ACCOUNT NAME --password-stdin)",
                ));
            }
            let limits = limits.map(|l| ctx.json_arg("--limits", &l)).transpose()?;
            let password = ctx.password()?;
            let body = object(vec![
                ("username", Some(json!(username))),
                ("password", Some(json!(password))),
                ("limits", limits),
                (
                    "allowed_source_cidrs",
                    (!allowed_source_cidrs.is_empty()).then(|| json!(allowed_source_cidrs)),
                ),
                ("allowlist_options", allowlist_options.map(Value::String)),
            ]);
            let p = path(&["v1", "accounts", &account, "users"])?;
            ctx.one(Method::POST, &p, Some(body), View::Fields)
                .await
                .map(drop)
        }
        Users::Update {
            id,
            enabled,
            password_stdin,
            limits,
            policy,
            allowed_source_cidrs,
            no_allowed_source_cidrs,
            allowlist_options,
        } => {
            let limits = limits.map(|l| ctx.json_arg("--limits", &l)).transpose()?;
            let policy = policy.map(|p| ctx.json_arg("--policy", &p)).transpose()?;
            let password = password_stdin.then(|| ctx.password()).transpose()?;
            let cidrs = if no_allowed_source_cidrs {
                Some(json!([]))
            } else {
                (!allowed_source_cidrs.is_empty()).then(|| json!(allowed_source_cidrs))
            };
            let body = object(vec![
                ("enabled", enabled.map(Value::Bool)),
                ("password", password.map(Value::String)),
                ("limits", limits),
                ("policy", policy),
                ("allowed_source_cidrs", cidrs),
                ("allowlist_options", allowlist_options.map(Value::String)),
            ]);
            if body.as_object().is_some_and(Map::is_empty) {
                return Err(Failure::usage(
                    "nothing to change: give --enabled, --password-stdin, --limits, --policy, \
                     --allowed-source-cidr, --no-allowed-source-cidrs or --allowlist-options",
                ));
            }
            ctx.one(
                Method::PATCH,
                &path(&["v1", "users", &id])?,
                Some(body),
                View::Fields,
            )
            .await
            .map(drop)
        }
        Users::Delete { id } => {
            let p = path(&["v1", "users", &id])?;
            ctx.no_content(Method::DELETE, &p, None, format!("user {id} deleted"))
                .await
        }
        Users::Quota { id } => ctx
            .one(
                Method::GET,
                &path(&["v1", "users", &id, "quota"])?,
                None,
                View::Fields,
            )
            .await
            .map(drop),
    }
}

async fn keys(ctx: &Ctx, c: Keys) -> Done {
    match c {
        Keys::List { account, page } => {
            let p = path(&["v1", "accounts", &account, "api-keys"])?;
            ctx.list(&p, &[], page.into(), KEYS).await
        }
        Keys::Create {
            account,
            operator: _,
            name,
        } => {
            let p = match &account {
                Some(a) => path(&["v1", "accounts", a, "api-keys"])?,
                None => "/v1/api-keys".to_owned(),
            };
            ctx.one(
                Method::POST,
                &p,
                Some(json!({ "name": name })),
                View::Fields,
            )
            .await?;
            if !ctx.json() {
                eprintln!("the key is shown once: store it now");
            }
            Ok(())
        }
        Keys::Revoke { id } => {
            let p = path(&["v1", "api-keys", &id])?;
            ctx.no_content(
                Method::DELETE,
                &p,
                None,
                format!("key {id} revoked, with every key it minted"),
            )
            .await
        }
    }
}

async fn plans(ctx: &Ctx, c: Plans) -> Done {
    match c {
        Plans::List(page) => ctx.list("/v1/plans", &[], page.into(), PLANS).await,
        Plans::Create { name, prices } => {
            let mut map = Map::new();
            for price in &prices {
                let (kind, cents) = price
                    .split_once('=')
                    .and_then(|(k, c)| Some((k.trim(), c.trim().parse::<i64>().ok()?)))
                    .ok_or_else(|| {
                        Failure::usage(format!("--price {price:?}: TYPE=CENTS, e.g. dc=100"))
                    })?;
                map.insert(kind.to_owned(), json!(cents));
            }
            ctx.one(
                Method::POST,
                "/v1/plans",
                Some(json!({ "name": name, "prices": map })),
                View::Fields,
            )
            .await
            .map(drop)
        }
    }
}

async fn entitlements(ctx: &Ctx, c: Entitlements) -> Done {
    match c {
        Entitlements::Get { account } => {
            let v = ctx
                .client
                .get(&path(&["v1", "accounts", &account])?, &[])
                .await?;
            let e = v.get("entitlements").cloned().unwrap_or(Value::Null);
            if ctx.json() {
                ctx.derived_json(&e)
            } else {
                output::print_lines(&output::fields(&e))
            }
        }
        Entitlements::Set { account, file } => set_entitlements(ctx, &account, &file).await,
    }
}

async fn policy(ctx: &Ctx, c: Policy) -> Done {
    match c {
        Policy::Get { owner } => {
            let p = match (&owner.account, &owner.user) {
                (Some(a), _) => path(&["v1", "accounts", a])?,
                (None, Some(u)) => path(&["v1", "users", u])?,
                (None, None) => {
                    let answer = ctx
                        .client
                        .send(Method::GET, "/v1/policy", &[], None)
                        .await?;
                    answer.json()?;
                    return output::print_json_text(&answer.text());
                }
            };
            let v = ctx.client.get(&p, &[]).await?;
            ctx.derived_json(v.get("policy").unwrap_or(&Value::Null))
        }
        Policy::Set { owner, file } => {
            let mut body = ctx.json_file("policy", &file)?;
            let (method, p, body) = match (&owner.account, &owner.user) {
                (Some(a), _) => (
                    Method::PATCH,
                    path(&["v1", "accounts", a])?,
                    json!({ "policy": body }),
                ),
                (None, Some(u)) => (
                    Method::PATCH,
                    path(&["v1", "users", u])?,
                    json!({ "policy": body }),
                ),
                (None, None) => {
                    // What `policy get` printed, read-only fields and all.
                    if let Some(map) = body.as_object_mut() {
                        map.remove("version");
                        map.remove("updated_at");
                    }
                    (Method::PUT, "/v1/policy".to_owned(), body)
                }
            };
            let answer = ctx
                .client
                .send(method, &p, &[], Some(crate::client::Body::Json(body)))
                .await?;
            let v = answer.json()?;
            match (&owner.account, &owner.user) {
                (None, None) => output::print_json_text(&answer.text()),
                _ => ctx.derived_json(v.get("policy").unwrap_or(&Value::Null)),
            }
        }
    }
}

fn source_body(s: SourceArgs) -> Value {
    object(vec![
        ("name", Some(json!(s.name))),
        ("source_type", Some(json!(s.source_type))),
        ("channel", Some(json!(s.channel))),
        ("supplier", Some(json!(s.supplier))),
        ("agreement_ref", Some(json!(s.agreement_ref))),
        ("notice_description", Some(json!(s.notice_description))),
        ("opt_out", Some(json!(s.opt_out))),
        ("liable_party", Some(json!(s.liable_party))),
        ("abuse_contact", Some(json!(s.abuse_contact))),
        ("countries", Some(json!(s.countries))),
        ("consent_required", s.consent_required.map(Value::Bool)),
    ])
}

async fn sources(ctx: &Ctx, c: Sources) -> Done {
    match c {
        Sources::List => ctx.whole("/v1/sources", &[], SOURCES).await,
        Sources::Get { id } => ctx
            .one(
                Method::GET,
                &path(&["v1", "sources", &id])?,
                None,
                View::Fields,
            )
            .await
            .map(drop),
        Sources::Create(s) => ctx
            .one(
                Method::POST,
                "/v1/sources",
                Some(source_body(s)),
                View::Fields,
            )
            .await
            .map(drop),
        Sources::Replace { id, source } => ctx
            .one(
                Method::PUT,
                &path(&["v1", "sources", &id])?,
                Some(source_body(source)),
                View::Fields,
            )
            .await
            .map(drop),
    }
}

fn grant_body(g: GrantArgs) -> Value {
    object(vec![
        ("method", Some(json!(g.method))),
        ("notice_version", Some(json!(g.notice_version))),
        ("notice_sha256", g.notice_sha256.map(Value::String)),
        ("evidence_ref", Some(json!(g.evidence_ref))),
        ("opt_out", Some(json!(g.opt_out))),
        ("granted_at", g.granted_at.map(Value::String)),
        ("expires_at", g.expires_at.map(Value::String)),
    ])
}

async fn consent(ctx: &Ctx, c: Consent) -> Done {
    match c {
        Consent::History { exit } => {
            ctx.whole(&path(&["v1", "exits", &exit, "consent"])?, &[], CONSENT)
                .await
        }
        Consent::Grant { exit, grant } => ctx
            .one(
                Method::POST,
                &path(&["v1", "exits", &exit, "consent"])?,
                Some(grant_body(grant)),
                View::Fields,
            )
            .await
            .map(drop),
        Consent::Revoke { exit, reason } => ctx
            .one(
                Method::POST,
                &path(&["v1", "exits", &exit, "consent", "revoke"])?,
                Some(json!({ "reason": reason })),
                View::Fields,
            )
            .await
            .map(drop),
        Consent::Notice(Notice::Create { version, file }) => {
            let body = ctx.read_file("notice", &file)?;
            ctx.one(
                Method::POST,
                "/v1/consent-notices",
                Some(json!({ "version": version, "body": body })),
                View::Fields,
            )
            .await
            .map(drop)
        }
        Consent::Notice(Notice::Get { version }) => {
            let p = path(&["v1", "consent-notices", &version])?;
            let answer = ctx.client.send(Method::GET, &p, &[], None).await?;
            if let Some(sha) = answer
                .headers
                .get("proxynet-notice-sha256")
                .and_then(|v| v.to_str().ok())
            {
                eprintln!("sha256: {sha}");
            }
            output::print_raw(&answer.text())
        }
    }
}

async fn exits(ctx: &Ctx, c: Exits) -> Done {
    let action =
        |id: &str, verb: &str| -> Result<String, Failure> { path(&["v1", "exits", id, verb]) };
    match c {
        Exits::List(page) => ctx.list("/v1/exits", &[], page.into(), EXITS).await,
        Exits::Get { id } => ctx
            .one(
                Method::GET,
                &path(&["v1", "exits", &id])?,
                None,
                View::Fields,
            )
            .await
            .map(drop),
        Exits::Drain { id } => ctx
            .one(Method::POST, &action(&id, "drain")?, None, View::Row(EXITS))
            .await
            .map(drop),
        Exits::Undrain { id } => ctx
            .one(
                Method::POST,
                &action(&id, "undrain")?,
                None,
                View::Row(EXITS),
            )
            .await
            .map(drop),
        Exits::Disable { id } => ctx
            .one(
                Method::POST,
                &action(&id, "disable")?,
                None,
                View::Row(EXITS),
            )
            .await
            .map(drop),
        Exits::Enable { id } => ctx
            .one(
                Method::POST,
                &action(&id, "enable")?,
                None,
                View::Row(EXITS),
            )
            .await
            .map(drop),
        Exits::Reinstate { id, grant } => ctx
            .one(
                Method::POST,
                &action(&id, "reinstate")?,
                Some(grant_body(grant)),
                View::Fields,
            )
            .await
            .map(drop),
        Exits::Provenance { id } => ctx
            .one(Method::GET, &action(&id, "provenance")?, None, View::Fields)
            .await
            .map(drop),
    }
}

async fn enrollment_tokens(ctx: &Ctx, c: EnrollmentTokens) -> Done {
    let EnrollmentTokens::Create {
        name,
        source_id,
        country,
        region,
        city,
        asn,
        ttl_seconds,
        behind_nat,
    } = c;
    let body = object(vec![
        ("name", Some(json!(name))),
        ("source_id", Some(json!(source_id))),
        ("country", Some(json!(country))),
        ("region", region.map(Value::String)),
        ("city", city.map(Value::String)),
        ("asn", asn.map(|a| json!(a))),
        ("ttl_seconds", ttl_seconds.map(|t| json!(t))),
        ("behind_nat", behind_nat.then_some(Value::Bool(true))),
    ]);
    ctx.one(
        Method::POST,
        "/v1/enrollment-tokens",
        Some(body),
        View::Fields,
    )
    .await?;
    if !ctx.json() {
        eprintln!("the token is shown once: hand it to the exit's agent (PROXYNET_ENROLL_TOKEN)");
    }
    Ok(())
}

async fn sessions(ctx: &Ctx, c: Sessions) -> Done {
    match c {
        Sessions::List { user } => {
            ctx.whole(&path(&["v1", "users", &user, "sessions"])?, &[], SESSIONS)
                .await
        }
        Sessions::Get { user, session } => ctx
            .one(
                Method::GET,
                &path(&["v1", "users", &user, "sessions", &session])?,
                None,
                View::Row(SESSIONS),
            )
            .await
            .map(drop),
        Sessions::End { user, session } => {
            let p = path(&["v1", "users", &user, "sessions", &session])?;
            ctx.no_content(Method::DELETE, &p, None, format!("session {session} ended"))
                .await
        }
        Sessions::SetTime {
            user,
            session,
            minutes,
        } => ctx
            .one(
                Method::PATCH,
                &path(&["v1", "users", &user, "sessions", &session])?,
                Some(json!({ "sesstime_minutes": minutes })),
                View::Row(SESSIONS),
            )
            .await
            .map(drop),
    }
}

async fn sites(ctx: &Ctx, c: Sites) -> Done {
    match c {
        Sites::List { site } => {
            let q = query(&[("site", site.as_deref())]);
            let answer = ctx.client.send(Method::GET, "/v1/sites", &q, None).await?;
            let value = answer.json()?;
            if ctx.json() {
                return output::print_json_text(&answer.text());
            }
            let rows = value
                .get("items")
                .and_then(Value::as_array)
                .cloned()
                .unwrap_or_default();
            output::print_lines(&output::table(SITES, &rows))
        }
        Sites::Lift { site, exit_id } => {
            let p = path(&["v1", "sites", &site, "cooldowns", &exit_id])?;
            ctx.no_content(
                Method::DELETE,
                &p,
                None,
                format!("exit {exit_id} is no longer cooled for {site}"),
            )
            .await
        }
    }
}

async fn usage(ctx: &Ctx, a: UsageArgs) -> Done {
    let q = query(&[
        ("from", a.from.as_deref()),
        ("to", a.to.as_deref()),
        ("group_by", a.group_by.as_deref()),
    ]);
    let p = path(&["v1", "accounts", &a.account, "usage"])?;
    let answer = ctx.client.send(Method::GET, &p, &q, None).await?;
    let value = answer.json()?;
    if ctx.json() {
        return output::print_json_text(&answer.text());
    }
    let rows = value.as_array().cloned().unwrap_or_default();
    // The dimensions the answer was grouped by, then its bytes.
    let asked: Vec<&str> = a
        .group_by
        .as_deref()
        .unwrap_or("")
        .split(',')
        .map(str::trim)
        .collect();
    let mut cols: Vec<Col> = USAGE_DIMENSIONS
        .iter()
        .filter(|(name, c)| {
            asked.contains(name)
                || match c.src {
                    output::Src::Field(f, _) => rows.iter().any(|r| r.get(f).is_some()),
                    output::Src::Custom(_) => false,
                }
        })
        .map(|(_, c)| *c)
        .collect();
    cols.extend_from_slice(USAGE_BYTES);
    output::print_lines(&output::table(&cols, &rows))
}

async fn invoices(ctx: &Ctx, a: InvoiceArgs) -> Done {
    let q = query(&[
        ("month", a.month.as_deref()),
        ("format", a.csv.then_some("csv")),
    ]);
    let p = path(&["v1", "accounts", &a.account, "invoices"])?;
    let answer = ctx.client.send(Method::GET, &p, &q, None).await?;
    if a.csv || !answer.is_json() {
        return output::print_raw(&answer.text());
    }
    let v = answer.json()?;
    if ctx.json() {
        return output::print_json_text(&answer.text());
    }
    let rows = v
        .get("lines")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let mut lines = output::fields(&json!({
        "account_id": v.get("account_id"),
        "month": v.get("month"),
        "plan_id": v.get("plan_id"),
    }));
    lines.push(String::new());
    lines.extend(output::table(INVOICE_LINES, &rows));
    let dedicated = v
        .get("dedicated")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    if !dedicated.is_empty() {
        lines.push(String::new());
        lines.extend(output::table(INVOICE_DEDICATED, &dedicated));
        if let Some(days) = v.get("address_days") {
            lines.push(format!("address days  {days}"));
        }
    }
    lines.push(String::new());
    lines.push(format!("total  {}", cents(&v, "total_cents")));
    output::print_lines(&lines)
}

async fn abuse(ctx: &Ctx, c: Abuse) -> Done {
    match c {
        Abuse::Lookup {
            egress_ip,
            at,
            target,
            window_minutes,
        } => {
            let window = window_minutes.map(|w| w.to_string());
            let q = query(&[
                ("egress_ip", Some(&egress_ip)),
                ("at", Some(&at)),
                ("target", target.as_deref()),
                ("window_minutes", window.as_deref()),
            ]);
            ctx.whole("/v1/abuse/lookup", &q, ABUSE).await
        }
        Abuse::Export {
            from,
            to,
            egress_ip,
            target,
            csv,
        } => {
            let q = query(&[
                ("from", Some(&from)),
                ("to", Some(&to)),
                ("egress_ip", egress_ip.as_deref()),
                ("target", target.as_deref()),
                ("format", csv.then_some("csv")),
            ]);
            if csv {
                let answer = ctx
                    .client
                    .send(Method::GET, "/v1/abuse/export", &q, None)
                    .await?;
                return output::print_raw(&answer.text());
            }
            ctx.whole("/v1/abuse/export", &q, ABUSE).await
        }
    }
}

/// `/v1/accounts/{id}/webhooks...` or `/v1/webhooks...`.
fn webhooks_path(account: Option<&str>, rest: &[&str]) -> Result<String, Failure> {
    let mut segments: Vec<&str> = match account {
        Some(a) => vec!["v1", "accounts", a, "webhooks"],
        None => vec!["v1", "webhooks"],
    };
    segments.extend_from_slice(rest);
    path(&segments)
}

async fn webhooks(ctx: &Ctx, c: Webhooks) -> Done {
    match c {
        Webhooks::List { account } => {
            ctx.whole(&webhooks_path(account.as_deref(), &[])?, &[], WEBHOOKS)
                .await
        }
        Webhooks::Create {
            account,
            url,
            events,
        } => {
            ctx.one(
                Method::POST,
                &webhooks_path(account.as_deref(), &[])?,
                Some(json!({ "url": url, "events": events })),
                View::Fields,
            )
            .await?;
            if !ctx.json() {
                eprintln!("the secret is shown once: give it to the receiver to check signatures");
            }
            Ok(())
        }
        Webhooks::Enable { id, account } => set_webhook_enabled(ctx, &id, account, true).await,
        Webhooks::Disable { id, account } => set_webhook_enabled(ctx, &id, account, false).await,
        Webhooks::Delete { id, account } => {
            let p = webhooks_path(account.as_deref(), &[&id])?;
            ctx.no_content(Method::DELETE, &p, None, format!("webhook {id} deleted"))
                .await
        }
        Webhooks::Deliveries { id, account, page } => {
            let p = webhooks_path(account.as_deref(), &[&id, "deliveries"])?;
            ctx.list(&p, &[], page.into(), DELIVERIES).await
        }
    }
}

/// `PATCH …/webhooks/{id} {enabled}`; prints the webhook as it is now.
async fn set_webhook_enabled(ctx: &Ctx, id: &str, account: Option<String>, enabled: bool) -> Done {
    ctx.one(
        Method::PATCH,
        &webhooks_path(account.as_deref(), &[id])?,
        Some(json!({ "enabled": enabled })),
        View::Fields,
    )
    .await?;
    Ok(())
}

async fn audit(ctx: &Ctx, a: AuditArgs) -> Done {
    let q = query(&[
        ("action", a.action.as_deref()),
        ("subject", a.subject.as_deref()),
        ("actor", a.actor.as_deref()),
        ("from", a.from.as_deref()),
        ("to", a.to.as_deref()),
    ]);
    ctx.list("/v1/audit", &q, a.page.into(), AUDIT).await
}

async fn health(ctx: &Ctx) -> Done {
    let answer = ctx.client.send(Method::GET, "/readyz", &[], None).await?;
    if ctx.json() {
        // The API answers text; scripts get its lines as an object.
        let mut map = Map::new();
        for line in answer.text().lines() {
            if let Some((k, v)) = line.split_once(':') {
                map.insert(k.trim().to_owned(), json!(v.trim()));
            }
        }
        return output::print_json(&Value::Object(map));
    }
    output::print_raw(&answer.text())
}

async fn api(ctx: &Ctx, a: ApiArgs) -> Done {
    let method = Method::from_bytes(a.method.to_ascii_uppercase().as_bytes())
        .map_err(|_| Failure::usage(format!("{:?} is not an HTTP method", a.method)))?;
    if !a.path.starts_with('/') {
        return Err(Failure::usage(format!(
            "{:?}: a path under the API, starting with / (e.g. /v1/exits)",
            a.path
        )));
    }
    let body = a.data.map(|d| ctx.json_arg("--data", &d)).transpose()?;
    let answer = ctx
        .client
        .send(method, &a.path, &[], body.map(crate::client::Body::Json))
        .await?;
    if answer.is_json() && answer.json().is_ok() {
        output::print_json_text(&answer.text())
    } else {
        output::print_raw(&answer.text())
    }
    .map(|()| {
        if answer.status == reqwest::StatusCode::NO_CONTENT && !ctx.json() {
            eprintln!("204 No Content");
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exit_reads_as_its_row() {
        let exit = json!({
            "id": "e1", "name": "exit-127.0.0.2", "country": "DE", "source_type": "dc",
            "egress_ips": ["127.0.0.2"], "egress_prefixes": ["2001:db8::/64"],
            "live": true, "disabled": false, "admin_draining": false, "draining": false,
            "health": {"score": 0.9321, "superproxies_ejecting_it": 0}
        });
        assert_eq!(
            output::table(EXITS, std::slice::from_ref(&exit)),
            vec![
                "ID  NAME            COUNTRY  TYPE  STATE  EGRESS                   SCORE",
                "e1  exit-127.0.0.2  DE       dc    live   127.0.0.2,2001:db8::/64  0.93",
            ]
        );
        let mut drained = exit.clone();
        drained["admin_draining"] = json!(true);
        assert_eq!(exit_state(&drained), "draining");
        let mut down = exit;
        down["live"] = json!(false);
        assert_eq!(exit_state(&down), "down");
    }

    #[test]
    fn bodies_leave_out_what_was_not_given() {
        assert_eq!(
            object(vec![("a", Some(json!(1))), ("b", None)]),
            json!({"a": 1})
        );
        assert_eq!(cents(&json!({"c": 1234}), "c"), "12.34");
        assert_eq!(cents(&json!({"c": 5}), "c"), "0.05");
        assert_eq!(
            webhooks_path(Some("a"), &["w", "deliveries"]).unwrap(),
            "/v1/accounts/a/webhooks/w/deliveries"
        );
        assert_eq!(webhooks_path(None, &[]).unwrap(), "/v1/webhooks");
    }

    #[test]
    fn an_invoices_dedicated_line_reads_as_its_row() {
        let line = json!({
            "ip": "127.0.0.2", "exit_id": "e1", "from": "2026-12-01T00:00:00Z",
            "to": "2026-12-11T00:00:00Z", "address_days": 10, "cents_per_month": 500,
            "amount_cents": 162
        });
        assert_eq!(
            output::table(INVOICE_DEDICATED, std::slice::from_ref(&line)),
            vec![
                "DEDICATED  EXIT  FROM                  TO                    DAYS  CENTS/MONTH  AMOUNT",
                "127.0.0.2  e1    2026-12-01 00:00:00Z  2026-12-11 00:00:00Z  10    500          1.62",
            ]
        );
    }
}
