//! A TCP balancer on loopback, the tests' stand-in for a Service in front of webhook replicas.

use std::{
    net::{Ipv4Addr, TcpListener},
    sync::{Arc, Mutex},
};

/// A TCP balancer on a free port of 127.0.0.1 in front of backends on 127.0.0.1, as a Service
/// in front of Pods: each connection goes to the next backend in turn, skipping one that
/// refuses it (a Pod whose endpoint is gone). Its backends can change while it runs, as a
/// Service's endpoints do. It runs on a thread of its own until the test process ends.
#[derive(Debug, Clone)]
pub struct Balancer {
    port: u16,
    backends: Arc<Mutex<Vec<u16>>>,
}

impl Balancer {
    /// Starts a balancer in front of `backends` (ports on 127.0.0.1).
    ///
    /// # Panics
    /// If no port of 127.0.0.1 is free, or the thread cannot start a runtime.
    #[must_use]
    pub fn start(backends: &[u16]) -> Self {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("a free port");
        let port = listener.local_addr().expect("a bound port").port();
        let balancer = Balancer {
            port,
            backends: Arc::new(Mutex::new(backends.to_vec())),
        };
        let shared = balancer.backends.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(serve(listener, shared));
        });
        balancer
    }

    /// The port it listens on, on 127.0.0.1.
    #[must_use]
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Replaces its backends (an endpoint gone, a new Pod ready).
    pub fn set_backends(&self, backends: &[u16]) {
        *self.backends.lock().unwrap_or_else(|e| e.into_inner()) = backends.to_vec();
    }
}

async fn serve(listener: TcpListener, backends: Arc<Mutex<Vec<u16>>>) {
    if listener.set_nonblocking(true).is_err() {
        return;
    }
    let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
        return;
    };
    let mut next = 0usize;
    loop {
        let Ok((mut inbound, _)) = listener.accept().await else {
            continue;
        };
        next += 1;
        let order: Vec<u16> = {
            let backends = backends.lock().unwrap_or_else(|e| e.into_inner());
            (0..backends.len())
                .map(|i| backends[(next + i) % backends.len()])
                .collect()
        };
        tokio::spawn(async move {
            for port in order {
                if let Ok(mut out) = tokio::net::TcpStream::connect((Ipv4Addr::LOCALHOST, port)).await {
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut out).await;
                    return;
                }
            }
        });
    }
}
