//! `kube-leader-node`: a local control plane with a real kubelet node, for `scripts/demo.sh` and
//! for trying `deploy/` by hand.
//!
//! Starts it ([`kube_leader_testenv::Node`]), then prints `KEY=VALUE` lines on stdout and a line
//! `ready`:
//!
//! ```text
//! KUBECONFIG=/tmp/kube-leader-testenv-.../kubeconfig/admin
//! APISERVER_PORT=41235
//! CONTAINERD_ADDRESS=/var/lib/kube-leader-testenv/node-.../containerd/containerd.sock
//! NODE=kl-node
//! NODE_IP=192.0.2.2
//! STARTED_MS=41234
//! ready
//! ```
//!
//! and runs until its standard input closes or it gets SIGTERM or SIGINT; then it tears the node
//! down and exits 0. If this machine cannot run a node it prints `unavailable: <reason>` and
//! exits 3; on any other failure it exits 1.

use std::io::Write as _;

use kube_leader_testenv::{Error, Node};

fn main() {
    let node = match Node::start() {
        Ok(node) => node,
        Err(Error::NodeUnavailable { reason }) => {
            println!("unavailable: {reason}");
            std::process::exit(3);
        }
        Err(e) => {
            let mut message = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(cause) = source {
                message.push_str(&format!("\n  caused by: {cause}"));
                source = cause.source();
            }
            eprintln!("kube-leader-node: {message}");
            std::process::exit(1);
        }
    };
    let control_plane = node.control_plane();
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "KUBECONFIG={}", control_plane.kubeconfig_path().display());
    let _ = writeln!(out, "APISERVER_PORT={}", control_plane.apiserver_port());
    let _ = writeln!(out, "CONTAINERD_ADDRESS={}", node.containerd_address().display());
    let _ = writeln!(out, "NODE={}", node.name());
    let _ = writeln!(out, "NODE_IP={}", node.ip());
    let _ = writeln!(out, "STARTED_MS={}", node.started_in().as_millis());
    let _ = writeln!(out, "ready");
    let _ = out.flush();
    drop(out);

    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let (closed_tx, closed) = tokio::sync::oneshot::channel::<()>();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut std::io::stdin().lock(), &mut std::io::sink());
        let _ = closed_tx.send(());
    });
    runtime.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
            _ = closed => {}
        }
    });
    drop(node);
}
