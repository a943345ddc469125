//! The picture of A's restart in each run (`meshctl timeline --svg`, the real binary against
//! A's agent while it still runs), and a page showing the run with the wait beside the one
//! without it.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

use super::SceneKind;
use crate::binaries::Binaries;
use crate::node_agent::NodeAgent;

/// Where the pictures go (kept after the run, unlike the scene's temp dir).
pub fn dir() -> PathBuf {
    std::env::temp_dir().join("meshwork-proof")
}

/// The picture of one run: `<dir>/<scene>-with-wait.svg` or `…-without-wait.svg`.
pub fn path(kind: SceneKind, with_wait: bool) -> PathBuf {
    let scene = match kind {
        SceneKind::Mesh => "mesh",
        SceneKind::Fixtures => "fixtures",
    };
    let wait = if with_wait {
        "with-wait"
    } else {
        "without-wait"
    };
    dir().join(format!("{scene}-{wait}.svg"))
}

/// Draws `agent`'s timeline into `path`; the proof's figures do not depend on it, so a
/// failure is printed, not returned.
pub async fn save(binaries: &Binaries, agent: &NodeAgent, with_wait: bool, path: &Path) {
    let wait = if with_wait {
        "with the wait (--clustermesh-ip-identities-sync-timeout=1m)"
    } else {
        "without it (--clustermesh-ip-identities-sync-timeout=0s)"
    };
    let title = format!("{} restarted {wait}", agent.name);
    match draw(binaries, agent, &title, path).await {
        Ok(()) => println!("  timeline of the restart {wait}: {}", path.display()),
        Err(err) => println!("  timeline of the restart {wait} not saved: {err:#}"),
    }
}

async fn draw(
    binaries: &Binaries,
    agent: &NodeAgent,
    title: &str,
    path: &Path,
) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir()).with_context(|| format!("creating {}", dir().display()))?;
    let output = tokio::process::Command::new(&binaries.meshctl)
        .env_remove("MESHWORK_SOCKET")
        .arg("--socket")
        .arg(agent.socket())
        .args(["timeline", "--title", title, "--svg"])
        .arg(path)
        .output()
        .await
        .context("running meshctl timeline")?;
    if !output.status.success() {
        bail!(
            "meshctl timeline failed: {}",
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}

/// Writes a page showing the run with the wait beside the one without it; its path.
pub fn side_by_side(kind: SceneKind) -> anyhow::Result<PathBuf> {
    let page = path(kind, true).with_file_name(match kind {
        SceneKind::Mesh => "mesh-timelines.html",
        SceneKind::Fixtures => "fixtures-timelines.html",
    });
    let image = |with_wait| {
        path(kind, with_wait)
            .file_name()
            .map(|name| name.to_string_lossy().into_owned())
            .unwrap_or_default()
    };
    let html = format!(
        "<!doctype html>\n<meta charset=\"utf-8\">\n<title>meshwork proof: A's restart</title>\n\
         <div style=\"display:flex;gap:8px\">\n<img src=\"{}\" style=\"width:50%\">\n\
         <img src=\"{}\" style=\"width:50%\">\n</div>\n",
        image(true),
        image(false)
    );
    std::fs::write(&page, html).with_context(|| format!("writing {}", page.display()))?;
    Ok(page)
}
