//! contract §2: interception rules, the defaults, per-simple-command matching (pure).

use regex::{Regex, RegexBuilder};
use serde::{Deserialize, Serialize};

use crate::shellwords::{self, SimpleCommand};

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

/// A structured block (contract §2, Ours).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Block {
    pub blocked: bool,
    /// Index of the rule in the rule list (0-based).
    pub rule: usize,
    pub suggested_tool: String,
    /// The exact error text: `Blocked: <message>\n\nOriginal command: <command>`.
    pub message: String,
}

impl Rule {
    fn new(pattern: &str, tool: &str, message: &str) -> Self {
        Rule { pattern: pattern.into(), flags: None, tool: tool.into(), message: message.into() }
    }
}

// contract §2 default rules, verbatim. Four of them are refined in code (see `Refinement`) to fix
// the false positives the contract lists; the patterns stay as written so settings files that copy them
// get the same fixes.
const READ_PATTERN: &str = r"^\s*(cat|head|tail|less|more)\s+";
const GREP_PATTERN: &str = r"^\s*(grep|rg|ripgrep|ag|ack)\s+";
const PERL_PATTERN: &str = r"^\s*perl\s+.*-[pn]?i";
const WRITE_PATTERN: &str = r"^\s*(echo|printf|cat\s*<<)\s+.*[^|]>\s*\S";

/// The seven default rules (contract §2), in order.
pub fn default_rules() -> Vec<Rule> {
    vec![
        Rule::new(
            READ_PATTERN,
            "read",
            "Use the `read` tool instead of cat/head/tail. It provides better context and handles binary files.",
        ),
        Rule::new(
            GREP_PATTERN,
            "grep",
            "Use the `grep` tool instead of grep/rg. It respects .gitignore and provides structured output.",
        ),
        Rule::new(
            r"^\s*(find|fd|locate)\s+.*(-name|-iname|-type|--type|-glob)",
            "find",
            "Use the `find` tool instead of find/fd. It respects .gitignore and is faster for glob patterns.",
        ),
        Rule::new(
            r"^\s*sed\s+(-i|--in-place)",
            "edit",
            "Use the `edit` tool instead of sed -i. It provides diff preview and fuzzy matching.",
        ),
        Rule::new(
            PERL_PATTERN,
            "edit",
            "Use the `edit` tool instead of perl -i. It provides diff preview and fuzzy matching.",
        ),
        Rule::new(
            r"^\s*awk\s+.*-i\s+inplace",
            "edit",
            "Use the `edit` tool instead of awk -i inplace. It provides diff preview and fuzzy matching.",
        ),
        Rule::new(
            WRITE_PATTERN,
            "write",
            "Use the `write` tool instead of echo/cat redirection. It handles encoding and provides confirmation.",
        ),
    ]
}

/// The exact text of a block (contract §2).
pub fn block_message(message: &str, command: &str) -> String {
    format!("Blocked: {message}\n\nOriginal command: {command}")
}

/// The top-level simple commands of `command`, which rules are matched against one by one.
pub fn simple_commands(command: &str) -> Vec<&str> {
    shellwords::simple_commands(command).iter().map(SimpleCommand::text).collect()
}

/// A rule whose regex compiled.
#[derive(Debug)]
struct Compiled {
    index: usize,
    regex: Regex,
    refinement: Option<Refinement>,
    tool: String,
    message: String,
}

/// A rule that was skipped because its regex is invalid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InvalidRule {
    pub index: usize,
    pub pattern: String,
    pub error: String,
}

/// Checks commands against the configured rules (contract §2).
#[derive(Debug)]
pub struct Interceptor {
    enabled: bool,
    rules: Vec<Compiled>,
    invalid: Vec<InvalidRule>,
}

impl Interceptor {
    /// Compiles the rules once. Invalid regexes are skipped and logged here, once.
    pub fn new(settings: &InterceptorSettings) -> Self {
        if !settings.enabled {
            return Interceptor { enabled: false, rules: Vec::new(), invalid: Vec::new() };
        }
        let defaults;
        let rules = match &settings.rules {
            Some(rules) => rules,
            None => {
                defaults = default_rules();
                &defaults
            }
        };
        let mut compiled = Vec::new();
        let mut invalid = Vec::new();
        for (index, rule) in rules.iter().enumerate() {
            match compile(&rule.pattern, rule.flags.as_deref()) {
                Ok(regex) => compiled.push(Compiled {
                    index,
                    regex,
                    refinement: Refinement::for_rule(rule),
                    tool: rule.tool.clone(),
                    message: rule.message.clone(),
                }),
                Err(err) => {
                    tracing::warn!(rule = index, pattern = %rule.pattern, "interceptor rule skipped: {err}");
                    invalid.push(InvalidRule {
                        index,
                        pattern: rule.pattern.clone(),
                        error: err.to_string(),
                    });
                }
            }
        }
        Interceptor { enabled: true, rules: compiled, invalid }
    }

    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Rules that were skipped because their regex does not compile.
    pub fn invalid_rules(&self) -> &[InvalidRule] {
        &self.invalid
    }

    /// Checks a normalized command. Only rules whose tool is in `tools` apply; with no `tools`
    /// (or when disabled) nothing is blocked. Rules are tried in order, each against every
    /// simple command; the first hit blocks.
    pub fn check(&self, normalized_command: &str, tools: Option<&[String]>) -> Option<Block> {
        let tools = tools.filter(|_| self.enabled)?;
        // Rules see each simple command as it really runs: `sudo cat f` is a `cat`.
        let commands: Vec<_> = shellwords::simple_commands(normalized_command)
            .iter()
            .map(shellwords::SimpleCommand::without_wrappers)
            .collect();
        // Tool names as callers type them (`--tools ' read , grep'`).
        let offered = |tool: &str| tools.iter().any(|t| t.trim() == tool);
        let whole = normalized_command.trim();
        let rule = self.rules.iter().filter(|rule| offered(&rule.tool)).find(|rule| {
            match rule.refinement {
                Some(refinement) => commands.iter().any(|c| refinement.matches(&rule.regex, c)),
                // Also the whole line, so a rule written for the reference, which saw only the
                // whole line, still fires (`^git add .* && git commit`).
                None => {
                    rule.regex.is_match(whole)
                        || commands.iter().any(|c| rule.regex.is_match(c.text()))
                }
            }
        })?;
        Some(Block {
            blocked: true,
            rule: rule.index,
            suggested_tool: rule.tool.clone(),
            message: block_message(&rule.message, normalized_command),
        })
    }
}

/// Compiles a pattern with JavaScript-style flags. `i`, `m`, `s` mean what they mean in
/// JavaScript; `x` (not JavaScript) turns on verbose mode as in most other engines; `g`, `u`,
/// `y`, `d`, `v` only matter to JavaScript's matching API and are ignored like anything else.
fn compile(pattern: &str, flags: Option<&str>) -> Result<Regex, regex::Error> {
    let mut builder = RegexBuilder::new(pattern);
    for flag in flags.unwrap_or("").chars() {
        match flag {
            'i' => builder.case_insensitive(true),
            'm' => builder.multi_line(true),
            's' => builder.dot_matches_new_line(true),
            'x' => builder.ignore_whitespace(true),
            _ => &mut builder,
        };
    }
    builder.build()
}

/// Shell-aware corrections of three default rules, applied when a rule's pattern is exactly the
/// contract pattern (with no flags). Each fixes a false positive or negative of the bare regex,
/// which sees the command as flat text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refinement {
    /// Rule 1: `cat <<EOF …` / `cat <<< x` reads nothing from disk, so it is not a read (contract:
    /// `cat <<EOF > f` is a write). The regex must still match.
    Read,
    /// Rule 2: a grep that reads a pipe (`ps aux | grep x`) filters another command's output,
    /// which the `grep` tool cannot do; only a grep over files is blocked.
    Grep,
    /// Rule 5: decided on perl's actual switches instead of the regex, which fires on any `-i`
    /// in the text (`perl x.pl --input`, `perl -e '"-i"'`) yet misses clusters like `-lpi`.
    /// A hit needs an `i` in a switch cluster before the script name.
    PerlInPlace,
    /// Rule 7: decided on the parsed redirections instead of the regex. `[^|]>\s*\S` fires on
    /// fd redirections (`2>/dev/null`, `>&2`) and on `>` inside quotes, while `cat <<EOF > f`
    /// fails its `<<\s+`. A hit needs `echo`/`printf` (or `cat` with a heredoc) whose stdout
    /// is redirected to a file: `>`, `>>`, `>|`, `1>`, `&>`, `&>>`, `>& file`, with a target
    /// outside `/dev/` (`/dev/null`, `/dev/stderr` are not files the `write` tool would make).
    Write,
}

impl Refinement {
    fn for_rule(rule: &Rule) -> Option<Self> {
        if rule.flags.as_deref().is_some_and(|f| !f.is_empty()) {
            return None;
        }
        match rule.pattern.as_str() {
            READ_PATTERN => Some(Refinement::Read),
            GREP_PATTERN => Some(Refinement::Grep),
            PERL_PATTERN => Some(Refinement::PerlInPlace),
            WRITE_PATTERN => Some(Refinement::Write),
            _ => None,
        }
    }

    fn matches(self, regex: &Regex, command: &SimpleCommand<'_>) -> bool {
        match self {
            // A stage that reads a pipe (`git log | head -5` kept for `-c`, `x | tail -f`)
            // is not reading a file either.
            Refinement::Read => {
                regex.is_match(command.text())
                    && !command.piped
                    && !command.redirects().iter().any(|(op, _)| op.starts_with("<<"))
            }
            Refinement::Grep => regex.is_match(command.text()) && !command.piped,
            Refinement::PerlInPlace => perl_in_place(&command.argv()),
            Refinement::Write => {
                let argv = command.argv();
                let redirects = command.redirects();
                let writer = match argv.first() {
                    Some(&"echo" | &"printf") => true,
                    Some(&"cat") => redirects.iter().any(|(op, _)| matches!(*op, "<<" | "<<-")),
                    _ => false,
                };
                writer && redirects.iter().any(|&(op, target)| writes_stdout_to_file(op, target))
            }
        }
    }
}

/// Whether `perl` is told to edit in place: an `i` among the switches before the script.
fn perl_in_place(argv: &[&str]) -> bool {
    let mut args = match argv {
        ["perl", rest @ ..] => rest.iter(),
        _ => return false,
    };
    while let Some(arg) = args.next() {
        let Some(cluster) = arg.strip_prefix('-') else { return false };
        if cluster.is_empty() || cluster == "-" {
            return false;
        }
        for (n, c) in cluster.char_indices() {
            match c {
                'i' => return true,
                // These take the rest of the cluster as their argument (`-MList::Util`,
                // `-e'…'`); with nothing left, `-e`/`-E`/`-I` take the next word.
                'e' | 'E' | 'M' | 'm' | 'I' | 'x' | 'd' | 'D' | 'C' | 'F' | 'V' => {
                    if n + 1 == cluster.len() && matches!(c, 'e' | 'E' | 'I') {
                        args.next();
                    }
                    break;
                }
                _ => {}
            }
        }
    }
    false
}

/// Devices a redirection may name without writing a file (contract §2).
const NOT_FILES: &[&str] = &["/dev/null", "/dev/stdout", "/dev/stderr", "/dev/tty"];

/// Whether a redirection sends stdout into a real file.
fn writes_stdout_to_file(op: &str, target: &str) -> bool {
    let target = unquote(target);
    let target = target.as_str();
    let fd_path =
        target.strip_prefix("/dev/fd/").is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()));
    if target.is_empty() || NOT_FILES.contains(&target) || fd_path {
        return false;
    }
    let fd = op.trim_end_matches(|c: char| !c.is_ascii_digit());
    let op = &op[fd.len()..];
    if !(fd.is_empty() || fd == "1") {
        return false;
    }
    match op {
        ">" | ">>" | ">|" | "&>" | "&>>" => true,
        // `>&2` / `>&-` duplicate or close a descriptor; `>& file` is bash for `&> file`.
        ">&" => !(target == "-" || target.bytes().all(|b| b.is_ascii_digit())),
        _ => false,
    }
}

/// A word with its quotes and backslashes removed (`"/dev/"'null'` → `/dev/null`); expansions
/// stay as written, so `"$out"` is still a name only known at run time.
fn unquote(word: &str) -> String {
    let mut out = String::with_capacity(word.len());
    let mut chars = word.chars();
    let mut quote: Option<char> = None;
    while let Some(c) = chars.next() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, '\\') | (Some('"'), '\\') => {
                if let Some(next) = chars.next() {
                    out.push(next);
                }
            }
            _ => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    const ALL_TOOLS: &[&str] = &["read", "grep", "find", "edit", "write"];

    fn tools(names: &[&str]) -> Vec<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    fn enabled(rules: Option<Vec<Rule>>) -> Interceptor {
        Interceptor::new(&InterceptorSettings { enabled: true, rules })
    }

    #[test]
    fn intercept_default_rules_table() {
        let interceptor = enabled(None);
        let all = tools(ALL_TOOLS);
        let cases: &[(&str, Option<usize>)] = &[
            ("cat file.txt", Some(0)),
            ("  head -n 5 file", Some(0)),
            ("tail -f log", Some(0)),
            ("less README", Some(0)),
            ("more x", Some(0)),
            ("grep -r foo .", Some(1)),
            ("rg foo", Some(1)),
            ("ag foo", Some(1)),
            ("ack foo", Some(1)),
            ("ripgrep foo", Some(1)),
            ("find . -name '*.rs'", Some(2)),
            ("fd --type f", Some(2)),
            ("locate -type x", Some(2)),
            ("sed -i 's/a/b/' f", Some(3)),
            ("sed --in-place 's/a/b/' f", Some(3)),
            ("perl -pi -e 's/a/b/' f", Some(4)),
            ("perl -i.bak -pe 's/a/b/' f", Some(4)),
            ("perl -lpi -e 's/a/b/' f", Some(4)),
            ("perl -0777 -ni -e 'print' f", Some(4)),
            ("awk -i inplace '{print}' f", Some(5)),
            ("echo hi > out.txt", Some(6)),
            ("echo hi >> out.txt", Some(6)),
            ("printf '%s' x > f", Some(6)),
            ("echo hi &> f", Some(6)),
            ("echo hi 1> f", Some(6)),
            ("cat <<EOF > f\nhello\nEOF", Some(6)),
            ("cat <<'EOF' >> f\n  a | b\nEOF", Some(6)),
            ("cat > f <<EOF\nhello\nEOF", Some(6)),
            // Per simple command.
            ("cd x && grep -r foo .", Some(1)),
            ("cd x; cat f", Some(0)),
            ("ls || find . -name x", Some(2)),
            // What runs the command is looked through.
            ("sudo cat /etc/hosts", Some(0)),
            ("FOO=1 grep -r x .", Some(1)),
            ("nohup cat f", Some(0)),
            ("timeout 5 grep -r x .", Some(1)),
            ("env FOO=1 cat f", Some(0)),
            ("nice -n 5 sed -i s/a/b/ f", Some(3)),
            ("sudo -u bob ls", None),
            ("FOO=cat ls", None),
            // A grep filtering a pipe is not a search over files: the grep tool cannot do it.
            ("make | grep error", None),
            ("ps aux | grep -v grep | grep foo", None),
            ("git log | head -c 100", None),
            ("grep -r foo . | head -c 10", Some(1)),
            ("if grep -q x f; then echo y; fi", Some(1)),
            ("(cd x && cat f)", Some(0)),
            ("true\nsed -i s/a/b/ f", Some(3)),
            // Rules are tried in order: read comes before grep.
            ("grep x f && cat f", Some(0)),
            // Not blocked.
            ("git status", None),
            ("ls -la", None),
            ("cat", None),
            ("find .", None),
            ("sed 's/a/b/' f", None),
            ("echo x 2>/dev/null", None),
            ("echo x > /dev/null", None),
            ("echo x >/dev/null 2>&1", None),
            ("echo error >&2", None),
            ("echo error 1>&2", None),
            ("echo 'a > b'", None),
            ("echo \"x\" | tee f", None),
            ("perl x.pl --input", None),
            ("perl -e 'print \"-i\"'", None),
            ("perl -ne 'print if /-i/' f", None),
            ("perl script.pl -i", None),
            ("perl -MList::Util -e 1", None),
            ("cat <<EOF\nhello\nEOF", None),
            ("cat <<< 'text'", None),
            ("echo $(cat f)", None),
            ("echo \"grep x\"", None),
            ("mygrep foo", None),
        ];
        for &(command, want) in cases {
            let got = interceptor.check(command, Some(&all)).map(|b| b.rule);
            assert_eq!(got, want, "{command:?}");
        }
    }

    #[test]
    fn intercept_block_is_structured_with_exact_text() {
        let interceptor = enabled(None);
        let got = interceptor.check("cd x && grep -r foo .", Some(&tools(&["grep"])));
        assert_eq!(
            got,
            Some(Block {
                blocked: true,
                rule: 1,
                suggested_tool: "grep".into(),
                message: "Blocked: Use the `grep` tool instead of grep/rg. It respects .gitignore and provides structured output.\n\nOriginal command: cd x && grep -r foo .".into(),
            })
        );
    }

    #[test]
    fn intercept_only_for_offered_tools() {
        let interceptor = enabled(None);
        assert_eq!(interceptor.check("grep -r foo .", None), None);
        assert_eq!(interceptor.check("grep -r foo .", Some(&[])), None);
        assert_eq!(interceptor.check("grep -r foo .", Some(&tools(&["read"]))), None);
        // With `read` not offered, `cat f && grep x` falls through to the grep rule.
        let got = interceptor.check("cat f && grep x f", Some(&tools(&["grep"])));
        assert_eq!(got.map(|b| b.rule), Some(1));

        let disabled = Interceptor::new(&InterceptorSettings::default());
        assert!(!disabled.enabled());
        assert_eq!(disabled.check("grep -r foo .", Some(&tools(ALL_TOOLS))), None);

        let none = enabled(Some(vec![]));
        assert_eq!(none.check("grep -r foo .", Some(&tools(ALL_TOOLS))), None);
    }

    #[test]
    fn intercept_custom_rules_flags_and_invalid_patterns() {
        let rules = vec![
            Rule { pattern: "(".into(), flags: None, tool: "x".into(), message: "bad".into() },
            Rule {
                pattern: "^CURL\\s".into(),
                flags: Some("gi".into()),
                tool: "fetch".into(),
                message: "Use fetch.".into(),
            },
            Rule {
                pattern: "^ wget # the downloader\n \\s".into(),
                flags: Some("x".into()),
                tool: "fetch".into(),
                message: "No wget.".into(),
            },
            Rule {
                pattern: "a.b".into(),
                flags: Some("s".into()),
                tool: "dots".into(),
                message: "dots".into(),
            },
        ];
        let interceptor = enabled(Some(rules));
        assert_eq!(interceptor.invalid_rules().len(), 1);
        assert_eq!(interceptor.invalid_rules()[0].index, 0);
        let offered = tools(&["x", "fetch", "dots"]);
        let check = |c: &str| interceptor.check(c, Some(&offered)).map(|b| (b.rule, b.message));
        assert_eq!(
            check("ls && curl https://x"),
            Some((1, "Blocked: Use fetch.\n\nOriginal command: ls && curl https://x".into()))
        );
        assert_eq!(check("wget x").map(|b| b.0), Some(2));
        assert_eq!(check("echo 'a\nb'").map(|b| b.0), Some(3));
        assert_eq!(check("ls"), None);
    }

    #[test]
    fn intercept_rules_also_see_the_whole_line() {
        let rules = vec![Rule {
            pattern: "^git add .* && git commit".into(),
            flags: None,
            tool: "commit".into(),
            message: "Use the commit tool.".into(),
        }];
        let interceptor = enabled(Some(rules));
        let offered = tools(&["commit"]);
        let check = |c: &str| interceptor.check(c, Some(&offered)).map(|b| b.rule);
        assert_eq!(check("git add -A && git commit -m x"), Some(0));
        assert_eq!(check("  git add . && git commit  "), Some(0));
        assert_eq!(check("git add -A"), None);
        // Refined default rules stay per command: the whole line `ps | grep x` is no grep.
        let defaults = enabled(None);
        let all = tools(ALL_TOOLS);
        assert_eq!(defaults.check("cat <<EOF > f\nx\nEOF", Some(&all)).map(|b| b.rule), Some(6));
        assert_eq!(defaults.check("ps aux | grep x", Some(&all)), None);
    }

    #[test]
    fn intercept_device_redirections_quoted_or_not_are_not_writes() {
        let interceptor = enabled(None);
        let all = tools(ALL_TOOLS);
        let check = |c: &str| interceptor.check(c, Some(&all)).map(|b| b.rule);
        for c in [
            "echo x > /dev/null",
            "echo x > \"/dev/null\"",
            "echo x >'/dev/null'",
            "echo x > \"/dev/\"null",
            "echo x > /dev/stderr",
            "printf x >> '/dev/stdout'",
            "echo x > \"/dev/tty\"",
            "echo x >/dev/fd/2",
        ] {
            assert_eq!(check(c), None, "{c}");
        }
        for c in ["echo x > \"out.txt\"", "echo x > /dev/shm/f", "echo x > \"$out\""] {
            assert_eq!(check(c), Some(6), "{c}");
        }
    }

    #[test]
    fn intercept_a_line_break_after_a_pipe_continues_the_pipeline() {
        let interceptor = enabled(None);
        let all = tools(ALL_TOOLS);
        let check = |c: &str| interceptor.check(c, Some(&all)).map(|b| b.rule);
        for c in ["cmd | grep x", "cmd |\ngrep x", "cmd |  \n\n  grep x", "cmd | # filter\n grep x"]
        {
            assert_eq!(check(c), None, "{c:?}");
        }
        assert_eq!(check("cmd\ngrep x f"), Some(1));
        assert_eq!(check("cmd &&\ngrep x f"), Some(1));
    }

    #[test]
    fn intercept_refinements_follow_the_pattern_not_the_position() {
        // A settings file that copies rule 7 alone gets the same shell-aware behaviour.
        let write = default_rules().remove(6);
        let interceptor = enabled(Some(vec![write.clone()]));
        let offered = tools(&["write"]);
        assert_eq!(interceptor.check("echo x 2>/dev/null", Some(&offered)), None);
        assert_eq!(interceptor.check("echo x > f", Some(&offered)).map(|b| b.rule), Some(0));
        // With flags it is the user's own regex, matched as text.
        let plain = Rule { flags: Some("i".into()), ..write };
        let interceptor = enabled(Some(vec![plain]));
        assert_eq!(
            interceptor.check("echo x 2>/dev/null", Some(&offered)).map(|b| b.rule),
            Some(0)
        );
    }

    #[test]
    fn intercept_default_rules_are_the_spec_ones() {
        let rules = default_rules();
        let summary: Vec<(&str, &str)> =
            rules.iter().map(|r| (r.pattern.as_str(), r.tool.as_str())).collect();
        assert_eq!(
            summary,
            [
                (r"^\s*(cat|head|tail|less|more)\s+", "read"),
                (r"^\s*(grep|rg|ripgrep|ag|ack)\s+", "grep"),
                (r"^\s*(find|fd|locate)\s+.*(-name|-iname|-type|--type|-glob)", "find"),
                (r"^\s*sed\s+(-i|--in-place)", "edit"),
                (r"^\s*perl\s+.*-[pn]?i", "edit"),
                (r"^\s*awk\s+.*-i\s+inplace", "edit"),
                (r"^\s*(echo|printf|cat\s*<<)\s+.*[^|]>\s*\S", "write"),
            ]
        );
        assert!(rules.iter().all(|r| r.flags.is_none()));
        assert_eq!(enabled(None).invalid_rules(), &[]);
    }

    #[test]
    fn intercept_simple_commands_helper() {
        assert_eq!(
            simple_commands("cd x && grep -r foo . | wc -l; echo 'a && b' & sleep 1 |& cat"),
            ["cd x", "grep -r foo .", "wc -l", "echo 'a && b'", "sleep 1", "cat"]
        );
    }

    proptest::proptest! {
        #[test]
        fn intercept_check_never_panics(command in "(\\PC|[|&;<>()'\"`$\\\\{}#\n -])*") {
            let interceptor = enabled(None);
            let offered = tools(ALL_TOOLS);
            if let Some(block) = interceptor.check(&command, Some(&offered)) {
                proptest::prop_assert!(block.message.ends_with(&command));
            }
        }
    }
}
