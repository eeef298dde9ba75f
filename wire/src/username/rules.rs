//! The grammar's fixed vocabulary: its length limits, the base-username
//! rule, and the ISO 3166 country and subdivision codes it accepts.

/// Longest username accepted (RFC 1929 caps SOCKS at 255 anyway).
pub const MAX_USERNAME_BYTES: usize = 256;
pub const DEFAULT_SESSION_MINUTES: u32 = 10;
pub const MAX_SESSION_MINUTES: u32 = 1440;

/// ISO 3166-1 alpha-2 codes currently assigned.
pub(super) const COUNTRIES: &str = "AD AE AF AG AI AL AM AO AQ AR AS AT AU AW AX AZ BA BB BD BE BF BG BH BI BJ BL BM BN BO BQ BR BS BT BV BW BY BZ \
CA CC CD CF CG CH CI CK CL CM CN CO CR CU CV CW CX CY CZ DE DJ DK DM DO DZ EC EE EG EH ER ES ET FI FJ FK FM FO FR \
GA GB GD GE GF GG GH GI GL GM GN GP GQ GR GS GT GU GW GY HK HM HN HR HT HU ID IE IL IM IN IO IQ IR IS IT JE JM JO JP \
KE KG KH KI KM KN KP KR KW KY KZ LA LB LC LI LK LR LS LT LU LV LY MA MC MD ME MF MG MH MK ML MM MN MO MP MQ MR MS MT \
MU MV MW MX MY MZ NA NC NE NF NG NI NL NO NP NR NU NZ OM PA PE PF PG PH PK PL PM PN PR PS PT PW PY QA RE RO RS RU RW \
SA SB SC SD SE SG SH SI SJ SK SL SM SN SO SR SS ST SV SX SY SZ TC TD TF TG TH TJ TK TL TM TN TO TR TT TV TW TZ UA UG \
UM US UY UZ VA VC VE VG VI VN VU WF WS YE YT ZA ZM ZW";

pub fn is_country_code(code: &str) -> bool {
    code.len() == 2 && COUNTRIES.split(' ').any(|c| c == code)
}

/// The base-username rule: 1–64 of `A-Z a-z 0-9 _ .` (no `-`, which starts
/// the grammar). A name outside it cannot exist, so it never reaches Redis
/// as a key.
pub fn is_base_username(user: &str) -> bool {
    !user.is_empty()
        && user.len() <= MAX_BASE_USERNAME_BYTES
        && user
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
}

/// Longest base username.
pub const MAX_BASE_USERNAME_BYTES: usize = 64;

/// Longest option string stored for allow-listed logins.
pub const MAX_OPTIONS_BYTES: usize = 200;

/// An ISO 3166-2 code from its two parts (`de`, `by`), upper case
/// (`DE-BY`): an assigned country, then 1–3 letters or digits.
pub fn subdivision_code(country: &str, subdivision: &str) -> Option<String> {
    let country = country.to_ascii_uppercase();
    (is_country_code(&country)
        && (1..=3).contains(&subdivision.len())
        && subdivision.bytes().all(|b| b.is_ascii_alphanumeric()))
    .then(|| format!("{country}-{}", subdivision.to_ascii_uppercase()))
}

/// A whole ISO 3166-2 code (`de-by`, `US-CA`) in upper case, as exits
/// declare theirs; `None` when it is not one.
pub fn parse_subdivision(code: &str) -> Option<String> {
    let (country, subdivision) = code.split_once('-')?;
    subdivision_code(country, subdivision)
}
