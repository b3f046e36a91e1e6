//! How a release or an extend ended: done, or refused.

use crate::{Error, LockKey};

/// A server's refusal of a release or an extend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Our grant is gone (expired, its lease or session ended).
    Expired,
    /// Someone else holds the name now.
    HeldByOther,
}

impl Refusal {
    /// The `why` of the `lost` event this refusal causes.
    pub fn why(self) -> &'static str {
        match self {
            Refusal::Expired => crate::trace::why::EXPIRED,
            Refusal::HeldByOther => crate::trace::why::HELD_BY_OTHER,
        }
    }

    /// The error a caller sees: [`Error::Lost`] for [`Refusal::Expired`],
    /// [`Error::NotHeld`] for [`Refusal::HeldByOther`].
    pub fn into_error(self, key: &LockKey) -> Error {
        let key = key.as_str().to_owned();
        match self {
            Refusal::Expired => Error::Lost { key },
            Refusal::HeldByOther => Error::NotHeld { key },
        }
    }
}

/// What a release or an extend came to: done, or refused.
pub type Outcome = std::result::Result<(), Refusal>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refusals_map_to_lost_and_not_held() {
        let k = LockKey::new("k").unwrap();
        assert!(matches!(Refusal::Expired.into_error(&k), Error::Lost { .. }));
        assert!(matches!(
            Refusal::HeldByOther.into_error(&k),
            Error::NotHeld { .. }
        ));
    }
}
