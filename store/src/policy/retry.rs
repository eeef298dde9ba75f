//! Retry rules (docs/policy.md, "Retry rules"): which answers from which
//! sites mean an exit is banned there, how they are stored, and which
//! rule applies to a target.

use serde::{Deserialize, Serialize};

use super::entries::normalize_list;
use super::matcher::entry_matches;
use super::target::PolicyTarget;

/// Most retry rules in one list (a user's, an account's, the operator's).
pub const MAX_RETRY_RULES: usize = 20;
/// Most other exits one rule may try after the first answer.
pub const MAX_RETRIES: u8 = 3;
/// Most site entries in one retry rule.
pub const MAX_RULE_SITES: usize = 100;
/// The longest response header name a rule may name.
const MAX_HEADER_NAME: usize = 64;

/// A ban rule (docs/policy.md, "Retry rules"): an answer from one of
/// `sites` whose status is one of `statuses` and which carries `header`
/// (each criterion that is given must hold, at least one is given) means
/// the exit is refused by that site; the gateway then tries up to `retry`
/// other exits (for requests safe to repeat) and, with `cool`, cools the
/// exit for the site.
///
/// Set on users and accounts (`PATCH`, `"retry_rules": [...]`) and by the
/// operator (`PUT /v1/policy`); [`rule_for`] picks the one that applies.
/// Unknown fields are ignored here, as in [`TrafficPolicy`](super::TrafficPolicy) (a newer
/// control-api may add some, and a record an older superproxy cannot read
/// would lock its user out); the control-api refuses them on input
/// ([`RetryRule::FIELDS`]), as its schema says, and needs at least one
/// status ([`RetryRule::normalized`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[schemars(
    deny_unknown_fields,
    description = "A ban rule (docs/policy.md, \"Retry rules\"): an answer from one of \
        `sites` with one of `statuses` (and `header`, if given) means the exit is refused by \
        that site; up to `retry` other exits are tried (for requests safe to repeat) and, with \
        `cool`, the exit is cooled for the site. The first rule whose sites cover the target \
        decides: the user's before the account's before the operator's."
)]
pub struct RetryRule {
    /// Domain entries as in the policies (a name covers the names under
    /// it, a network IP-literal targets); empty: every site.
    #[serde(default)]
    #[schemars(length(max = MAX_RULE_SITES))]
    pub sites: Vec<String>,
    /// Response statuses that mean a ban; empty: any status.
    #[serde(default)]
    // Required on input (`normalized` refuses a rule without one), though
    // a stored rule reads without.
    #[schemars(
        !default,
        length(min = 1),
        inner(range(min = 400, max = 599)),
        description = "Error statuses (400 to 599) that mean a ban; at least one"
    )]
    pub statuses: Vec<u16>,
    /// A response header (lower case) whose presence means a ban, e.g.
    /// `cf-mitigated`; none: any headers.
    #[serde(default)]
    #[schemars(regex(pattern = r"^[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}$"))]
    pub header: Option<String>,
    /// How many other exits to try after a ban, 0 to [`MAX_RETRIES`].
    #[serde(default)]
    #[schemars(
        range(min = 0, max = MAX_RETRIES),
        description = "How many other exits to try after a ban"
    )]
    pub retry: u8,
    /// Whether a ban cools the exit for the site at once.
    #[serde(default)]
    pub cool: bool,
}

impl RetryRule {
    pub const FIELDS: [&'static str; 5] = ["sites", "statuses", "header", "retry", "cool"];

    /// Whether the rule applies to the target: no sites, or one covering it
    /// as a policy's domain entry would ([`entry_matches`]).
    pub fn covers(&self, target: &PolicyTarget<'_>) -> bool {
        self.sites.is_empty() || self.sites.iter().any(|e| entry_matches(e, target))
    }

    /// Whether an answer with `status`, carrying the headers `has_header`
    /// says it carries (asked with a lower-case name), is a ban under this
    /// rule.
    pub fn bans(&self, status: u16, has_header: impl Fn(&str) -> bool) -> bool {
        (self.statuses.is_empty() || self.statuses.contains(&status))
            && self.header.as_deref().is_none_or(has_header)
    }

    /// [`RetryRule::covers`] the target and [`RetryRule::bans`] the answer.
    pub fn matches(
        &self,
        target: &PolicyTarget<'_>,
        status: u16,
        has_header: impl Fn(&str) -> bool,
    ) -> bool {
        self.covers(target) && self.bans(status, has_header)
    }

    /// The rule as stored: sites normalised like policy entries
    /// ([`normalize_list`]), statuses checked and de-duplicated, the header
    /// name lower-cased and checked, `retry` bounded. `Err` names the field.
    pub fn normalized(mut self, field: &str) -> Result<Self, String> {
        if self.sites.len() > MAX_RULE_SITES {
            return Err(format!("{field}.sites: at most {MAX_RULE_SITES} entries"));
        }
        self.sites = normalize_list(&format!("{field}.sites"), &self.sites)?;
        // A ban is an error answer: a rule that called a 200 a ban would
        // send every request to the target up to four times and throw away
        // answers that worked.
        if let Some(bad) = self.statuses.iter().find(|s| !(400..=599).contains(*s)) {
            return Err(format!(
                "{field}.statuses: {bad} is not an error status (400 to 599): only an error answer can be a ban"
            ));
        }
        let mut seen = Vec::with_capacity(self.statuses.len());
        self.statuses.retain(|s| {
            let first = !seen.contains(s);
            seen.push(*s);
            first
        });
        if let Some(header) = self.header.take() {
            let name = header.trim().to_ascii_lowercase();
            if !is_header_name(&name) {
                return Err(format!(
                    "{field}.header: {header:?} is not a header name (1 to {MAX_HEADER_NAME} of \
                     a-z 0-9 and !#$%&'*+-.^_`|~)"
                ));
            }
            self.header = Some(name);
        }
        if self.statuses.is_empty() {
            return Err(format!(
                "{field}.statuses: which error statuses are a ban (400 to 599; a header narrows them)"
            ));
        }
        if self.retry > MAX_RETRIES {
            return Err(format!("{field}.retry: from 0 to {MAX_RETRIES}"));
        }
        Ok(self)
    }
}

/// Whether `name` is a lower-case HTTP field name (RFC 9110 §5.1: a token)
/// of reasonable length.
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_HEADER_NAME
        && name.bytes().all(|b| {
            b.is_ascii_lowercase() || b.is_ascii_digit() || b"!#$%&'*+-.^_`|~".contains(&b)
        })
}

/// A whole list of retry rules as stored ([`RetryRule::normalized`] each,
/// at most [`MAX_RETRY_RULES`]); `field` names the list in errors.
pub fn normalize_retry_rules(field: &str, rules: Vec<RetryRule>) -> Result<Vec<RetryRule>, String> {
    if rules.len() > MAX_RETRY_RULES {
        return Err(format!("{field}: at most {MAX_RETRY_RULES} rules"));
    }
    rules
        .into_iter()
        .enumerate()
        .map(|(i, rule)| rule.normalized(&format!("{field}[{i}]")))
        .collect()
}

/// The retry rule that applies to a target: the first in the user's list
/// that covers it, else the first in the account's, else the first in the
/// operator's. The first covering rule decides even when it does not ban
/// the answer at hand or asks for nothing (`retry` 0, no `cool`): a user
/// or an account can so opt a site out of the rules below its own.
pub fn rule_for<'a>(
    user: &'a [RetryRule],
    account: &'a [RetryRule],
    operator: &'a [RetryRule],
    target: &PolicyTarget<'_>,
) -> Option<&'a RetryRule> {
    user.iter()
        .chain(account)
        .chain(operator)
        .find(|rule| rule.covers(target))
}
