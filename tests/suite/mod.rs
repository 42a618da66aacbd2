//! Integration suites, one file per area.

mod agents;
/// Each listed test, `async fn name(shell: &str)`, runs in bash and in zsh (contract §5: the user's
/// shell is either): as `<file>::bash::name` and `<file>::zsh::name`, the zsh oracle being
/// `zsh -c` where the bash one is `bash -c`.
macro_rules! in_each_shell {
    ($($name:ident),* $(,)?) => {
        mod bash {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
              async fn $name() { super::$name("/bin/bash").await })*
        }
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
mod security;
mod shell;
mod spawn;
pub mod sshd;
mod support;
mod wires;
