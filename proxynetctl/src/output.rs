//! Printing: aligned tables and field lists for people, the API's JSON as
//! it came (pretty) for scripts.

use std::io::Write;

use serde_json::Value;

use crate::error::Failure;

/// How a cell renders its value.
#[derive(Clone, Copy)]
pub(crate) enum Fmt {
    Text,
    /// RFC 3339 as `2026-12-01 19:16:01Z`.
    Time,
    /// Bytes with SI units (`451.5 MB`).
    Bytes,
    /// `yes` / `no`.
    YesNo,
    /// Two decimals.
    Num2,
    /// Milliseconds as a duration (`29m 59s`).
    Millis,
}

/// Where a column's cell comes from.
#[derive(Clone, Copy)]
pub(crate) enum Src {
    /// A field, dotted for nested ones (`health.score`).
    Field(&'static str, Fmt),
    Custom(fn(&Value) -> String),
}

#[derive(Clone, Copy)]
pub(crate) struct Col {
    pub(crate) header: &'static str,
    pub(crate) src: Src,
}

pub(crate) const fn col(header: &'static str, field: &'static str) -> Col {
    Col {
        header,
        src: Src::Field(field, Fmt::Text),
    }
}

pub(crate) const fn fmt(header: &'static str, field: &'static str, fmt: Fmt) -> Col {
    Col {
        header,
        src: Src::Field(field, fmt),
    }
}

pub(crate) const fn custom(header: &'static str, f: fn(&Value) -> String) -> Col {
    Col {
        header,
        src: Src::Custom(f),
    }
}

/// `a.b.c` inside `v`.
pub(crate) fn lookup<'a>(v: &'a Value, path: &str) -> &'a Value {
    path.split('.')
        .fold(v, |v, key| v.get(key).unwrap_or(&Value::Null))
}

/// A value as a cell: `-` for nothing, lists joined with commas.
pub(crate) fn cell(v: &Value, fmt: Fmt) -> String {
    match (v, fmt) {
        (Value::Null, _) => "-".into(),
        (Value::String(s), _) if s.is_empty() => "-".into(),
        (Value::String(s), Fmt::Time) => time(s),
        (Value::Number(n), Fmt::Bytes) => n.as_f64().map_or_else(|| n.to_string(), bytes),
        (Value::Number(n), Fmt::Num2) => n
            .as_f64()
            .map_or_else(|| n.to_string(), |f| format!("{f:.2}")),
        (Value::Number(n), Fmt::Millis) => n.as_i64().map_or_else(|| n.to_string(), millis),
        (Value::Bool(b), _) => if *b { "yes" } else { "no" }.into(),
        (Value::String(s), _) => s.clone(),
        (Value::Array(items), _) if items.is_empty() => "-".into(),
        (Value::Array(items), _) if items.iter().all(|i| !i.is_object() && !i.is_array()) => items
            .iter()
            .map(|i| cell(i, fmt))
            .collect::<Vec<_>>()
            .join(","),
        (other, _) => other.to_string(),
    }
}

/// `2026-12-01T19:16:01.123456Z` → `2026-12-01 19:16:01Z`.
pub(crate) fn time(s: &str) -> String {
    let b = s.as_bytes();
    let looks_like_rfc3339 =
        b.len() >= 20 && b[4] == b'-' && b[7] == b'-' && b[10] == b'T' && b[13] == b':';
    if !looks_like_rfc3339 {
        return s.to_owned();
    }
    let zone = if s.ends_with('Z') || s.ends_with("+00:00") {
        "Z".to_owned()
    } else {
        s.get(s.len().saturating_sub(6)..).unwrap_or("").to_owned()
    };
    format!("{} {}{zone}", &s[..10], &s[11..19])
}

/// Bytes with SI units, one decimal: `451.5 MB`.
pub(crate) fn bytes(n: f64) -> String {
    const UNITS: [&str; 6] = ["B", "kB", "MB", "GB", "TB", "PB"];
    let mut value = n;
    let mut unit = 0;
    while value.abs() >= 1000.0 && unit < UNITS.len() - 1 {
        value /= 1000.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n} B")
    } else {
        format!("{value:.1} {}", UNITS[unit])
    }
}

/// `1h 2m`, `29m 59s`, `12s`.
pub(crate) fn millis(ms: i64) -> String {
    if ms < 0 {
        return "-".into();
    }
    let s = ms / 1000;
    match (s / 3600, (s % 3600) / 60, s % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m {s}s"),
        (h, m, _) => format!("{h}h {m}m"),
    }
}

/// The lines of an aligned table: headers, then one row per item; cells
/// padded to their column's widest, two spaces apart.
pub(crate) fn table(columns: &[Col], rows: &[Value]) -> Vec<String> {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            columns
                .iter()
                .map(|c| {
                    let text = match c.src {
                        Src::Field(path, f) => cell(lookup(row, path), f),
                        Src::Custom(f) => f(row),
                    };
                    crate::error::one_line(&text)
                })
                .collect()
        })
        .collect();
    let mut widths: Vec<usize> = columns.iter().map(|c| c.header.chars().count()).collect();
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |row: Vec<String>| {
        let mut out = String::new();
        let last = row.len().saturating_sub(1);
        for (i, (c, w)) in row.into_iter().zip(&widths).enumerate() {
            if i == last {
                out.push_str(&c);
            } else {
                let pad = w - c.chars().count();
                out.push_str(&c);
                out.push_str(&" ".repeat(pad + 2));
            }
        }
        out.trim_end().to_owned()
    };
    let mut out = vec![line(columns.iter().map(|c| c.header.to_owned()).collect())];
    out.extend(cells.into_iter().map(line));
    out
}

/// One object as `field  value` lines: nested objects flattened with dots,
/// lists of scalars joined, lists of objects counted (their detail is in
/// `-o json`).
pub(crate) fn fields(v: &Value) -> Vec<String> {
    let mut pairs: Vec<(String, String)> = Vec::new();
    flatten("", v, &mut pairs);
    let width = pairs
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    pairs
        .into_iter()
        .map(|(k, v)| format!("{k:width$}  {v}").trim_end().to_owned())
        .collect()
}

fn flatten(prefix: &str, v: &Value, out: &mut Vec<(String, String)>) {
    match v {
        Value::Object(map) => {
            // serde_json's maps are sorted: the id and name lead, the rest
            // follow alphabetically.
            let lead = ["id", "name"];
            let keys = lead
                .iter()
                .filter(|k| map.contains_key(**k))
                .map(|k| (*k).to_owned())
                .chain(map.keys().filter(|k| !lead.contains(&k.as_str())).cloned());
            for k in keys {
                let v = &map[&k];
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                match v {
                    Value::Object(inner) if !inner.is_empty() => flatten(&key, v, out),
                    Value::Object(_) => out.push((key, "-".into())),
                    _ => flatten(&key, v, out),
                }
            }
        }
        Value::Array(items) if items.iter().any(|i| i.is_object() || i.is_array()) => {
            let n = items.len();
            out.push((
                prefix.to_owned(),
                format!(
                    "{n} {} (-o json shows them)",
                    if n == 1 { "entry" } else { "entries" }
                ),
            ));
        }
        Value::String(_) => out.push((prefix.to_owned(), cell(v, Fmt::Time))),
        other => out.push((
            prefix.to_owned(),
            crate::error::one_line(&cell(other, Fmt::Text)),
        )),
    }
}

/// Writes lines to stdout; a closed pipe (`| head`) ends quietly.
pub(crate) fn print_lines(lines: &[String]) -> Result<(), Failure> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    for line in lines {
        if let Err(e) = writeln!(out, "{line}") {
            return closed(e);
        }
    }
    out.flush().or_else(closed)
}

/// Writes text as is.
pub(crate) fn print_raw(text: &str) -> Result<(), Failure> {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    out.write_all(text.as_bytes()).or_else(closed)?;
    if !text.is_empty() && !text.ends_with('\n') {
        out.write_all(b"\n").or_else(closed)?;
    }
    out.flush().or_else(closed)
}

/// A value built here (not received), pretty.
pub(crate) fn print_json(v: &Value) -> Result<(), Failure> {
    let text = serde_json::to_string_pretty(v)
        .map_err(|e| Failure::Answer(format!("cannot print the answer: {e}")))?;
    print_raw(&text)
}

/// JSON text as the API sent it, re-indented: its fields in the API's
/// order, its numbers as written.
pub(crate) fn print_json_text(raw: &str) -> Result<(), Failure> {
    print_raw(&pretty(raw))
}

/// Re-indents valid JSON text (two spaces, as `serde_json` pretty-prints)
/// without parsing it into a map, which would reorder its fields.
pub(crate) fn pretty(raw: &str) -> String {
    let chars: Vec<char> = raw.chars().collect();
    let mut out = String::with_capacity(raw.len() * 2);
    let mut depth = 0usize;
    let newline = |out: &mut String, depth: usize| {
        out.push('\n');
        out.push_str(&"  ".repeat(depth));
    };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' => {
                out.push(c);
                i += 1;
                while i < chars.len() {
                    let s = chars[i];
                    out.push(s);
                    i += 1;
                    if s == '\\' {
                        if let Some(e) = chars.get(i) {
                            out.push(*e);
                            i += 1;
                        }
                    } else if s == '"' {
                        break;
                    }
                }
                continue;
            }
            '{' | '[' => {
                out.push(c);
                let close = if c == '{' { '}' } else { ']' };
                let mut j = i + 1;
                while chars.get(j).is_some_and(|c| c.is_whitespace()) {
                    j += 1;
                }
                if chars.get(j) == Some(&close) {
                    out.push(close);
                    i = j;
                } else {
                    depth += 1;
                    newline(&mut out, depth);
                }
            }
            '}' | ']' => {
                depth = depth.saturating_sub(1);
                newline(&mut out, depth);
                out.push(c);
            }
            ',' => {
                out.push(c);
                newline(&mut out, depth);
            }
            ':' => out.push_str(": "),
            c if c.is_whitespace() => {}
            c => out.push(c),
        }
        i += 1;
    }
    out
}

fn closed(e: std::io::Error) -> Result<(), Failure> {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    Err(Failure::Answer(format!("cannot write the output: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn tables_align_their_columns() {
        let cols = [
            col("ID", "id"),
            col("NAME", "name"),
            fmt("SCORE", "h.score", Fmt::Num2),
        ];
        let rows = vec![
            json!({"id": "1", "name": "exit-127.0.0.2", "h": {"score": 0.876}}),
            json!({"id": "22", "name": "b", "h": null}),
        ];
        assert_eq!(
            table(&cols, &rows),
            vec![
                "ID  NAME            SCORE",
                "1   exit-127.0.0.2  0.88",
                "22  b               -",
            ]
        );
        assert_eq!(table(&cols, &[]), vec!["ID  NAME  SCORE"]);
    }

    #[test]
    fn cells_render_units_times_and_lists() {
        assert_eq!(bytes(451_523_866.0), "451.5 MB");
        assert_eq!(bytes(999.0), "999 B");
        assert_eq!(time("2026-12-01T19:16:01.123456Z"), "2026-12-01 19:16:01Z");
        assert_eq!(
            time("2026-12-01T19:16:01+02:00"),
            "2026-12-01 19:16:01+02:00"
        );
        assert_eq!(time("soon"), "soon");
        assert_eq!(millis(1_799_000), "29m 59s");
        assert_eq!(millis(3_720_000), "1h 2m");
        assert_eq!(cell(&json!(["a", "b"]), Fmt::Text), "a,b");
        assert_eq!(cell(&json!(true), Fmt::YesNo), "yes");
        assert_eq!(cell(&json!(null), Fmt::Text), "-");
    }

    #[test]
    fn pretty_keeps_the_order_and_text_it_was_given() {
        let raw = r#"{"z":1,"a":[],"s":"x,\\\"{y}:","n":{"b":1.50,"c":[1,2]},"e":{}}"#;
        let text = pretty(raw);
        assert_eq!(
            text,
            "{\n  \"z\": 1,\n  \"a\": [],\n  \"s\": \"x,\\\\\\\"{y}:\",\n  \"n\": {\n    \"b\": 1.50,\n    \"c\": [\n      1,\n      2\n    ]\n  },\n  \"e\": {}\n}"
        );
        let parsed: Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed, serde_json::from_str::<Value>(raw).unwrap());
        assert_eq!(pretty("[ ]"), "[]");
    }

    #[test]
    fn fields_flatten_one_object() {
        let v = json!({"id": "x", "health": {"score": 1.5}, "egress": {"history": [{"a": 1}]},
                       "created_at": "2026-12-01T19:16:01Z", "ips": ["1", "2"], "policy": {}});
        assert_eq!(
            fields(&v),
            vec![
                "id              x",
                "created_at      2026-12-01 19:16:01Z",
                "egress.history  1 entry (-o json shows them)",
                "health.score    1.5",
                "ips             1,2",
                "policy          -",
            ]
        );
    }
}
