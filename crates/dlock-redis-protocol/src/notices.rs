//! Release notices: waking waiters. One subscriber connection per server per
//! lock handle, one subscription per key that has waiters, shared by all of
//! them. A notice names the waiter it is for (then only that one wakes) or
//! is [`WAKE_ALL`](crate::scripts::WAKE_ALL) (then all do); a notice from
//! any server counts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use fred::clients::SubscriberClient;
use fred::interfaces::{EventInterface, PubsubInterface};
use futures::future::join_all as futures_join_all;
use tokio::sync::Notify;
use tokio::task::JoinHandle;

/// The registry of waiters of one lock handle.
pub struct Waiters {
    subscribers: Vec<SubscriberClient>,
    channels: Mutex<HashMap<String, Channel>>,
    timeout: Duration,
}

struct Channel {
    members: Vec<(u64, String, Arc<Notify>)>,
}

/// A registered interest in a key's release channel; dropping it gives the
/// subscription up when no other waiter needs it.
pub struct Waiting {
    waiters: Arc<Waiters>,
    channel: String,
    slot: u64,
    /// This waiter's id: the notices naming it wake it.
    pub id: String,
    /// Notified (`notify_waiters`) on every release notice for this waiter
    /// (naming it, or everyone).
    pub notify: Arc<Notify>,
}

static NEXT_SLOT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Waiters {
    /// The registry and its dispatcher tasks, one per subscriber (the caller
    /// aborts them when done).
    pub fn start(subscribers: Vec<SubscriberClient>, timeout: Duration) -> (Arc<Self>, Vec<JoinHandle<()>>) {
        let waiters = Arc::new(Waiters {
            subscribers,
            channels: Mutex::default(),
            timeout,
        });
        let tasks = waiters
            .subscribers
            .iter()
            .map(|subscriber| {
                let mut rx = subscriber.message_rx();
                let dispatcher = Arc::clone(&waiters);
                tokio::spawn(async move {
                    loop {
                        match rx.recv().await {
                            Ok(message) => {
                                let to = message.value.as_str();
                                dispatcher.wake(Some(&message.channel), to.as_deref());
                            }
                            // Notices were dropped: wake everyone, they re-check.
                            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                                dispatcher.wake(None, None)
                            }
                            Err(tokio::sync::broadcast::error::RecvError::Closed) => return,
                        }
                    }
                })
            })
            .collect();
        (waiters, tasks)
    }

    fn channels(&self) -> std::sync::MutexGuard<'_, HashMap<String, Channel>> {
        self.channels.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Wakes the waiter `to` names on `channel`, or all of them (`to` is
    /// `*`, unknown to this version, or absent); every waiter of every key
    /// when `channel` is absent (notices were dropped).
    fn wake(&self, channel: Option<&str>, to: Option<&str>) {
        let channels = self.channels();
        let everyone = |c: &Channel| c.members.iter().for_each(|(_, _, n)| n.notify_waiters());
        match channel {
            Some(name) => {
                let Some(c) = channels.get(name) else { return };
                match to {
                    Some(id) if crate::scripts::is_waiter_id(id) => {
                        // Another client's waiter: not ours to wake.
                        if let Some((_, _, n)) = c.members.iter().find(|(_, w, _)| w == id) {
                            n.notify_waiters();
                        }
                    }
                    _ => everyone(c),
                }
            }
            None => channels.values().for_each(everyone),
        }
    }

    /// Registers a waiter on `channel`, subscribing on every server if it is
    /// the first. A failed subscription is not an error: waiters then rely on
    /// polling.
    pub async fn wait_on(self: &Arc<Self>, channel: String) -> Waiting {
        let slot = NEXT_SLOT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = crate::scripts::new_waiter_id();
        let notify = Arc::new(Notify::new());
        let first = {
            let mut channels = self.channels();
            let entry = channels
                .entry(channel.clone())
                .or_insert_with(|| Channel { members: Vec::new() });
            entry.members.push((slot, id.clone(), Arc::clone(&notify)));
            entry.members.len() == 1
        };
        let waiting = Waiting {
            waiters: Arc::clone(self),
            channel: channel.clone(),
            slot,
            id,
            notify,
        };
        if first {
            let subscribe = self.subscribers.iter().map(|s| {
                let channel = channel.clone();
                async move {
                    let _ = tokio::time::timeout(self.timeout, s.subscribe(channel)).await;
                }
            });
            futures_join_all(subscribe).await;
        }
        waiting
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let last = {
            let mut channels = self.waiters.channels();
            match channels.get_mut(&self.channel) {
                Some(c) => {
                    c.members.retain(|(slot, _, _)| *slot != self.slot);
                    if c.members.is_empty() {
                        channels.remove(&self.channel);
                        true
                    } else {
                        false
                    }
                }
                None => false,
            }
        };
        if last {
            if let Ok(rt) = tokio::runtime::Handle::try_current() {
                for subscriber in &self.waiters.subscribers {
                    let (subscriber, channel) = (subscriber.clone(), self.channel.clone());
                    drop(rt.spawn(async move {
                        let _ = subscriber.unsubscribe(channel).await;
                    }));
                }
            }
        }
    }
}
