//! Run a job once across machines: every host runs this from cron; the one
//! that gets the lock does the work, the others skip.
//!
//! ```text
//! DLOCK_URL=etcd://10.0.0.1:2379 cargo run -p distlock --features etcd --example run_once
//! ```

use std::time::Duration;

use distlock::{Guard, Lock, LockKey, Settings, Wait};

#[tokio::main]
async fn main() -> distlock::Result<()> {
    let settings = Settings::from_env()?;
    let lock = distlock::connect(&settings.config).await?;
    let key = LockKey::new("nightly-cleanup")?;
    let opts = settings.options.ttl(Duration::from_secs(60)).wait(Wait::No);
    let Some(guard) = lock.try_acquire(&key, opts).await? else {
        println!("another host is running the job; skipping");
        return Ok(());
    };
    println!("running the job (token {:?})", guard.token());
    let lost = guard.lost();
    tokio::select! {
        () = tokio::time::sleep(Duration::from_millis(200)) => println!("job done"),
        () = lost.wait() => println!("lost the lock; stopping the job"),
    }
    guard.release().await
}
