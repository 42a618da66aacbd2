//! The small answers every layer asks for: which project a directory belongs to, and how a path
//! or a command is written as one shell word.
//!
//! A leaf: it imports nothing of ours, so the fence, the receipts, the shells and the PTY path
//! can all stand on it without pointing at each other (`scripts/check-cycles.py`).

use std::path::{Path, PathBuf};

/// The project root for a working directory: the nearest directory holding `.git` (a git work
/// tree, a worktree or a submodule), else the directory itself, with whether `.git` was found.
/// `None` inside a `.git`.
pub fn root(cwd: &Path) -> Option<(PathBuf, bool)> {
    if cwd.components().any(|c| c.as_os_str() == ".git") {
        return None;
    }
    let mut dir = Some(cwd);
    while let Some(d) = dir {
        if d.join(".git").symlink_metadata().is_ok() {
            return Some((d.to_path_buf(), true));
        }
        dir = d.parent();
    }
    Some((cwd.to_path_buf(), false))
}

/// The project a cwd belongs to, as change receipts see it (the nearest directory at or above
/// it holding `.git`, else the cwd itself); a cwd inside a `.git` is its own project.
pub fn root_or_cwd(cwd: &Path) -> PathBuf {
    root(cwd).map_or_else(|| cwd.to_path_buf(), |(root, _)| root)
}

/// Quotes `s` as one shell word in single quotes.
pub fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roots() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir_all(repo.join(".git")).unwrap();
        std::fs::create_dir_all(repo.join("src/deep")).unwrap();
        assert_eq!(root(&repo.join("src/deep")), Some((repo.clone(), true)));
        assert_eq!(root(&repo.join(".git")), None);
    }

    #[test]
    fn root_or_cwd_is_the_work_tree() {
        let dir = tempfile::tempdir().unwrap();
        let sub = dir.path().join("a/b");
        std::fs::create_dir_all(&sub).unwrap();
        assert_eq!(root_or_cwd(&sub), sub);
        std::fs::create_dir(dir.path().join(".git")).unwrap();
        assert_eq!(root_or_cwd(&sub), dir.path());
    }
}
