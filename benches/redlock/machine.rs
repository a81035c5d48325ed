//! Where and when the figures were taken: CPU, cores, kernel, memory, redis-server version.

use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

use serde::Serialize;

/// The machine and the moment of a run.
#[derive(Debug, Clone, Serialize)]
pub struct Machine {
    /// UTC, ISO 8601.
    pub date: String,
    pub cpu_model: String,
    /// Logical CPUs available to this process.
    pub cores: usize,
    pub kernel: String,
    pub memory_total: String,
    pub redis_server: String,
    pub redis_benchmark: String,
    /// `/proc/loadavg` (1, 5 and 15 minutes) when the run started and when it ended: other
    /// work on the machine shows up here, and in the tails of every distribution.
    pub load_average_start: String,
    pub load_average_end: String,
}

impl Machine {
    pub fn describe() -> Machine {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| l.strip_prefix("model name"))
            .and_then(|rest| rest.split_once(':'))
            .map(|(_, model)| model.trim().to_string())
            .unwrap_or_else(|| "unknown (no model name in /proc/cpuinfo)".into());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_total = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .map(|v| {
                let kb: f64 = v
                    .trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse()
                    .unwrap_or(0.0);
                format!("{:.1} GiB", kb / 1024.0 / 1024.0)
            })
            .unwrap_or_else(|| "unknown".into());
        Machine {
            date: utc_now(),
            cpu_model,
            cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
            kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map(|k| format!("Linux {}", k.trim()))
                .unwrap_or_else(|_| std::env::consts::OS.to_string()),
            memory_total,
            redis_server: version_of(&redis_server()),
            redis_benchmark: version_of("redis-benchmark"),
            load_average_start: load_average(),
            load_average_end: String::new(),
        }
    }
}

/// The first three fields of `/proc/loadavg`.
pub fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|l| l.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

/// The redis-server the harness starts: `$REDIS_SERVER`, else `redis-server` on `PATH`.
pub fn redis_server() -> String {
    std::env::var(redlock_testkit::REDIS_SERVER_ENV).unwrap_or_else(|_| "redis-server".into())
}

/// The first line of `binary --version`, or why there is none.
fn version_of(binary: &str) -> String {
    match Command::new(binary).arg("--version").output() {
        Ok(out) if out.status.success() => String::from_utf8_lossy(&out.stdout)
            .lines()
            .next()
            .unwrap_or("")
            .trim()
            .to_string(),
        Ok(out) => format!("{binary} --version failed ({})", out.status),
        Err(e) => format!("{binary} not runnable ({e})"),
    }
}

/// The current time as `YYYY-MM-DDTHH:MM:SSZ`.
fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    format_utc(secs)
}

/// Seconds since the epoch to ISO 8601, by Howard Hinnant's `civil_from_days`.
fn format_utc(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}
