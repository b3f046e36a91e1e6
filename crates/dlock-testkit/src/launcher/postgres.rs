//! PostgreSQL from Debian's `postgresql` package: `initdb` in a temporary
//! directory, `postgres` on a free loopback port (its socket directory
//! inside the temporary one), stopped by pid when dropped. The data
//! directory outlives a kill, so a restart finds the tables as they were
//! (what a crashed and restarted server does).
//!
//! PostgreSQL refuses to run as root: under root (CI), `initdb` and the
//! server run as the package's `postgres` user, which owns the directory.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tempfile::TempDir;

use super::member::{Member, start_all};
use super::{LaunchError, free_ports, loopback};

/// Debian 12's server binaries (the `postgresql` package pulls in 15).
pub(crate) const BIN: &str = "/usr/lib/postgresql/15/bin";
/// The server, whose presence says the package is installed.
pub(crate) const SERVER: &str = "/usr/lib/postgresql/15/bin/postgres";

/// The database and the superuser the launcher creates (trust
/// authentication on loopback: no password).
pub const USER: &str = "dlock";

/// One PostgreSQL server.
#[derive(Debug)]
pub struct Postgres {
    members: Vec<Member>,
    sockets: PathBuf,
    ca_file: Option<PathBuf>,
    _dir: TempDir,
}

/// The uid and gid to run as: the `postgres` user's under root, else none.
fn run_as() -> Result<Option<(u32, u32)>, LaunchError> {
    if !nix::unistd::Uid::effective().is_root() {
        return Ok(None);
    }
    let user = nix::unistd::User::from_name("postgres")
        .map_err(|e| LaunchError(format!("looking up the postgres user: {e}")))?
        .ok_or_else(|| LaunchError("no postgres user (is the postgresql package installed?)".into()))?;
    Ok(Some((user.uid.as_raw(), user.gid.as_raw())))
}

fn chown_all(path: &Path, (uid, gid): (u32, u32)) -> Result<(), LaunchError> {
    let (uid, gid) = (
        Some(nix::unistd::Uid::from_raw(uid)),
        Some(nix::unistd::Gid::from_raw(gid)),
    );
    nix::unistd::chown(path, uid, gid).map_err(|e| LaunchError(format!("chown {}: {e}", path.display())))
}

impl Postgres {
    /// Initializes a data directory and starts the server; waits until it
    /// accepts connections (`pg_isready`).
    ///
    /// # Errors
    ///
    /// If the package is missing, `initdb` fails, or the server does not
    /// become ready in time.
    pub async fn start() -> Result<Self, LaunchError> {
        Self::start_with(false).await
    }

    /// A server that takes only TLS connections on loopback (plain ones are
    /// refused by `pg_hba.conf`), with a certificate for `127.0.0.1` (not
    /// `localhost`, so a name check can be seen to fail) signed by a new
    /// CA: [`Postgres::ca_file`].
    ///
    /// # Errors
    ///
    /// As [`Postgres::start`], and if the certificates cannot be made.
    pub async fn start_tls() -> Result<Self, LaunchError> {
        Self::start_with(true).await
    }

    async fn start_with(tls: bool) -> Result<Self, LaunchError> {
        if !Path::new(SERVER).exists() {
            return Err(LaunchError(format!(
                "{SERVER} not found: install Debian's postgresql package"
            )));
        }
        let dir = tempfile::Builder::new().prefix("dlock-postgres-").tempdir()?;
        let user = run_as()?;
        let (data, sockets) = (dir.path().join("data"), dir.path().join("sockets"));
        std::fs::create_dir_all(&sockets)?;
        if let Some(ids) = user {
            chown_all(dir.path(), ids)?;
            chown_all(&sockets, ids)?;
        }
        let mut initdb = tokio::process::Command::new(format!("{BIN}/initdb"));
        initdb
            .args(["-D"])
            .arg(&data)
            .args([
                "-U",
                USER,
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-sync",
                "--locale=C",
            ])
            // A directory the server's user may enter (PostgreSQL goes back
            // to its working directory at start).
            .current_dir(dir.path())
            .stdin(std::process::Stdio::null());
        if let Some((uid, gid)) = user {
            initdb.uid(uid).gid(gid);
        }
        let out = initdb
            .output()
            .await
            .map_err(|e| LaunchError(format!("cannot run initdb: {e}")))?;
        if !out.status.success() {
            return Err(LaunchError(format!(
                "initdb failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let port = free_ports(1)?[0];
        let addr = loopback(port);
        let log = dir.path().join("postgres.log");
        let args = vec![
            "-D".to_owned(),
            data.display().to_string(),
            "-p".to_owned(),
            port.to_string(),
            "-k".to_owned(),
            sockets.display().to_string(),
            "-c".to_owned(),
            "listen_addresses=127.0.0.1".to_owned(),
            // A test server: durability is not what is tested here (a
            // kill still keeps every committed row the OS has).
            "-c".to_owned(),
            "fsync=off".to_owned(),
            "-c".to_owned(),
            "max_connections=200".to_owned(),
        ];
        let mut args = args;
        let ca_file = if tls {
            let tls_dir = dir.path().join("tls");
            std::fs::create_dir_all(&tls_dir)?;
            let files = certificates(&tls_dir)?;
            let hba = dir.path().join("pg_hba.conf");
            std::fs::write(
                &hba,
                "local all all trust\n\
                 hostssl all all 127.0.0.1/32 trust\n\
                 hostnossl all all 127.0.0.1/32 reject\n",
            )?;
            if let Some(ids) = user {
                chown_all(&files.key, ids)?;
                chown_all(&files.cert, ids)?;
                chown_all(&hba, ids)?;
            }
            for setting in [
                "ssl=on".to_owned(),
                format!("ssl_cert_file={}", files.cert.display()),
                format!("ssl_key_file={}", files.key.display()),
                format!("hba_file={}", hba.display()),
            ] {
                args.push("-c".to_owned());
                args.push(setting);
            }
            Some(files.ca)
        } else {
            None
        };
        let mut member = Member::new(
            "postgres-0".to_owned(),
            addr,
            PathBuf::from(SERVER),
            args,
            log.clone(),
            probe,
            Duration::from_secs(60),
        )
        .retrying_start()
        .faulted_as_a_tree();
        if let Some(ids) = user {
            std::fs::File::create(&log)?;
            chown_all(&log, ids)?;
            member = member.run_as(ids, dir.path().to_owned());
        }
        let mut members = vec![member];
        start_all(&mut members).await?;
        let mut pg = Postgres {
            members,
            sockets,
            ca_file,
            _dir: dir,
        };
        pg.create_database().await?;
        Ok(pg)
    }

    /// Creates the database named [`USER`] (initdb makes only `postgres`).
    async fn create_database(&mut self) -> Result<(), LaunchError> {
        let out = tokio::process::Command::new(format!("{BIN}/createdb"))
            // By the socket, which a TLS-only server takes too.
            .arg("-h")
            .arg(&self.sockets)
            .args(["-p", &self.addr().port().to_string(), "-U", USER, USER])
            .output()
            .await
            .map_err(|e| LaunchError(format!("cannot run createdb: {e}")))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(LaunchError(format!(
                "createdb failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            )))
        }
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.members[0].addr()
    }

    /// `postgres://dlock@127.0.0.1:PORT/dlock`.
    pub fn url(&self) -> String {
        format!("postgres://{USER}@{}/{USER}", self.addr())
    }

    /// The CA that signed a [`Postgres::start_tls`] server's certificate
    /// (PEM), or none.
    pub fn ca_file(&self) -> Option<&Path> {
        self.ca_file.as_deref()
    }

    /// The server process, to kill, restart, pause and resume.
    pub fn members(&mut self) -> &mut [Member] {
        &mut self.members
    }
}

/// The files [`certificates`] writes.
struct Certificates {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

/// A new CA, and a server certificate it signs for `127.0.0.1`, written to `dir` (the key readable by its owner only, as
/// PostgreSQL demands).
fn certificates(dir: &Path) -> Result<Certificates, LaunchError> {
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    let err = |e: rcgen::Error| LaunchError(format!("making a test certificate: {e}"));
    let ca_key = KeyPair::generate().map_err(err)?;
    let mut ca_params = CertificateParams::new(Vec::new()).map_err(err)?;
    ca_params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "dlock test CA");
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca_params.self_signed(&ca_key).map_err(err)?;
    let issuer = Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().map_err(err)?;
    let params = CertificateParams::new(vec!["127.0.0.1".to_owned()]).map_err(err)?;
    let cert = params.signed_by(&key, &issuer).map_err(err)?;
    let files = Certificates {
        ca: dir.join("ca.pem"),
        cert: dir.join("server.pem"),
        key: dir.join("server.key"),
    };
    std::fs::write(&files.ca, ca_cert.pem())?;
    std::fs::write(&files.cert, cert.pem())?;
    std::fs::write(&files.key, key.serialize_pem())?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o600))?;
    Ok(files)
}

/// Ready when `pg_isready` says the server accepts connections.
fn probe(addr: SocketAddr) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>> {
    Box::pin(async move {
        tokio::process::Command::new(format!("{BIN}/pg_isready"))
            .args([
                "-q",
                "-h",
                "127.0.0.1",
                "-p",
                &addr.port().to_string(),
                "-U",
                USER,
                "-d",
                "postgres",
            ])
            .status()
            .await
            .is_ok_and(|s| s.success())
    })
}
