//! The CPU time a run costs per cycle, on each side of the wire: this process's (every thread
//! of the client, the library's own connection tasks included) and, given its process id, the
//! server's (with its child processes: a PostgreSQL server's backends), read when the timed
//! window opens and once every worker finished: this process's from its CPU clock, the
//! server's from `/proc` (in 10 ms ticks). On two shared cores a request costs
//! both sides CPU, not only a round trip: these figures say where a cycle's cost goes.

use crate::report::Report;

/// `/proc`'s clock ticks per second (`USER_HZ`, fixed at 100 in Linux's ABI).
const TICKS_PER_S: u64 = 100;

/// The CPU time, in µs, of this process and of the server's processes at one moment.
#[derive(Debug, Clone, Copy)]
pub(crate) struct CpuTimes {
    client_us: Option<u64>,
    server_us: Option<u64>,
}

impl CpuTimes {
    /// Reads them now (`server`: the server's process id, if known).
    pub(crate) fn now(server: Option<u32>) -> CpuTimes {
        CpuTimes {
            client_us: own_us(),
            server_us: server.and_then(tree_us),
        }
    }

    /// Adds what was spent since `before`, per cycle, to `report`: `client_cpu_us_per_cycle`
    /// and `server_cpu_us_per_cycle` (each only when read both times).
    pub(crate) fn push_since(&self, before: CpuTimes, cycles: u64, report: &mut Report) {
        let per = |after: Option<u64>, before: Option<u64>| {
            Some(format!(
                "{:.0}",
                after?.checked_sub(before?)? as f64 / cycles.max(1) as f64
            ))
        };
        if let Some(client) = per(self.client_us, before.client_us) {
            report.push("client_cpu_us_per_cycle", client);
        }
        if let Some(server) = per(self.server_us, before.server_us) {
            report.push("server_cpu_us_per_cycle", server);
        }
    }
}

/// User + system time of this process (every thread), in µs, to the nanosecond the kernel
/// accounts (`/proc` would give 10 ms ticks: a short window's figure would be off by a tick's
/// share of it).
fn own_us() -> Option<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid timespec that clock_gettime writes into; it reads nothing else.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000)
}

/// User + system time of the process `pid` (every thread), in µs, from `/proc/<pid>/stat`.
fn process_us(pid: &str) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    ticks_of(&stat).map(|ticks| ticks * 1_000_000 / TICKS_PER_S)
}

/// `utime + stime` of a `/proc/<pid>/stat` line: fields 14 and 15, counted after the command
/// name's closing parenthesis (the name may hold spaces and parentheses).
fn ticks_of(stat: &str) -> Option<u64> {
    let (_, rest) = stat.rsplit_once(')')?;
    let mut fields = rest.split_whitespace().skip(11);
    let user: u64 = fields.next()?.parse().ok()?;
    let system: u64 = fields.next()?.parse().ok()?;
    Some(user + system)
}

/// The CPU time of the process `pid` and of its child processes (one level, as a
/// PostgreSQL server's backends), in µs. Children that ended meanwhile are not counted.
fn tree_us(pid: u32) -> Option<u64> {
    let own = process_us(&pid.to_string())?;
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let children: u64 = tasks
        .flatten()
        .filter_map(|task| std::fs::read_to_string(task.path().join("children")).ok())
        .flat_map(|list| {
            list.split_whitespace()
                .filter_map(process_us)
                .collect::<Vec<_>>()
        })
        .sum();
    Some(own + children)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fields are counted after the name, which may hold spaces and parentheses.
    #[test]
    fn ticks_are_read_after_the_command_name() {
        let stat = "4242 (a (b) c) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 75 3 4 20 0 9 0";
        assert_eq!(ticks_of(stat), Some(325));
        assert_eq!(ticks_of("4242 (x) S 1"), None);
    }

    /// This process's time is read (from `/proc` and from its clock, which agree to a tick)
    /// and moves forward with work; a process that is not there
    /// reads as nothing.
    #[test]
    fn this_process_is_read_and_a_missing_one_is_none() {
        let before = process_us("self").expect("this process's /proc/self/stat");
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < std::time::Duration::from_millis(60) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = process_us("self").expect("read again");
        assert!(after >= before + 10_000, "{before} -> {after}");
        let own = own_us().expect("this process's clock");
        assert!(own + 10_000 >= after, "{own} µs against /proc's {after} µs");
        assert_eq!(tree_us(u32::MAX), None);
    }
}
