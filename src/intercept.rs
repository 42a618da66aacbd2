//! SPEC §2: interception rules, the defaults, per-simple-command matching (pure).

use serde::{Deserialize, Serialize};

/// One rule as written in settings (`interceptor.rules`).
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
pub struct Rule {
    pub pattern: String,
    /// Regex flags as in JavaScript (`i`, `m`, `s`, `x` are honoured; others are ignored).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flags: Option<String>,
    pub tool: String,
    pub message: String,
}

/// `interceptor.*` settings. `rules: None` means the seven defaults; `Some(vec![])` means none.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
pub struct InterceptorSettings {
    #[serde(default)]
    pub enabled: bool,
    #[serde(default)]
    pub rules: Option<Vec<Rule>>,
}

/// A structured block (SPEC §2, Ours).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Block {
    pub blocked: bool,
    /// Index of the rule in the rule list (0-based).
    pub rule: usize,
    pub suggested_tool: String,
    /// The exact error text: `Blocked: <message>\n\nOriginal command: <command>`.
    pub message: String,
}
