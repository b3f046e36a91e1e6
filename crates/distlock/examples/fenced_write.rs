//! A fenced write: the resource refuses a holder older than the newest one,
//! so a holder paused past its TTL cannot overwrite a newer holder's data.
//!
//! ```text
//! DLOCK_URL=zk://127.0.0.1:2181 cargo run -p distlock --features zk --example fenced_write
//! ```

use distlock::{FenceGate, Guard, Lock, LockKey, Settings};

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let settings = Settings::from_env().or_else(|_| {
        distlock::Config::from_url("mem://").map(|config| Settings {
            config,
            options: distlock::AcquireOptions::default(),
        })
    })?;
    let lock = distlock::connect(&settings.config).await?;
    if !lock.capabilities().fences() {
        println!(
            "the {} backend gives no fencing tokens: use it for efficiency locks only",
            lock.backend()
        );
        return Ok(());
    }
    // Stands for the resource: a DB row checked with `UPDATE ... WHERE fence <= $token`.
    let account = FenceGate::new();
    let key = LockKey::new("account:17")?;
    let first = lock.acquire(&key, settings.options).await?;
    let old = first.token().expect("a fencing backend");
    first.release().await?;
    let second = lock.acquire(&key, settings.options).await?;
    let new = second.token().expect("a fencing backend");
    account
        .write("account:17", new, || println!("holder {new} wrote"))
        .expect("the newest holder writes");
    match account.write("account:17", old, || println!("stale holder {old} wrote")) {
        Ok(()) => println!("BUG: a stale holder wrote"),
        Err(highest) => println!("stale token {old} refused (the resource has seen {highest})"),
    }
    second.release().await
}
