//! Builds the datapath's BPF programs (C, `bpf/*.c`) with clang: Rust stable has no BPF target
//! here, and Cilium's own datapath is C too.

use std::env;
use std::path::PathBuf;
use std::process::Command;

/// The programs, by file stem under `bpf/`.
const PROGRAMS: &[&str] = &["endpoint", "sock_lb"];

fn main() {
    println!("cargo:rerun-if-changed=bpf");
    println!("cargo:rerun-if-env-changed=CLANG");
    let out = PathBuf::from(env::var_os("OUT_DIR").expect("cargo sets OUT_DIR"));
    let clang = env::var("CLANG").unwrap_or_else(|_| "clang".to_owned());
    let arch = env::var("CARGO_CFG_TARGET_ARCH").unwrap_or_else(|_| "x86_64".to_owned());
    // Debian keeps asm/types.h under the multiarch directory.
    let multiarch = format!("/usr/include/{arch}-linux-gnu");
    for program in PROGRAMS {
        let source = format!("bpf/{program}.c");
        let object = out.join(format!("{program}.o"));
        let status = Command::new(&clang)
            .args(["-O2", "-g", "-Wall", "-Werror", "-target", "bpf"])
            .arg(format!("-I{multiarch}"))
            .args(["-c", &source, "-o"])
            .arg(&object)
            .status();
        match status {
            Ok(status) if status.success() => {}
            Ok(status) => panic!(
                "clang failed to build {source} ({status}); the BPF headers come from \
                 libbpf-dev: run `cargo xtask setup`"
            ),
            Err(err) => panic!(
                "cannot run `{clang}` to build the BPF program {source}: {err}. \
                 Install clang and libbpf-dev with `cargo xtask setup` (or set CLANG)"
            ),
        }
    }
}
