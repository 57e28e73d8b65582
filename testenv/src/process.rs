//! Child processes that cannot outlive the test binary.
//!
//! Every child is started as `setpriv --pdeathsig KILL -- <binary> <args>`: the kernel sends it
//! SIGKILL when its parent dies. For `PR_SET_PDEATHSIG` the parent is the *thread* that forked,
//! so all children are forked by one dedicated thread that lives as long as the process (test
//! threads come and go). Each child also leads its own process group, so a terminal's Ctrl-C
//! reaches only the test binary, which then takes the children with it.

use std::{
    ffi::OsString,
    fs::File,
    io,
    os::unix::process::CommandExt,
    path::{Path, PathBuf},
    process::{Child, ChildStdin, Command, ExitStatus, Stdio},
    sync::{mpsc, OnceLock},
};

use crate::{Error, Result};

/// How many log lines errors quote.
const TAIL_LINES: usize = 30;

struct SpawnRequest {
    command: Command,
    reply: mpsc::Sender<io::Result<Child>>,
}

/// Spawns `command` on the spawner thread.
fn spawn_on_spawner_thread(command: Command) -> io::Result<Child> {
    static SPAWNER: OnceLock<mpsc::Sender<SpawnRequest>> = OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        std::thread::Builder::new()
            .name("kube-leader-testenv-spawner".into())
            .spawn(move || {
                // The sender lives in a static, so this loop ends only with the process.
                for mut request in rx {
                    let _ = request.reply.send(request.command.spawn());
                }
            })
            .expect("could not start the kube-leader-testenv spawner thread");
        tx
    });
    let (reply, result) = mpsc::channel();
    spawner
        .send(SpawnRequest { command, reply })
        .map_err(|_| io::Error::other("the spawner thread is gone"))?;
    result
        .recv()
        .map_err(|_| io::Error::other("the spawner thread is gone"))?
}

/// A running control-plane component, with stdout and stderr in a log file.
///
/// Dropping it kills the process.
#[derive(Debug)]
pub(crate) struct Process {
    component: &'static str,
    child: Child,
    log: PathBuf,
}

// === impl Process ===

impl Process {
    /// Starts `binary` with `args` in `dir`, logging to `<dir>/<component>.log` (appending, so a
    /// restarted component keeps its earlier log).
    pub(crate) fn spawn(
        component: &'static str,
        binary: &Path,
        args: &[OsString],
        dir: &Path,
    ) -> Result<Self> {
        Self::spawn_with_env(component, binary, args, dir, &[])
    }

    /// [`Process::spawn`] with extra environment variables.
    pub(crate) fn spawn_with_env(
        component: &'static str,
        binary: &Path,
        args: &[OsString],
        dir: &Path,
        env: &[(&str, &std::ffi::OsStr)],
    ) -> Result<Self> {
        let log = dir.join(format!("{component}.log"));
        let stdout = File::options()
            .create(true)
            .append(true)
            .open(&log)
            .map_err(|e| Error::io("open", &log, e))?;
        let stderr = stdout.try_clone().map_err(|e| Error::io("open", &log, e))?;

        let mut command = Command::new("setpriv");
        command
            .arg("--pdeathsig")
            .arg("KILL")
            .arg("--")
            .arg(binary)
            .args(args)
            .envs(env.iter().copied())
            .current_dir(dir)
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .process_group(0);
        let child = spawn_on_spawner_thread(command).map_err(|source| Error::Spawn {
            component,
            binary: binary.to_owned(),
            source,
        })?;
        tracing::debug!(component, pid = child.id(), log = %log.display(), "started");
        Ok(Self {
            component,
            child,
            log,
        })
    }

    /// The error to report if the process has exited, or `None` while it runs.
    pub(crate) fn exited(&mut self) -> Option<Error> {
        match self.child.try_wait() {
            Ok(None) => None,
            Ok(Some(status)) => Some(self.exited_error(status)),
            Err(e) => Some(Error::io("wait for", &self.log, e)),
        }
    }

    fn exited_error(&self, status: ExitStatus) -> Error {
        Error::Exited {
            component: self.component,
            status,
            log: self.log.clone(),
            tail: self.tail(),
        }
    }

    /// The error to report when the process did not become ready in time.
    pub(crate) fn not_ready(&self, waited: std::time::Duration, last_problem: String) -> Error {
        Error::NotReady {
            component: self.component,
            waited,
            last_problem,
            log: self.log.clone(),
            tail: self.tail(),
        }
    }

    /// The last lines of the log file.
    pub(crate) fn tail(&self) -> String {
        tail(&self.log, TAIL_LINES)
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub(crate) fn kill(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
            tracing::debug!(component = self.component, pid = self.child.id(), "killed");
        }
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Removes a directory when the test binary exits, however it exits.
///
/// A `sh` child blocks reading a pipe whose only writer is this process. When the process exits
/// (even by SIGKILL) the kernel closes the pipe, and `sh` removes the directory and exits. Used
/// for etcd's data (over 100 MB of preallocated write-ahead log) of the shared control plane,
/// which is never dropped; its logs stay for post-mortems until the next run removes them.
#[derive(Debug)]
pub(crate) struct Janitor {
    child: Child,
    pipe: Option<ChildStdin>,
}

// === impl Janitor ===

impl Janitor {
    pub(crate) fn spawn(dir: &Path) -> Result<Self> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(r#"cat >/dev/null; exec rm -rf -- "$1""#)
            .arg("kube-leader-testenv-janitor")
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            // Out of the terminal's process group, so that Ctrl-C does not end it before the
            // test binary.
            .process_group(0)
            .spawn()
            .map_err(|source| Error::Spawn {
                component: "janitor",
                binary: "sh".into(),
                source,
            })?;
        let pipe = child.stdin.take();
        Ok(Self { child, pipe })
    }
}

impl Drop for Janitor {
    fn drop(&mut self) {
        // Closing the pipe makes it remove the directory now.
        drop(self.pipe.take());
        let _ = self.child.wait();
    }
}

/// The last `lines` lines of a file, or a note saying why it could not be read.
fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read(path) {
        Ok(bytes) => {
            let text = String::from_utf8_lossy(&bytes);
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(could not read the log: {e})"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_janitor_removes_its_directory_when_dropped() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        std::fs::create_dir(&data).unwrap();
        std::fs::write(data.join("wal"), "x").unwrap();
        let janitor = Janitor::spawn(&data).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert!(data.exists());

        drop(janitor);

        assert!(!data.exists());
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.log");
        let text: String = (1..=40).map(|i| format!("line {i}\n")).collect();
        std::fs::write(&path, text).unwrap();

        let tail = tail(&path, 30);

        assert!(tail.starts_with("line 11\n"), "{tail}");
        assert!(tail.ends_with("line 40"), "{tail}");
    }

    #[test]
    fn children_get_killed_and_logged() {
        let dir = tempfile::tempdir().unwrap();
        let mut process = Process::spawn(
            "sh",
            Path::new("/bin/sh"),
            &["-c".into(), "echo hello; exec sleep 60".into()],
            dir.path(),
        )
        .unwrap();
        assert!(process.exited().is_none());
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while process.tail().is_empty() && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(10));
        }

        process.kill();

        assert!(matches!(process.exited(), Some(Error::Exited { .. })));
        assert_eq!(process.tail(), "hello");
    }
}
