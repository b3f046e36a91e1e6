//! PostgreSQL-specific behaviour against real servers: a restart, bad input
//! and missing permissions, the table's statement, and ShedLock's own SQL
//! on the same table.

use std::time::{Duration, Instant};

use dlock_core::{AcquireOptions, Error, Guard, Lock, LockKey, Wait};
use dlock_postgres::{PostgresConfig, PostgresLock};
use dlock_testkit::launcher::{Postgres, shared};

const LIMIT: Duration = Duration::from_secs(30);

fn key(name: &str) -> LockKey {
    LockKey::new(format!("{name}-{:x}", rand::random::<u64>())).unwrap()
}

/// A plain client of the server, for what the tests do beside the driver.
async fn raw(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// A held lock and its table survive a server kill and restart; the
/// handle reconnects by itself, and the next grant's token is higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_locks_and_tokens_survive_a_restart() {
    let mut server = Postgres::start().await.unwrap();
    let lock = PostgresLock::connect(PostgresConfig::from_url(server.url()))
        .await
        .unwrap();
    let (k, other) = (key("restart"), key("restart-other"));
    let opts = AcquireOptions::default().ttl(Duration::from_secs(60));
    let g = lock.acquire(&k, opts).await.unwrap();
    let before = g.token().unwrap();
    // (A start that meets the killed server's last children is retried.)
    server.members()[0].restart().await.unwrap();
    let deadline = Instant::now() + LIMIT;
    // The handle's connection died with the server: calls fail as
    // unavailable until it reconnects, then the lock is still there.
    let still = loop {
        match lock.holder(&k).await {
            Ok(h) => break h,
            Err(Error::Unavailable { .. }) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("holder after a restart: {e:?}"),
        }
    };
    assert_eq!(still.map(|h| h.fence), Some(i64::try_from(before.get()).unwrap()));
    assert!(
        matches!(
            lock.acquire(&k, opts.wait(Wait::No)).await,
            Err(Error::Timeout { .. })
        ),
        "a lock held across the restart was granted again"
    );
    g.extend(Duration::from_secs(60)).await.unwrap();
    g.release().await.unwrap();
    let again = lock.acquire(&k, opts).await.unwrap();
    assert!(
        again.token().unwrap() > before,
        "{:?} after {before:?}",
        again.token()
    );
    let fresh = lock.acquire(&other, opts).await.unwrap();
    assert!(
        fresh.token().unwrap() > before,
        "a new name's token must pass the clock term too"
    );
    again.release().await.unwrap();
    fresh.release().await.unwrap();
}

/// Bad input and missing rights read as clear errors, never a panic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_missing_databases_and_missing_rights_are_clear_errors() {
    let server = shared::postgres().await.unwrap();
    let url = server.addresses[0].clone();
    for bad in [
        "postgres://127.0.0.1:notaport/x",
        "mysql://127.0.0.1/x",
        "postgres://h/db?sslmode=disable&sslrootcert=system",
        "postgres://h/db?sslcert=/client.pem",
    ] {
        let e = PostgresLock::connect(PostgresConfig::from_url(bad))
            .await
            .unwrap_err();
        assert!(matches!(e, Error::InvalidConfig(_)), "{bad}: {e:?}");
    }
    let base = url.rsplit_once('/').unwrap().0.to_owned();
    let e = PostgresLock::connect(PostgresConfig::from_url(format!("{base}/no_such_db")))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::InvalidConfig(m) if m.contains("does not exist")),
        "{e:?}"
    );
    // A missing table that may not be created names the statement.
    let off = PostgresConfig {
        create_table: false,
        ..PostgresConfig::from_url(url.clone()).table("public", "never_created")
    };
    let e = PostgresLock::connect(off).await.unwrap_err();
    assert!(
        matches!(&e, Error::InvalidConfig(m) if m.contains("CREATE TABLE")),
        "{e:?}"
    );
    // A role without the right to create it: the error says what to run.
    let admin = raw(&url).await;
    let role = format!("weak_{:x}", rand::random::<u32>());
    admin
        .batch_execute(&format!("CREATE ROLE {role} LOGIN"))
        .await
        .unwrap();
    let weak_url = url.replacen("dlock@", &format!("{role}@"), 1);
    let table = format!("weak_locks_{:x}", rand::random::<u32>());
    let e = PostgresLock::connect(PostgresConfig::from_url(weak_url.clone()).table("public", &table))
        .await
        .unwrap_err();
    assert!(
        matches!(&e, Error::Backend { .. }) && e.to_string().contains("CREATE TABLE"),
        "{e:?}"
    );
    // Given the table (as a migration would), the same role locks.
    admin
        .batch_execute(&format!(
            "{}; GRANT SELECT, INSERT, UPDATE ON public.{table} TO {role}",
            PostgresConfig::default()
                .table("public", &table)
                .create_table_sql()
                .unwrap()
        ))
        .await
        .unwrap();
    let weak = PostgresLock::connect(PostgresConfig::from_url(weak_url).table("public", &table))
        .await
        .unwrap();
    weak.acquire(&key("weak"), AcquireOptions::default())
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// ShedLock's JDBC provider (`usingDbTime()`) runs these statements on the
/// same table: a ShedLock holder keeps dlock out, and dlock's holder keeps
/// ShedLock out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shedlock_and_dlock_exclude_each_other() {
    let server = shared::postgres().await.unwrap();
    let url = server.addresses[0].clone();
    let config = PostgresConfig::from_url(url.clone()).table("public", "shedlock_shared");
    let lock = PostgresLock::connect(config).await.unwrap();
    let admin = raw(&url).await;
    let now = "timezone('utc', CURRENT_TIMESTAMP)";
    let shed_lock = format!(
        "INSERT INTO shedlock_shared(name, lock_until, locked_at, locked_by) \
         VALUES($1, {now} + make_interval(secs => $2), {now}, $3) \
         ON CONFLICT (name) DO UPDATE SET lock_until = {now} + make_interval(secs => $2), \
         locked_at = {now}, locked_by = $3 \
         WHERE shedlock_shared.name = $1 AND shedlock_shared.lock_until <= {now}"
    );
    let shed_unlock = format!(
        "UPDATE shedlock_shared SET lock_until = CASE WHEN locked_at + make_interval(secs => 0) > {now} \
         THEN locked_at + make_interval(secs => 0) ELSE {now} END WHERE name = $1 AND locked_by = $2"
    );
    let k = key("shed");
    let (name, host) = (k.as_str(), "shedlock-host");
    let taken = admin
        .execute(&shed_lock, &[&name, &30.0f64, &host])
        .await
        .unwrap();
    assert_eq!(taken, 1, "ShedLock could not take a free name");
    let now_opts = AcquireOptions::default().wait(Wait::No);
    assert!(
        matches!(lock.acquire(&k, now_opts).await, Err(Error::Timeout { .. })),
        "dlock took a name ShedLock holds"
    );
    assert_eq!(lock.holder(&k).await.unwrap().unwrap().locked_by, host);
    admin.execute(&shed_unlock, &[&name, &host]).await.unwrap();
    let g = lock.acquire(&k, now_opts).await.unwrap();
    let taken = admin
        .execute(&shed_lock, &[&name, &30.0f64, &host])
        .await
        .unwrap();
    assert_eq!(taken, 0, "ShedLock took a name dlock holds");
    g.release().await.unwrap();
    let taken = admin
        .execute(&shed_lock, &[&name, &30.0f64, &host])
        .await
        .unwrap();
    assert_eq!(taken, 1, "ShedLock could not take the name dlock released");
}

/// The statement in the docs is the one the driver runs.
#[test]
fn the_documented_statement_is_the_one_run() {
    let readme = include_str!("../README.md");
    let sql = PostgresConfig::default().create_table_sql().unwrap();
    assert!(
        readme.contains(&sql),
        "README.md's statement differs from:\n{sql}"
    );
}

/// `sslmode=require` makes a TLS connection and verifies it: against a
/// server that refuses plain connections, the driver locks with the CA
/// given (in the URL or the configuration), refuses a server whose
/// certificate no trusted CA signed, and `prefer` connects in the clear
/// (so the server refuses it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_is_verified_and_used() {
    let server = Postgres::start_tls().await.unwrap();
    let ca = server.ca_file().unwrap().to_owned();
    let base = server.url();
    let in_url = format!("{base}?sslmode=require&sslrootcert={}", ca.display());
    let k = key("tls");
    for config in [
        PostgresConfig::from_url(in_url.clone()),
        PostgresConfig {
            ca_file: Some(ca.clone()),
            ..PostgresConfig::from_url(format!("{base}?sslmode=verify-full"))
        },
        // A CA file alone turns TLS on.
        PostgresConfig {
            ca_file: Some(ca.clone()),
            ..PostgresConfig::from_url(base.clone())
        },
    ] {
        let lock = PostgresLock::connect(config.clone()).await.unwrap();
        let g = lock.acquire(&k, AcquireOptions::default()).await.unwrap();
        assert!(g.token().is_some());
        g.release().await.unwrap();
        lock.abandon().await;
    }
    // Plain connections are refused by this server: prefer (the default)
    // and disable do not use TLS.
    for url in [
        base.clone(),
        format!("{base}?sslmode=prefer"),
        format!("{base}?sslmode=disable"),
    ] {
        let e = PostgresLock::connect(PostgresConfig::from_url(url.clone()))
            .await
            .unwrap_err();
        assert!(e.to_string().contains("no encryption"), "{url}: {e}");
    }
    // Without the CA, the system's roots do not know the test CA: refused,
    // as a configuration error naming the certificate.
    assert_refused(
        PostgresConfig::from_url(format!("{base}?sslmode=require")),
        "certificate",
    )
    .await;
    // A host name the certificate does not name (it names only
    // 127.0.0.1) is refused, though the CA signed it (hostaddr: the
    // address is the server's, whatever localhost resolves to first).
    let port = server.addr().port();
    assert_refused(
        PostgresConfig::from_url(format!(
            "postgres://dlock@localhost:{port}/dlock?hostaddr=127.0.0.1&sslmode=require&sslrootcert={}",
            ca.display()
        )),
        "certificate",
    )
    .await;
    // A plain server refuses TLS: require says so clearly.
    let plain = shared::postgres().await.unwrap();
    assert_refused(
        PostgresConfig::from_url(format!(
            "{}?sslmode=require&sslrootcert={}",
            plain.addresses[0],
            ca.display()
        )),
        "does not support TLS",
    )
    .await;
    // Bad TLS input: a missing CA file, both places at once, disable with
    // a CA.
    for (config, says) in [
        (
            PostgresConfig::from_url(format!("{base}?sslmode=require&sslrootcert=/nonexistent/ca.pem")),
            "/nonexistent/ca.pem",
        ),
        (
            PostgresConfig {
                ca_file: Some(ca.clone()),
                ..PostgresConfig::from_url(in_url.clone())
            },
            "give one",
        ),
        (
            PostgresConfig {
                ca_file: Some(ca.clone()),
                ..PostgresConfig::from_url(format!("{base}?sslmode=disable"))
            },
            "sslmode=disable",
        ),
    ] {
        assert_refused(config, says).await;
    }
}

/// `config` cannot connect: an [`Error::InvalidConfig`] that says `says`.
async fn assert_refused(config: PostgresConfig, says: &str) {
    let e = PostgresLock::connect(config).await.unwrap_err();
    assert!(
        matches!(&e, Error::InvalidConfig(m) if m.contains(says)),
        "{says}: {e:?}"
    );
}
