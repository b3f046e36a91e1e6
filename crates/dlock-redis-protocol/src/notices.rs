//! Release notices: waking waiters. One subscriber connection per server per
//! lock handle, one subscription per key that has waiters, shared by all of
//! them; a notice from any server wakes them.

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
    waiters: usize,
    notify: Arc<Notify>,
}

/// A registered interest in a key's release channel; dropping it gives the
/// subscription up when no other waiter needs it.
pub struct Waiting {
    waiters: Arc<Waiters>,
    channel: String,
    /// Notified (`notify_waiters`) on every release notice for the key.
    pub notify: Arc<Notify>,
}

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
                            Ok(message) => dispatcher.wake(Some(&message.channel)),
                            // Notices were dropped: wake everyone, they re-check.
                            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => dispatcher.wake(None),
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

    fn wake(&self, channel: Option<&str>) {
        let channels = self.channels();
        match channel {
            Some(name) => {
                if let Some(c) = channels.get(name) {
                    c.notify.notify_waiters();
                }
            }
            None => channels.values().for_each(|c| c.notify.notify_waiters()),
        }
    }

    /// Registers a waiter on `channel`, subscribing on every server if it is
    /// the first. A failed subscription is not an error: waiters then rely on
    /// polling.
    pub async fn wait_on(self: &Arc<Self>, channel: String) -> Waiting {
        let (notify, first) = {
            let mut channels = self.channels();
            let entry = channels.entry(channel.clone()).or_insert_with(|| Channel {
                waiters: 0,
                notify: Arc::new(Notify::new()),
            });
            entry.waiters += 1;
            (Arc::clone(&entry.notify), entry.waiters == 1)
        };
        let waiting = Waiting {
            waiters: Arc::clone(self),
            channel: channel.clone(),
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
                Some(c) if c.waiters > 1 => {
                    c.waiters -= 1;
                    false
                }
                Some(_) => {
                    channels.remove(&self.channel);
                    true
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
