//! **The driver-author API.** What every driver needs and must not write
//! again: applications never need this module. One file per concern, as
//! tokio's `sync` is one primitive per file:
//!
//! - time: [`Drift`], the slack taken off a TTL before a client trusts a
//!   grant, and [`Drift::deadline`], the one formula for a local deadline
//!   (`sent + ttl - drift`, measured from when the request that granted or
//!   renewed was *sent*); [`saturating_add`] and [`wait_deadline`],
//!   deadlines from user input that never overflow an [`Instant`](std::time::Instant);
//!   [`within_wait`], a wait in line bounded by the caller's
//!   [`Wait`](crate::Wait).
//! - checks: [`check_ttl`] and [`check_permits`], the argument checks.
//! - outcome: [`Refusal`], the server's two ways of saying no to a release
//!   or an extend, and their one mapping to [`Error`](crate::Error).
//! - validity: [`Validity`], a guard's local deadline and lost signal;
//!   [`lose`], the same report for a guard whose signal is a session's.
//! - renewal: [`Keeper`], the one engine that renews every guard of a
//!   client handle and fires its `lost()` at the deadline, in one task (a
//!   guard costs a slot, not a task), over the scheduler every such task
//!   shares ([`Inbox`], [`Slots`]: a session backend's guard watcher runs
//!   on it too); [`Lease`], what a lease backend's guard keeps of its
//!   grant (deadline, slot, extend, release on drop), once.
//! - background work: [`clean_up_in_background`], the one detached
//!   clean-up (release on drop, a contender entry left by a cancelled or
//!   timed-out acquire), with one retry policy; [`spawn_detached`] for a
//!   single detached request (a revoke, an unsubscribe); [`OnDrop`], the
//!   armed drop guard that starts one when a call ends early.
//! - [`queue`]: the queue recipe etcd and ZooKeeper share (wait for the
//!   predecessors within the caller's wait, give the place back when out
//!   of time), over a driver's [`queue::Place`].
//! - listing: [`names`], the one shape of
//!   [`Lock::keys_in_use`](crate::Lock::keys_in_use)'s answer.
//! - owner: what a holder writes about itself, the one writer and
//!   parser ([`owner_value`], [`owner_detail`], [`Owner`]).
//! - urls: where the servers are, as messages show it ([`endpoint_of`],
//!   [`redact_url`], [`host_name`]).
//! - [`acquire_all`]: what `Lock::acquire_all` does by default, for a
//!   driver that overrides it and falls back to it.
//!
//! This module is public so that drivers outside this workspace can keep
//! the contract the same way; it is versioned with the crate like the rest
//! of the API.

mod background;
mod checks;
mod keeper;
mod lease;
mod listing;
mod outcome;
mod owner;
pub mod queue;
pub(crate) mod schedule;
mod time;
mod url;
mod validity;

pub use background::{
    CLEAN_UP_FIRST_PAUSE, CLEAN_UP_MAX_PAUSE, OnDrop, clean_up_in_background, spawn_detached,
};
pub use checks::{check_permits, check_ttl};
pub use keeper::{Keeper, Kept, Renew};
pub use lease::{Granted, Lease, LeaseHome};
pub use listing::names;
pub use outcome::{Outcome, Refusal};
pub use owner::{Owner, VALUE_TAG, owner_detail, owner_value};
pub use schedule::{COMPACT, Inbox, Msg, Slot, Slots, Taken};
pub use time::{Drift, FAR_FUTURE, drift, saturating_add, wait_deadline, within_wait};
pub use url::{Authority, authority, endpoint_of, host_name, redact_url, with_port};
pub use validity::{Validity, lose};

pub use crate::lock::acquire_all;
