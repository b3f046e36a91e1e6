//! Release notices: waking waiters. One subscriber connection per server per
//! lock handle, one subscription per key that has waiters, shared by all of
//! them. A notice names the waiter it is for (then only that one wakes) or
//! is [`WAKE_ALL`](crate::scripts::WAKE_ALL) (then all do); a notice from
//! any server counts.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use dlock_core::driver::saturating_add;

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
    /// Whether this handle is subscribed to the channel; held across a
    /// subscribe or unsubscribe, so the two never cross on the way to the
    /// server (a new first waiter's subscribe answered before the last
    /// one's unsubscribe would leave it unsubscribed).
    subscribed: Arc<tokio::sync::Mutex<bool>>,
}

/// A registered interest in a key's release channel; dropping it gives the
/// subscription up when no other waiter needs it.
pub struct Waiter {
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

    /// Registers a waiter on `channel`, subscribing on every server unless
    /// this handle already is. A failed subscription is not an error:
    /// waiters then rely on polling. Waits for the subscribe at most until
    /// `deadline` and the server timeout. fred answers a `SUBSCRIBE` once
    /// it is written, not once Redis has read it, so a release published
    /// in between is missed: the waiter's own poll (the driver's, 150 ms
    /// or the holder's remaining TTL) takes the lock then. While another
    /// waiter's subscribe or a last waiter's unsubscribe is under way, it
    /// does not wait at all (a task takes the subscription up after it).
    ///
    /// Cancelling it is safe: the registration is undone (and the channel
    /// given up if nobody else waits on it). A subscribe cut short that the
    /// server took anyway stays until the connection does.
    pub async fn wait_on(self: &Arc<Self>, channel: String, deadline: Option<Instant>) -> Waiter {
        let slot = NEXT_SLOT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let id = crate::scripts::new_waiter_id();
        let notify = Arc::new(Notify::new());
        let subscribed = {
            let mut channels = self.channels();
            let entry = channels.entry(channel.clone()).or_insert_with(|| Channel {
                members: Vec::new(),
                subscribed: Arc::default(),
            });
            entry.members.push((slot, id.clone(), Arc::clone(&notify)));
            Arc::clone(&entry.subscribed)
        };
        let waiting = Waiter {
            waiters: Arc::clone(self),
            channel: channel.clone(),
            slot,
            id,
            notify,
        };
        match Arc::clone(&subscribed).try_lock_owned() {
            Ok(mut state) => {
                if !*state {
                    let until = saturating_add(Instant::now(), self.timeout);
                    let until = deadline.map_or(until, |d| d.min(until));
                    *state = self.subscribe(&channel, until).await;
                }
            }
            Err(_) => drop(tokio::spawn(Arc::clone(self).take_up(channel, subscribed))),
        }
        waiting
    }

    /// Subscribes to `channel` on every server, each bounded by `until`;
    /// whether any answered (a notice from any of them counts, and waiters
    /// poll besides: the others are not retried while the channel stays in
    /// use, so a down server does not cost every new waiter a timeout).
    async fn subscribe(&self, channel: &str, until: Instant) -> bool {
        let subscribe = self.subscribers.iter().map(|s| {
            let channel = channel.to_owned();
            async move {
                matches!(
                    tokio::time::timeout_at(until.into(), s.subscribe(channel)).await,
                    Ok(Ok(()))
                )
            }
        });
        futures_join_all(subscribe).await.into_iter().any(|ok| ok)
    }

    /// After a subscribe or unsubscribe under way: subscribes to `channel`
    /// if someone still waits on it and nobody did.
    async fn take_up(self: Arc<Self>, channel: String, subscribed: Arc<tokio::sync::Mutex<bool>>) {
        let mut state = subscribed.lock().await;
        if *state || !self.is_current(&channel, &subscribed, |c| !c.members.is_empty()) {
            return;
        }
        let until = saturating_add(Instant::now(), self.timeout);
        *state = self.subscribe(&channel, until).await;
    }

    /// Whether `subscribed` is still `channel`'s entry (not a newer one's)
    /// and `test` holds for it.
    fn is_current(
        &self,
        channel: &str,
        subscribed: &Arc<tokio::sync::Mutex<bool>>,
        test: impl Fn(&Channel) -> bool,
    ) -> bool {
        self.channels()
            .get(channel)
            .is_some_and(|c| Arc::ptr_eq(&c.subscribed, subscribed) && test(c))
    }

    /// Gives `channel` up on every server if nobody waits on it any more
    /// (checked again under its subscription lock, so a waiter that came
    /// meanwhile keeps it). An entry that is no longer this one's (removed,
    /// replaced) is left alone.
    async fn give_up(self: Arc<Self>, channel: String, subscribed: Arc<tokio::sync::Mutex<bool>>) {
        let mut state = subscribed.lock().await;
        if !self.is_current(&channel, &subscribed, |c| c.members.is_empty()) {
            return;
        }
        if *state {
            let timeout = self.timeout;
            let unsubscribe = self.subscribers.iter().map(|s| {
                let channel = channel.clone();
                async move {
                    let _ = tokio::time::timeout(timeout, s.unsubscribe(channel)).await;
                }
            });
            futures_join_all(unsubscribe).await;
            *state = false;
        }
        let mut channels = self.channels();
        if channels
            .get(&channel)
            .is_some_and(|c| Arc::ptr_eq(&c.subscribed, &subscribed) && c.members.is_empty())
        {
            channels.remove(&channel);
        }
    }
}

impl Drop for Waiter {
    fn drop(&mut self) {
        let idle = {
            let mut channels = self.waiters.channels();
            match channels.get_mut(&self.channel) {
                Some(c) => {
                    c.members.retain(|(slot, _, _)| *slot != self.slot);
                    c.members.is_empty().then(|| Arc::clone(&c.subscribed))
                }
                None => None,
            }
        };
        let Some(subscribed) = idle else { return };
        // Outside a runtime nothing can be sent: the empty entry stays (with
        // its state), for the next waiter to take up or a later drop to give up.
        dlock_core::driver::spawn_detached(
            "redis: give up a release channel",
            Arc::clone(&self.waiters).give_up(self.channel.clone(), subscribed),
        );
    }
}
