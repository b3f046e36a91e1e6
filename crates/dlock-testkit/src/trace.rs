//! A `tracing` subscriber that keeps what dlock reports, for tests that
//! check a driver's events ([`dlock_core::trace`]).
//!
//! [`Capture::start`] installs the kit's subscriber as the process's global
//! default (once; it sees the events of every thread and task) and collects
//! the events of target `dlock` whose key lies in a namespace. Each
//! [`Captured`] event carries its own fields and those of the spans around
//! it, as a subscriber printing them would show them.
//!
//! ```
//! use dlock_core::{AcquireOptions, Guard, Lock, LockKey, MemLock};
//! use dlock_testkit::trace::Capture;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> dlock_core::Result<()> {
//! let capture = Capture::start("doc-example/").expect("no other global subscriber");
//! let guard = MemLock::new().acquire(&LockKey::new("doc-example/k")?, AcquireOptions::default()).await?;
//! guard.release().await?;
//! let granted = capture.events("granted");
//! assert_eq!(granted[0].field("backend"), Some("mem"));
//! assert_eq!(granted[0].field("span"), Some("acquire"));
//! # Ok(())
//! # }
//! ```

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};
use tracing_subscriber::Layer;
use tracing_subscriber::layer::Context;
use tracing_subscriber::prelude::*;
use tracing_subscriber::registry::LookupSpan;

/// One event as a test sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Captured {
    /// The event's `message`.
    pub message: String,
    /// Its level.
    pub level: Level,
    /// Its fields and those of the spans around it (the event's own win),
    /// each as text; `span` is the innermost span's name.
    pub fields: BTreeMap<String, String>,
}

impl Captured {
    /// The field `name`, if present.
    pub fn field(&self, name: &str) -> Option<&str> {
        self.fields.get(name).map(String::as_str)
    }
}

impl fmt::Display for Captured {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {:?}", self.level, self.message)?;
        for (k, v) in &self.fields {
            write!(f, " {k}={v}")?;
        }
        Ok(())
    }
}

type Sink = Arc<Mutex<Vec<(String, Arc<Mutex<Vec<Captured>>>)>>>;

/// What a test collects: the events in its namespace since it started.
/// Dropping it stops the collecting (the subscriber stays installed).
#[derive(Debug)]
pub struct Capture {
    namespace: String,
    events: Arc<Mutex<Vec<Captured>>>,
}

static SINK: OnceLock<Result<Sink, String>> = OnceLock::new();

impl Capture {
    /// Starts collecting the `dlock` events whose `key` starts with
    /// `namespace`, installing the kit's subscriber first if this process
    /// has none of its own.
    ///
    /// # Errors
    ///
    /// If another global subscriber was installed before (then nothing can
    /// be captured).
    pub fn start(namespace: &str) -> Result<Capture, String> {
        let sink = SINK
            .get_or_init(|| {
                let sink: Sink = Arc::default();
                let layer = CaptureLayer {
                    sink: Arc::clone(&sink),
                };
                tracing::subscriber::set_global_default(tracing_subscriber::registry().with(layer))
                    .map(|()| sink)
                    .map_err(|e| format!("the kit cannot capture dlock's events: {e}"))
            })
            .as_ref()
            .map_err(Clone::clone)?;
        let events = Arc::default();
        sink.lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push((namespace.to_owned(), Arc::clone(&events)));
        Ok(Capture {
            namespace: namespace.to_owned(),
            events,
        })
    }

    /// Every event collected so far, in order.
    pub fn all(&self) -> Vec<Captured> {
        self.events.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The events collected so far whose message is `message`.
    pub fn events(&self, message: &str) -> Vec<Captured> {
        self.all().into_iter().filter(|e| e.message == message).collect()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if let Some(Ok(sink)) = SINK.get() {
            sink.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .retain(|(ns, events)| !(ns == &self.namespace && Arc::ptr_eq(events, &self.events)));
        }
    }
}

struct CaptureLayer {
    sink: Sink,
}

/// A span's fields, kept in its extensions.
struct SpanFields(BTreeMap<String, String>);

#[derive(Default)]
struct Fields {
    message: Option<String>,
    map: BTreeMap<String, String>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.map.insert(field.name().to_owned(), value.to_owned());
    }

    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let text = format!("{value:?}");
        if field.name() == "message" {
            self.message = Some(text);
        } else {
            self.map.insert(field.name().to_owned(), text);
        }
    }
}

impl<S> Layer<S> for CaptureLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn register_callsite(&self, metadata: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        if metadata.target() == dlock_core::trace::TARGET {
            tracing::subscriber::Interest::always()
        } else {
            tracing::subscriber::Interest::never()
        }
    }

    fn enabled(&self, metadata: &Metadata<'_>, _: Context<'_, S>) -> bool {
        metadata.target() == dlock_core::trace::TARGET
    }

    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        attrs.record(&mut fields);
        if let Some(span) = ctx.span(id) {
            span.extensions_mut().insert(SpanFields(fields.map));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::default();
        values.record(&mut fields);
        if let Some(span) = ctx.span(id)
            && let Some(kept) = span.extensions_mut().get_mut::<SpanFields>()
        {
            kept.0.extend(fields.map);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        // Nothing collects: cost nothing more (other tests of the binary run on).
        if self
            .sink
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_empty()
        {
            return;
        }
        let mut own = Fields::default();
        event.record(&mut own);
        let mut map = BTreeMap::new();
        if let Some(scope) = ctx.event_scope(event) {
            let mut innermost = None;
            for span in scope.from_root() {
                if let Some(kept) = span.extensions().get::<SpanFields>() {
                    map.extend(kept.0.clone());
                }
                innermost = Some(span.name());
            }
            if let Some(name) = innermost {
                map.insert("span".to_owned(), name.to_owned());
            }
        }
        map.extend(own.map);
        let Some(key) = map.get("key") else { return };
        let sinks = self.sink.lock().unwrap_or_else(PoisonError::into_inner);
        let matching: Vec<_> = sinks
            .iter()
            .filter(|(ns, _)| key.starts_with(ns.as_str()))
            .map(|(_, events)| Arc::clone(events))
            .collect();
        drop(sinks);
        if matching.is_empty() {
            return;
        }
        let captured = Captured {
            message: own.message.unwrap_or_default(),
            level: *event.metadata().level(),
            fields: map,
        };
        for events in matching {
            events
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(captured.clone());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use dlock_core::driver::{Drift, Keeper, Validity};
    use dlock_core::{Error, LockKey, trace::why};

    use super::Capture;

    /// The keeper every driver shares reports a renewal that failed (not
    /// refused) and then the loss at the local deadline, with its reason;
    /// a refusal is reported as one.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_keeper_reports_failed_renewals_and_why_it_lost() {
        let capture = Capture::start("kit-trace-keeper/").unwrap();
        for (name, refused) in [
            ("kit-trace-keeper/failing", false),
            ("kit-trace-keeper/refused", true),
        ] {
            let key = LockKey::new(name).unwrap();
            let ttl = Duration::from_millis(300);
            let sent = Instant::now();
            let (validity, lost) = Validity::of_key("test", &key, sent, ttl, Drift::DEFAULT);
            let keeper = Keeper::new();
            let kept = keeper.keep(
                validity,
                ttl,
                true,
                sent,
                Box::new(move || {
                    Box::pin(async move {
                        if refused {
                            Ok(Err(dlock_core::driver::Refusal::HeldByOther))
                        } else {
                            Err(Error::unavailable("test", "the link is down"))
                        }
                    })
                }),
                || false,
            );
            tokio::time::timeout(Duration::from_secs(10), lost.wait())
                .await
                .unwrap();
            drop(kept);
            let of = |message| -> Vec<_> {
                capture
                    .events(message)
                    .into_iter()
                    .filter(|e| e.field("key") == Some(name))
                    .collect()
            };
            let lost = of("lost");
            assert_eq!(lost.len(), 1, "{lost:?}");
            assert_eq!(lost[0].field("backend"), Some("test"));
            let failed = of("renewal failed");
            if refused {
                assert_eq!(lost[0].field("why"), Some(why::HELD_BY_OTHER));
                assert!(failed.is_empty(), "{failed:?}");
            } else {
                assert_eq!(lost[0].field("why"), Some(why::DEADLINE));
                assert!(!failed.is_empty());
                assert!(
                    failed[0]
                        .field("error")
                        .is_some_and(|e| e.contains("the link is down")),
                    "{failed:?}"
                );
            }
        }
    }
}
