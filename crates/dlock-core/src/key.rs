//! [`LockKey`]: the validated name of a lock.

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;

use crate::{Error, Result};

/// The name of a lock: non-empty, at most [`LockKey::MAX_LEN`] bytes of UTF-8,
/// with no NUL or other control characters.
///
/// Every driver maps a `LockKey` into its own namespace under a configurable
/// prefix; a driver whose backend cannot store some valid key refuses it with
/// [`Error::InvalidKey`] at acquire time. Cloning is cheap (shared storage).
///
/// # Examples
///
/// ```
/// use dlock_core::LockKey;
///
/// let key = LockKey::new("job:4471")?;
/// assert_eq!(key.as_str(), "job:4471");
/// assert!(LockKey::new("").is_err());
/// assert!(LockKey::new("a\0b").is_err());
/// # Ok::<(), dlock_core::Error>(())
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct LockKey(Arc<str>);

impl LockKey {
    /// The longest key accepted, in bytes.
    pub const MAX_LEN: usize = 512;

    /// Validates `name` and makes it a key.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidKey`] if `name` is empty, longer than
    /// [`MAX_LEN`](Self::MAX_LEN) bytes, or contains a control character
    /// (NUL included).
    pub fn new(name: impl AsRef<str>) -> Result<Self> {
        let name = name.as_ref();
        if name.is_empty() {
            return Err(invalid("the key is empty".to_owned()));
        }
        if name.len() > Self::MAX_LEN {
            return Err(invalid(format!(
                "the key is {} bytes long; at most {} are allowed",
                name.len(),
                Self::MAX_LEN
            )));
        }
        if let Some((at, c)) = name.char_indices().find(|(_, c)| c.is_control()) {
            return Err(invalid(format!(
                "the key has the control character {c:?} at byte {at}"
            )));
        }
        Ok(LockKey(Arc::from(name)))
    }

    /// The key as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn invalid(reason: String) -> Error {
    Error::InvalidKey { reason }
}

impl fmt::Debug for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for LockKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl AsRef<str> for LockKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl FromStr for LockKey {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        LockKey::new(s)
    }
}

impl TryFrom<&str> for LockKey {
    type Error = Error;
    fn try_from(s: &str) -> Result<Self> {
        LockKey::new(s)
    }
}

impl TryFrom<String> for LockKey {
    type Error = Error;
    fn try_from(s: String) -> Result<Self> {
        LockKey::new(s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_ordinary_names() {
        for name in ["a", "job:4471", "s3://bucket/obj", "ünïcødé", &"x".repeat(512)] {
            assert_eq!(LockKey::new(name).unwrap().as_str(), name);
        }
    }

    #[test]
    fn refuses_bad_names_without_panicking() {
        for name in ["", "a\0b", "tab\there", "line\n", "\u{7f}", &"x".repeat(513)] {
            let err = LockKey::new(name).unwrap_err();
            assert!(matches!(err, Error::InvalidKey { .. }), "{name:?}: {err}");
        }
        // 512 bytes of a multi-byte character is fine, 513 is not.
        assert!(LockKey::new("é".repeat(256)).is_ok());
        assert!(LockKey::new(format!("{}x", "é".repeat(256))).is_err());
    }
}
