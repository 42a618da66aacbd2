//! contract §10: bang commands recorded per editor session (JSONL) and worded for the agent.
//!
//! The file is `<session dir>/session.jsonl`, beside the session's artifacts, so that a backend
//! restarted for the same editor session (same session id) keeps appending to it. Each line is
//! one [`BashExecution`]; a line that cannot be parsed (a torn write after a crash) is skipped on
//! load, never fatal.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::result::{truncation_notice, BashResult};

/// File name of the record inside the session directory.
pub const FILE: &str = "session.jsonl";

/// One recorded bang command (`role = "bashExecution"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BashExecution {
    pub role: String,
    pub command: String,
    /// The command's output as the model would see it (head/tail applied, window-bounded),
    /// without annotations or notices.
    pub output: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    pub cancelled: bool,
    pub truncated: bool,
    /// Everything else worth keeping: cwd, counters, artifact id, timing, the notice text.
    pub meta: serde_json::Value,
    /// Milliseconds since the Unix epoch.
    pub timestamp: u64,
    pub exclude_from_context: bool,
}

impl BashExecution {
    /// The record of a finished bang command.
    pub fn from_result(
        command: &str,
        cwd: &Path,
        r: &BashResult,
        limit_bytes: u64,
        exclude: bool,
    ) -> Self {
        let notice = r.truncation.as_ref().map(|t| truncation_notice(t, limit_bytes));
        let meta = serde_json::json!({
            "cwd": cwd,
            "timed_out": r.timed_out,
            "duration_ms": r.duration_ms,
            "total_lines": r.total_lines,
            "total_bytes": r.total_bytes,
            "output_lines": r.output_lines,
            "artifact_id": r.artifact_id,
            "notice": notice,
            "resources": r.resources,
            "rescued": r.rescued,
        });
        BashExecution {
            role: "bashExecution".into(),
            command: command.to_string(),
            output: r.text.clone(),
            exit_code: r.exit_code,
            cancelled: r.cancelled,
            truncated: r.truncated,
            meta,
            timestamp: now_ms(),
            exclude_from_context: exclude,
        }
    }

    /// The user message the agent gets (contract §10), or `None` for excluded commands.
    pub fn context_message(&self) -> Option<String> {
        if self.exclude_from_context {
            return None;
        }
        let body = if self.output.is_empty() { "(no output)" } else { self.output.as_str() };
        let body = body.strip_suffix('\n').unwrap_or(body);
        let mut text = format!("Ran `{}`\n```\n{body}\n```", self.command);
        if self.cancelled {
            text.push_str("\n\n(command cancelled)");
        } else if let Some(code) = self.exit_code.filter(|c| *c != 0) {
            text.push_str(&format!("\n\nCommand exited with code {code}"));
        }
        if let Some(notice) = self.meta.get("notice").and_then(|n| n.as_str()) {
            text.push_str("\n\n");
            text.push_str(notice);
        }
        Some(text)
    }
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The JSONL record of one editor session.
#[derive(Debug, Clone)]
pub struct SessionLog {
    path: PathBuf,
}

impl SessionLog {
    pub fn new(session_dir: &Path) -> SessionLog {
        SessionLog { path: session_dir.join(FILE) }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one record as a single `write` of one line (O_APPEND), so concurrent writers
    /// never interleave within a line.
    ///
    /// Blocking: async callers use spawn_blocking ([`crate::mode::record_bang`]).
    #[allow(clippy::disallowed_methods)]
    pub fn append(&self, rec: &BashExecution) -> std::io::Result<()> {
        use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
        let mut line = serde_json::to_vec(rec).map_err(std::io::Error::other)?;
        line.push(b'\n');
        let open = || {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW)
                .open(&self.path)
        };
        // The directory exists after the first record: made only when the open says it is not.
        let mut f = match open() {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                if let Some(dir) = self.path.parent() {
                    std::fs::DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
                }
                open()?
            }
            other => other?,
        };
        f.write_all(&line)
    }

    /// Every record, oldest first; unreadable lines are skipped. Blocking: async callers use
    /// spawn_blocking ([`crate::mode::context_page`], [`crate::mode::history_page`]).
    #[allow(clippy::disallowed_methods)]
    pub fn load(&self) -> Vec<BashExecution> {
        let Ok(text) = std::fs::read_to_string(&self.path) else { return Vec::new() };
        text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect()
    }

    /// The agent's context: one user message per recorded, non-excluded command, in order.
    pub fn context(&self) -> Vec<String> {
        self.load().iter().filter_map(BashExecution::context_message).collect()
    }

    /// One page of the records (contract §4.3: answers are paged, never the whole session).
    pub fn history_page(&self, offset: Option<usize>, limit: usize) -> Page<BashExecution> {
        self.page(offset, limit, Some)
    }

    /// One page of the agent's context messages.
    pub fn context_page(&self, offset: Option<usize>, limit: usize) -> Page<String> {
        self.page(offset, limit, |r| r.context_message())
    }

    /// Items `offset..offset + limit` of the records `pick` keeps (the last `limit` when
    /// `offset` is None), reading the file line by line: memory holds one page, whatever the
    /// session's length.
    #[allow(clippy::disallowed_methods)] // callers run it under spawn_blocking
    fn page<T>(
        &self,
        offset: Option<usize>,
        limit: usize,
        pick: impl Fn(BashExecution) -> Option<T>,
    ) -> Page<T> {
        use std::io::BufRead;
        let mut items = std::collections::VecDeque::new();
        let mut total = 0;
        if let Ok(file) = std::fs::File::open(&self.path) {
            for line in std::io::BufReader::new(file).split(b'\n').map_while(|l| l.ok()) {
                let Some(item) = serde_json::from_slice(&line).ok().and_then(&pick) else {
                    continue;
                };
                let index = total;
                total += 1;
                match offset {
                    Some(o) if index < o || index >= o.saturating_add(limit) => {}
                    Some(_) => items.push_back(item),
                    None => {
                        items.push_back(item);
                        if items.len() > limit {
                            items.pop_front();
                        }
                    }
                }
            }
        }
        let offset = offset.unwrap_or(total.saturating_sub(items.len())).min(total);
        Page { items: items.into(), offset, total }
    }
}

/// A page of a session's record.
#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Index of the first item.
    pub offset: usize,
    /// Items in the whole session.
    pub total: usize,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(
        cmd: &str,
        output: &str,
        exit: Option<i32>,
        cancelled: bool,
        notice: Option<&str>,
    ) -> BashExecution {
        BashExecution {
            role: "bashExecution".into(),
            command: cmd.into(),
            output: output.into(),
            exit_code: exit,
            cancelled,
            truncated: notice.is_some(),
            meta: serde_json::json!({ "notice": notice }),
            timestamp: 1,
            exclude_from_context: false,
        }
    }

    #[test]
    fn session_context_wording() {
        assert_eq!(
            rec("ls", "a\nb\n", Some(0), false, None).context_message().unwrap(),
            "Ran `ls`\n```\na\nb\n```"
        );
        assert_eq!(
            rec("true", "", Some(0), false, None).context_message().unwrap(),
            "Ran `true`\n```\n(no output)\n```"
        );
        assert_eq!(
            rec("false", "x\n", Some(1), false, None).context_message().unwrap(),
            "Ran `false`\n```\nx\n```\n\nCommand exited with code 1"
        );
        assert_eq!(
            rec("sleep 9", "", None, true, None).context_message().unwrap(),
            "Ran `sleep 9`\n```\n(no output)\n```\n\n(command cancelled)"
        );
        let notice = "[Showing lines 2-3 of 3 (50.0KB limit). Full: artifact://0]";
        assert_eq!(
            rec("seq 3", "2\n3\n", Some(0), false, Some(notice)).context_message().unwrap(),
            format!("Ran `seq 3`\n```\n2\n3\n```\n\n{notice}")
        );
        let mut excluded = rec("secret", "x", Some(0), false, None);
        excluded.exclude_from_context = true;
        assert_eq!(excluded.context_message(), None);
    }

    #[test]
    fn session_log_appends_and_survives_torn_lines() {
        let dir = tempfile::tempdir().unwrap();
        let log = SessionLog::new(&dir.path().join("s"));
        log.append(&rec("a", "1\n", Some(0), false, None)).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(log.path())
            .unwrap()
            .write_all(b"{\"torn")
            .unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(log.path())
            .unwrap()
            .write_all(b"\n")
            .unwrap();
        log.append(&rec("b", "2\n", Some(0), false, None)).unwrap();
        let all = log.load();
        assert_eq!(all.iter().map(|r| r.command.as_str()).collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(log.context().len(), 2);
    }

    #[test]
    fn session_pages_bounded() {
        let dir = tempfile::tempdir().unwrap();
        let log = SessionLog::new(dir.path());
        for i in 0..10 {
            let mut r = rec(&format!("c{i}"), "", Some(0), false, None);
            r.exclude_from_context = i % 2 == 1;
            log.append(&r).unwrap();
        }
        let p = log.history_page(Some(3), 2);
        assert_eq!((p.offset, p.total), (3, 10));
        assert_eq!(p.items.iter().map(|r| r.command.as_str()).collect::<Vec<_>>(), ["c3", "c4"]);
        let p = log.history_page(None, 3);
        assert_eq!((p.offset, p.total), (7, 10));
        assert_eq!(
            p.items.iter().map(|r| r.command.as_str()).collect::<Vec<_>>(),
            ["c7", "c8", "c9"]
        );
        let p = log.context_page(Some(4), 10);
        assert_eq!((p.offset, p.total, p.items.len()), (4, 5, 1));
        assert!(p.items[0].starts_with("Ran `c8`"));
        let p = log.context_page(Some(99), 10);
        assert_eq!((p.offset, p.total, p.items.len()), (5, 5, 0));
    }
}
