//! The partner's username template: parsed once, rendered per tunnel from
//! what the tunnel asks, with every customer value sanitised.

/// What a tunnel asks of the partner, rendered into the username. Values are
/// the customer's and are sanitised by [`Template::render`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct UpstreamAsk {
    pub(crate) session: Option<String>,
    pub(crate) country: Option<String>,
    pub(crate) city: Option<String>,
}

/// A placeholder of the username template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    User,
    Session,
    Country,
    City,
}

const SLOT_NAMES: &str = "{user}, {session}, {country}, {city}";

#[derive(Debug, Clone, PartialEq, Eq)]
enum Piece {
    Text(String),
    Slot(Slot),
}

/// Which tunnel options a template passes on: what the exit can declare its
/// partner supports.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct TemplateKeys {
    pub(crate) session: bool,
    pub(crate) country: bool,
    pub(crate) city: bool,
}

impl TemplateKeys {
    /// `session`, `country`, `city`: those the template uses, in that order.
    pub(crate) fn names(self) -> Vec<&'static str> {
        [
            (self.session, "session"),
            (self.country, "country"),
            (self.city, "city"),
        ]
        .into_iter()
        .filter_map(|(used, name)| used.then_some(name))
        .collect()
    }
}

/// The partner's username format, such as
/// `{user}-country-{country}-session-{session}`, parsed once.
///
/// Placeholders: `{user}` (the account named in the upstream URL, verbatim:
/// it is the operator's), `{session}`, `{country}`, `{city}` (the tunnel's
/// [`UpstreamAsk`]). Unknown placeholders, unbalanced braces, empty segments
/// and `:` or blanks in the text are refused at parse.
///
/// Rendering rule. The template is split at every `-` into *segments*. A
/// segment renders as its text with each placeholder replaced by its value.
/// A placeholder has no value when the ask leaves it out or its value is
/// empty once sanitised. When a segment holds a placeholder without a value,
/// the segment is left out; and when that placeholder is the whole segment,
/// the segment just before it is left out too if it is plain text (no
/// placeholder): that is its key. The segments kept are joined with `-`.
/// So `{user}-country-{country}-session-{session}` with no country renders
/// `acme-session-S`, with nothing but the user `acme`; `{user}-cc_{country}`
/// with no country renders `acme` (the segment carries its own key).
///
/// Sanitising: a session keeps only `[A-Za-z0-9]`; a country too, lower-cased;
/// a city too (spaces and everything else removed, case kept). A customer's
/// value can never add a segment, a `-` or a `:` (which would end the
/// username in a Basic credential).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Template {
    segments: Vec<Vec<Piece>>,
}

impl Template {
    pub(crate) fn parse(text: &str) -> Result<Template, String> {
        let text = text.trim();
        if text.is_empty() {
            return Err("the upstream username template is empty".into());
        }
        let segments = text
            .split('-')
            .map(|segment| {
                if segment.is_empty() {
                    Err(format!(
                        "username template {text:?} has an empty segment (two `-` in a row, or one at an end)"
                    ))
                } else {
                    parse_segment(text, segment)
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Template { segments })
    }

    /// Which of session, country and city the template passes on.
    pub(crate) fn keys(&self) -> TemplateKeys {
        TemplateKeys {
            session: self.uses(Slot::Session),
            country: self.uses(Slot::Country),
            city: self.uses(Slot::City),
        }
    }

    pub(super) fn uses_user(&self) -> bool {
        self.uses(Slot::User)
    }

    fn uses(&self, slot: Slot) -> bool {
        self.segments
            .iter()
            .flatten()
            .any(|piece| *piece == Piece::Slot(slot))
    }

    /// The username for one tunnel; see the type's rule for missing values.
    pub(crate) fn render(&self, user: &str, ask: &UpstreamAsk) -> String {
        let values = Values {
            user: (!user.is_empty()).then_some(user),
            session: sanitised(ask.session.as_deref(), false),
            country: sanitised(ask.country.as_deref(), true),
            city: sanitised(ask.city.as_deref(), false),
        };
        let mut kept: Vec<Option<String>> = Vec::with_capacity(self.segments.len());
        for (i, segment) in self.segments.iter().enumerate() {
            let mut out = String::new();
            let mut missing = false;
            for piece in segment {
                match piece {
                    Piece::Text(text) => out.push_str(text),
                    Piece::Slot(slot) => match values.get(*slot) {
                        Some(value) => out.push_str(value),
                        None => missing = true,
                    },
                }
            }
            if !missing {
                kept.push(Some(out));
                continue;
            }
            let alone = segment.len() == 1;
            if alone && i > 0 && is_plain_text(&self.segments[i - 1]) {
                // Its key (`country` before `{country}`) goes with it.
                if let Some(key) = kept.get_mut(i - 1) {
                    *key = None;
                }
            }
            kept.push(None);
        }
        kept.into_iter().flatten().collect::<Vec<_>>().join("-")
    }
}

fn is_plain_text(segment: &[Piece]) -> bool {
    segment.iter().all(|piece| matches!(piece, Piece::Text(_)))
}

/// One `-`-free segment: text and placeholders.
fn parse_segment(template: &str, segment: &str) -> Result<Vec<Piece>, String> {
    let unbalanced = || format!("username template {template:?} has unbalanced braces");
    let mut pieces = Vec::new();
    let mut rest = segment;
    while !rest.is_empty() {
        let Some(at) = rest.find(['{', '}']) else {
            pieces.push(checked_text(template, rest)?);
            break;
        };
        if at > 0 {
            pieces.push(checked_text(template, &rest[..at])?);
        }
        let Some(opened) = rest[at..].strip_prefix('{') else {
            return Err(unbalanced()); // a `}` with no `{`
        };
        let close = opened.find('}').ok_or_else(unbalanced)?;
        let name = &opened[..close];
        let slot = match name {
            "user" => Slot::User,
            "session" => Slot::Session,
            "country" => Slot::Country,
            "city" => Slot::City,
            _ if name.contains('{') => return Err(unbalanced()),
            _ => {
                return Err(format!(
                    "username template {template:?}: unknown placeholder {{{name}}} (known: {SLOT_NAMES})"
                ))
            }
        };
        pieces.push(Piece::Slot(slot));
        rest = &opened[close + 1..];
    }
    Ok(pieces)
}

/// Literal text of a template: printable ASCII without `:` (which would end
/// the username inside a Basic credential).
fn checked_text(template: &str, text: &str) -> Result<Piece, String> {
    if text.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
        Ok(Piece::Text(text.to_owned()))
    } else {
        Err(format!(
            "username template {template:?}: its text may hold only printable ASCII without `:`"
        ))
    }
}

/// A customer's value reduced to `[A-Za-z0-9]` (lower-cased if asked);
/// nothing left is no value.
fn sanitised(value: Option<&str>, lower: bool) -> Option<String> {
    let kept: String = value?
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .map(|c| if lower { c.to_ascii_lowercase() } else { c })
        .collect();
    (!kept.is_empty()).then_some(kept)
}

struct Values<'a> {
    user: Option<&'a str>,
    session: Option<String>,
    country: Option<String>,
    city: Option<String>,
}

impl Values<'_> {
    fn get(&self, slot: Slot) -> Option<&str> {
        match slot {
            Slot::User => self.user,
            Slot::Session => self.session.as_deref(),
            Slot::Country => self.country.as_deref(),
            Slot::City => self.city.as_deref(),
        }
    }
}
