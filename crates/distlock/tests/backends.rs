//! The same generic application code runs unchanged on every backend, chosen
//! only by `DLOCK_URL`, against the local test servers; and the examples run.
#![cfg(feature = "full")]

use std::time::Duration;

use distlock::{FenceGate, Guard, Lock, LockKey, Settings};
use dlock_testkit::launcher::shared;

/// Application code: knows nothing of the backend.
async fn app<L: Lock>(lock: &L, settings: &Settings, name: &str) -> distlock::Result<Vec<Option<u64>>> {
    let key = LockKey::new(name)?;
    let gate = FenceGate::new();
    let mut tokens = Vec::new();
    for _ in 0..3 {
        let g = lock.acquire(&key, settings.options).await?;
        if let Some(t) = g.token() {
            assert!(
                gate.check(name, t).is_accepted(),
                "a fresh holder was refused by the fence"
            );
        }
        tokens.push(g.token().map(|t| t.get()));
        g.release().await?;
    }
    let other = lock
        .try_acquire(&key, settings.options)
        .await?
        .expect("free after release");
    assert!(
        lock.try_acquire(&key, settings.options).await?.is_none(),
        "held twice"
    );
    other.release().await?;
    Ok(tokens)
}

async fn urls() -> (Vec<String>, Vec<Box<dyn std::any::Any + Send>>) {
    let redis = shared::redis().await.unwrap();
    let nodes = shared::redis_nodes().await.unwrap();
    let etcd = shared::etcd().await.unwrap();
    let zk = shared::zk().await.unwrap();
    let postgres = shared::postgres().await.unwrap();
    let strip = |u: &str| {
        u.trim_start_matches("redis://")
            .trim_start_matches("http://")
            .to_owned()
    };
    let urls = vec![
        "mem://".to_owned(),
        redis.addresses[0].clone(),
        format!(
            "redlock://{}",
            nodes
                .addresses
                .iter()
                .map(|u| strip(u))
                .collect::<Vec<_>>()
                .join(",")
        ),
        format!(
            "etcd://{}",
            etcd.addresses
                .iter()
                .map(|u| strip(u))
                .collect::<Vec<_>>()
                .join(",")
        ),
        format!("zk://{}", zk.addresses[0]),
        postgres.addresses[0].clone(),
    ];
    let keep: Vec<Box<dyn std::any::Any + Send>> = vec![
        Box::new(redis),
        Box::new(nodes),
        Box::new(etcd),
        Box::new(zk),
        Box::new(postgres),
    ];
    (urls, keep)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_application_every_backend_chosen_by_dlock_url() {
    let (urls, _servers) = urls().await;
    for url in urls {
        let mut settings = Settings::from_vars(|k| match k {
            "DLOCK_URL" => Some(url.clone()),
            "DLOCK_TTL" => Some("5s".to_owned()),
            "DLOCK_WAIT" => Some("10s".to_owned()),
            _ => None,
        })
        .unwrap();
        // The five Redlock nodes share this machine's two cores with every
        // other test server and build: a healthy node's reply can take
        // longer than the default node time-out (50 ms, sized for a quiet
        // production network; seen under load: "no quorum", every node
        // "Request timed out"). An application on a slow network raises
        // it the same way.
        if let distlock::Config::Redlock(c) = &mut settings.config {
            c.request_timeout = Duration::from_secs(1);
        }
        let lock = distlock::connect(&settings.config)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        let name = format!("app-{:x}", rand::random::<u64>());
        let tokens = app(&lock, &settings, &name)
            .await
            .unwrap_or_else(|e| panic!("{url}: {e}"));
        if lock.capabilities().fences() {
            assert!(tokens.windows(2).all(|w| w[1] > w[0]), "{url}: tokens {tokens:?}");
        } else {
            assert!(
                tokens.iter().all(Option::is_none),
                "{url}: a non-fencing backend gave tokens"
            );
        }
        assert_eq!(settings.options.ttl, Duration::from_secs(5));
    }
}

/// The examples run against the local servers and say what they should.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_examples_run_on_every_backend() {
    let (urls, _servers) = urls().await;
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_owned());
    for example in ["run_once", "fenced_write", "swap_backends"] {
        for url in &urls {
            let out = tokio::process::Command::new(&cargo)
                .args([
                    "run",
                    "--quiet",
                    "-p",
                    "distlock",
                    "--features",
                    "full",
                    "--example",
                    example,
                ])
                .env("DLOCK_URL", url)
                .output()
                .await
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(out.status.success(), "{example} on {url}: {out:?}");
            let expected = match example {
                "run_once" => "job done",
                "fenced_write" if url.starts_with("redlock") => "no fencing tokens",
                "fenced_write" => "refused",
                _ => "rotated logs",
            };
            assert!(stdout.contains(expected), "{example} on {url}: {stdout}");
        }
    }
}
