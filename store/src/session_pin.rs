//! A sticky session's pin as it is stored in Redis
//! (`pn:session:{USER_ID}:SESSION`, a string with the pin's TTL): the
//! superproxies write and read it (`superproxy/src/select/sessions.rs`), the
//! control-api's session routes read it and move its expiry. Written once,
//! here, so both read the same thing.
//!
//! The value is `EXIT_ID[ EGRESS_IP][ idle:DEADLINE_MS]`: the pinned exit,
//! the egress IP the session leaves from once a tunnel chose one, and — for
//! `sessidle` sessions — the Unix time (ms, Redis' clock) after which the pin
//! counts as gone because no tunnel used it. Older readers that know only
//! `EXIT_ID[ EGRESS_IP]` still find the exit (the idle part does not parse
//! as an address). The pin's lifetime is the key's TTL, not part of the value.

use std::fmt::Write as _;
use std::net::IpAddr;
use uuid::Uuid;

/// What separates the idle deadline from the rest of the value. The Lua
/// scripts that compare pins strip it with the pattern ` idle:%d+$`.
pub const IDLE_MARK: &str = " idle:";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PinValue {
    pub exit: Uuid,
    pub egress_ip: Option<IpAddr>,
    /// Unix ms (Redis' clock): a pin not used by a tunnel until then is gone.
    pub idle_deadline_ms: Option<i64>,
}

impl PinValue {
    /// `EXIT_ID[ EGRESS_IP]`: what compare-and-set compares (the idle
    /// deadline moves with every tunnel and is no part of which pin it is).
    pub fn base(exit: Uuid, egress_ip: Option<IpAddr>) -> String {
        let mut value = exit.to_string();
        if let Some(ip) = egress_ip {
            let _ = write!(value, " {ip}");
        }
        value
    }

    /// The whole value as stored.
    pub fn encode(&self) -> String {
        let mut value = Self::base(self.exit, self.egress_ip);
        if let Some(deadline) = self.idle_deadline_ms {
            let _ = write!(value, "{IDLE_MARK}{deadline}");
        }
        value
    }

    /// The stored value, or `None` when it is not a pin.
    pub fn parse(value: &str) -> Option<Self> {
        let (rest, idle_deadline_ms) = match value.rsplit_once(IDLE_MARK) {
            Some((rest, deadline)) => (rest, Some(deadline.parse::<i64>().ok()?)),
            None => (value, None),
        };
        let (exit, egress_ip) = match rest.split_once(' ') {
            Some((exit, ip)) => (exit, Some(ip.parse().ok()?)),
            None => (rest, None),
        };
        Some(Self {
            exit: exit.parse().ok()?,
            egress_ip,
            idle_deadline_ms,
        })
    }

    /// The idle rule: a `sessidle` pin whose deadline is not after `now_ms`
    /// (Redis' clock) is gone, whatever its TTL says.
    pub fn idle_expired(&self, now_ms: i64) -> bool {
        self.idle_deadline_ms
            .is_some_and(|deadline| deadline <= now_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_round_trips_and_old_values_still_parse() {
        let exit = Uuid::new_v4();
        let ip: IpAddr = "2001:db8::7".parse().unwrap();
        for (egress_ip, idle_deadline_ms) in [
            (None, None),
            (Some(ip), None),
            (None, Some(1_700_000_000_000)),
            (Some(ip), Some(5)),
        ] {
            let pin = PinValue {
                exit,
                egress_ip,
                idle_deadline_ms,
            };
            assert_eq!(PinValue::parse(&pin.encode()), Some(pin));
        }
        // What superproxies wrote before sessions had an idle deadline.
        assert_eq!(
            PinValue::parse(&format!("{exit} 192.0.2.1"))
                .unwrap()
                .egress_ip,
            Some("192.0.2.1".parse().unwrap())
        );
        assert_eq!(
            PinValue::base(exit, Some(ip)),
            format!("{exit} 2001:db8::7")
        );
        for junk in ["", "x", &format!("{exit} nope"), &format!("{exit} idle:x")] {
            assert_eq!(PinValue::parse(junk), None, "{junk:?}");
        }
    }

    #[test]
    fn a_pin_is_idle_from_its_deadline_on() {
        let pin = PinValue {
            exit: Uuid::new_v4(),
            egress_ip: None,
            idle_deadline_ms: Some(1_000),
        };
        assert!(!pin.idle_expired(999));
        assert!(pin.idle_expired(1_000));
        assert!(pin.idle_expired(5_000));
        let no_idle = PinValue {
            idle_deadline_ms: None,
            ..pin
        };
        assert!(!no_idle.idle_expired(i64::MAX));
    }
}
