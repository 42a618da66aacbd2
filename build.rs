//! Builds the bash loadable builtin (`src/shell/runner.c` and its spawn path `src/shell/spawn.c`)
//! into `$OUT_DIR/spawn.so`, which the
//! binary embeds (`src/shell/local.rs`, `SPAWN_SO`). Without a C compiler, or off Linux, the
//! file is empty and sessions fork for external commands as bash does.

use std::path::PathBuf;

#[allow(clippy::disallowed_methods)] // a build script: blocking file calls are the point
fn main() {
    let srcs = ["src/shell/runner.c", "src/shell/spawn.c"];
    let src = srcs.join(" ");
    for src in srcs {
        println!("cargo:rerun-if-changed={src}");
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap_or_default()).join("spawn.so");
    let linux = std::env::var("CARGO_CFG_TARGET_OS").is_ok_and(|os| os == "linux");
    let built = linux
        && match cc::Build::new().try_get_compiler() {
            Ok(tool) => {
                let mut cmd = tool.to_command();
                // `-z now`: every symbol it takes from bash is bound when bash loads it, so a
                // bash without one refuses the `enable -f` (the session then forks) instead of
                // dying at the first call.
                cmd.args(["-O2", "-fPIC", "-shared", "-Wall", "-Wl,-z,now", "-o"])
                    .arg(&out)
                    .args(srcs);
                match cmd.status() {
                    Ok(st) if st.success() => true,
                    Ok(st) => {
                        println!("cargo:warning=compiling {src} failed ({st}): sessions use the plain-bash driver");
                        false
                    }
                    Err(e) => {
                        println!(
                            "cargo:warning=cannot run the C compiler ({e}): sessions use the plain-bash driver"
                        );
                        false
                    }
                }
            }
            Err(e) => {
                println!("cargo:warning=no C compiler ({e}): sessions use the plain-bash driver");
                false
            }
        };
    if !built {
        std::fs::write(&out, b"").unwrap_or_else(|e| panic!("cannot write {out:?}: {e}"));
    }
}
