//! The CPU time a local process has used (`--target-pid`): the steadiest cost figure on a
//! shared machine, where req/s moves with whatever else runs but the server's own CPU time per
//! request does not. Read from `/proc/<pid>/stat` (user + system time of every thread, living
//! or exited) at the start and the end of the measured window.

use std::path::PathBuf;
use std::time::Duration;

use super::BenchError;

/// `/proc`'s clock tick: Linux reports process times in USER_HZ, which is 100 on every
/// architecture tollgate builds for (the kernel's internal HZ may differ; /proc converts).
const USER_HZ: u64 = 100;

/// A process's CPU time so far, split as the kernel reports it: user time is the process's own
/// code (protocol, client, decision), system time the kernel working for it (sockets, wake-ups).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct CpuTime {
    pub(super) user: Duration,
    pub(super) system: Duration,
}

impl CpuTime {
    /// What was used between `start` and `self`.
    pub(super) fn since(self, start: CpuTime) -> CpuTime {
        CpuTime {
            user: self.user.saturating_sub(start.user),
            system: self.system.saturating_sub(start.system),
        }
    }

    pub(super) fn total(self) -> Duration {
        self.user + self.system
    }
}

/// Reads one process's CPU time.
#[derive(Debug)]
pub(super) struct CpuClock {
    pid: u32,
    stat: PathBuf,
}

impl CpuClock {
    /// A clock for `pid`, read once now so a wrong PID fails before the run, not after it.
    pub(super) fn open(pid: u32) -> Result<Self, BenchError> {
        let clock = CpuClock {
            pid,
            stat: PathBuf::from(format!("/proc/{pid}/stat")),
        };
        clock.read()?;
        Ok(clock)
    }

    /// User and system time so far (10 ms resolution: measure for seconds, not milliseconds).
    pub(super) fn read(&self) -> Result<CpuTime, BenchError> {
        let text = std::fs::read_to_string(&self.stat).map_err(|source| BenchError::TargetPid {
            pid: self.pid,
            source,
        })?;
        parse_stat(&text).ok_or(BenchError::TargetPidStat { pid: self.pid })
    }
}

/// utime and stime from a `/proc/<pid>/stat` line. The command name (field 2) is in parentheses
/// and may itself contain spaces or parentheses, so the fields are counted after the last `)`:
/// there, field 3 (state) comes first and utime, stime are fields 14 and 15.
fn parse_stat(text: &str) -> Option<CpuTime> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(14 - 3);
    let mut ticks = || -> Option<Duration> {
        let n: u64 = fields.next()?.parse().ok()?;
        Some(Duration::from_millis(n.checked_mul(1000 / USER_HZ)?))
    };
    let user = ticks()?;
    let system = ticks()?;
    Some(CpuTime { user, system })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_are_counted_after_the_command_name() {
        // A command name with spaces and a parenthesis cannot shift the fields.
        let line = "4242 (tollgate (x) 1) S 1 4242 4242 0 -1 4194560 1234 0 0 0 250 130 0 0 20 0 5 0 100 0 0";
        let time = parse_stat(line).unwrap();
        assert_eq!(time.user, Duration::from_millis(2_500));
        assert_eq!(time.system, Duration::from_millis(1_300));
        assert_eq!(time.total(), Duration::from_millis(3_800));
        assert_eq!(parse_stat("4242 (short) S 1 2"), None);
        assert_eq!(parse_stat("no parenthesis at all"), None);
    }

    #[test]
    fn this_process_uses_cpu_and_a_missing_one_is_a_clear_error() {
        let clock = CpuClock::open(std::process::id()).unwrap();
        let before = clock.read().unwrap();
        // Burn more than one tick of CPU.
        let mut x = 0u64;
        let until = std::time::Instant::now() + Duration::from_millis(60);
        while std::time::Instant::now() < until {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
        assert!(clock.read().unwrap().since(before).total() > Duration::ZERO);
        let e = CpuClock::open(u32::MAX).unwrap_err();
        assert!(
            e.to_string()
                .contains(&format!("--target-pid {}", u32::MAX)),
            "{e}"
        );
    }
}
