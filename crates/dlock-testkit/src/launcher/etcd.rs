//! etcd (Debian's `etcd-server`, 3.4): a single member or a cluster.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::member::{Member, start_all};
use super::{LaunchError, free_ports, loopback};

pub(crate) const SERVER: &str = "/usr/bin/etcd";
pub(crate) const CTL: &str = "/usr/bin/etcdctl";

/// An etcd cluster of one or more members on loopback.
#[derive(Debug)]
pub struct Etcd {
    members: Vec<Member>,
    _dir: TempDir,
}

impl Etcd {
    /// Starts a single-member etcd and waits until `/health` says so.
    ///
    /// # Errors
    ///
    /// If `etcd` is missing or does not become healthy in time.
    pub async fn start() -> Result<Self, LaunchError> {
        Self::start_cluster(1).await
    }

    /// Starts an `n`-member cluster and waits until every member is healthy
    /// (which needs a quorum and an elected leader).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub async fn start_cluster(n: usize) -> Result<Self, LaunchError> {
        let dir = tempfile::Builder::new().prefix("dlock-etcd-").tempdir()?;
        let ports = free_ports(2 * n)?;
        let (client, peer) = ports.split_at(n);
        let initial: Vec<String> = (0..n)
            .map(|i| format!("etcd-{i}=http://127.0.0.1:{}", peer[i]))
            .collect();
        let token = format!("dlock-{:x}", rand::random::<u64>());
        let mut members = Vec::with_capacity(n);
        for i in 0..n {
            let curl = format!("http://127.0.0.1:{}", client[i]);
            let purl = format!("http://127.0.0.1:{}", peer[i]);
            let args = vec![
                format!("--name=etcd-{i}"),
                format!("--data-dir={}", dir.path().join(format!("m{i}")).display()),
                format!("--listen-client-urls={curl}"),
                format!("--advertise-client-urls={curl}"),
                format!("--listen-peer-urls={purl}"),
                format!("--initial-advertise-peer-urls={purl}"),
                format!("--initial-cluster={}", initial.join(",")),
                "--initial-cluster-state=new".to_owned(),
                format!("--initial-cluster-token={token}"),
                "--logger=zap".to_owned(),
                "--log-level=warn".to_owned(),
            ];
            members.push(Member::new(
                format!("etcd-{i}"),
                loopback(client[i]),
                SERVER,
                args,
                dir.path().join(format!("m{i}.log")),
                |addr| Box::pin(healthy(addr)),
                Duration::from_secs(60),
            ));
        }
        start_all(&mut members).await?;
        Ok(Etcd { members, _dir: dir })
    }

    /// `http://127.0.0.1:PORT` of every member.
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| format!("http://{}", m.addr()))
            .collect()
    }

    /// The members, to kill, restart, pause or resume.
    pub fn members(&mut self) -> &mut [Member] {
        &mut self.members
    }

    /// Runs `etcdctl` (v3 API) against the given members' endpoints and
    /// returns its standard output.
    ///
    /// # Errors
    ///
    /// If `etcdctl` cannot run or exits non-zero (the error has its stderr).
    pub fn etcdctl(&self, members: &[usize], args: &[&str]) -> Result<String, LaunchError> {
        let endpoints: Vec<String> = members
            .iter()
            .filter_map(|&i| self.members.get(i))
            .map(|m| format!("http://{}", m.addr()))
            .collect();
        etcdctl(&endpoints, args)
    }
}

/// Runs `etcdctl` against `endpoints` with a 5 s command timeout.
///
/// # Errors
///
/// If it cannot run or exits non-zero.
pub fn etcdctl(endpoints: &[String], args: &[&str]) -> Result<String, LaunchError> {
    let out = Command::new(CTL)
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .arg("--command-timeout=5s")
        .args(args)
        .output()
        .map_err(|e| LaunchError(format!("cannot run {CTL}: {e}")))?;
    if !out.status.success() {
        return Err(LaunchError(format!(
            "etcdctl {args:?} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `GET /health` on a member: `true` when it reports `"health":"true"`.
pub async fn healthy(addr: SocketAddr) -> bool {
    let get = async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(format!("GET /health HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes())
            .await?;
        let mut body = String::new();
        s.read_to_string(&mut body).await?;
        Ok::<_, std::io::Error>(body)
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), get).await,
        Ok(Ok(body)) if body.contains("\"health\":\"true\"")
    )
}
