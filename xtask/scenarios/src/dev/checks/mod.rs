//! `cargo xtask dev test`: the stack from fresh images, the checks on it, and everything
//! removed again — also when a check fails.
//!
//! 0. a node refuses the host's cgroup namespace ([`cgroupns`]: its safety check can fail);
//! 1. every agent reaches 1/1 remote clusters ready;
//! 2. pods through `meshwork-cni`: pod B gets an ENI address from the operator, which the
//!    agent and EC2 (moto) agree on;
//! 3. the no-drop proof on compose ([`restart`]): with the bounded wait 0 drops and no gap,
//!    and the negative control (0s) drops;
//! 4. cluster-2 cut off the shared network and put back ([`partition`]).

mod cgroupns;
mod partition;
mod pods;
mod restart;

use std::time::{Duration, Instant};

use super::stack;

/// How long the agents may take to have every remote cluster ready once compose is up.
const CONVERGE_TIMEOUT: Duration = Duration::from_secs(120);

/// One check's outcome.
struct Outcome {
    name: &'static str,
    took: Duration,
    error: Option<String>,
}

/// Runs the whole test; the stack is removed at the end whatever happened.
pub fn run() -> anyhow::Result<()> {
    let started = Instant::now();
    // Whatever an earlier run left goes first (its images stay: they are rebuilt anyway).
    stack::down(true)?;
    let mut outcomes = Vec::new();
    let checked = run_checks(&mut outcomes);
    println!("\n==> removing the stack");
    let removed = stack::down(false);
    println!("\ndev test:");
    for outcome in &outcomes {
        match &outcome.error {
            None => println!(
                "  ok     {:<48} {:>6.1} s",
                outcome.name,
                outcome.took.as_secs_f64()
            ),
            Some(error) => println!(
                "  FAILED {:<48} {:>6.1} s: {error}",
                outcome.name,
                outcome.took.as_secs_f64()
            ),
        }
    }
    let failed = outcomes.iter().filter(|o| o.error.is_some()).count();
    println!(
        "dev test: {} of {} checks ok in {:.0} s",
        outcomes.len() - failed,
        outcomes.len(),
        started.elapsed().as_secs_f64()
    );
    checked?;
    removed?;
    anyhow::ensure!(failed == 0, "{failed} dev stack check(s) failed");
    Ok(())
}

/// Runs `check`, recording its outcome; its value, or `None` when it failed.
fn check<T>(
    outcomes: &mut Vec<Outcome>,
    name: &'static str,
    check: impl FnOnce() -> anyhow::Result<T>,
) -> Option<T> {
    println!("\n==> {name}");
    let started = Instant::now();
    let result = check();
    let error = result.as_ref().err().map(|err| format!("{err:#}"));
    if let Some(error) = &error {
        println!("  FAILED: {error}");
    }
    outcomes.push(Outcome {
        name,
        took: started.elapsed(),
        error,
    });
    result.ok()
}

/// The checks in order; a check whose prerequisites failed is not run.
fn run_checks(outcomes: &mut Vec<Outcome>) -> anyhow::Result<()> {
    check(outcomes, "images built, the stack up", || {
        super::images::build_all()?;
        super::compose::up()
    })
    .ok_or_else(|| anyhow::anyhow!("the stack did not come up"))?;
    check(
        outcomes,
        "a node refuses the host's cgroup namespace",
        cgroupns::node_refuses_the_hosts_cgroup_namespace,
    );
    check(outcomes, "every agent: 1/1 remote clusters ready", || {
        let took = stack::wait_converged(CONVERGE_TIMEOUT)?;
        println!(
            "  converged {:.1} s after compose was up",
            took.as_secs_f64()
        );
        Ok(())
    })
    .ok_or_else(|| anyhow::anyhow!("the mesh did not converge"))?;
    let pods = check(
        outcomes,
        "an ENI address for a pod through meshwork-cni",
        pods::add_both,
    )
    .ok_or_else(|| anyhow::anyhow!("the pods could not be added"))?;
    check(
        outcomes,
        "agent restart: 0 drops with the wait, drops at 0s",
        || restart::prove(&pods),
    );
    check(outcomes, "cluster-2 disconnected and reconnected", || {
        stack::wait_converged(CONVERGE_TIMEOUT)?;
        partition::run(&pods)
    });
    Ok(())
}
