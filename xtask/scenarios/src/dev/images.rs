//! `meshwork-scenarios images` (`cargo xtask images`): the dev stack's images, built here
//! without pulling anything (no registry is reachable): each `FROM scratch` with `COPY` of a
//! root filesystem holding the workspace's binaries of the current build (beside this
//! binary), the Debian-packaged programs they need, and exactly the shared libraries `ldd`
//! lists for them; Docker's legacy builder (`DOCKER_BUILDKIT=0`); tags
//! `meshwork/<component>:dev`.
//!
//! | image | holds | entrypoint |
//! |---|---|---|
//! | `meshwork/etcd:dev` | Debian's `etcd`, `etcdctl` | `etcd` |
//! | `meshwork/apiserver:dev` | `meshwork-apiserver` (also kvstoremesh), `meshctl` (the probe) | `meshwork-apiserver` |
//! | `meshwork/operator:dev` | `meshwork-operator`, `meshctl` (the probe) | `meshwork-operator` |
//! | `meshwork/agent:dev` (the nodes) | `meshwork-agent`, `meshctl`, `meshwork-cni` (+ its conflist, by `meshwork-cni install`), `meshwork-devnode`, Debian's `wireguard-go` | `meshwork-devnode node` |
//! | `meshwork/moto:dev` | Debian's Python 3.11, `moto[server,ec2]`'s closure, the lab's patch module | `python -m meshwork_moto` |

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context as _, bail};

use super::python;
use super::rootfs::Rootfs;
use crate::binaries;

/// The label every image carries, so that `dev down` finds them.
pub const LABEL: &str = "io.meshwork.dev=1";
/// The tag of every image.
pub const TAG: &str = "dev";

/// One image: its component name and how its root is laid out.
struct Image {
    component: &'static str,
    entrypoint: &'static [&'static str],
    env: &'static [&'static str],
    lay_out: fn(&mut Rootfs) -> anyhow::Result<String>,
}

const IMAGES: &[Image] = &[
    Image {
        component: "etcd",
        entrypoint: &["/usr/bin/etcd"],
        env: &[],
        lay_out: etcd,
    },
    Image {
        component: "apiserver",
        entrypoint: &["/usr/bin/meshwork-apiserver"],
        env: &[],
        lay_out: apiserver,
    },
    Image {
        component: "operator",
        entrypoint: &["/usr/bin/meshwork-operator"],
        env: &[],
        lay_out: operator,
    },
    Image {
        component: "agent",
        entrypoint: &["/usr/bin/meshwork-devnode", "node"],
        env: &[],
        lay_out: node,
    },
    Image {
        component: "moto",
        entrypoint: &["/opt/venv/bin/python", "-m", "meshwork_moto"],
        env: &[
            "PYTHONPATH=/opt/meshwork/moto",
            "PYTHONUNBUFFERED=1",
            "PYTHONDONTWRITEBYTECODE=1",
        ],
        lay_out: moto,
    },
];

/// The image name of `component`.
pub fn name(component: &str) -> String {
    format!("meshwork/{component}:{TAG}")
}

/// Builds every image; prints one line each.
pub fn build_all() -> anyhow::Result<()> {
    let work = std::env::current_exe()?
        .parent()
        .context("the scenario binary's directory")?
        .join("dev-images");
    if work.exists() {
        std::fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    }
    let started = Instant::now();
    for image in IMAGES {
        build(image, &work.join(image.component))?;
    }
    std::fs::remove_dir_all(&work).with_context(|| format!("removing {}", work.display()))?;
    println!(
        "{} images built in {:.1} s",
        IMAGES.len(),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn build(image: &Image, context: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut root = Rootfs::new(&context.join("rootfs"))?;
    let what = (image.lay_out)(&mut root)?;
    let env: String = image.env.iter().map(|var| format!("ENV {var}\n")).collect();
    let entrypoint = serde_json::to_string(image.entrypoint)?;
    std::fs::write(
        context.join("Dockerfile"),
        format!(
            "FROM scratch\nLABEL {LABEL}\nCOPY rootfs/ /\nENV PATH=/usr/bin:/usr/sbin\n{env}\
             ENTRYPOINT {entrypoint}\n"
        ),
    )?;
    let tag = name(image.component);
    let replaced = image_id(&tag);
    let out = Command::new("docker")
        .args(["build", "--quiet", "--force-rm", "--tag", &tag])
        .arg(context)
        .env("DOCKER_BUILDKIT", "0")
        .output()
        .context("running docker build")?;
    if !out.status.success() {
        bail!(
            "docker build of {tag} failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    std::fs::remove_dir_all(context)?;
    // The image the tag named before (and its builder's intermediates) would be left
    // dangling; one a container still runs stays until `dev down`.
    if let Some(old) = replaced.filter(|old| image_id(&tag).as_ref() != Some(old)) {
        let _ = Command::new("docker").args(["rmi", &old]).output();
    }
    println!(
        "{tag:<26} {what} ({:.1} s)",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// The ID of the image `reference`, if there is one.
fn image_id(reference: &str) -> Option<String> {
    let out = Command::new("docker")
        .args(["image", "inspect", "--format", "{{.Id}}", reference])
        .output()
        .ok()?;
    let id = String::from_utf8_lossy(&out.stdout).trim().to_owned();
    (out.status.success() && !id.is_empty()).then_some(id)
}

/// Removes every image carrying [`LABEL`] (tagged, dangling and the builder's
/// intermediates) that no container uses; how many went.
pub fn remove_all() -> usize {
    let mut removed = 0;
    // A parent goes only after its children: repeat while something goes.
    loop {
        let listed = Command::new("docker")
            .args(["images", "--all", "--quiet", "--no-trunc"])
            .args(["--filter", &format!("label={LABEL}")])
            .output();
        let ids: Vec<String> = listed
            .map(|out| {
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default();
        let before = removed;
        for id in ids {
            let tags = Command::new("docker")
                .args([
                    "image",
                    "inspect",
                    "--format",
                    "{{join .RepoTags \" \"}}",
                    &id,
                ])
                .output()
                .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
                .unwrap_or_default();
            let mut rmi = Command::new("docker");
            rmi.arg("rmi");
            // A tagged image goes by its tags (an ID with several tags needs --force).
            if tags.is_empty() {
                rmi.arg(&id);
            } else {
                rmi.args(tags.split(' '));
            }
            if rmi.output().is_ok_and(|out| out.status.success()) {
                removed += 1;
            }
        }
        if removed == before {
            return removed;
        }
    }
}

/// A binary of the workspace's current build (beside this one).
fn workspace_binary(name: &str) -> anyhow::Result<PathBuf> {
    binaries::beside(name)
}

fn etcd(root: &mut Rootfs) -> anyhow::Result<String> {
    root.binary(Path::new("/usr/bin/etcd"), "/usr/bin/etcd")?;
    root.binary(Path::new("/usr/bin/etcdctl"), "/usr/bin/etcdctl")?;
    root.dir_with_mode("/var/lib/etcd", 0o700)?;
    Ok("Debian's etcd, etcdctl".to_owned())
}

fn apiserver(root: &mut Rootfs) -> anyhow::Result<String> {
    for name in ["meshwork-apiserver", "meshctl"] {
        root.binary(&workspace_binary(name)?, &format!("/usr/bin/{name}"))?;
    }
    Ok("meshwork-apiserver, meshctl".to_owned())
}

fn operator(root: &mut Rootfs) -> anyhow::Result<String> {
    for name in ["meshwork-operator", "meshctl"] {
        root.binary(&workspace_binary(name)?, &format!("/usr/bin/{name}"))?;
    }
    ca_certificates(root)?;
    Ok("meshwork-operator, meshctl, Debian's CA bundle".to_owned())
}

/// Debian's CA bundle: the AWS SDK's HTTPS client loads the system's root certificates when
/// it is built (it panics on none), even for moto's `http://` endpoint.
fn ca_certificates(root: &mut Rootfs) -> anyhow::Result<()> {
    const BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";
    root.file(Path::new(BUNDLE), BUNDLE)
}

fn node(root: &mut Rootfs) -> anyhow::Result<String> {
    for name in ["meshwork-agent", "meshctl", "meshwork-devnode"] {
        root.binary(&workspace_binary(name)?, &format!("/usr/bin/{name}"))?;
    }
    root.binary(Path::new("/usr/bin/wireguard-go"), "/usr/bin/wireguard-go")?;
    // The plugin installs itself and its conflist, as the agent's init container would.
    let cni = workspace_binary("meshwork-cni")?;
    root.dir_with_mode("/opt/cni/bin", 0o755)?;
    root.dir_with_mode("/etc/cni/net.d", 0o755)?;
    let out = Command::new(&cni)
        .arg("install")
        .arg("--cni-bin-dir")
        .arg(root.path("/opt/cni/bin"))
        .arg("--cni-conf-dir")
        .arg(root.path("/etc/cni/net.d"))
        .args(["--agent-socket", "/run/meshwork/agent.sock"])
        .output()
        .context("running meshwork-cni install")?;
    if !out.status.success() {
        bail!(
            "meshwork-cni install: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    root.libs_of(&cni)?;
    // `meshwork-devnode eni-scene` talks to moto through the AWS SDK.
    ca_certificates(root)?;
    Ok(
        "meshwork-agent, meshctl, meshwork-cni, meshwork-devnode, Debian's wireguard-go and CA bundle"
            .to_owned(),
    )
}

fn moto(root: &mut Rootfs) -> anyhow::Result<String> {
    let distributions = python::lay_out(root)?;
    Ok(format!(
        "Debian's Python 3.11, {} ({distributions} distributions), meshwork_moto",
        python::REQUIREMENT
    ))
}
