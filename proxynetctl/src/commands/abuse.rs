//! `proxynetctl abuse`: the abuse desk (`/v1/abuse/lookup`,
//! `/v1/abuse/export`): who used an egress address, and when.

use reqwest::Method;
use serde_json::Value;

use super::common::{query, Ctx, Done};
use crate::cli::Abuse;
use crate::output::{self, col, custom, fmt, Col, Fmt};

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

pub(super) async fn run(ctx: &Ctx, c: Abuse) -> Done {
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
