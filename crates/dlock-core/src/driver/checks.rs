//! The argument checks every acquire and extend makes.

use std::time::Duration;

use crate::{Error, Result};

/// Checks a TTL asked of `backend` (on acquire or extend): more than zero
/// and at most [`AcquireOptions::MAX_TTL`](crate::AcquireOptions::MAX_TTL).
/// Every acquire is checked by [`Lock::acquire_claim`](crate::Lock::acquire_claim);
/// a driver calls this at the top of its [`Guard::extend`](crate::Guard::extend).
///
/// A zero TTL would become the backend's shortest lease renewed hundreds of
/// times a second, and lost at random under load; a TTL of years would keep
/// a crashed holder's lock that long.
///
/// # Errors
///
/// [`Error::InvalidConfig`] naming the backend and the TTL otherwise.
pub fn check_ttl(backend: &'static str, ttl: Duration) -> Result<()> {
    let max = crate::AcquireOptions::MAX_TTL;
    if ttl.is_zero() {
        return Err(Error::InvalidConfig(format!(
            "{backend}: a lock's TTL must be more than zero (it is how long the lock outlives a crashed holder)"
        )));
    }
    if ttl > max {
        return Err(Error::InvalidConfig(format!(
            "{backend}: a TTL of {ttl:?} is more than the {}h allowed (a crashed holder's lock would be kept that long)",
            max.as_secs() / 3600
        )));
    }
    Ok(())
}

/// Checks a semaphore request: `1 <= count <= limit`.
///
/// # Errors
///
/// [`Error::InvalidConfig`] naming the numbers otherwise.
pub fn check_permits(count: u32, limit: u32) -> Result<()> {
    if count == 0 || count > limit {
        return Err(Error::InvalidConfig(format!(
            "a semaphore's permits: asked for {count} of {limit}, need 1 to {limit} (and a limit of at least 1)"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttls_of_zero_or_more_than_a_day_are_refused() {
        let max = crate::AcquireOptions::MAX_TTL;
        for bad in [Duration::ZERO, max + Duration::from_nanos(1), Duration::MAX] {
            match check_ttl("redis", bad) {
                Err(Error::InvalidConfig(m)) => assert!(m.starts_with("redis: "), "{m}"),
                other => panic!("{bad:?}: {other:?}"),
            }
        }
        for good in [Duration::from_nanos(1), Duration::from_secs(30), max] {
            check_ttl("redis", good).unwrap();
        }
    }
}
