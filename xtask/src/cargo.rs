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
/// etcd, moto, wireguard-go, bpffs or root), which setup made possible.
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
        )
    } else {
        run(
            "cargo test --workspace -- --include-ignored",
            cargo()
                .args(["test", "--workspace", "--no-fail-fast", "--"])
                .arg("--include-ignored")
                .args(runner_args),
        )
    }
}

fn has_nextest() -> bool {
    cargo()
        .args(["nextest", "--version"])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// Builds and runs the scenario binary with `args` (`release` for benchmarks). The
/// `packages` (the binaries the scenario runs) are built with the same profile first:
/// scenarios run them from beside their own executable.
pub fn run_scenario(release: bool, packages: &[&str], args: &[&str]) -> anyhow::Result<()> {
    if !packages.is_empty() {
        let mut build = cargo();
        build.args(["build", "--quiet"]);
        for package in packages {
            build.args(["--package", package]);
        }
        if release {
            build.arg("--release");
        }
        run(&format!("cargo build {}", packages.join(" ")), &mut build)?;
    }
    let mut command = cargo();
    command.args(["run", "--quiet", "--package", SCENARIOS]);
    if release {
        command.arg("--release");
    }
    command.arg("--").args(args);
    run(
        &format!("meshwork-scenarios {}", args.join(" ")),
        &mut command,
    )
}
