//! Which continent each country is on: the `continent` username key
//! (`continent-eu`) matches exits by the continent of their country.
//!
//! One code per ISO 3166-1 alpha-2 country (every assigned code, the same
//! 249 [`crate::username`] accepts), as GeoNames' `countryInfo` assigns them
//! (MaxMind's continent codes follow the same convention). A
//! transcontinental country gets the one continent GeoNames gives it (RU
//! and CY `eu`; TR, GE, AM, AZ and KZ `as`; EG `af`; TL `oc`); the
//! uninhabited southern territories (AQ, BV, GS, HM, TF) are `an`.

use std::fmt;

/// A continent as GeoNames codes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Continent {
    /// Africa.
    Af,
    /// Antarctica.
    An,
    /// Asia.
    As,
    /// Europe.
    Eu,
    /// North America (with Central America and the Caribbean).
    Na,
    /// Oceania.
    Oc,
    /// South America.
    Sa,
}

impl Continent {
    pub const ALL: [Continent; 7] = [
        Continent::Af,
        Continent::An,
        Continent::As,
        Continent::Eu,
        Continent::Na,
        Continent::Oc,
        Continent::Sa,
    ];

    /// The username's spelling (`eu`), any case.
    pub fn parse(value: &str) -> Option<Self> {
        let lower = value.to_ascii_lowercase();
        Self::ALL.into_iter().find(|c| c.as_str() == lower)
    }

    /// Lower case, as the username spells it: `af`, `an`, `as`, `eu`, `na`, `oc`, `sa`.
    pub fn as_str(self) -> &'static str {
        match self {
            Continent::Af => "af",
            Continent::An => "an",
            Continent::As => "as",
            Continent::Eu => "eu",
            Continent::Na => "na",
            Continent::Oc => "oc",
            Continent::Sa => "sa",
        }
    }

    /// The continent of an ISO 3166-1 alpha-2 country code (upper case, as
    /// exit records carry it); `None` for a code that is not assigned.
    pub fn of_country(code: &str) -> Option<Self> {
        COUNTRY_CONTINENTS
            .binary_search_by(|(country, _)| (*country).cmp(code))
            .ok()
            .map(|i| COUNTRY_CONTINENTS[i].1)
    }
}

impl fmt::Display for Continent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

use Continent::{Af, An, As, Eu, Na, Oc, Sa};

/// Every assigned ISO 3166-1 alpha-2 code and its continent, sorted by code.
const COUNTRY_CONTINENTS: [(&str, Continent); 249] = [
    ("AD", Eu),
    ("AE", As),
    ("AF", As),
    ("AG", Na),
    ("AI", Na),
    ("AL", Eu),
    ("AM", As),
    ("AO", Af),
    ("AQ", An),
    ("AR", Sa),
    ("AS", Oc),
    ("AT", Eu),
    ("AU", Oc),
    ("AW", Na),
    ("AX", Eu),
    ("AZ", As),
    ("BA", Eu),
    ("BB", Na),
    ("BD", As),
    ("BE", Eu),
    ("BF", Af),
    ("BG", Eu),
    ("BH", As),
    ("BI", Af),
    ("BJ", Af),
    ("BL", Na),
    ("BM", Na),
    ("BN", As),
    ("BO", Sa),
    ("BQ", Na),
    ("BR", Sa),
    ("BS", Na),
    ("BT", As),
    ("BV", An),
    ("BW", Af),
    ("BY", Eu),
    ("BZ", Na),
    ("CA", Na),
    ("CC", As),
    ("CD", Af),
    ("CF", Af),
    ("CG", Af),
    ("CH", Eu),
    ("CI", Af),
    ("CK", Oc),
    ("CL", Sa),
    ("CM", Af),
    ("CN", As),
    ("CO", Sa),
    ("CR", Na),
    ("CU", Na),
    ("CV", Af),
    ("CW", Na),
    ("CX", As),
    ("CY", Eu),
    ("CZ", Eu),
    ("DE", Eu),
    ("DJ", Af),
    ("DK", Eu),
    ("DM", Na),
    ("DO", Na),
    ("DZ", Af),
    ("EC", Sa),
    ("EE", Eu),
    ("EG", Af),
    ("EH", Af),
    ("ER", Af),
    ("ES", Eu),
    ("ET", Af),
    ("FI", Eu),
    ("FJ", Oc),
    ("FK", Sa),
    ("FM", Oc),
    ("FO", Eu),
    ("FR", Eu),
    ("GA", Af),
    ("GB", Eu),
    ("GD", Na),
    ("GE", As),
    ("GF", Sa),
    ("GG", Eu),
    ("GH", Af),
    ("GI", Eu),
    ("GL", Na),
    ("GM", Af),
    ("GN", Af),
    ("GP", Na),
    ("GQ", Af),
    ("GR", Eu),
    ("GS", An),
    ("GT", Na),
    ("GU", Oc),
    ("GW", Af),
    ("GY", Sa),
    ("HK", As),
    ("HM", An),
    ("HN", Na),
    ("HR", Eu),
    ("HT", Na),
    ("HU", Eu),
    ("ID", As),
    ("IE", Eu),
    ("IL", As),
    ("IM", Eu),
    ("IN", As),
    ("IO", As),
    ("IQ", As),
    ("IR", As),
    ("IS", Eu),
    ("IT", Eu),
    ("JE", Eu),
    ("JM", Na),
    ("JO", As),
    ("JP", As),
    ("KE", Af),
    ("KG", As),
    ("KH", As),
    ("KI", Oc),
    ("KM", Af),
    ("KN", Na),
    ("KP", As),
    ("KR", As),
    ("KW", As),
    ("KY", Na),
    ("KZ", As),
    ("LA", As),
    ("LB", As),
    ("LC", Na),
    ("LI", Eu),
    ("LK", As),
    ("LR", Af),
    ("LS", Af),
    ("LT", Eu),
    ("LU", Eu),
    ("LV", Eu),
    ("LY", Af),
    ("MA", Af),
    ("MC", Eu),
    ("MD", Eu),
    ("ME", Eu),
    ("MF", Na),
    ("MG", Af),
    ("MH", Oc),
    ("MK", Eu),
    ("ML", Af),
    ("MM", As),
    ("MN", As),
    ("MO", As),
    ("MP", Oc),
    ("MQ", Na),
    ("MR", Af),
    ("MS", Na),
    ("MT", Eu),
    ("MU", Af),
    ("MV", As),
    ("MW", Af),
    ("MX", Na),
    ("MY", As),
    ("MZ", Af),
    ("NA", Af),
    ("NC", Oc),
    ("NE", Af),
    ("NF", Oc),
    ("NG", Af),
    ("NI", Na),
    ("NL", Eu),
    ("NO", Eu),
    ("NP", As),
    ("NR", Oc),
    ("NU", Oc),
    ("NZ", Oc),
    ("OM", As),
    ("PA", Na),
    ("PE", Sa),
    ("PF", Oc),
    ("PG", Oc),
    ("PH", As),
    ("PK", As),
    ("PL", Eu),
    ("PM", Na),
    ("PN", Oc),
    ("PR", Na),
    ("PS", As),
    ("PT", Eu),
    ("PW", Oc),
    ("PY", Sa),
    ("QA", As),
    ("RE", Af),
    ("RO", Eu),
    ("RS", Eu),
    ("RU", Eu),
    ("RW", Af),
    ("SA", As),
    ("SB", Oc),
    ("SC", Af),
    ("SD", Af),
    ("SE", Eu),
    ("SG", As),
    ("SH", Af),
    ("SI", Eu),
    ("SJ", Eu),
    ("SK", Eu),
    ("SL", Af),
    ("SM", Eu),
    ("SN", Af),
    ("SO", Af),
    ("SR", Sa),
    ("SS", Af),
    ("ST", Af),
    ("SV", Na),
    ("SX", Na),
    ("SY", As),
    ("SZ", Af),
    ("TC", Na),
    ("TD", Af),
    ("TF", An),
    ("TG", Af),
    ("TH", As),
    ("TJ", As),
    ("TK", Oc),
    ("TL", Oc),
    ("TM", As),
    ("TN", Af),
    ("TO", Oc),
    ("TR", As),
    ("TT", Na),
    ("TV", Oc),
    ("TW", As),
    ("TZ", Af),
    ("UA", Eu),
    ("UG", Af),
    ("UM", Oc),
    ("US", Na),
    ("UY", Sa),
    ("UZ", As),
    ("VA", Eu),
    ("VC", Na),
    ("VE", Sa),
    ("VG", Na),
    ("VI", Na),
    ("VN", As),
    ("VU", Oc),
    ("WF", Oc),
    ("WS", Oc),
    ("YE", As),
    ("YT", Af),
    ("ZA", Af),
    ("ZM", Af),
    ("ZW", Af),
];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::username::is_country_code;

    #[test]
    fn the_table_is_sorted_and_covers_exactly_the_assigned_codes() {
        assert!(COUNTRY_CONTINENTS.windows(2).all(|w| w[0].0 < w[1].0));
        for a in b'A'..=b'Z' {
            for b in b'A'..=b'Z' {
                let code = String::from_utf8(vec![a, b]).unwrap();
                assert_eq!(
                    Continent::of_country(&code).is_some(),
                    is_country_code(&code),
                    "{code}"
                );
            }
        }
        // Every continent has countries.
        for continent in Continent::ALL {
            assert!(COUNTRY_CONTINENTS.iter().any(|(_, c)| *c == continent));
        }
    }

    #[test]
    fn countries_land_where_geonames_puts_them() {
        let cases = [
            ("DE", Eu),
            ("US", Na),
            ("MX", Na),
            ("PA", Na),
            ("BR", Sa),
            ("JP", As),
            ("TR", As),
            ("RU", Eu),
            ("CY", Eu),
            ("EG", Af),
            ("AU", Oc),
            ("TL", Oc),
            ("AQ", An),
            ("GL", Na),
            ("GF", Sa),
            ("RE", Af),
        ];
        for (code, continent) in cases {
            assert_eq!(Continent::of_country(code), Some(continent), "{code}");
        }
        assert_eq!(Continent::of_country("de"), None, "upper case only");
        assert_eq!(Continent::of_country("XX"), None);
        assert_eq!(Continent::parse("EU"), Some(Eu));
        assert_eq!(Continent::parse("eu"), Some(Eu));
        assert_eq!(Continent::parse("europe"), None);
        assert_eq!(Sa.to_string(), "sa");
    }
}
