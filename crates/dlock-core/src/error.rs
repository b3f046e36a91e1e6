//! The one error type of dlock.

use std::error::Error as StdError;

/// A boxed error from a backend's client library, kept as the `source` of
/// [`Error::Unavailable`] and [`Error::Backend`].
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Shorthand for `Result<T, dlock_core::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong when taking, keeping or giving back a lock.
///
/// The variants are *semantic*: callers (and the conformance kit) branch on
/// them with `matches!`, never on message text. Each driver maps its client
/// library's errors into these; nothing a server replies makes a driver panic.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The wait asked for in [`AcquireOptions::wait`](crate::AcquireOptions)
    /// ran out (for [`Wait::No`](crate::Wait::No): the key was held) before
    /// the lock was granted. Nothing is left held or queued: the driver
    /// removes its place in line before it returns, or, if that fails (the
    /// server out of reach), keeps trying in the background until it is
    /// done or the lease/session it lives on has ended.
    #[error("timed out waiting for lock {key:?}")]
    Timeout {
        /// The key that could not be acquired in time.
        key: String,
    },
    /// The lock is, or may be, no longer held by this guard: its TTL or lease
    /// ran out, its session ended, or a renewal could not finish in time.
    #[error("lock {key:?} was lost")]
    Lost {
        /// The key whose lock was lost.
        key: String,
    },
    /// Someone else holds the lock: a release or extend by anyone but the
    /// owner is refused and changes nothing.
    #[error("lock {key:?} is not held by this guard")]
    NotHeld {
        /// The key the caller does not hold.
        key: String,
    },
    /// The key is not a valid lock name (empty, too long, control characters)
    /// or the backend cannot store it.
    #[error("invalid lock key: {reason}")]
    InvalidKey {
        /// Why the key was refused.
        reason: String,
    },
    /// A configuration value or URL was refused (a semaphore's permits
    /// among them: a count of 1 to `limit`, a limit of at least 1).
    #[error("invalid configuration: {0}")]
    InvalidConfig(String),
    /// The backend does not offer this primitive (read-write locks,
    /// semaphores), or cannot keep its invariant; see
    /// [`Capabilities`](crate::Capabilities).
    #[error("{backend} does not offer {what}: {why}")]
    Unsupported {
        /// The backend's short name.
        backend: &'static str,
        /// The primitive asked for.
        what: &'static str,
        /// Why not.
        why: &'static str,
    },
    /// The backend could not be reached, or has no quorum. Shown as one
    /// sentence: `redis at 127.0.0.1:6379 unavailable: connection refused`
    /// when the driver knows the endpoint (the source is then an
    /// [`Unreachable`], whose own source is the client library's error).
    #[error("{}", unavailable_message(backend, source))]
    Unavailable {
        /// The backend's short name.
        backend: &'static str,
        /// What the client library reported.
        #[source]
        source: BoxError,
    },
    /// The backend answered with an error or a reply the driver did not expect.
    #[error("{backend} error: {source}")]
    Backend {
        /// The backend's short name.
        backend: &'static str,
        /// What the client library reported.
        #[source]
        source: BoxError,
    },
}

impl Error {
    /// `true` for [`Error::Timeout`].
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }

    /// `true` for [`Error::Lost`].
    pub fn is_lost(&self) -> bool {
        matches!(self, Error::Lost { .. })
    }

    /// `true` for [`Error::NotHeld`].
    pub fn is_not_held(&self) -> bool {
        matches!(self, Error::NotHeld { .. })
    }

    /// Builds an [`Error::Backend`] from anything that converts into a [`BoxError`].
    pub fn backend(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Backend {
            backend,
            source: source.into(),
        }
    }

    /// Builds an [`Error::Unavailable`] from anything that converts into a [`BoxError`].
    pub fn unavailable(backend: &'static str, source: impl Into<BoxError>) -> Self {
        Error::Unavailable {
            backend,
            source: source.into(),
        }
    }

    /// An [`Error::Unavailable`] told as having happened at `endpoint`
    /// (`host:port`, credentials already hidden): its source becomes an
    /// [`Unreachable`] with the cause in plain words and the original error
    /// as *its* source. Any other error is returned as it is.
    pub fn at(self, endpoint: &str) -> Self {
        match self {
            Error::Unavailable { backend, source } if !source.is::<Unreachable>() => Error::Unavailable {
                backend,
                source: Box::new(Unreachable::new(endpoint, source)),
            },
            other => other,
        }
    }
}

fn unavailable_message(backend: &str, source: &BoxError) -> String {
    match source.downcast_ref::<Unreachable>() {
        Some(u) => format!("{backend} at {} unavailable: {}", u.endpoint, u.cause),
        None => format!("{backend} unavailable: {source}"),
    }
}

/// A backend out of reach, said for people: where it was asked (an endpoint,
/// credentials hidden) and what happened, in a few plain words. The client
/// library's own error, with all its detail, stays reachable as
/// [`source()`](StdError::source).
///
/// ```
/// use dlock_core::{Error, Unreachable};
/// let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
/// let e = Error::unavailable("redis", refused).at("127.0.0.1:1");
/// assert_eq!(e.to_string(), "redis at 127.0.0.1:1 unavailable: connection refused");
/// let e = Error::unavailable("zk", Unreachable::because("127.0.0.1:1", "no server answered within 5s"));
/// assert_eq!(e.to_string(), "zk at 127.0.0.1:1 unavailable: no server answered within 5s");
/// ```
#[derive(Debug)]
pub struct Unreachable {
    endpoint: String,
    cause: String,
    source: Option<BoxError>,
}

impl Unreachable {
    /// `endpoint` could not be reached because of `source` (its cause is
    /// read off it: see [`plain_cause`]).
    pub fn new(endpoint: &str, source: impl Into<BoxError>) -> Self {
        let source = source.into();
        Unreachable {
            endpoint: endpoint.to_owned(),
            cause: plain_cause(&*source),
            source: Some(source),
        }
    }

    /// `endpoint` could not be reached, for the reason `cause` (no library
    /// error behind it: a time-out of the driver's own).
    pub fn because(endpoint: &str, cause: impl Into<String>) -> Self {
        Unreachable {
            endpoint: endpoint.to_owned(),
            cause: cause.into(),
            source: None,
        }
    }

    /// Where the backend was asked.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// What happened, in a few plain words.
    pub fn cause(&self) -> &str {
        &self.cause
    }
}

impl std::fmt::Display for Unreachable {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.cause)
    }
}

impl StdError for Unreachable {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        self.source.as_deref().map(|e| e as &(dyn StdError + 'static))
    }
}

/// What went wrong with a connection, in a few plain words, read off an
/// error and its sources: the first I/O error in the chain (its kind when
/// that is a connection's fate, `connection refused`, `timed out`; its
/// message otherwise, which says more than `other error`); else a
/// connection's fate named in a client library's message that prints an I/O
/// error's `Debug` form (`... kind: ConnectionRefused ...`); else a message
/// that is one `CamelCase` word, in words; else the message's first line.
pub fn plain_cause(e: &(dyn StdError + 'static)) -> String {
    let mut next = Some(e);
    while let Some(err) = next {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            return if CONNECTION_FATES.iter().any(|(_, k)| *k == io.kind()) {
                io.kind().to_string()
            } else {
                io.to_string()
            };
        }
        next = err.source();
    }
    let text = e.to_string();
    if let Some(at) = text.find("kind: ") {
        let kind: String = text[at + 6..]
            .chars()
            .take_while(char::is_ascii_alphabetic)
            .collect();
        if let Some((_, k)) = CONNECTION_FATES.iter().find(|(name, _)| *name == kind) {
            return k.to_string();
        }
    }
    let first = text.lines().next().unwrap_or_default().trim();
    let camel = first.chars().next().is_some_and(|c| c.is_ascii_uppercase())
        && first.chars().all(|c| c.is_ascii_alphanumeric())
        && first.chars().any(|c| c.is_ascii_lowercase());
    if camel {
        return words(first);
    }
    match first {
        "" => text.trim().to_owned(),
        first => first.to_owned(),
    }
}

/// The I/O error kinds that say what became of a connection, by their
/// `Debug` names.
const CONNECTION_FATES: [(&str, std::io::ErrorKind); 10] = {
    use std::io::ErrorKind as K;
    [
        ("ConnectionRefused", K::ConnectionRefused),
        ("ConnectionReset", K::ConnectionReset),
        ("ConnectionAborted", K::ConnectionAborted),
        ("NotConnected", K::NotConnected),
        ("BrokenPipe", K::BrokenPipe),
        ("UnexpectedEof", K::UnexpectedEof),
        ("TimedOut", K::TimedOut),
        ("AddrNotAvailable", K::AddrNotAvailable),
        ("HostUnreachable", K::HostUnreachable),
        ("NetworkUnreachable", K::NetworkUnreachable),
    ]
};

/// `ConnectionRefused` as `connection refused`.
fn words(camel: &str) -> String {
    let mut out = String::with_capacity(camel.len() + 4);
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            out.push(' ');
        }
        out.push(c.to_ascii_lowercase());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Text(&'static str);
    impl std::fmt::Display for Text {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl StdError for Text {}

    #[test]
    fn causes_read_as_plain_words() {
        let io = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(plain_cause(&io), "connection reset");
        // An I/O error that is not a connection's fate keeps its message.
        let io = std::io::Error::other("failed to lookup address information");
        assert_eq!(plain_cause(&io), "failed to lookup address information");
        // As fred and tonic print them.
        for (text, cause) in [
            (
                r#"IO Error: Os { code: 111, kind: ConnectionRefused, message: "Connection refused" }"#,
                "connection refused",
            ),
            (
                r#"grpc request error: code: 'The service is currently unavailable', message: "tcp connect error", source: tonic::transport::Error(Transport, ConnectError(ConnectError("tcp connect error", 127.0.0.1:1, Os { code: 111, kind: ConnectionRefused, message: "Connection refused" })))"#,
                "connection refused",
            ),
            ("InvalidDomainCharacter", "invalid domain character"),
            ("Request timed out.", "Request timed out."),
            ("first line\nsecond", "first line"),
            // Not split letter by letter, not a kind that says nothing.
            (
                "NOAUTH Authentication required.",
                "NOAUTH Authentication required.",
            ),
            ("NOAUTH", "NOAUTH"),
            (
                r#"IO Error: Custom { kind: Uncategorized, error: "failed to lookup address" }"#,
                r#"IO Error: Custom { kind: Uncategorized, error: "failed to lookup address" }"#,
            ),
        ] {
            assert_eq!(plain_cause(&Text(text)), cause, "{text}");
        }
    }

    #[test]
    fn unavailable_reads_as_one_sentence_and_keeps_its_sources() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let e = Error::unavailable("redis", refused).at("127.0.0.1:1");
        assert_eq!(
            e.to_string(),
            "redis at 127.0.0.1:1 unavailable: connection refused"
        );
        let source = StdError::source(&e).expect("the Unreachable");
        let io = source.source().expect("the client's error");
        assert!(io.downcast_ref::<std::io::Error>().is_some());
        // Told once: a second `at` changes nothing.
        assert_eq!(
            e.at("elsewhere:1").to_string(),
            "redis at 127.0.0.1:1 unavailable: connection refused"
        );
        // Without an endpoint, as before.
        let e = Error::unavailable("etcd", Text("no quorum"));
        assert_eq!(e.to_string(), "etcd unavailable: no quorum");
        // Other errors are left alone.
        assert!(matches!(
            Error::InvalidConfig("x".into()).at("h:1"),
            Error::InvalidConfig(_)
        ));
    }
}
