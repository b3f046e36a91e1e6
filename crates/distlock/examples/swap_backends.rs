//! The same application code on any backend, chosen by configuration alone:
//! `DLOCK_URL=redis://...`, `etcd://...`, `zk://...`, `redlock://...`,
//! `mem://`, or `DLOCK_CONFIG=dlock.toml`.
//!
//! ```text
//! DLOCK_URL=redis://127.0.0.1:6379 cargo run -p distlock --features full --example swap_backends
//! ```

use distlock::{AnyLock, Guard, Lock, LockKey, Settings};

/// Application code: generic over any `Lock`, unaware of the backend.
async fn rotate_logs<L: Lock>(lock: &L, settings: &Settings) -> distlock::Result<Option<u64>> {
    let key = LockKey::new("rotate-logs")?;
    lock.with_lock(&key, settings.options, |held| async move {
        held.token().map(|t| t.get())
    })
    .await
}

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let settings = Settings::from_env()?;
    let lock: AnyLock = distlock::connect(&settings.config).await?;
    let token = rotate_logs(&lock, &settings).await?;
    println!("rotated logs under a {} lock (token {token:?})", lock.backend());
    let guard = lock
        .acquire(&LockKey::new("rotate-logs")?, settings.options)
        .await?;
    guard.release().await
}
