//! PostgreSQL-specific behaviour against real servers: a restart, bad input
//! and missing permissions, the table's statement, ShedLock's own SQL on
//! the same table, statements stuck on row locks, other isolation levels,
//! odd column types, pruning, and what errors say.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
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

/// Whether `condition` turns true within `limit` (looked at every 20 ms).
async fn within<F, Fut>(limit: Duration, mut condition: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if condition().await {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// `host:port/database` of a launcher URL (`postgres://dlock@host:port/db`).
fn endpoint(url: &str) -> String {
    url.split_once('@').unwrap().1.to_owned()
}

/// How many rows of `table` are named `name`.
async fn rows(admin: &tokio_postgres::Client, table: &str, name: &str) -> i64 {
    admin
        .query_one(
            &format!("SELECT count(*) FROM public.{table} WHERE name = $1"),
            &[&name],
        )
        .await
        .unwrap()
        .get(0)
}

/// A held lock and its table survive a server kill and restart; the
/// handle reconnects by itself, and the next grant's token is higher.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn held_locks_and_tokens_survive_a_restart() {
    let mut server = Postgres::start().await.unwrap();
    // The launcher's pause stops the whole server, not only the
    // postmaster: a connection already open gets no answer until it
    // resumes (its backend process is stopped too).
    let open = raw(&server.url()).await;
    open.simple_query("SELECT 1").await.unwrap();
    server.members()[0].pause().unwrap();
    let paused = tokio::time::timeout(Duration::from_secs(1), open.simple_query("SELECT 1")).await;
    server.members()[0].resume().unwrap();
    assert!(paused.is_err(), "a paused server answered an open connection");
    tokio::time::timeout(LIMIT, open.simple_query("SELECT 1"))
        .await
        .expect("no answer after resume")
        .unwrap();
    drop(open);
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
    assert_eq!(still.and_then(|h| h.token), Some(before.get()));
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
    assert_eq!(lock.holder(&k).await.unwrap().unwrap().detail, host);
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

/// An acquire whose statement waits on a row lock past the request time-out
/// leaves no grant behind once the row is free: the statement is cancelled,
/// or its late grant released. Before, the clean-up ran on a new connection,
/// found the row not ours and stopped; the old backend then committed the
/// grant, and the name stayed held for the whole TTL by nobody.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_acquire_leaves_no_grant_behind() {
    let server = shared::postgres().await.unwrap();
    let url = server.addresses[0].clone();
    let table = format!("stuck_{:x}", rand::random::<u32>());
    let config = PostgresConfig::from_url(url.clone()).table("public", &table);
    let a = PostgresLock::connect(PostgresConfig {
        request_timeout: Duration::from_millis(500),
        ..config.clone()
    })
    .await
    .unwrap();
    let mut admin = raw(&url).await;
    let watcher = raw(&url).await;
    let k = key("stuck");
    // The row is there and free (expired a minute ago).
    admin
        .execute(
            &format!(
                "INSERT INTO public.{table} (name, lock_until, locked_at, locked_by, fence) \
                 VALUES ($1, timezone('utc', now()) - interval '1 minute', timezone('utc', now()) - interval '2 minutes', 'gone', 1)"
            ),
            &[&k.as_str()],
        )
        .await
        .unwrap();
    let since: std::time::SystemTime = watcher
        .query_one("SELECT clock_timestamp()", &[])
        .await
        .unwrap()
        .get(0);
    let tx = admin.transaction().await.unwrap();
    tx.query(
        &format!("SELECT 1 FROM public.{table} WHERE name = $1 FOR UPDATE"),
        &[&k.as_str()],
    )
    .await
    .unwrap();
    let opts = AcquireOptions::default().ttl(Duration::from_secs(60));
    let e = a.try_acquire(&k, opts).await.unwrap_err();
    assert!(
        matches!(e, Error::Unavailable { .. }) && e.to_string().contains(&endpoint(&url)),
        "{e}"
    );
    // Let the driver's clean-up have its say before the row is free: its
    // acquire no longer waits (cancelled), or a release ran on a
    // connection opened since (what the driver did before).
    let (w, t) = (&watcher, table.as_str());
    within(Duration::from_secs(10), move || async move {
        let row = w
            .query_one(
                "SELECT count(*) FILTER (WHERE wait_event_type = 'Lock' AND strpos(query, 'INSERT INTO') > 0), \
                        count(*) FILTER (WHERE state = 'idle' AND backend_start > $2 AND strpos(query, 'pg_notify') > 0) \
                 FROM pg_stat_activity WHERE pid <> pg_backend_pid() AND strpos(query, $1) > 0",
                &[&t, &since],
            )
            .await
            .unwrap();
        let (waiting, released): (i64, i64) = (row.get(0), row.get(1));
        waiting == 0 || released > 0
    })
    .await;
    tx.commit().await.unwrap();
    let b = PostgresLock::connect(config).await.unwrap();
    let asked = Instant::now();
    let g = b
        .acquire(&k, opts.wait(Wait::For(Duration::from_secs(10))))
        .await
        .unwrap_or_else(|e| panic!("the timed-out attempt left the name held: {e}"));
    assert!(asked.elapsed() < Duration::from_secs(10));
    assert_eq!(
        b.holder(&k).await.unwrap().and_then(|h| h.token),
        Some(g.token().unwrap().get())
    );
    g.release().await.unwrap();
    // The handle that timed out works on: a new connection.
    a.try_acquire(&key("after"), opts)
        .await
        .unwrap()
        .unwrap()
        .release()
        .await
        .unwrap();
}

/// With `REPEATABLE READ` set on the role, contention raised serialization
/// failures (40001), which ended waiting acquires as "unavailable". The
/// driver pins `READ COMMITTED` and sends a statement that lost a conflict
/// again: six clients contending on one name all get it, one at a time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repeatable_read_role_does_not_fail_contended_acquires() {
    let server = shared::postgres().await.unwrap();
    let url = server.addresses[0].clone();
    let admin = raw(&url).await;
    let role = format!("iso_{:x}", rand::random::<u32>());
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN SUPERUSER; \
             ALTER ROLE {role} SET default_transaction_isolation = 'repeatable read'"
        ))
        .await
        .unwrap();
    let role_url = url.replacen("dlock@", &format!("{role}@"), 1);
    // The role's own sessions do run in REPEATABLE READ.
    let level: String = raw(&role_url)
        .await
        .query_one("SHOW default_transaction_isolation", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(level, "repeatable read");
    let config =
        PostgresConfig::from_url(role_url).table("public", format!("iso_{:x}", rand::random::<u32>()));
    let k = key("iso");
    let holding = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for _ in 0..6 {
        clients.push(PostgresLock::connect(config.clone()).await.unwrap());
    }
    let opts = AcquireOptions::default()
        .ttl(Duration::from_secs(10))
        .wait(Wait::For(Duration::from_secs(30)));
    let tasks: Vec<_> = clients
        .into_iter()
        .map(|lock| {
            let (k, holding) = (k.clone(), Arc::clone(&holding));
            tokio::spawn(async move {
                for round in 0..8 {
                    let g = lock
                        .acquire(&k, opts)
                        .await
                        .map_err(|e| format!("round {round}: {e}"))?;
                    assert!(!holding.swap(true, Ordering::SeqCst), "two holders at once");
                    tokio::task::yield_now().await;
                    holding.store(false, Ordering::SeqCst);
                    g.release()
                        .await
                        .map_err(|e| format!("release, round {round}: {e}"))?;
                }
                Ok::<(), String>(())
            })
        })
        .collect();
    let mut failed = Vec::new();
    for task in tasks {
        match tokio::time::timeout(Duration::from_secs(60), task).await {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => failed.push(e),
            Ok(Err(panicked)) => panic!("{panicked}"),
            Err(_) => failed.push("no end within 60 s".to_owned()),
        }
    }
    assert!(failed.is_empty(), "{failed:?}");
}

/// An acquire stuck on a row lock held elsewhere (`SELECT ... FOR UPDATE`)
/// does not hold up the renewals of the handle's other guards. Before, one
/// connection ran both: the renewal of a 3 s guard waited behind the stuck
/// acquire until its own time-out, and the guard was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_acquire_stuck_on_a_row_lock_does_not_stall_renewals() {
    let server = shared::postgres().await.unwrap();
    let url = server.addresses[0].clone();
    // The default request time-out (2 s) against a 3 s TTL.
    let lock = PostgresLock::connect(PostgresConfig::from_url(url.clone()))
        .await
        .unwrap();
    let (k1, k2) = (key("row-locked"), key("renewed"));
    let short = AcquireOptions::default().ttl(Duration::from_secs(3));
    lock.acquire(&k1, short).await.unwrap().release().await.unwrap();
    let g = lock.acquire(&k2, short).await.unwrap();
    let mut admin = raw(&url).await;
    let tx = admin.transaction().await.unwrap();
    tx.query(
        "SELECT 1 FROM public.dlock_locks WHERE name = $1 FOR UPDATE",
        &[&k1.as_str()],
    )
    .await
    .unwrap();
    let until = Instant::now() + Duration::from_secs(7);
    let mut tries = 0;
    while Instant::now() < until && !g.lost().is_lost() {
        tries += 1;
        match lock.try_acquire(&k1, short).await {
            Ok(None) | Err(Error::Unavailable { .. }) => {}
            Ok(Some(_)) => panic!("{k1} granted while its row is locked"),
            Err(e) => panic!("try {tries}: {e:?}"),
        }
    }
    assert!(
        !g.lost().is_lost() && g.is_held(),
        "{k2} was lost while acquires of {k1} were stuck ({tries} tries)"
    );
    tx.rollback().await.unwrap();
    g.release().await.unwrap();
}

/// A lock table made by hand with a `fence` that is not `bigint` is a
/// configuration error at connect that says what to run; before, connect
/// took it and acquire or holder panicked decoding the column. Once the
/// statement said is run, the table serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fence_column_that_is_not_bigint_is_a_config_error() {
    let server = shared::postgres().await.unwrap();
    let url = server.addresses[0].clone();
    let admin = raw(&url).await;
    for ty in ["integer", "text"] {
        let table = format!("fence_{ty}_{:x}", rand::random::<u32>());
        admin
            .batch_execute(&format!(
                "CREATE TABLE public.{table} (name TEXT NOT NULL PRIMARY KEY, lock_until TIMESTAMP NOT NULL, \
                 locked_at TIMESTAMP NOT NULL, locked_by TEXT NOT NULL, fence {ty} NOT NULL DEFAULT '0'); \
                 INSERT INTO public.{table} VALUES ('held', timezone('utc', now()) + interval '1 hour', \
                 timezone('utc', now()), 'someone', '7')"
            ))
            .await
            .unwrap();
        let config = PostgresConfig::from_url(url.clone()).table("public", &table);
        let e = PostgresLock::connect(config.clone()).await.unwrap_err();
        let fix = format!(
            "ALTER TABLE \"public\".\"{table}\" ALTER COLUMN fence DROP DEFAULT, \
             ALTER COLUMN fence TYPE bigint USING fence::bigint, ALTER COLUMN fence SET DEFAULT 0"
        );
        assert!(
            matches!(&e, Error::InvalidConfig(m)
                if m.contains(&format!("column fence of type {ty}, not bigint")) && m.contains(&fix)),
            "{e:?}"
        );
        admin.batch_execute(&fix).await.unwrap();
        let lock = PostgresLock::connect(config).await.unwrap();
        let held = LockKey::new("held").unwrap();
        assert_eq!(lock.holder(&held).await.unwrap().and_then(|h| h.token), Some(7));
        let g = lock
            .acquire(&key("fence"), AcquireOptions::default())
            .await
            .unwrap();
        g.release().await.unwrap();
    }
}

/// Rows idle longer than the bound are deleted (by `prune`, and by a
/// handle with `prune_after` at connect); a held row is not; a pruned
/// name's next token is higher than its last.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pruned_names_are_granted_again_with_higher_tokens() {
    let server = shared::postgres().await.unwrap();
    let url = server.addresses[0].clone();
    let table = format!("prune_{:x}", rand::random::<u32>());
    let config = PostgresConfig::from_url(url.clone()).table("public", &table);
    let lock = PostgresLock::connect(config.clone()).await.unwrap();
    let admin = raw(&url).await;
    let (k, kept) = (key("pruned"), key("kept"));
    let opts = AcquireOptions::default().ttl(Duration::from_secs(60));
    let g = lock.acquire(&k, opts).await.unwrap();
    let first = g.token().unwrap();
    g.release().await.unwrap();
    let held = lock.acquire(&kept, opts).await.unwrap();
    // A released row younger than the bound stays.
    assert_eq!(lock.prune(Duration::from_secs(3600)).await.unwrap(), 0);
    assert_eq!(rows(&admin, &table, k.as_str()).await, 1);
    assert_eq!(lock.prune(Duration::ZERO).await.unwrap(), 1);
    assert_eq!(rows(&admin, &table, k.as_str()).await, 0);
    assert_eq!(rows(&admin, &table, kept.as_str()).await, 1);
    assert!(held.is_held() && lock.holder(&kept).await.unwrap().is_some());
    let g = lock.acquire(&k, opts).await.unwrap();
    let second = g.token().unwrap();
    assert!(second > first, "{second:?} after {first:?}");
    g.release().await.unwrap();
    // A handle with prune_after prunes at connect, in the background.
    let _pruning = PostgresLock::connect(PostgresConfig {
        prune_after: Some(Duration::ZERO),
        ..config
    })
    .await
    .unwrap();
    let (a, t, name) = (&admin, table.as_str(), k.as_str());
    assert!(
        within(LIMIT, move || async move { rows(a, t, name).await == 0 }).await,
        "prune_after did not prune"
    );
    assert_eq!(rows(&admin, &table, kept.as_str()).await, 1);
    let g = lock.acquire(&k, opts).await.unwrap();
    assert!(g.token().unwrap() > second);
    g.release().await.unwrap();
    held.release().await.unwrap();
}

/// Errors say where (`host:port/database`, no password) and what the
/// server said, with its SQLSTATE; before, a server error read "db error".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_name_the_endpoint_and_the_servers_words() {
    let server = shared::postgres().await.unwrap();
    let url = server.addresses[0].clone();
    let (base, _) = url.rsplit_once('/').unwrap();
    let e = PostgresLock::connect(PostgresConfig::from_url(format!("{base}/no_such_db")))
        .await
        .unwrap_err();
    let host = endpoint(base);
    let shown = e.to_string();
    assert!(
        shown.contains(&format!("{host}/no_such_db")) && shown.contains("(SQLSTATE 3D000)"),
        "{shown}"
    );
    let nowhere = dlock_testkit::link::nowhere(1).unwrap()[0];
    let e = PostgresLock::connect(
        PostgresConfig::from_url(format!("postgres://dlock:s3cret@{nowhere}/x"))
            .timeouts(Duration::from_secs(2), Duration::from_secs(1)),
    )
    .await
    .unwrap_err();
    let shown = e.to_string();
    assert!(
        matches!(e, Error::Unavailable { .. })
            && shown.starts_with(&format!("postgres at {nowhere}/x unavailable: "))
            && !shown.contains("s3cret"),
        "{shown}"
    );
    // A role that may only read: the server's refusal, word for word.
    let admin = raw(&url).await;
    let role = format!("reader_{:x}", rand::random::<u32>());
    let table = format!("read_only_{:x}", rand::random::<u32>());
    admin
        .batch_execute(&format!(
            "CREATE ROLE {role} LOGIN; {}; GRANT SELECT ON public.{table} TO {role}",
            PostgresConfig::default()
                .table("public", &table)
                .create_table_sql()
                .unwrap()
        ))
        .await
        .unwrap();
    let reader = PostgresLock::connect(
        PostgresConfig::from_url(url.replacen("dlock@", &format!("{role}@"), 1)).table("public", &table),
    )
    .await
    .unwrap();
    let e = reader
        .acquire(&key("read-only"), AcquireOptions::default())
        .await
        .unwrap_err();
    let shown = e.to_string();
    assert!(
        matches!(e, Error::Backend { .. })
            && shown.contains(&endpoint(&url))
            && shown.contains(&format!("permission denied for table {table}"))
            && shown.contains("(SQLSTATE 42501)"),
        "{shown}"
    );
}
