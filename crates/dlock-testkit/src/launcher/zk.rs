//! ZooKeeper (Debian's `zookeeper`, 3.8, on the machine's Java 17):
//! standalone or an ensemble.

use std::net::SocketAddr;
use std::time::Duration;

use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::member::{Member, start_all};
use super::{LaunchError, free_ports, loopback};

pub(crate) const JAR: &str = "/usr/share/java/zookeeper.jar";
const JAVA: &str = "/usr/bin/java";

/// The servers' tick. ZooKeeper's shortest session timeout is two ticks, so
/// this sets the shortest TTL a ZooKeeper lock can honour.
pub const TICK: Duration = Duration::from_millis(250);

/// A ZooKeeper server, or an ensemble of them, on loopback.
#[derive(Debug)]
pub struct ZooKeeper {
    members: Vec<Member>,
    _dir: TempDir,
}

impl ZooKeeper {
    /// Starts a standalone server.
    ///
    /// # Errors
    ///
    /// If Java or ZooKeeper is missing or the server is not serving in time.
    pub async fn start() -> Result<Self, LaunchError> {
        Self::start_ensemble(1).await
    }

    /// Starts `n` servers (standalone for 1, an ensemble otherwise) and waits
    /// until every one is serving (an ensemble has elected a leader).
    ///
    /// # Errors
    ///
    /// As [`start`](Self::start).
    pub async fn start_ensemble(n: usize) -> Result<Self, LaunchError> {
        let dir = tempfile::Builder::new().prefix("dlock-zk-").tempdir()?;
        let ports = free_ports(3 * n)?;
        let (client, quorum) = ports.split_at(n);
        let servers: String = (0..n)
            .map(|i| {
                format!(
                    "server.{}=127.0.0.1:{}:{}\n",
                    i + 1,
                    quorum[2 * i],
                    quorum[2 * i + 1]
                )
            })
            .collect();
        let mut members = Vec::with_capacity(n);
        for (i, &client_port) in client.iter().enumerate() {
            let data = dir.path().join(format!("z{i}"));
            std::fs::create_dir_all(&data)?;
            let tick = TICK.as_millis();
            let mut cfg = format!(
                "tickTime={tick}\ninitLimit=40\nsyncLimit=20\ndataDir={}\nclientPort={}\n\
                 clientPortAddress=127.0.0.1\nadmin.enableServer=false\n4lw.commands.whitelist=*\n\
                 maxSessionTimeout=120000\nmaxClientCnxns=0\nforceSync=no\n",
                data.display(),
                client_port
            );
            if n > 1 {
                std::fs::write(data.join("myid"), format!("{}\n", i + 1))?;
                cfg.push_str("standaloneEnabled=false\nreconfigEnabled=false\n");
                cfg.push_str(&servers);
            }
            let cfg_path = dir.path().join(format!("z{i}.cfg"));
            std::fs::write(&cfg_path, cfg)?;
            let args = vec![
                "-Xmx192m".to_owned(),
                "-XX:+UseSerialGC".to_owned(),
                "-XX:TieredStopAtLevel=1".to_owned(),
                "-XX:-UsePerfData".to_owned(),
                format!("-Dzookeeper.log.dir={}", dir.path().display()),
                "-cp".to_owned(),
                JAR.to_owned(),
                "org.apache.zookeeper.server.quorum.QuorumPeerMain".to_owned(),
                cfg_path.display().to_string(),
            ];
            members.push(Member::new(
                format!("zk-{i}"),
                loopback(client_port),
                JAVA,
                args,
                dir.path().join(format!("z{i}.log")),
                |addr| Box::pin(async move { mode(addr).await.is_some() }),
                Duration::from_secs(90),
            ));
        }
        start_all(&mut members).await?;
        Ok(ZooKeeper { members, _dir: dir })
    }

    /// `127.0.0.1:a,127.0.0.1:b,...`: the connect string of the ensemble.
    pub fn connect_string(&self) -> String {
        self.members
            .iter()
            .map(|m| m.addr().to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The members, to kill, restart, pause or resume.
    pub fn members(&mut self) -> &mut [Member] {
        &mut self.members
    }

    /// The index of the current leader (or the standalone server), if any
    /// member says so.
    pub async fn leader(&self) -> Option<usize> {
        for (i, m) in self.members.iter().enumerate() {
            if matches!(mode(m.addr()).await.as_deref(), Some("leader" | "standalone")) {
                return Some(i);
            }
        }
        None
    }
}

/// Sends a four-letter command (`ruok`, `srvr`, `mntr`...) and returns the
/// reply. Bounded by a 2 s timeout.
///
/// # Errors
///
/// On connection failure or no reply in time.
pub async fn four_letter(addr: SocketAddr, cmd: &str) -> std::io::Result<String> {
    let talk = async {
        let mut s = TcpStream::connect(addr).await?;
        s.write_all(cmd.as_bytes()).await?;
        let mut reply = String::new();
        s.read_to_string(&mut reply).await?;
        Ok(reply)
    };
    tokio::time::timeout(Duration::from_secs(2), talk)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "no reply within 2s"))?
}

/// The server's mode (`standalone`, `leader`, `follower`) while it is serving
/// requests; `None` otherwise.
pub async fn mode(addr: SocketAddr) -> Option<String> {
    let reply = four_letter(addr, "srvr").await.ok()?;
    reply
        .lines()
        .find_map(|l| l.strip_prefix("Mode: "))
        .map(|m| m.trim().to_owned())
}

const CLI: &str = "/usr/share/zookeeper/bin/zkCli.sh";

/// Runs ZooKeeper's own command-line client (`zkCli.sh -server CONNECT
/// ARGS...`) and returns its output.
///
/// # Errors
///
/// If it cannot run or exits non-zero.
pub fn cli(connect: &str, args: &[&str]) -> Result<String, LaunchError> {
    let out = std::process::Command::new(CLI)
        .arg("-server")
        .arg(connect)
        .args(args)
        .output()
        .map_err(|e| LaunchError(format!("cannot run {CLI}: {e}")))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        return Err(LaunchError(format!(
            "zkCli {args:?} failed ({}): {text}",
            out.status
        )));
    }
    Ok(text)
}
