//! SPEC §1: `| head` / `| tail` extraction and head/tail application (pure).

use serde::Serialize;

/// One rewrite made to the command, reported in result metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Rewrite {
    /// The exact text removed from the end of the command, e.g. `| head -n 5` or `2>&1`.
    pub removed: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub head: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tail: Option<usize>,
}

/// The command as it will run, plus the line limits to apply to its output.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Normalized {
    pub command: String,
    pub head: Option<usize>,
    pub tail: Option<usize>,
    pub rewrites: Vec<Rewrite>,
}

/// Normalizes `command`; explicit `head` / `tail` override the extracted value of the same kind.
pub fn normalize(command: &str, head: Option<usize>, tail: Option<usize>) -> Normalized {
    let _ = (command, head, tail);
    todo!("issue 2")
}

/// Applies head first, then tail, to `text` (lines as a person sees them). A limit is a no-op
/// when the text is not longer. `tail = N` on text ending in a newline gives N real lines.
pub fn apply_head_tail(text: &str, head: Option<usize>, tail: Option<usize>) -> String {
    let _ = (text, head, tail);
    todo!("issue 2")
}
