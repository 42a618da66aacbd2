//! contract §7 (Ours, receipt): what a finished run cost, from what Linux tells an unprivileged
//! process: `resources {wall_ms, cpu_user_ms, cpu_sys_ms, max_rss_kib}`.
//!
//! A command of a pipe run runs inside a persistent shell (`crate::shell::local`), which reaps
//! its processes, so the backend never gets their `wait4` rusage. Instead ([`Meter`]):
//! - CPU, where the shell session has a cgroup v2 of its own ([`crate::shell::procs`]): the
//!   cgroup's `cpu.stat` (`user_usec`, `system_usec`) before and after the command. It holds
//!   every process of the session, waited for or not (a daemon that left with `setsid` too), in
//!   microseconds; the shell's own time and a background job of an earlier command that is still
//!   busy count as well.
//! - CPU otherwise: `/proc/<shell>/stat` before and after the command. The shell's own time
//!   (builtins, loops in the shell itself) plus `cutime`/`cstime`, the time of the children it
//!   has waited for, which include their own waited-for children: the foreground part of the
//!   command, whole. Background jobs still running are not counted. Resolution: one clock tick
//!   (10 ms).
//! - Peak memory: the largest `VmHWM` (a process's own peak resident set, as `ru_maxrss`) among
//!   the shell's descendants (the members of its cgroup, when it has one), sampled at most every
//!   [`SAMPLE_EVERY`] while the command runs (when its output moves, or after each
//!   [`crate::shell::local::IDLE_TICK`] of silence), from one period in: a process that lives
//!   shorter than that may be missed, and a command that ends sooner reports none. (A cgroup's
//!   `memory.peak` is not used: it counts
//!   the page cache the command's writes fill, which no process's resident set holds, and it
//!   needs the memory controller delegated.)
//!
//! A PTY run's shell is the backend's own child, so its receipt is exact ([`from_rusage`]): the
//! `wait4` rusage of the shell, which includes every descendant it waited for (CPU) and the
//! largest resident set among them.
//!
//! Fields the OS could not tell (the shell was killed on timeout, no process was sampled) are
//! absent.
//!
//! Off Linux (and with `AGENT_BASH_PORTABLE=1`) there is neither `/proc` nor a cgroup: a pipe
//! run's receipt has its wall time only, a PTY run's the `wait4` rusage as above (macOS gives
//! `ru_maxrss` in bytes, Linux in KiB).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;

/// How often the command's processes are sampled for their peak memory.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(100);

/// CPU over this much, or memory over [`EXPENSIVE_RSS_KIB`], adds a line to the model text.
pub const EXPENSIVE_CPU_MS: u64 = 10_000;
/// 1 GiB.
pub const EXPENSIVE_RSS_KIB: u64 = 1 << 20;

/// What a run cost (contract §7).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub struct Resources {
    pub wall_ms: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_user_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_sys_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_rss_kib: Option<u64>,
}

impl Resources {
    /// `[Used 12.3 s CPU, peak 1.4 GiB]` when the run was expensive (contract §7), else `None`.
    pub fn note(&self) -> Option<String> {
        let cpu = match (self.cpu_user_ms, self.cpu_sys_ms) {
            (Some(u), Some(s)) => Some(u + s),
            _ => None,
        };
        let rss = self.max_rss_kib;
        let expensive =
            cpu.is_some_and(|c| c > EXPENSIVE_CPU_MS) || rss.is_some_and(|r| r > EXPENSIVE_RSS_KIB);
        if !expensive {
            return None;
        }
        let mut parts = Vec::new();
        if let Some(c) = cpu {
            parts.push(format!("{:.1} s CPU", c as f64 / 1000.0));
        }
        if let Some(r) = rss {
            parts.push(format!("peak {}", format_kib(r)));
        }
        Some(format!("[Used {}]", parts.join(", ")))
    }
}

/// `512 KiB`, `210 MiB`, `1.4 GiB`.
pub fn format_kib(kib: u64) -> String {
    if kib >= 1 << 20 {
        format!("{:.1} GiB", kib as f64 / (1u64 << 20) as f64)
    } else if kib >= 1 << 10 {
        format!("{} MiB", kib >> 10)
    } else {
        format!("{kib} KiB")
    }
}

/// CPU times: of a process and its waited-for children in clock ticks, or of a cgroup in µs.
#[derive(Debug, Clone, Copy)]
struct Cpu {
    user: u64,
    sys: u64,
}

/// Whether `/proc` figures are read (Linux, not the portable paths).
fn proc_figures() -> bool {
    cfg!(target_os = "linux") && !crate::platform::portable()
}

// /proc reads of the command's processes: kernel tables, not disk.
#[allow(clippy::disallowed_methods)]
fn cpu_of(pid: i32) -> Option<Cpu> {
    if !proc_figures() {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name: state is field 3; utime, stime, cutime, cstime are 14–17.
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    let n = |i: usize| f.get(i - 3).and_then(|s| s.parse::<i64>().ok()).map(|v| v.max(0) as u64);
    Some(Cpu { user: n(14)? + n(16)?, sys: n(15)? + n(17)? })
}

// /proc reads of the command's processes: kernel tables, not disk.
#[allow(clippy::disallowed_methods)]
fn vm_hwm_kib(pid: i32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_ascii_whitespace().nth(1)?.parse().ok()
}

fn ticks_per_second() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as u64
    } else {
        100
    }
}

/// `ru_maxrss` units per KiB: Linux reports kilobytes, macOS bytes.
#[cfg(target_os = "macos")]
const MAXRSS_PER_KIB: u64 = 1024;
#[cfg(not(target_os = "macos"))]
const MAXRSS_PER_KIB: u64 = 1;

/// The receipt of a process the backend reaped itself with `wait4` (a PTY run's shell), which
/// ran for `wall`.
pub fn from_rusage(wall: Duration, ru: &libc::rusage) -> Resources {
    let ms = |t: libc::timeval| (t.tv_sec.max(0) as u64) * 1000 + (t.tv_usec.max(0) as u64) / 1000;
    Resources {
        wall_ms: u64::try_from(wall.as_millis()).unwrap_or(u64::MAX),
        cpu_user_ms: Some(ms(ru.ru_utime)),
        cpu_sys_ms: Some(ms(ru.ru_stime)),
        // 0 means the process never ran long enough to have a page.
        max_rss_kib: (ru.ru_maxrss > 0).then_some(ru.ru_maxrss as u64 / MAXRSS_PER_KIB),
    }
}

/// CPU time of a cgroup v2 and everything below it, in microseconds (`cpu.stat`, read again
/// from its start through a descriptor kept open: the kernel renders it anew on each read).
fn cgroup_cpu_usec(stat: &std::fs::File) -> Option<Cpu> {
    use std::os::unix::fs::FileExt;
    let mut buf = [0u8; 2048];
    let mut len = 0;
    while len < buf.len() {
        match stat.read_at(&mut buf[len..], len as u64) {
            Ok(0) => break,
            Ok(n) => len += n,
            Err(_) => return None,
        }
    }
    let stat = std::str::from_utf8(&buf[..len]).ok()?;
    let field = |name: &str| {
        stat.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<u64>().ok())
    };
    Some(Cpu { user: field("user_usec")?, sys: field("system_usec")? })
}

/// Where the CPU time of one shell session is read, found once when the shell starts (a
/// command's round trip then costs two reads of an open file, not a look at `/proc`).
#[derive(Debug, Clone, Default)]
pub struct CpuProbe {
    /// The session's own cgroup v2 and its open `cpu.stat`.
    cgroup: Option<(std::path::PathBuf, Arc<std::fs::File>)>,
}

impl CpuProbe {
    /// The probe of the shell `pid`: its session cgroup when it has one of its own
    /// ([`crate::shell::procs::session_cgroup_of`]), else `/proc/<pid>/stat` at each look.
    // /proc reads of the command's processes: kernel tables, not disk.
    #[allow(clippy::disallowed_methods)]
    pub fn of(pid: i32) -> CpuProbe {
        let cgroup = crate::shell::procs::session_cgroup_of(pid).and_then(|dir| {
            let file = std::fs::File::open(dir.join("cpu.stat")).ok()?;
            Some((dir, Arc::new(file)))
        });
        CpuProbe { cgroup }
    }
}

/// Where a [`Meter`] reads CPU time.
#[derive(Debug)]
enum CpuSource {
    /// The shell session's own cgroup v2 (µs).
    Cgroup(Arc<std::fs::File>, Option<Cpu>),
    /// `/proc/<shell>/stat` (clock ticks).
    Proc(Option<Cpu>),
}

/// Measures one command run by the shell `pid`: start it right before sending the command,
/// [`tick`](Self::tick) it whenever the command's output moves or pauses (the peak-memory
/// samples are taken there, at most every [`SAMPLE_EVERY`], so a quick command costs no timer
/// and no task), [`finish`](Self::finish) it once the shell reported the command done.
#[derive(Debug)]
pub struct Meter {
    pid: i32,
    started: Instant,
    before: CpuSource,
    peak: u64,
    /// The session's own cgroup, whose members are the command's processes.
    members: Option<std::path::PathBuf>,
    next_sample: Instant,
}

impl Meter {
    pub fn start(pid: i32, probe: &CpuProbe) -> Meter {
        let before = match &probe.cgroup {
            Some((_, stat)) => {
                let cpu = cgroup_cpu_usec(stat);
                CpuSource::Cgroup(stat.clone(), cpu)
            }
            None => CpuSource::Proc(cpu_of(pid)),
        };
        let started = Instant::now();
        Meter {
            pid,
            started,
            before,
            peak: 0,
            members: probe.cgroup.as_ref().map(|(dir, _)| dir.clone()),
            // The first look is one period in: a command that ends sooner costs no sampling at
            // all (a walk of `/proc` is hundreds of system calls on a busy machine), and its
            // processes would rarely have been caught anyway.
            next_sample: started + SAMPLE_EVERY,
        }
    }

    /// Samples the peak memory of the command's processes when a period has passed since the
    /// last look. Cheap otherwise (one clock read): call it as often as convenient.
    pub fn tick(&mut self) {
        let now = Instant::now();
        if now < self.next_sample {
            return;
        }
        self.next_sample = now + SAMPLE_EVERY;
        if !proc_figures() {
            // No per-process peak without /proc (a `ps` run per sample would cost more than
            // the figure is worth).
            return;
        }
        // With a cgroup of its own, the session's members are listed there.
        let pids = match &self.members {
            Some(dir) => {
                let mut pids = crate::shell::procs::cgroup_pids(dir);
                pids.retain(|&p| p != self.pid);
                pids
            }
            None => descendants(self.pid),
        };
        for p in pids {
            if let Some(kib) = vm_hwm_kib(p) {
                self.peak = self.peak.max(kib);
            }
        }
    }

    /// The receipt. `alive`: the shell survived the command (after a kill its counters are gone).
    pub fn finish(self, alive: bool) -> Resources {
        let wall_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let peak = self.peak;
        let (before, after, per_second) = match &self.before {
            // A killed session's cgroup may be gone; then nothing is known.
            CpuSource::Cgroup(stat, b) => (*b, cgroup_cpu_usec(stat).filter(|_| alive), 1_000_000),
            CpuSource::Proc(b) => (*b, cpu_of(self.pid).filter(|_| alive), ticks_per_second()),
        };
        let (cpu_user_ms, cpu_sys_ms) = match (before, after) {
            (Some(b), Some(a)) => {
                let ms = |t: u64| t * 1000 / per_second;
                (Some(ms(a.user.saturating_sub(b.user))), Some(ms(a.sys.saturating_sub(b.sys))))
            }
            _ => (None, None),
        };
        Resources { wall_ms, cpu_user_ms, cpu_sys_ms, max_rss_kib: (peak > 0).then_some(peak) }
    }
}

/// The live descendants of `root` (not `root` itself), by parent pid.
fn descendants(root: i32) -> Vec<i32> {
    let procs = crate::shell::procs::all_procs();
    let mut found = vec![root];
    let mut i = 0;
    while i < found.len() {
        let parent = found[i];
        found.extend(procs.iter().filter(|p| p.ppid == parent && !p.zombie).map(|p| p.pid));
        i += 1;
    }
    found.split_off(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn note_only_for_expensive_runs() {
        let r = |cpu: u64, rss: u64| Resources {
            wall_ms: 1,
            cpu_user_ms: Some(cpu),
            cpu_sys_ms: Some(300),
            max_rss_kib: Some(rss),
        };
        assert_eq!(r(1_000, 1000).note(), None);
        assert_eq!(r(12_000, 1_468_006).note().unwrap(), "[Used 12.3 s CPU, peak 1.4 GiB]");
        assert_eq!(r(100, 2 << 20).note().unwrap(), "[Used 0.4 s CPU, peak 2.0 GiB]");
        assert_eq!(r(20_000, 215_040).note().unwrap(), "[Used 20.3 s CPU, peak 210 MiB]");
        let unknown = Resources { wall_ms: 5, ..Default::default() };
        assert_eq!(unknown.note(), None);
        assert_eq!(serde_json::to_value(unknown).unwrap(), serde_json::json!({"wall_ms": 5}));
    }
}
