//! The guard's client side, from [`dlock_core::driver`]: its validity and
//! the keeper task, fed by the Redis scripts' [`Outcome`].

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dlock_core::Result;
pub use dlock_core::driver::Validity;

use crate::Outcome;

/// [`dlock_core::driver::keep`] with a renewal that answers in the
/// scripts' [`Outcome`].
pub async fn keep<R, Fut>(
    validity: Arc<Validity>,
    ttl: Duration,
    auto_extend: bool,
    sent: Instant,
    mut renew: R,
    stopped: impl Fn() -> bool,
) where
    R: FnMut() -> Fut,
    Fut: Future<Output = Result<Outcome>>,
{
    let renew = move || {
        let r = renew();
        async move { r.await.map(Outcome::refusal) }
    };
    dlock_core::driver::keep(validity, ttl, auto_extend, sent, renew, stopped).await;
}
