//! A fault-injecting TCP proxy between a client and the API server.
//!
//! [`FaultProxy`] listens on a free port of 127.0.0.1 and forwards every connection to a target
//! (usually the API server). Bytes pass through untouched, so TLS works end to end. Its [`Fault`]
//! can be switched at any time, from any thread, and applies at once to new *and* existing
//! connections:
//!
//! - [`Fault::Pass`]: forward as soon as read.
//! - [`Fault::Delay`] / [`Fault::Jittered`]: forward each chunk that long after it was read
//!   (in both directions, so a request/response round trip takes twice the delay).
//! - [`Fault::Blackhole`]: accept and read, but forward nothing, neither requests nor answers; a
//!   partition. What was read is held (up to a bound, then the sender is back-pressured) and
//!   delivered when the fault is lifted, as TCP would after a partition that heals before its
//!   retransmissions give up. New connections are accepted but not connected onward until then.
//! - [`Fault::Reset`]: reset every connection (RST to both ends) and reset new ones as soon as
//!   they are accepted; a crashed or restarting server.
//!
//! [`FaultProxy::reset_connections`] resets the current connections once, without changing
//! the fault.
//!
//! The proxy runs on a thread with a tokio runtime of its own, so it outlives the runtime of
//! any one `#[tokio::test]` and can be driven from blocking code. Dropping it stops it and
//! closes every connection.
//!
//! ```no_run
//! use kube_leader_testenv::{ControlPlane, Fault, FaultProxy};
//!
//! # async fn example() -> kube_leader_testenv::Result<()> {
//! let control_plane = ControlPlane::shared();
//! let proxy = FaultProxy::to_apiserver(control_plane)?;
//! let client = proxy.client(control_plane, "admin").await; // every request goes through the proxy
//! proxy.set(Fault::Blackhole); // partition that client from the API server
//! proxy.set(Fault::Pass); // heal
//! # Ok(()) }
//! ```

use std::{
    io,
    net::{Ipv4Addr, SocketAddr},
    path::PathBuf,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::Duration,
};

use kube::{Client, Config};
use socket2::SockRef;
use tokio::{
    net::{TcpListener, TcpStream},
    sync::{mpsc, oneshot, watch},
    time::Instant,
};

use crate::{error::report, ControlPlane, Error, Result};

/// Size of one read.
const CHUNK: usize = 16 * 1024;
/// Chunks held per direction of a connection (delayed or blackholed) before reading stops.
const QUEUE: usize = 256;

/// What the proxy does to the traffic it forwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Forward every chunk as soon as it is read.
    Pass,
    /// Forward every chunk this long after it was read, in both directions.
    Delay(Duration),
    /// Forward every chunk after a delay drawn uniformly from `min..=max` when it was read;
    /// chunks keep their order, so a chunk also waits for the one before it.
    Jittered {
        /// The shortest delay.
        min: Duration,
        /// The longest delay.
        max: Duration,
    },
    /// Accept and read, never forward nor answer, until the fault changes.
    Blackhole,
    /// Reset every connection, and every new one as soon as it is accepted.
    Reset,
}

/// The fault, and how many one-shot resets were asked for.
#[derive(Debug, Clone, Copy)]
struct Mode {
    fault: Fault,
    resets: u64,
}

#[derive(Debug, Default)]
struct Stats {
    accepted: AtomicU64,
    reset: AtomicU64,
    active: AtomicU64,
}

/// A fault-injecting TCP proxy on 127.0.0.1; see the [module documentation](self).
///
/// Dropping it stops it: its listener closes and every connection through it is closed.
pub struct FaultProxy {
    addr: SocketAddr,
    target: SocketAddr,
    mode: Arc<watch::Sender<Mode>>,
    stats: Arc<Stats>,
    stop: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

// === impl FaultProxy ===

impl FaultProxy {
    /// Starts a proxy to `target` on a free port of 127.0.0.1, in [`Fault::Pass`].
    pub fn start(target: SocketAddr) -> Result<Self> {
        let listener = std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .map_err(|e| Error::io("bind a free port on", "127.0.0.1", e))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::io("bind a free port on", "127.0.0.1", e))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| Error::io("configure the proxy listener on", addr.to_string(), e))?;
        let mode = Arc::new(
            watch::channel(Mode {
                fault: Fault::Pass,
                resets: 0,
            })
            .0,
        );
        let stats = Arc::new(Stats::default());
        let (stop, stopped) = oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| Error::io("start a tokio runtime for", "the fault proxy", e))?;
        let thread = {
            let (mode, stats) = (mode.clone(), stats.clone());
            std::thread::Builder::new()
                .name(format!("kube-leader-testenv-proxy-{}", addr.port()))
                .spawn(move || {
                    runtime.block_on(async move {
                        match TcpListener::from_std(listener) {
                            Ok(listener) => accept_loop(listener, target, mode, stats, stopped).await,
                            Err(e) => tracing::warn!(error = %e, "the fault proxy could not listen"),
                        }
                    });
                    // Dropping the runtime drops every connection task and closes its sockets.
                })
                .map_err(|e| Error::io("start a thread for", "the fault proxy", e))?
        };
        tracing::debug!(%addr, %target, "fault proxy started");
        Ok(Self {
            addr,
            target,
            mode,
            stats,
            stop: Some(stop),
            thread: Some(thread),
        })
    }

    /// Starts a proxy to the API server of `control_plane`; see [`FaultProxy::start`].
    pub fn to_apiserver(control_plane: &ControlPlane) -> Result<Self> {
        Self::start(SocketAddr::from((
            Ipv4Addr::LOCALHOST,
            control_plane.apiserver_port(),
        )))
    }

    /// Where the proxy listens (127.0.0.1 and a free port).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Where the proxy forwards to.
    pub fn target(&self) -> SocketAddr {
        self.target
    }

    /// The proxy's URL as an API server URL: `https://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Switches the fault, at once, for new and existing connections.
    pub fn set(&self, fault: Fault) {
        tracing::debug!(proxy = %self.addr, ?fault, "fault proxy switched");
        self.mode.send_modify(|m| m.fault = fault);
    }

    /// The fault in force.
    pub fn fault(&self) -> Fault {
        self.mode.borrow().fault
    }

    /// Resets every current connection once (RST to both ends); new connections are served as
    /// the fault in force says.
    pub fn reset_connections(&self) {
        self.mode.send_modify(|m| m.resets += 1);
    }

    /// How many connections were accepted so far.
    pub fn accepted(&self) -> u64 {
        self.stats.accepted.load(Ordering::Relaxed)
    }

    /// How many connections were reset so far ([`Fault::Reset`],
    /// [`FaultProxy::reset_connections`], or an error on either end).
    pub fn reset_count(&self) -> u64 {
        self.stats.reset.load(Ordering::Relaxed)
    }

    /// How many connections are open now.
    pub fn active(&self) -> u64 {
        self.stats.active.load(Ordering::Relaxed)
    }

    /// The client configuration of `user` (as [`ControlPlane::config`]) with the proxy as the
    /// API server. Set its timeouts as the test needs: kube's read timeout is 295 s by default,
    /// so under [`Fault::Blackhole`] only the caller's own timeouts end a call.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe: it only reads a file.
    pub async fn config(&self, control_plane: &ControlPlane, user: &str) -> Result<Config> {
        let mut config = control_plane.config(user).await?;
        config.cluster_url = self
            .url()
            .parse()
            .map_err(|e| Error::io("build the proxy URL", self.url(), io::Error::other(e)))?;
        Ok(config)
    }

    /// A new client for `user` whose every request goes through the proxy, bound to the calling
    /// tokio runtime; see [`ControlPlane::user_client`].
    ///
    /// # Panics
    ///
    /// If `user` is unknown.
    ///
    /// # Cancellation safety
    ///
    /// Cancellation safe.
    pub async fn client(&self, control_plane: &ControlPlane, user: &str) -> Client {
        let config = self
            .config(control_plane, user)
            .await
            .unwrap_or_else(|e| panic!("no client for {user} through {}: {}", self.addr, report(&e)));
        Client::try_from(config)
            .unwrap_or_else(|e| panic!("no client for {user} through {}: {}", self.addr, report(&e)))
    }

    /// Writes a copy of `user`'s kubeconfig whose server is the proxy, for candidates that run
    /// as processes of their own; returns its path (in the control plane's directory).
    pub fn write_kubeconfig(&self, control_plane: &ControlPlane, user: &str) -> Result<PathBuf> {
        let original = control_plane.user_kubeconfig_path(user)?;
        let text = std::fs::read_to_string(original).map_err(|e| Error::io("read", original, e))?;
        let server = format!("server: {}\n", control_plane.apiserver_url());
        if !text.contains(&server) {
            return Err(Error::io(
                "find the API server URL in",
                original,
                io::Error::other(format!("no line {:?}", server.trim())),
            ));
        }
        let text = text.replace(&server, &format!("server: {}\n", self.url()));
        let path = original.with_file_name(format!("{user}-via-proxy-{}", self.addr.port()));
        std::fs::write(&path, text).map_err(|e| Error::io("write", &path, e))?;
        Ok(path)
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(thread) = self.thread.take() {
            // The thread only has to drop its runtime: this is quick, even when called from a
            // runtime's thread.
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for FaultProxy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultProxy")
            .field("addr", &self.addr)
            .field("target", &self.target)
            .field("fault", &self.fault())
            .field("accepted", &self.accepted())
            .field("active", &self.active())
            .finish()
    }
}

// === the proxy's tasks ===

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    mode: Arc<watch::Sender<Mode>>,
    stats: Arc<Stats>,
    mut stopped: oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            biased;
            _ = &mut stopped => return,
            accepted = listener.accept() => match accepted {
                Ok((client, _)) => {
                    stats.accepted.fetch_add(1, Ordering::Relaxed);
                    if mode.borrow().fault == Fault::Reset {
                        stats.reset.fetch_add(1, Ordering::Relaxed);
                        abort(&client);
                        continue;
                    }
                    tokio::spawn(serve(client, target, mode.subscribe(), stats.clone()));
                }
                Err(e) => {
                    // Out of file descriptors, typically: try again shortly.
                    tracing::debug!(error = %e, "fault proxy: accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            },
        }
    }
}

/// Forwards one connection until both directions end, an error occurs, or a reset is asked for.
async fn serve(client: TcpStream, target: SocketAddr, mode: watch::Receiver<Mode>, stats: Arc<Stats>) {
    stats.active.fetch_add(1, Ordering::Relaxed);
    let _ = client.set_nodelay(true);
    let born = mode.borrow().resets;
    let mut upstream = None;
    let reset = {
        let forwarding = forward(&client, &mut upstream, target, mode.clone());
        tokio::select! {
            biased;
            () = reset_asked(mode, born) => true,
            result = forwarding => result.is_err(),
        }
    };
    if reset {
        stats.reset.fetch_add(1, Ordering::Relaxed);
        abort(&client);
        if let Some(upstream) = &upstream {
            abort(upstream);
        }
    }
    stats.active.fetch_sub(1, Ordering::Relaxed);
}

/// Reads from the client at once; connects to the target once the fault lets traffic through,
/// then forwards both ways. An error on either side ends the connection (with a reset).
async fn forward(
    client: &TcpStream,
    upstream: &mut Option<TcpStream>,
    target: SocketAddr,
    mode: watch::Receiver<Mode>,
) -> io::Result<()> {
    let (to_upstream, from_client) = mpsc::channel(QUEUE);
    let onward = async {
        let mut open = mode.clone();
        if open
            .wait_for(|m| !matches!(m.fault, Fault::Blackhole | Fault::Reset))
            .await
            .is_err()
        {
            return Ok(());
        }
        let stream = TcpStream::connect(target).await?;
        let _ = stream.set_nodelay(true);
        let upstream: &TcpStream = upstream.insert(stream);
        let (to_client, from_upstream) = mpsc::channel(QUEUE);
        tokio::try_join!(
            write_loop(upstream, from_client, mode.clone()),
            read_loop(upstream, to_client),
            write_loop(client, from_upstream, mode.clone()),
        )
        .map(|_| ())
    };
    tokio::try_join!(read_loop(client, to_upstream), onward).map(|_| ())
}

/// Resolves when this connection (accepted at reset count `born`) must be reset.
async fn reset_asked(mut mode: watch::Receiver<Mode>, born: u64) {
    if mode
        .wait_for(|m| m.fault == Fault::Reset || m.resets != born)
        .await
        .is_err()
    {
        // The proxy is stopping: its runtime drops this task.
        std::future::pending::<()>().await;
    }
}

/// One chunk read from one end; `data: None` is the end of the stream.
#[derive(Debug)]
struct Chunk {
    data: Option<Vec<u8>>,
    read_at: Instant,
    /// Where in a jittered delay's range this chunk falls, in `0.0..1.0`.
    jitter: f64,
}

async fn read_loop(from: &TcpStream, to: mpsc::Sender<Chunk>) -> io::Result<()> {
    let mut buf = vec![0; CHUNK];
    loop {
        from.readable().await?;
        let n = match from.try_read(&mut buf) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e),
        };
        let data = (n > 0).then(|| buf[..n].to_vec());
        let chunk = Chunk {
            data,
            read_at: Instant::now(),
            jitter: rand::random(),
        };
        if to.send(chunk).await.is_err() || n == 0 {
            return Ok(());
        }
    }
}

async fn write_loop(
    to: &TcpStream,
    mut from: mpsc::Receiver<Chunk>,
    mut mode: watch::Receiver<Mode>,
) -> io::Result<()> {
    while let Some(chunk) = from.recv().await {
        // Hold the chunk until the fault in force lets it through; re-decide on every change.
        loop {
            let fault = mode.borrow_and_update().fault;
            let due = match fault {
                Fault::Pass => break,
                Fault::Delay(d) => chunk.read_at + d,
                Fault::Jittered { min, max } => {
                    chunk.read_at + min + max.saturating_sub(min).mul_f64(chunk.jitter)
                }
                Fault::Blackhole | Fault::Reset => {
                    if mode.changed().await.is_err() {
                        return Ok(());
                    }
                    continue;
                }
            };
            if due <= Instant::now() {
                break;
            }
            tokio::select! {
                () = tokio::time::sleep_until(due) => break,
                changed = mode.changed() => if changed.is_err() { return Ok(()) },
            }
        }
        match chunk.data {
            Some(data) => write_all(to, &data).await?,
            None => {
                // Pass the end of the stream on; the other direction goes on (half close).
                let _ = SockRef::from(to).shutdown(std::net::Shutdown::Write);
                return Ok(());
            }
        }
    }
    Ok(())
}

async fn write_all(to: &TcpStream, mut data: &[u8]) -> io::Result<()> {
    while !data.is_empty() {
        to.writable().await?;
        match to.try_write(data) {
            Ok(n) => data = &data[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Makes the coming close of `stream` abortive: an RST instead of a FIN.
fn abort(stream: &TcpStream) {
    let _ = SockRef::from(stream).set_linger(Some(Duration::ZERO));
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// An echo server on the test's runtime; returns its address.
    async fn echo_server() -> SocketAddr {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = stream.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                    let _ = w.shutdown().await;
                });
            }
        });
        addr
    }

    async fn round_trip(stream: &mut TcpStream, msg: &[u8]) -> io::Result<Vec<u8>> {
        stream.write_all(msg).await?;
        let mut buf = vec![0; msg.len()];
        stream.read_exact(&mut buf).await?;
        Ok(buf)
    }

    async fn connect(proxy: &FaultProxy) -> TcpStream {
        TcpStream::connect(proxy.addr()).await.unwrap()
    }

    /// Whether the peer closed or reset `stream` within `within`.
    async fn closed_within(stream: &mut TcpStream, within: Duration) -> bool {
        let mut buf = [0; 16];
        match tokio::time::timeout(within, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => true,
            Ok(Ok(_)) | Err(_) => false,
        }
    }

    #[tokio::test]
    async fn passes_bytes_both_ways_and_half_closes() {
        let proxy = FaultProxy::start(echo_server().await).unwrap();
        assert_eq!(proxy.fault(), Fault::Pass);
        let mut stream = connect(&proxy).await;
        assert_eq!(round_trip(&mut stream, b"hello").await.unwrap(), b"hello");
        // A large transfer, then our end of the stream: the echo ends too.
        let big: Vec<u8> = (0..1_000_000u32).map(|i| i as u8).collect();
        let (mut r, mut w) = stream.into_split();
        let writer = tokio::spawn(async move {
            w.write_all(&big).await.unwrap();
            w.shutdown().await.unwrap();
            big
        });
        let mut echoed = Vec::new();
        r.read_to_end(&mut echoed).await.unwrap();
        assert_eq!(echoed, writer.await.unwrap());
        assert_eq!(proxy.accepted(), 1);
        tokio::time::timeout(Duration::from_secs(2), async {
            while proxy.active() > 0 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await
        .expect("the connection ends with both directions");
    }

    #[tokio::test]
    async fn blackhole_stalls_existing_and_new_connections_until_healed() {
        let proxy = FaultProxy::start(echo_server().await).unwrap();
        let mut old = connect(&proxy).await;
        assert_eq!(round_trip(&mut old, b"before").await.unwrap(), b"before");

        proxy.set(Fault::Blackhole);
        let mut new = connect(&proxy).await; // accepted all the same
        for stream in [&mut old, &mut new] {
            let stalled =
                tokio::time::timeout(Duration::from_millis(300), round_trip(stream, b"lost?")).await;
            assert!(stalled.is_err(), "a blackholed connection answered");
        }

        // Healed: what was held is delivered, in order, and both connections work again.
        proxy.set(Fault::Pass);
        for stream in [&mut old, &mut new] {
            let mut buf = [0; 5];
            tokio::time::timeout(Duration::from_secs(2), stream.read_exact(&mut buf))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(&buf, b"lost?");
            assert_eq!(round_trip(stream, b"after").await.unwrap(), b"after");
        }
    }

    #[tokio::test]
    async fn reset_closes_existing_connections_and_refuses_new_ones() {
        let proxy = FaultProxy::start(echo_server().await).unwrap();
        let mut old = connect(&proxy).await;
        assert_eq!(round_trip(&mut old, b"x").await.unwrap(), b"x");

        proxy.set(Fault::Reset);
        assert!(
            closed_within(&mut old, Duration::from_secs(2)).await,
            "an existing connection survived"
        );
        for _ in 0..3 {
            // The handshake may complete (the kernel accepts), but the proxy resets at once.
            if let Ok(mut new) = TcpStream::connect(proxy.addr()).await {
                assert!(
                    closed_within(&mut new, Duration::from_secs(2)).await,
                    "a new connection was served"
                );
            }
        }
        assert!(proxy.reset_count() >= 4, "{}", proxy.reset_count());

        proxy.set(Fault::Pass);
        let mut again = connect(&proxy).await;
        assert_eq!(round_trip(&mut again, b"y").await.unwrap(), b"y");

        // A one-shot reset ends current connections only.
        proxy.reset_connections();
        assert!(closed_within(&mut again, Duration::from_secs(2)).await);
        let mut later = connect(&proxy).await;
        assert_eq!(round_trip(&mut later, b"z").await.unwrap(), b"z");
    }

    #[tokio::test]
    async fn reset_reaches_the_target_too() {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).await.unwrap();
        let proxy = FaultProxy::start(listener.local_addr().unwrap()).unwrap();
        let mut client = connect(&proxy).await;
        client.write_all(b"hi").await.unwrap();
        let (mut server, _) = listener.accept().await.unwrap();
        let mut buf = [0; 2];
        server.read_exact(&mut buf).await.unwrap();
        proxy.set(Fault::Reset);
        let r = tokio::time::timeout(Duration::from_secs(2), server.read(&mut buf))
            .await
            .unwrap();
        assert!(
            matches!(&r, Err(e) if e.kind() == io::ErrorKind::ConnectionReset),
            "the server side should see a reset: {r:?}"
        );
    }

    #[tokio::test]
    async fn delay_applies_in_each_direction_and_to_existing_connections() {
        let proxy = FaultProxy::start(echo_server().await).unwrap();
        let mut stream = connect(&proxy).await;
        let t = Instant::now();
        round_trip(&mut stream, b"fast").await.unwrap();
        assert!(t.elapsed() < Duration::from_millis(300), "{:?}", t.elapsed());

        proxy.set(Fault::Delay(Duration::from_millis(200)));
        let t = Instant::now();
        round_trip(&mut stream, b"slow").await.unwrap();
        let rtt = t.elapsed();
        assert!(
            rtt >= Duration::from_millis(400) && rtt < Duration::from_millis(1000),
            "{rtt:?}"
        );

        proxy.set(Fault::Jittered {
            min: Duration::from_millis(50),
            max: Duration::from_millis(150),
        });
        for _ in 0..5 {
            let t = Instant::now();
            round_trip(&mut stream, b"jitter").await.unwrap();
            let rtt = t.elapsed();
            assert!(
                rtt >= Duration::from_millis(100) && rtt < Duration::from_millis(600),
                "{rtt:?}"
            );
        }

        // Switching back to Pass releases chunks that are still waiting.
        proxy.set(Fault::Delay(Duration::from_secs(30)));
        stream.write_all(b"held").await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let t = Instant::now();
        proxy.set(Fault::Pass);
        let mut buf = [0; 4];
        stream.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"held");
        assert!(t.elapsed() < Duration::from_millis(300), "{:?}", t.elapsed());
    }

    #[test]
    fn works_from_blocking_code_and_stops_when_dropped() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let target = runtime.block_on(echo_server());
        let proxy = FaultProxy::start(target).unwrap();
        let addr = proxy.addr();
        let mut stream = std::net::TcpStream::connect(addr).unwrap();
        let echo = std::thread::spawn(move || {
            use std::io::{Read, Write};
            stream.write_all(b"sync").unwrap();
            let mut buf = [0; 4];
            stream.read_exact(&mut buf).unwrap();
            buf
        });
        // The echo server lives on `runtime`: drive it while the blocking client waits.
        runtime.block_on(async {
            while !echo.is_finished() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        assert_eq!(&echo.join().unwrap(), b"sync");
        drop(proxy);
        assert!(
            std::net::TcpStream::connect(addr).is_err(),
            "the proxy still listens after drop"
        );
    }
}
