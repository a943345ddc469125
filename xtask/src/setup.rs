//! `cargo xtask setup`: installs what Meshwork needs on Debian 12 (bookworm). Idempotent.
//!
//! Each component in [`COMPONENTS`] is detected by the program or file its Debian package
//! provides, not by `dpkg` alone. Only when something is missing does setup run
//! `apt-get update` (once) and one `apt-get install` for all missing packages; if that batch
//! fails, it retries the packages one by one so the report can say which failed and why.
//! Then the Python venv `<cache>/venv` (moto, boto3, kubernetes-validate, grpcio) is created and
//! filled, if its checks fail. The cache dir is `$MESHWORK_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/meshwork`, else `$HOME/.cache/meshwork` (the lab resolves the same).
//!
//! Then Docker's daemon (for the dev stack) is started when none runs ([`docker`]).
//! kubectl, which Debian does not package, is only reported ([`kubectl`]).
//!
//! Prints one line per component (`present`, `installed`, `started` or `failed: <why>`) and fails,
//! naming the components, when one can't be had. Installing needs root; when nothing is
//! missing, any user may run it. A run that finds everything present is fast: no
//! `apt-get update`, no pip.

mod apt;
mod cache;
mod cmd;
mod docker;
mod kubectl;
mod probe;
mod venv;

use std::collections::HashMap;
use std::path::Path;
use std::thread;

use anyhow::bail;

use self::cache::CacheDir;
use self::probe::{Component, Probe};

/// What Meshwork needs from Debian, in report order: name, Debian package, check.
const COMPONENTS: &[Component] = &[
    Component::program("etcd", "etcd-server", &["etcd"], &["--version"]),
    Component::program("etcdctl", "etcd-client", &["etcdctl"], &["version"]),
    Component::program("wg", "wireguard-tools", &["wg"], &["--version"]),
    Component::program(
        "wireguard-go",
        "wireguard-go",
        &["wireguard-go"],
        &["--version"],
    ),
    Component::program("clang", "clang", &["clang"], &["--version"]),
    Component::program(
        "llvm",
        "llvm",
        &["llvm-strip", "llvm-objdump"],
        &["--version"],
    ),
    Component::file(
        "libbpf headers",
        "libbpf-dev",
        "/usr/include/bpf/bpf_helpers.h",
    ),
    Component::program("bpftool", "bpftool", &["bpftool"], &["--version"]),
    Component::program("ip", "iproute2", &["ip"], &["-V"]),
    Component::program("nft", "nftables", &["nft"], &["--version"]),
    Component::program("openssl", "openssl", &["openssl"], &["version"]),
    Component::program("promtool", "prometheus", &["promtool"], &["--version"]),
    // `meshctl timeline --png` rasterises its text from a font file.
    Component::file(
        "DejaVu fonts",
        "fonts-dejavu-core",
        "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    ),
    Component::python_venv("python3-venv", "python3-venv"),
    Component::program("protoc", "protobuf-compiler", &["protoc"], &["--version"]),
    Component::file(
        "protobuf headers",
        "libprotobuf-dev",
        "/usr/include/google/protobuf/descriptor.proto",
    ),
    Component::program("nsenter", "util-linux", &["nsenter"], &["--version"]),
    Component::program("ps", "procps", &["ps"], &["--version"]),
    // A real CNI runtime runs meshwork-cni in the tests: podman with its CNI backend (the
    // tests give it their own containers.conf; nothing under /etc/containers is changed).
    Component::program("podman", "podman", &["podman"], &["--version"]),
    // crun refuses this host's hybrid cgroups (hugetlb on the v2 side); runc runs.
    Component::program("runc", "runc", &["runc"], &["--version"]),
    Component::file(
        "CNI reference plugins",
        "containernetworking-plugins",
        "/usr/lib/cni/loopback",
    ),
    // The dev stack (compose.yaml): Debian's engine and the v1 `docker-compose` command; the
    // daemon is started below when none runs.
    Component::program("dockerd", "docker.io", &["dockerd"], &["--version"]),
    Component::program(
        "docker-compose",
        "docker-compose",
        &["docker-compose"],
        &["version", "--short"],
    ),
];

/// The name of the venv's line in the report.
const VENV_NAME: &str = "python venv";
/// The name of the Docker daemon's line in the report.
const DOCKER_DAEMON_NAME: &str = "docker daemon";

/// Runs `cargo xtask setup`: checks every component, installs what is missing, prints the
/// report, and fails naming the components that could not be had.
pub fn run() -> anyhow::Result<()> {
    let cache = CacheDir::resolve();
    println!(
        "meshwork setup: cache dir {} ({})",
        cache.path.display(),
        cache.source
    );
    let venv_dir = cache.path.join("venv");

    let (probes, venv_state) = check_all(&venv_dir);
    let missing: Vec<&Component> = COMPONENTS
        .iter()
        .zip(&probes)
        .filter(|(_, probe)| !probe.is_present())
        .map(|(component, _)| component)
        .collect();

    if (!missing.is_empty() || venv_state.is_err()) && !is_root() {
        let mut rows = report_without_installing(&probes, &venv_state);
        rows.push(kubectl::row());
        print_report(&rows);
        bail!(
            "setup needs root to install what is missing ({}); run it again as root",
            failed_names(&rows)
        );
    }

    let mut rows = install_packages(&probes, &missing);
    let python_venv_ok = rows
        .iter()
        .any(|row| row.name == "python3-venv" && !row.status.is_failure());
    rows.push(ensure_venv(&venv_dir, venv_state, python_venv_ok));
    rows.push(ensure_docker_daemon(&rows));
    rows.push(kubectl::row());
    print_report(&rows);

    let failed = failed_names(&rows);
    if !failed.is_empty() {
        bail!("setup could not provide: {failed}");
    }
    Ok(())
}

/// Probes every component and the venv, in parallel (some version commands are slow).
fn check_all(venv_dir: &Path) -> (Vec<Probe>, Result<String, venv::Missing>) {
    thread::scope(|scope| {
        let venv = scope.spawn(|| venv::check(venv_dir));
        let probes: Vec<_> = COMPONENTS
            .iter()
            .map(|component| scope.spawn(|| component.probe()))
            .collect();
        let probes = probes
            .into_iter()
            .map(|handle| handle.join().expect("probe thread panicked"))
            .collect();
        (probes, venv.join().expect("venv check thread panicked"))
    })
}

/// One line of the report.
struct Row {
    /// The component's name.
    name: &'static str,
    /// What setup found or did.
    status: Status,
}

/// A component's outcome.
enum Status {
    /// It was there already; the detail is usually its version.
    Present(Option<String>),
    /// Setup installed it just now.
    Installed(Option<String>),
    /// Setup started it just now (a daemon).
    Started(String),
    /// It is missing and setup did not try to install it (not root).
    Missing(String),
    /// Setup tried and failed; why.
    Failed(String),
}

impl Status {
    /// Whether the component is (still) unavailable.
    fn is_failure(&self) -> bool {
        matches!(self, Status::Missing(_) | Status::Failed(_))
    }
}

/// The report for a user who can't install: present or missing, nothing installed.
fn report_without_installing(
    probes: &[Probe],
    venv_state: &Result<String, venv::Missing>,
) -> Vec<Row> {
    let mut rows: Vec<Row> = COMPONENTS
        .iter()
        .zip(probes)
        .map(|(component, probe)| Row {
            name: component.name,
            status: match probe {
                Probe::Present(detail) => Status::Present(detail.clone()),
                Probe::Missing(why) => {
                    Status::Missing(format!("{why} (apt: {})", component.package))
                }
            },
        })
        .collect();
    rows.push(Row {
        name: VENV_NAME,
        status: match venv_state {
            Ok(detail) => Status::Present(Some(detail.clone())),
            Err(missing) => Status::Missing(missing.to_string()),
        },
    });
    rows
}

/// Installs the packages of the `missing` components, then re-probes them.
fn install_packages(probes: &[Probe], missing: &[&Component]) -> Vec<Row> {
    let mut packages: Vec<&'static str> = missing.iter().map(|c| c.package).collect();
    packages.sort_unstable();
    packages.dedup();
    let outcomes = if packages.is_empty() {
        HashMap::new()
    } else {
        apt::install(&packages)
    };
    COMPONENTS
        .iter()
        .zip(probes)
        .map(|(component, probe)| Row {
            name: component.name,
            status: match probe {
                Probe::Present(detail) => Status::Present(detail.clone()),
                Probe::Missing(_) => after_install(component, outcomes.get(component.package)),
            },
        })
        .collect()
}

/// A missing component's status after `apt-get install` of its package gave `outcome`.
fn after_install(component: &Component, outcome: Option<&Result<(), String>>) -> Status {
    match (component.probe(), outcome) {
        (Probe::Present(detail), _) => Status::Installed(detail),
        (Probe::Missing(_), Some(Err(why))) => {
            Status::Failed(format!("apt-get install {}: {why}", component.package))
        }
        (Probe::Missing(why), _) => {
            Status::Failed(format!("{why} even after installing {}", component.package))
        }
    }
}

/// Makes the venv usable if `state` says it isn't; `python_venv_ok` is whether Debian's
/// python3-venv is there to make one with.
fn ensure_venv(venv_dir: &Path, state: Result<String, venv::Missing>, python_venv_ok: bool) -> Row {
    let status = match state {
        Ok(detail) => Status::Present(Some(detail)),
        Err(_) if !python_venv_ok => Status::Failed("needs python3-venv".to_owned()),
        Err(missing) => match venv::ensure(venv_dir, &missing) {
            Ok(detail) => Status::Installed(Some(detail)),
            Err(why) => Status::Failed(why),
        },
    };
    Row {
        name: VENV_NAME,
        status,
    }
}

/// Makes sure a Docker daemon with a private default cgroup namespace runs, once `dockerd`
/// is there (its row in `rows`).
fn ensure_docker_daemon(rows: &[Row]) -> Row {
    let dockerd_ok = rows
        .iter()
        .any(|row| row.name == "dockerd" && !row.status.is_failure());
    let status = if dockerd_ok {
        match docker::ensure() {
            docker::Daemon::Running(detail) => Status::Present(Some(detail)),
            docker::Daemon::Started(detail) => Status::Started(detail),
            docker::Daemon::Unusable(why) => Status::Failed(why),
        }
    } else {
        Status::Failed("needs dockerd (apt: docker.io)".to_owned())
    };
    Row {
        name: DOCKER_DAEMON_NAME,
        status,
    }
}

/// Prints the report, one aligned line per component.
fn print_report(rows: &[Row]) {
    let width = rows.iter().map(|row| row.name.len()).max().unwrap_or(0) + 2;
    for row in rows {
        let name = row.name;
        match &row.status {
            Status::Present(detail) => println!("{name:<width$}present    {}", paren(detail)),
            Status::Installed(detail) => println!("{name:<width$}installed  {}", paren(detail)),
            Status::Started(detail) => println!("{name:<width$}started    ({detail})"),
            Status::Missing(why) => println!("{name:<width$}missing    ({why})"),
            Status::Failed(why) => println!("{name:<width$}failed: {why}"),
        }
    }
}

/// `(detail)`, or nothing.
fn paren(detail: &Option<String>) -> String {
    detail
        .as_ref()
        .map_or_else(String::new, |detail| format!("({detail})"))
}

/// The names of the rows that failed or are missing, comma-separated.
fn failed_names(rows: &[Row]) -> String {
    let names: Vec<&str> = rows
        .iter()
        .filter(|row| row.status.is_failure())
        .map(|row| row.name)
        .collect();
    names.join(", ")
}

/// Whether this process runs as root (effective uid 0, from `/proc/self/status`).
fn is_root() -> bool {
    let Ok(status) = std::fs::read_to_string("/proc/self/status") else {
        return false;
    };
    status
        .lines()
        .find_map(|line| line.strip_prefix("Uid:"))
        .and_then(|uids| uids.split_whitespace().nth(1))
        .is_some_and(|effective| effective == "0")
}
