//! Every container of every workload: its environment, its command line expanded, the
//! binary it runs (which its image must hold) and what that binary's parser makes of it.

use crate::Finding;
use crate::binaries::{self, Binary, Parsed};
use crate::env::{Environment, environment};
use crate::manifest::Manifests;
use crate::pod::{Container, Workload, workloads};

/// One container, understood.
#[derive(Debug, Clone)]
pub struct Analyzed<'a> {
    /// The container.
    pub container: Container<'a>,
    /// Its environment.
    pub env: Environment,
    /// Its command line, expanded.
    pub argv: Vec<String>,
    /// What its binary's parser made of it (`None` when it did not parse).
    pub parsed: Option<Parsed>,
}

/// A workload and its containers, understood.
#[derive(Debug, Clone)]
pub struct Pod<'a> {
    /// The workload.
    pub workload: Workload<'a>,
    /// Its containers, init containers first.
    pub containers: Vec<Analyzed<'a>>,
}

impl Pod<'_> {
    /// The finding's subject for container `name`.
    pub fn id(&self, container: &str) -> String {
        format!("{} container {container}", self.workload.object.id())
    }
}

/// Analyzes every workload; what does not hold goes to `findings`.
pub fn analyze<'a>(manifests: &'a Manifests, findings: &mut Vec<Finding>) -> Vec<Pod<'a>> {
    workloads(manifests)
        .into_iter()
        .map(|workload| {
            let containers = workload
                .containers()
                .into_iter()
                .map(|container| analyze_container(manifests, &workload, container, findings))
                .collect();
            Pod {
                workload,
                containers,
            }
        })
        .collect()
}

fn analyze_container<'a>(
    manifests: &Manifests,
    workload: &Workload<'a>,
    container: Container<'a>,
    findings: &mut Vec<Finding>,
) -> Analyzed<'a> {
    let id = format!("{} container {}", workload.object.id(), container.name());
    let env = environment(manifests, workload, &container);
    for problem in &env.problems {
        findings.push(Finding::new(&id, problem.clone()));
    }
    let raw = container.argv();
    let mut argv = Vec::with_capacity(raw.len());
    for arg in &raw {
        for name in Environment::referenced(arg) {
            let Some(service) = env.vars.get(&name).and_then(|var| var.service) else {
                continue;
            };
            if service > workload.object.index {
                findings.push(Finding::new(
                    &id,
                    format!("{arg:?} uses {name}, but its Service comes after the workload: pods created first lack it"),
                ));
            }
        }
        match env.expand(arg) {
            Ok(expanded) => argv.push(expanded),
            Err(missing) => {
                findings.push(Finding::new(
                    &id,
                    format!(
                        "{arg:?}: no variable {} in the container's environment",
                        missing.join(", ")
                    ),
                ));
                argv.push(arg.clone());
            }
        }
    }
    let parsed = parse_checked(&id, container.image(), &argv, &env, findings);
    Analyzed {
        container,
        env,
        argv,
        parsed,
    }
}

/// Parses a command line run in `image` (a container's command, or an exec probe's) with
/// its binary's parser; what does not hold goes to `findings`.
pub fn parse_checked(
    id: &str,
    image: &str,
    argv: &[String],
    env: &Environment,
    findings: &mut Vec<Finding>,
) -> Option<Parsed> {
    let Some(program) = argv.first() else {
        findings.push(Finding::new(id, "no command: the image's entrypoint is unknown to these checks (FROM scratch images need an explicit command)"));
        return None;
    };
    let Some(contents) = binaries::image_binaries(image) else {
        findings.push(Finding::new(
            id,
            format!("image {image:?} is not one these checks know"),
        ));
        return None;
    };
    if !contents.contains(&program.as_str()) {
        findings.push(Finding::new(
            id,
            format!(
                "{program:?} is not in image {image} (it holds {})",
                contents.join(", ")
            ),
        ));
        return None;
    }
    let binary = Binary::from_path(program)?;
    match binaries::parse(binary, argv, env) {
        Ok(parsed) => Some(parsed),
        Err(why) => {
            let first = why.lines().next().unwrap_or_default();
            findings.push(Finding::new(
                id,
                format!("{program} refuses its arguments {:?}: {first}", &argv[1..]),
            ));
            None
        }
    }
}
