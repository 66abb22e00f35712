//! How much of the machine's CPU time other work took while a benchmark ran: the check that
//! makes a bench row honest (issue 11). A shared machine, or a virtual one whose host gives
//! our cores to other guests (`steal`), can halve a measured speed without a trace in it.
//!
//! Linux only: the machine's busy time from `/proc/stat` (steal counts as busy: those are
//! ticks our cores wanted and did not get) less what the bench itself used, from
//! `/proc/<pid>/stat` of this process (every thread, and its children once reaped) and of
//! processes it names (a server under test). Elsewhere nothing is measured (`None`).

use std::path::Path;

/// Rows whose foreign share is at least this were measured under load: tables mark them,
/// and published numbers must not come from them.
pub const LOADED: f64 = 0.05;

/// A measurement under way.
#[derive(Debug, Clone)]
pub struct Window {
    machine: Ticks,
    own: u64,
    live: Vec<u32>,
}

/// `/proc/stat`'s aggregate line: ticks spent busy (steal included) and in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ticks {
    pub busy: u64,
    pub total: u64,
}

impl Window {
    /// Starts measuring. `live` are processes besides this one (and its reaped children)
    /// whose CPU time is the bench's own; they must still run when [`Window::foreign_share`]
    /// is called (an exited one's time would count as foreign).
    pub fn start(live: &[u32]) -> Option<Window> {
        Some(Window { machine: machine()?, own: own(live)?, live: live.to_vec() })
    }

    /// The share (0 to 1) of all the machine's CPU time since [`Window::start`] that was
    /// busy with something other than the bench. `None` where it cannot be read, or when no
    /// tick has passed.
    pub fn foreign_share(&self) -> Option<f64> {
        let now = machine()?;
        let own = own(&self.live)?.saturating_sub(self.own);
        share(self.machine, now, own)
    }
}

/// The foreign share between two `/proc/stat` readings, given the bench's own ticks.
pub fn share(before: Ticks, after: Ticks, own: u64) -> Option<f64> {
    let total = after.total.checked_sub(before.total).filter(|&t| t > 0)?;
    let busy = after.busy.saturating_sub(before.busy);
    Some(busy.saturating_sub(own) as f64 / total as f64)
}

/// The machine's ticks now.
fn machine() -> Option<Ticks> {
    parse_proc_stat(&std::fs::read_to_string("/proc/stat").ok()?)
}

/// This process's and `live`'s ticks now (user and system, their reaped children's too).
fn own(live: &[u32]) -> Option<u64> {
    let mine = process_ticks(Path::new("/proc/self/stat"))?;
    live.iter()
        .try_fold(mine, |sum, pid| Some(sum + process_ticks(&Path::new("/proc").join(pid.to_string()).join("stat"))?))
}

fn process_ticks(path: &Path) -> Option<u64> {
    parse_pid_stat(&std::fs::read_to_string(path).ok()?)
}

/// The `cpu` line of `/proc/stat`: user nice system idle iowait irq softirq steal (guest
/// time is already in user). Busy is all but idle and iowait.
pub fn parse_proc_stat(text: &str) -> Option<Ticks> {
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line.split_whitespace().skip(1).take(8).map(|f| f.parse().ok()).collect::<Option<_>>()?;
    if v.len() < 4 {
        return None;
    }
    let total: u64 = v.iter().sum();
    let idle = v[3] + v.get(4).copied().unwrap_or(0);
    Some(Ticks { busy: total - idle, total })
}

/// utime + stime + cutime + cstime of a `/proc/<pid>/stat` line (fields 14 to 17; the
/// command name, field 2, may hold spaces and parentheses, so fields count from its last
/// `)`).
pub fn parse_pid_stat(text: &str) -> Option<u64> {
    let rest = &text[text.rfind(')')? + 1..];
    // After the name: field 3 (state) is the first.
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields.get(11..15)?.iter().map(|f| f.parse::<u64>().ok()).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_machine_line() {
        let text = "cpu  6196670 9502 226011 1187951 58301 0 11730 305357 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n";
        let t = parse_proc_stat(text).unwrap();
        assert_eq!(t.total, 6196670 + 9502 + 226011 + 1187951 + 58301 + 11730 + 305357);
        assert_eq!(t.busy, t.total - 1187951 - 58301);
        assert_eq!(parse_proc_stat("cpu0 1 2 3 4\n"), None);
        assert_eq!(parse_proc_stat("cpu  1 2 x 4\n"), None);
    }

    #[test]
    fn reads_a_process_line_whatever_its_name() {
        // pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime cutime cstime
        let text = "4242 (a b) (c)) R 1 2 3 4 5 6 7 8 9 10 100 20 3 4 20 0 1";
        assert_eq!(parse_pid_stat(text), Some(127));
        assert_eq!(parse_pid_stat("4242 (x) R 1 2"), None);
    }

    #[test]
    fn share_is_what_the_bench_did_not_use() {
        let before = Ticks { busy: 100, total: 1000 };
        let after = Ticks { busy: 300, total: 1400 };
        // 200 busy ticks of 400, 150 of them ours: 50 foreign.
        assert_eq!(share(before, after, 150), Some(0.125));
        // Our count can run ahead of the machine's (sampled at other instants): never below 0.
        assert_eq!(share(before, after, 500), Some(0.0));
        assert_eq!(share(before, before, 0), None);
    }

    #[test]
    fn measures_this_process() {
        let w = Window::start(&[]).unwrap();
        // Some work of our own; whatever else runs, the share stays within 0..=1.
        let mut x = 0u64;
        let started = std::time::Instant::now();
        while started.elapsed().as_millis() < 50 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        let s = w.foreign_share().unwrap();
        assert!((0.0..=1.0).contains(&s), "{s}");
        assert!(Window::start(&[u32::MAX]).is_none(), "a process that does not exist is an error, not 0");
    }
}
