//! CPU time and resident memory of a process, from `/proc`.

use std::time::Duration;

use crate::error::{BenchError, Context};

/// The unit of `utime` and `stime` in `/proc/PID/stat`. Linux reports them in `USER_HZ`
/// ticks, which is 100 on every architecture it exposes to user space, whatever the
/// kernel's internal tick rate: 10 ms resolution, fine over a run of seconds.
const USER_HZ: u64 = 100;

const ADVICE: &str = "this bench needs Linux with /proc mounted";

/// User plus system CPU time consumed so far by process `pid` (`"self"` for this one), all
/// threads included.
pub fn cpu_time(pid: &str) -> Result<Duration, BenchError> {
    let path = format!("/proc/{pid}/stat");
    let stat = std::fs::read_to_string(&path).during(format!("reading {path}"), ADVICE)?;
    // The command name (field 2) is in parentheses and may hold spaces: count the fields
    // after its closing parenthesis. utime and stime are fields 14 and 15 of the line.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let tick = |i: usize| -> Result<u64, BenchError> {
        fields
            .get(i)
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| BenchError::new(format!("parsing {path}"), "no utime/stime", ADVICE))
    };
    // Field 3 (state) is at index 0 here, so field k is at index k - 3.
    let ticks = tick(14 - 3)? + tick(15 - 3)?;
    Ok(Duration::from_millis(ticks * 1000 / USER_HZ))
}

/// Resident memory of this process (`VmRSS`), in bytes.
pub fn rss_bytes() -> Result<u64, BenchError> {
    let path = "/proc/self/status";
    let status = std::fs::read_to_string(path).during(format!("reading {path}"), ADVICE)?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .map(|kb| kb * 1024)
        .ok_or_else(|| BenchError::new(format!("parsing {path}"), "no VmRSS line", ADVICE))
}
