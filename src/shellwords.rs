//! A small shell-aware scanner shared by normalization (§1) and interception (§2).
//!
//! It understands enough of POSIX/bash syntax to tell what is at top level: quotes, escapes,
//! `$(…)`, backticks, `${…}`, comments, heredocs, and the operators `;` `&` `&&` `||` `|` `|&`
//! and newlines. It is not a parser: anything it does not understand is treated as a word.
