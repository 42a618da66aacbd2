//! Running a command in zsh as `zsh -c` would (contract §5): the driver files shared by shell
//! sessions ([`super::local`]) and PTY runs ([`crate::pty`]).
//!
//! # Why a file named `zsh`
//! zsh names the script in its messages: `zsh -c 'cd /nope'` prints
//! `zsh:cd:1: no such file or directory: /nope`. A shell reading its script from a pipe prints
//! no name and no line at all, and `eval` prints `(eval):cd:1:`. A file sourced by the bare name
//! `zsh` from the current directory prints exactly what `zsh -c` prints, numbers its lines from 1
//! and keeps `$0`, `return` and `local` as at top level. So each command is written to a file
//! `zsh` in the shell's driver directory, whose first line starts with our prefix (enter the
//! call's cwd, restore `OLDPWD` and the directory stack, all in a group whose stderr is
//! /dev/null so `set -x` shows none of it), then the user's text as written; a last line, after
//! an empty one, marks that the text ran to its end.
//!
//! # Syntax errors fail alone
//! `zsh -c` parses the whole text before running any of it, while a sourced file runs line by
//! line. The text is first parsed as a function body (`functions[name]=text`, which runs
//! nothing and defines nothing when it does not parse); a text that does not parse goes to the
//! other driver, `p/zsh`, which `eval`s it with `EVAL_LINENO` off, so the error reads as
//! `zsh -c`'s (`zsh:2: unmatched "`, status 1) and nothing runs.
//!
//! # Statuses
//! An error that aborts the script (`no matches found`, `division by zero`) makes `source`
//! return 126 where `zsh -c` exits 1: when the end mark was not reached, 126 is reported as 1.
//! A text whose end mark cannot be appended (an unterminated heredoc would swallow it, a final
//! backslash would join it) keeps 126.

use std::io;
use std::path::Path;

use crate::project::quote;

/// The driver's file name: what zsh names in its messages, as `zsh -c` does.
pub const DRIVER_NAME: &str = "zsh";
/// The subdirectory of the driver that runs a text that does not parse.
const PARSE_ERROR_DIR: &str = "p";

/// The variable the protocol text leaves the command's `zsh -c` status in.
pub const STATUS_VAR: &str = "__ab_r";

/// Makes, in the existing private directory `dir`, the parse-error driver (`p/zsh`).
pub fn make_dir(dir: &Path) -> io::Result<()> {
    use super::rundir::{private_dir, private_file};
    private_dir(&dir.join(PARSE_ERROR_DIR))?;
    private_file(&dir.join(PARSE_ERROR_DIR).join(DRIVER_NAME), b"\\builtin eval \"$__ab_cmd\"\n")
}

/// Writes the file `zsh` of `dir` (mode 0600) for `command` (see the module docs).
// A small file per command, on the runtime directory's memory file system: see `local::open_fifo`.
#[allow(clippy::disallowed_methods)]
pub fn write_command(dir: &Path, command: &str) -> io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(dir.join(DRIVER_NAME))?;
    f.write_all(driver_text(command).as_bytes())
}

/// The text of the file `zsh`: the prefix on line 1, the user's text, the end mark.
fn driver_text(command: &str) -> String {
    let mut text = String::with_capacity(command.len() + 200);
    text.push_str(
        "{ \\builtin cd -q -- \"$__ab_w\";} 2>/dev/null||\\builtin return 1;\
         { OLDPWD=$__ab_o;dirstack=(\"${__ab_k[@]}\");} 2>/dev/null;",
    );
    text.push_str(command);
    let trailing_backslashes = command.bytes().rev().take_while(|&b| b == b'\\').count();
    if trailing_backslashes % 2 == 0 && !crate::shellwords::ends_in_heredoc(command) {
        text.push_str("\n\n{ __ab_ok=$?;} 2>/dev/null\n");
    }
    text
}

/// The protocol text that runs the command of `dir`'s file `zsh` in `cwd` (already quoted)
/// with `redirect` applied to it, leaving its `zsh -c` status in `$__ab_r`. No reserved word
/// starts a line and every builtin is escaped, so a user's alias changes nothing.
pub fn protocol(dir: &Path, command: &str, cwd: &str, redirect: &str) -> String {
    let d = quote(&dir.to_string_lossy());
    let p = quote(&dir.join(PARSE_ERROR_DIR).to_string_lossy());
    format!(
        "__ab_cmd={cmd};__ab_w={cwd};__ab_o=$OLDPWD;__ab_k=(\"${{dirstack[@]}}\");__ab_ok=;__ab_d={d};__ab_e=$options[evallineno]\n\
         functions[__ab_p]=$__ab_cmd 2>/dev/null\n\
         (( $+functions[__ab_p] ))&&\\builtin unfunction __ab_p||{{ __ab_d={p};options[evallineno]=off;}}\n\
         \\builtin cd -q -- \"$__ab_d\"&&\\builtin source {DRIVER_NAME} {redirect};__ab_r=$?\n\
         [[ $__ab_d = {p} ]]&&options[evallineno]=$__ab_e\n\
         [[ -n $__ab_ok ]]&&__ab_r=$__ab_ok\n\
         [[ $__ab_r = 126 && -z $__ab_ok ]]&&__ab_r=1\n",
        cmd = quote(command),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_end_mark_is_left_out_where_it_would_join_the_text() {
        assert!(driver_text("echo a").ends_with("\n\n{ __ab_ok=$?;} 2>/dev/null\n"));
        assert!(driver_text("echo a\\\\").contains("__ab_ok"));
        for open in ["echo a \\", "cat <<EOF\nno end"] {
            assert!(!driver_text(open).contains("__ab_ok"), "{open:?}");
        }
    }
}
