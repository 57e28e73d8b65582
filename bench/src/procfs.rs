//! Memory and CPU of a process, from `/proc/<pid>/status` and `/proc/<pid>/stat`.

use std::time::Duration;

/// Memory figures of one process, in KiB, as the kernel reports them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Memory {
    /// `VmHWM`: peak resident set size.
    pub(crate) hwm_kib: u64,
    /// `VmRSS`: resident set size now.
    pub(crate) rss_kib: u64,
    /// `RssAnon`: resident anonymous memory (heap, stacks).
    pub(crate) anon_kib: u64,
    /// `RssFile`: resident file mappings (the binary's pages, shared libraries).
    pub(crate) file_kib: u64,
}

// === impl Memory ===

impl Memory {
    /// Reads `/proc/<pid>/status`; `None` if the process is gone.
    pub(crate) fn of(pid: u32) -> Option<Self> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        Some(parse_status(&text))
    }
}

fn parse_status(text: &str) -> Memory {
    let field = |name: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Memory {
        hwm_kib: field("VmHWM"),
        rss_kib: field("VmRSS"),
        anon_kib: field("RssAnon"),
        file_kib: field("RssFile"),
    }
}

/// KiB as MiB with one decimal.
pub(crate) fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

/// CPU time (user + system) the process has used so far; `None` if it is gone.
pub(crate) fn cpu_time(pid: u32) -> Option<Duration> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces; the fields after its ')' are fixed.
    let rest = &text[text.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // After ')': state is field 3, so utime (14) and stime (15) are at 11 and 12.
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .and_then(|hz| u64::try_from(hz).ok())
        .filter(|&hz| hz > 0)
        .unwrap_or(100);
    Some(Duration::from_secs_f64(ticks as f64 / hz as f64))
}

/// The pids of the direct children of `pid` (all its threads').
pub(crate) fn children(pid: u32) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect()
}

/// The command line of `pid`, arguments joined by spaces.
pub(crate) fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " ").trim().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_status() {
        let text = "Name:\tx\nVmHWM:\t    9000 kB\nVmRSS:\t    8000 kB\nRssAnon:\t    3000 kB\nRssFile:\t    5000 kB\n";
        let m = parse_status(text);
        assert_eq!(
            (m.hwm_kib, m.rss_kib, m.anon_kib, m.file_kib),
            (9000, 8000, 3000, 5000)
        );
        assert_eq!(mib(9216), "9.0 MiB");
    }

    #[test]
    fn reads_this_process() {
        let me = std::process::id();
        assert!(Memory::of(me).unwrap().hwm_kib > 0);
        assert!(cpu_time(me).is_some());
    }
}
