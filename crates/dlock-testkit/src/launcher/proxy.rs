//! [`FaultProxy`]: a TCP proxy on loopback to put in front of a server, with
//! faults switched on and off at run time.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::LaunchError;

/// What the proxy does to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Fault {
    /// Forward everything at once.
    #[default]
    None,
    /// Hold each chunk this long before forwarding it (each direction, so a
    /// request/reply round trip gains twice this).
    Delay(Duration),
    /// Accept and read, forward nothing, answer nothing: a silent network.
    /// Data read while blackholed is dropped for good, so a connection that
    /// lost data is reset when the blackhole ends, as TCP would have given
    /// up on it (a byte stream with a hole in it is not one any client can
    /// read on); connections that lost nothing carry on.
    Blackhole,
    /// Reset every open connection (TCP RST) and every new one.
    Reset,
    /// Hold traffic and deliver it all once the fault changes: a network
    /// stall. Nothing is lost.
    Pause,
}

/// A TCP proxy from a loopback port to `upstream`. Dropping it stops it and
/// closes its connections.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    upstream: SocketAddr,
    fault: Arc<watch::Sender<Fault>>,
    task: JoinHandle<()>,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port forwarding to `upstream`.
    ///
    /// # Errors
    ///
    /// If no loopback port can be bound or `upstream` is not on loopback.
    pub async fn start(upstream: SocketAddr) -> Result<Self, LaunchError> {
        Self::start_switched(upstream, Arc::new(watch::channel(Fault::None).0)).await
    }

    /// Starts a proxy whose fault is `fault`'s: several proxies sharing one
    /// switch fail together (a [`Link`](crate::Link) to many nodes).
    pub(crate) async fn start_switched(
        upstream: SocketAddr,
        fault: Arc<watch::Sender<Fault>>,
    ) -> Result<Self, LaunchError> {
        if !upstream.ip().is_loopback() {
            return Err(LaunchError(format!(
                "the fault proxy only forwards to loopback, not {upstream}"
            )));
        }
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let task = tokio::spawn(accept_loop(listener, upstream, fault.subscribe()));
        Ok(FaultProxy {
            addr,
            upstream,
            fault,
            task,
        })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where traffic goes.
    pub fn upstream(&self) -> SocketAddr {
        self.upstream
    }

    /// Switches the fault; takes effect at once on open connections.
    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    /// The current fault.
    pub fn fault(&self) -> Fault {
        *self.fault.borrow()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
        // Tell open connections to close.
        self.fault.send_replace(Fault::Reset);
    }
}

async fn accept_loop(listener: TcpListener, upstream: SocketAddr, fault: watch::Receiver<Fault>) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let Ok((client, _)) = accepted else { continue };
                connections.spawn(connection(client, upstream, fault.clone()));
            }
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
        }
    }
}

/// Makes the coming close of `stream` a TCP RST. (`set_linger` is deprecated
/// because a non-zero linger blocks on drop; a zero linger does not block.)
#[allow(deprecated)]
fn reset(stream: &TcpStream) {
    let _ = stream.set_linger(Some(Duration::ZERO));
}

async fn connection(mut client: TcpStream, upstream: SocketAddr, mut fault: watch::Receiver<Fault>) {
    if *fault.borrow() == Fault::Reset {
        reset(&client);
        return;
    }
    let Ok(mut server) = TcpStream::connect(upstream).await else {
        reset(&client);
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let ended_by_reset = {
        let (mut cr, mut cw) = client.split();
        let (mut sr, mut sw) = server.split();
        let (f1, f2) = (fault.clone(), fault.clone());
        // Set when a blackhole dropped data of this connection.
        let holed = AtomicBool::new(false);
        tokio::select! {
            r = pump(&mut cr, &mut sw, f1, &holed) => r,
            r = pump(&mut sr, &mut cw, f2, &holed) => r,
            () = async {
                let _ = fault
                    .wait_for(|f| {
                        *f == Fault::Reset || (*f != Fault::Blackhole && holed.load(Ordering::SeqCst))
                    })
                    .await;
            } => true,
        }
    };
    if ended_by_reset {
        reset(&client);
        reset(&server);
    }
}

/// Copies one direction under the current fault, setting `holed` when a
/// blackhole drops data. Returns `true` if it ended because of a reset.
///
/// A delay is latency, not a throttle: each chunk is due `d` after it was
/// read, and chunks read meanwhile are on their way too (a reader queues,
/// a writer delivers in order at the due times), so a delayed link adds `d`
/// to every crossing, however many are in flight. The fault at the moment
/// of delivery decides what happens to a chunk (a blackhole that begins
/// while a chunk is delayed swallows it).
async fn pump(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWriteExt + Unpin),
    fault: watch::Receiver<Fault>,
    holed: &AtomicBool,
) -> bool {
    let (queue, mut due) = tokio::sync::mpsc::unbounded_channel::<(Instant, Vec<u8>)>();
    let mut read_fault = fault.clone();
    let reader = async move {
        let mut buf = vec![0u8; 16 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return false,
                Ok(n) => n,
            };
            let delay = match *read_fault.borrow_and_update() {
                Fault::Delay(d) => d,
                Fault::Reset => return true,
                _ => Duration::ZERO,
            };
            let at = Instant::now().checked_add(delay).unwrap_or_else(Instant::now);
            if queue.send((at, buf[..n].to_vec())).is_err() {
                return false;
            }
        }
    };
    let writer = async {
        let mut fault = fault;
        while let Some((at, chunk)) = due.recv().await {
            tokio::time::sleep_until(at.into()).await;
            loop {
                let current = *fault.borrow_and_update();
                match current {
                    Fault::Reset => return true,
                    Fault::Pause => {
                        if fault.changed().await.is_err() {
                            return true;
                        }
                    }
                    Fault::Blackhole => {
                        holed.store(true, Ordering::SeqCst);
                        break;
                    }
                    Fault::None | Fault::Delay(_) => {
                        if to.write_all(&chunk).await.is_err() {
                            return false;
                        }
                        break;
                    }
                }
            }
        }
        false
    };
    tokio::pin!(reader, writer);
    tokio::select! {
        // The reader ended: a reset ends at once; at the end of the stream,
        // what is on its way is still delivered.
        reset = &mut reader => reset || writer.await,
        ended = &mut writer => ended,
    }
}
