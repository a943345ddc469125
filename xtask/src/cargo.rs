//! Running cargo for the test suite and the scenario binary.

use std::process::Command;

use anyhow::{Context, bail};

use crate::setup;

/// The package that holds the demo and the benchmarks.
const SCENARIOS: &str = "meshwork-scenarios";

fn cargo() -> Command {
    Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
}

fn run(step: &str, command: &mut Command) -> anyhow::Result<()> {
    eprintln!("==> {step}");
    let status = command
        .status()
        .with_context(|| format!("starting {step}"))?;
    if !status.success() {
        bail!("{step} failed ({status})");
    }
    Ok(())
}

/// The README's test command: setup, formatting, lints, then both tiers of tests — the plain
/// ones `cargo test` runs, and the real-component ones (`#[ignore]`d there because they need
/// etcd, moto, wireguard-go, bpffs or root), which setup made possible — and then the dev
/// stack's checks on Docker (`dev test`, which removes the stack even when a check fails).
pub fn test_suite(runner_args: &[String]) -> anyhow::Result<()> {
    setup::run()?;
    run(
        "cargo fmt --check",
        cargo().args(["fmt", "--all", "--", "--check"]),
    )?;
    run(
        "cargo clippy --all-targets -- -D warnings",
        cargo().args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]),
    )?;
    if has_nextest() {
        run(
            "cargo nextest run --workspace --run-ignored all",
            cargo()
                .args(["nextest", "run", "--workspace", "--no-fail-fast"])
                .args(["--run-ignored", "all"])
                .args(runner_args),
        )?;
    } else {
        run(
            "cargo test --workspace -- --include-ignored",
            cargo()
                .args(["test", "--workspace", "--no-fail-fast", "--"])
                .arg("--include-ignored")
                .args(runner_args),
        )?;
    }
    if !runner_args.is_empty() {
        eprintln!("==> dev test skipped: the test runner was given arguments (a filter)");
        return Ok(());
    }
    run_scenario(false, crate::DEV_BINARIES, &["dev", "test"])
}

fn has_nextest() -> bool {
    cargo()
        .args(["nextest", "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Builds and runs the scenario binary with `args` (`release` for benchmarks). The
/// `packages` (the binaries the scenario runs) are built in the same cargo invocation as the
/// scenario binary, with the same profile: scenarios run them from beside their own
/// executable, and one invocation unifies the dependencies' features once (two invocations
/// with different package sets built aws-sdk-ec2 twice, a quarter of an hour in release).
pub fn run_scenario(release: bool, packages: &[&str], args: &[&str]) -> anyhow::Result<()> {
    let mut build = cargo();
    build.args(["build", "--quiet", "--package", SCENARIOS]);
    for package in packages {
        build.args(["--package", package]);
    }
    if release {
        build.arg("--release");
    }
    let built: Vec<&str> = std::iter::once(SCENARIOS)
        .chain(packages.iter().copied())
        .collect();
    run(&format!("cargo build {}", built.join(" ")), &mut build)?;
    let profile = if release { "release" } else { "debug" };
    let scenarios = target_dir().join(profile).join(SCENARIOS);
    run(
        &format!("meshwork-scenarios {}", args.join(" ")),
        Command::new(&scenarios).args(args),
    )
}

/// Cargo's target directory: `$CARGO_TARGET_DIR`, else `target/` at the workspace root.
fn target_dir() -> std::path::PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(
        || {
            std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                .parent()
                .expect("xtask lives in the workspace")
                .join("target")
        },
        std::path::PathBuf::from,
    )
}
