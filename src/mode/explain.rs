//! `agent-bash explain`: shows what normalization and interception make of a command.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::intercept::{Interceptor, InterceptorSettings, Rule};
use crate::normalize::{self, Rewrite};
use crate::Error;

/// Flags of `agent-bash explain`.
#[derive(Debug, clap::Args)]
pub struct ExplainArgs {
    /// Tool names the caller offers (comma-separated); rules for other tools never block.
    #[arg(long, value_delimiter = ',')]
    pub tools: Option<Vec<String>>,
    /// A TOML or JSON file with interceptor rules (`[[rules]]` / `{"rules": [...]}`).
    #[arg(long)]
    pub rules: Option<PathBuf>,
    /// Explicit head line count (overrides one extracted from the command).
    #[arg(long)]
    pub head: Option<usize>,
    /// Explicit tail line count (overrides one extracted from the command).
    #[arg(long)]
    pub tail: Option<usize>,
    /// The command, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

/// What `explain` prints: one JSON object.
#[derive(Debug, Serialize)]
struct Explanation<'a> {
    command: &'a str,
    head: Option<usize>,
    tail: Option<usize>,
    rewrites: &'a [Rewrite],
    blocked: bool,
    rule: Option<usize>,
    suggested_tool: Option<&'a str>,
    message: Option<&'a str>,
}

/// Runs `explain`; returns the process exit status.
///
/// The interceptor is always enabled here: the point is to see what it would do.
pub fn run(args: ExplainArgs) -> crate::Result<i32> {
    let rules = args.rules.as_deref().map(load_rules).transpose()?;
    let interceptor = Interceptor::new(&InterceptorSettings { enabled: true, rules });
    for invalid in interceptor.invalid_rules() {
        eprintln!(
            "agent-bash: rule {} skipped, invalid pattern {:?}: {}",
            invalid.index, invalid.pattern, invalid.error
        );
    }

    let command = args.command.join(" ");
    let normalized = normalize::normalize(&command, args.head, args.tail);
    let block = interceptor.check(&normalized.command, args.tools.as_deref());
    let explanation = Explanation {
        command: &normalized.command,
        head: normalized.head,
        tail: normalized.tail,
        rewrites: &normalized.rewrites,
        blocked: block.is_some(),
        rule: block.as_ref().map(|b| b.rule),
        suggested_tool: block.as_ref().map(|b| b.suggested_tool.as_str()),
        message: block.as_ref().map(|b| b.message.as_str()),
    };
    let json = serde_json::to_string(&explanation)
        .map_err(|err| Error::InvalidInput(format!("cannot encode the explanation: {err}")))?;
    writeln!(std::io::stdout().lock(), "{json}")?;
    Ok(0)
}

/// A rules file as a table: `{"rules": [...]}` or `[[rules]]`. Other keys are ignored, so a
/// settings file's `interceptor` section can be used as it is.
#[derive(Deserialize)]
struct RulesTable {
    rules: Vec<Rule>,
}

/// Loads rules from a TOML or JSON file, chosen by extension (or by content when the extension
/// says neither).
#[allow(clippy::disallowed_methods)] // `explain` answers one question and exits
fn load_rules(path: &Path) -> crate::Result<Vec<Rule>> {
    let bad = |what: String| Error::InvalidInput(format!("rules file {}: {what}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|err| bad(err.to_string()))?;
    let ext = path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase);
    let json = match ext.as_deref() {
        Some("json") => true,
        Some("toml") => false,
        _ => text.trim_start().starts_with(['{', '[']) && !text.trim_start().starts_with("[["),
    };
    if !json {
        let table: RulesTable =
            toml::from_str(&text).map_err(|err| bad(format!("invalid TOML: {}", err.message())))?;
        return Ok(table.rules);
    }
    // Through a Value first, so the error names what is wrong (a missing field) instead of
    // "did not match any variant".
    let value: serde_json::Value =
        serde_json::from_str(&text).map_err(|err| bad(format!("invalid JSON: {err}")))?;
    let rules = if value.is_array() {
        serde_json::from_value(value)
    } else {
        serde_json::from_value::<RulesTable>(value).map(|t| t.rules)
    };
    rules.map_err(|err| bad(format!("invalid rules: {err}")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn load(name: &str, text: &str) -> crate::Result<Vec<Rule>> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(name);
        std::fs::write(&path, text).unwrap();
        load_rules(&path)
    }

    #[test]
    fn explain_loads_rules_in_every_shape() {
        let want = vec![Rule {
            pattern: "^x".into(),
            flags: Some("i".into()),
            tool: "t".into(),
            message: "m".into(),
        }];
        let toml = "[[rules]]\npattern = '^x'\nflags = 'i'\ntool = 't'\nmessage = 'm'\n";
        let json = r#"{"rules":[{"pattern":"^x","flags":"i","tool":"t","message":"m"}]}"#;
        let bare = r#"[{"pattern":"^x","flags":"i","tool":"t","message":"m"}]"#;
        assert_eq!(load("r.toml", toml).unwrap(), want);
        assert_eq!(load("r.json", json).unwrap(), want);
        assert_eq!(load("r.json", bare).unwrap(), want);
        assert_eq!(load("rules", toml).unwrap(), want);
        assert_eq!(load("rules", json).unwrap(), want);
        assert_eq!(load("rules", bare).unwrap(), want);
        assert_eq!(load("r.toml", "rules = []").unwrap(), vec![]);
    }

    #[test]
    fn explain_bad_rules_files_are_errors() {
        let missing_field = load("r.json", r#"{"rules":[{"pattern":"x"}]}"#).unwrap_err();
        assert_eq!(
            missing_field.to_string().split_once(": ").map(|(_, rest)| rest),
            Some("invalid rules: missing field `tool`")
        );
        let not_json = load("r.json", "{").unwrap_err();
        assert!(not_json.to_string().contains("invalid JSON: "), "{not_json}");
        let bad_toml = load("r.toml", "[[rules]]\npattern = \n").unwrap_err();
        assert!(bad_toml.to_string().contains("invalid TOML: "), "{bad_toml}");
        let gone = load_rules(Path::new("/nonexistent/rules.toml")).unwrap_err();
        assert!(gone.to_string().starts_with("rules file /nonexistent/rules.toml: "), "{gone}");
    }
}
