//! What every resource's file shares: [`Ctx`], one invocation's client and
//! output format with the ways an answer is shown (a table, `field  value`
//! lines, or the API's JSON), its inputs (files, stdin, JSON arguments), and
//! small builders of query strings and request bodies.

use std::cell::Cell;
use std::io::Read;

use reqwest::Method;
use serde_json::{Map, Value};

use crate::cli::{Output, PageArgs};
use crate::client::{Client, Paging, Rows};
use crate::error::Failure;
use crate::output::{self, Col};

/// One invocation's client and output format.
pub(crate) struct Ctx {
    pub(crate) client: Client,
    pub(crate) output: Output,
    /// Stdin feeds at most one input.
    stdin_used: Cell<bool>,
}

pub(super) type Done = Result<(), Failure>;

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
pub(super) enum View<'a> {
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

    pub(super) fn json(&self) -> bool {
        self.output == Output::Json
    }

    /// A list, shown as a table (or its JSON).
    pub(super) async fn list(
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
    pub(super) async fn whole(&self, p: &str, query: &[(String, String)], cols: &[Col]) -> Done {
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
    pub(super) async fn one(
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
    pub(super) async fn no_content(
        &self,
        method: Method,
        p: &str,
        body: Option<Value>,
        said: String,
    ) -> Done {
        self.client.call(method, p, body).await?;
        if !self.json() {
            output::print_lines(&[said])?;
        }
        Ok(())
    }

    /// A value derived from an answer (not the answer itself), as JSON in both modes.
    pub(super) fn derived_json(&self, v: &Value) -> Done {
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
    pub(super) fn read_file(&self, what: &str, file: &str) -> Result<String, Failure> {
        if file == "-" {
            return self.take_stdin(what);
        }
        std::fs::read_to_string(file).map_err(|e| Failure::usage(format!("{what}: {file}: {e}")))
    }

    /// A JSON document from a file (or `-`, stdin).
    pub(super) fn json_file(&self, what: &str, file: &str) -> Result<Value, Failure> {
        let text = self.read_file(what, file)?;
        parse_json(what, &text)
    }

    /// A JSON argument: inline, `@FILE`, or `-` for stdin.
    pub(super) fn json_arg(&self, what: &str, arg: &str) -> Result<Value, Failure> {
        match arg.strip_prefix('@') {
            Some(file) => self.json_file(what, file),
            None if arg == "-" => self.json_file(what, "-"),
            None => parse_json(what, arg),
        }
    }

    /// The first line of stdin, for a password.
    pub(super) fn password(&self) -> Result<String, Failure> {
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
pub(super) fn query(pairs: &[(&str, Option<&str>)]) -> Vec<(String, String)> {
    pairs
        .iter()
        .filter_map(|(k, v)| v.map(|v| ((*k).to_owned(), v.to_owned())))
        .collect()
}

/// An object from optional fields (absent ones left out).
pub(super) fn object(fields: Vec<(&str, Option<Value>)>) -> Value {
    let map: Map<String, Value> = fields
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v)))
        .collect();
    Value::Object(map)
}
