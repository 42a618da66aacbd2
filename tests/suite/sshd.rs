//! A private OpenSSH server on loopback with throwaway keys, for the remote tests
//! (tests/suite/remote.rs) and the bench's remote section (benches/bench.rs includes this file).
#![allow(dead_code)] // the bench uses part of it

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SSHD: &str = "/usr/sbin/sshd";

/// A private sshd on 127.0.0.1 and a free port, killed on drop.
pub struct Sshd {
    child: Child,
    pub dir: tempfile::TempDir,
    pub port: u16,
}

impl Sshd {
    pub fn start() -> Sshd {
        assert!(
            Path::new(SSHD).exists(),
            "{SSHD} is missing: run scripts/sshd.sh (scripts/test.sh does) to install openssh-server"
        );
        // Privilege separation needs this directory (the package creates it at boot only).
        std::fs::create_dir_all("/run/sshd").unwrap();
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        for key in ["host", "user"] {
            let st = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-f"])
                .arg(d.join(key))
                .stdin(Stdio::null())
                .status()
                .unwrap();
            assert!(st.success(), "ssh-keygen failed");
        }
        std::fs::copy(d.join("user.pub"), d.join("authorized_keys")).unwrap();
        // The remote login gets a private, empty HOME (`SetEnv` overrides sshd's default), as
        // the local suites give their shells one: the machine's own rc files (a slow or locked
        // `pyenv rehash` in root's .bashrc) are not what these tests are about.
        std::fs::create_dir(d.join("home")).unwrap();
        let mut attempt = 0;
        loop {
            attempt += 1;
            let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let config = format!(
                "ListenAddress 127.0.0.1\nPort {port}\nHostKey {host}\nAuthorizedKeysFile {ak}\n\
                 PasswordAuthentication no\nKbdInteractiveAuthentication no\nUsePAM no\n\
                 StrictModes no\nPermitRootLogin prohibit-password\nPidFile {pid}\n\
                 MaxStartups 100\nMaxSessions 100\nSetEnv HOME={home}\n",
                home = d.join("home").display(),
                host = d.join("host").display(),
                ak = d.join("authorized_keys").display(),
                pid = d.join("sshd.pid").display(),
            );
            std::fs::write(d.join("sshd_config"), config).unwrap();
            let mut child = Command::new(SSHD)
                .args(["-D", "-e", "-f"])
                .arg(d.join("sshd_config"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(d.join("sshd.log")).unwrap())
                .spawn()
                .unwrap();
            // Wait for the port with a deadline, watching that sshd is still alive.
            let deadline = Instant::now() + Duration::from_secs(20);
            let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
            let up = loop {
                if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
                    break true;
                }
                if child.try_wait().unwrap().is_some() || Instant::now() >= deadline {
                    break false;
                }
                std::thread::sleep(Duration::from_millis(10));
            };
            if up {
                return Sshd { child, dir, port };
            }
            let _ = child.kill();
            let _ = child.wait();
            let log = std::fs::read_to_string(d.join("sshd.log")).unwrap_or_default();
            assert!(attempt < 5, "sshd did not start on port {port}:\n{log}");
        }
    }

    /// The remote login's HOME.
    pub fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    /// The profile: ssh with the throwaway key, no prompts, no known-hosts file.
    pub fn argv(&self) -> Vec<String> {
        let key = self.dir.path().join("user");
        [
            "ssh",
            "-T",
            "-i",
            &key.to_string_lossy(),
            "-p",
            &self.port.to_string(),
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=no",
            "-o",
            "UserKnownHostsFile=/dev/null",
            "-o",
            "LogLevel=ERROR",
            "root@127.0.0.1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// Runs `script` over a second, independent ssh connection; its stdout.
    pub fn ssh(&self, script: &str) -> String {
        let argv = self.argv();
        let out = Command::new(&argv[0])
            .args(&argv[1..])
            .arg(script)
            .stdin(Stdio::null())
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Remote processes whose command line matches `pattern` (pgrep over a second ssh).
    pub fn remote_pgrep(&self, pattern: &str) -> String {
        // `[x]yz` keeps the pgrep (and the shell running it) from matching itself.
        let (first, rest) = pattern.split_at(1);
        self.ssh(&format!("pgrep -af '[{first}]{rest}' || true")).trim().to_string()
    }

    /// The per-connection sshd processes (children of ours).
    pub fn connection_pids(&self) -> Vec<i32> {
        let ours = self.child.id() as i32;
        let mut out = Vec::new();
        for e in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else { continue };
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            let ppid = stat.rsplit(')').next().and_then(|r| r.split_whitespace().nth(1));
            if ppid.and_then(|p| p.parse::<i32>().ok()) == Some(ours) {
                out.push(pid);
            }
        }
        out
    }
}

impl Drop for Sshd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
