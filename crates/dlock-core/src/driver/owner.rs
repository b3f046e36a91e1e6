//! What a holder writes about itself, and how it is read back.

use std::time::Duration;

/// When a holder acquired, read from the detail the etcd and ZooKeeper
/// drivers write (`host pid unix-ms`, perhaps followed by more): for the
/// operator views' [`Holder::since`](crate::Holder::since), display only.
/// `None` for any other detail.
pub fn since_of_detail(detail: &str) -> Option<std::time::SystemTime> {
    let ms: u64 = detail.split(' ').nth(2)?.parse().ok()?;
    std::time::SystemTime::UNIX_EPOCH.checked_add(Duration::from_millis(ms))
}
