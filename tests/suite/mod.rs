//! Integration suites, one file per area.

mod agents;
/// Each listed test, `async fn name(shell: &str)`, runs in every bash of the version matrix
/// (contract §5: a session is one script on every bash from 3.2 to 5.3): as `<file>::bash::name`
/// with the machine's `/bin/bash` (5.2), and `<file>::bash_3_2::name`, `bash_4_4`, `bash_5_3`
/// with the builds in `../shared/bash/` ([`support::bash_build`]: a missing build fails the test,
/// never skips it). The test's oracle is the same bash (`<shell> -c`).
macro_rules! in_each_bash {
    ($($name:ident),* $(,)?) => {
        mod bash {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
              async fn $name() { super::$name("/bin/bash").await })*
        }
        mod bash_3_2 {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
              async fn $name() { super::$name(crate::suite::support::bash_build("3.2")).await })*
        }
        mod bash_4_4 {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
              async fn $name() { super::$name(crate::suite::support::bash_build("4.4")).await })*
        }
        mod bash_5_3 {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
              async fn $name() { super::$name(crate::suite::support::bash_build("5.3")).await })*
        }
    };
}

/// [`in_each_bash`], and in zsh (contract §5: the user's shell is either): `<file>::zsh::name`,
/// the zsh oracle being `zsh -c` where the bash one is `bash -c`.
macro_rules! in_each_shell {
    ($($name:ident),* $(,)?) => {
        in_each_bash!($($name),*);
        mod zsh {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
              async fn $name() { super::$name(crate::suite::support::ZSH).await })*
        }
    };
}

mod changes;
mod differential;
mod editor;
mod exec;
mod explain;
mod faults;
mod fence;
mod install;
mod load;
mod mcp;
mod nvim;
mod nvim_faults;
mod pipeline;
mod pty;
mod rc;
mod receipt;
mod remote;
mod rescue;
mod rpc;
mod script;
mod security;
mod sessions;
mod shell;
mod spawn;
pub mod sshd;
mod support;
mod wires;
