//! Stage 2, authorize: what the logged-in user may ask for. The username's
//! targeting is bounded by what the account allows the user (its
//! entitlements) and by what the account's plan prices; the bounds travel on
//! with the request so selection never picks outside them.

use crate::error::{ErrorKind, ProxyError};
use crate::request::{Client, UserLimits};

use super::authenticate::LoggedIn;

/// The authenticated client, or a 403 naming the targeting it may not use.
pub(super) fn authorize(logged_in: LoggedIn) -> Result<Client, ProxyError> {
    let LoggedIn {
        mut request,
        verified,
        network,
    } = logged_in;
    let user = &verified.record;
    let targeting = &mut request.targeting;
    within(
        targeting.source_type.as_ref(),
        user.allowed_source_types.as_deref(),
        || {
            format!(
                "this proxy user may not use type={}",
                source_type(targeting)
            )
        },
    )?;
    within(
        targeting.country.as_ref(),
        user.allowed_countries.as_deref(),
        || {
            format!(
                "this proxy user may not use country={}",
                targeting.country.as_deref().unwrap_or_default()
            )
        },
    )?;
    within(
        targeting.channel.as_ref(),
        user.allowed_channels.as_deref(),
        || {
            format!(
                "this proxy user may not use channel={}",
                targeting.channel.map(|c| c.as_str()).unwrap_or_default()
            )
        },
    )?;
    within(
        targeting.source_type.as_ref(),
        user.plan_source_types.as_deref(),
        || {
            format!(
                "the account's plan does not price type={} exits",
                source_type(targeting)
            )
        },
    )?;
    targeting.allowed_types = user.allowed_source_types.clone();
    targeting.allowed_countries = user.allowed_countries.clone();
    targeting.allowed_channels = user.allowed_channels.clone();
    targeting.plan_types = user.plan_source_types.clone();
    targeting.tenant = Some((user.account_id, user.id));
    targeting.dedicated |= user.dedicated_only;
    targeting.dedicated_fallback = user.dedicated_fallback;
    Ok(Client {
        user_id: user.id,
        account_id: user.account_id,
        username: user.username.clone(),
        credential_digest: verified.credential_digest,
        limits: UserLimits {
            max_concurrent_tunnels: user.max_concurrent_tunnels,
            max_new_tunnels_per_second: user.max_new_tunnels_per_second,
            bandwidth: user.bandwidth_bytes.map(|b| (b, user.quota_period)),
            account: user.account_limits,
        },
        request,
        network,
        record: verified.record.clone(),
    })
}

fn source_type(targeting: &proxynet_wire::username::Targeting) -> &'static str {
    targeting
        .source_type
        .map(|t| t.as_str())
        .unwrap_or_default()
}

/// An ask outside an allowed set is refused; no ask, or no set, passes.
fn within<T: PartialEq>(
    asked: Option<&T>,
    allowed: Option<&[T]>,
    refusal: impl FnOnce() -> String,
) -> Result<(), ProxyError> {
    match (asked, allowed) {
        (Some(asked), Some(allowed)) if !allowed.contains(asked) => {
            Err(ProxyError::new(ErrorKind::TargetingNotAllowed, refusal()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::within;

    #[test]
    fn an_ask_outside_the_allowed_set_is_refused_and_no_set_allows_anything() {
        let allowed = ["us".to_owned(), "de".to_owned()];
        let us = "us".to_owned();
        let fr = "fr".to_owned();
        assert!(within(Some(&us), Some(&allowed[..]), String::new).is_ok());
        assert!(within(None, Some(&allowed[..]), String::new).is_ok());
        assert!(within(Some(&fr), None, String::new).is_ok());
        let refused = within(Some(&fr), Some(&allowed[..]), || "country=fr".to_owned())
            .expect_err("fr is not allowed");
        assert_eq!(refused.kind, crate::error::ErrorKind::TargetingNotAllowed);
        // An empty set allows nothing: an operator who clears the list
        // closes the targeting, not opens it.
        assert!(within(Some(&us), Some(&[][..]), String::new).is_err());
    }
}
