//! The binaries the tests run: the agent this package builds, and meshctl beside it.

use std::path::{Path, PathBuf};

/// The `meshwork-agent` binary of this build.
pub fn agent_binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_meshwork-agent"))
}

/// `meshctl`, built beside the agent by the workspace build; panics naming the build to
/// run when it is missing.
pub fn meshctl() -> PathBuf {
    let meshctl = agent_binary().with_file_name("meshctl");
    assert!(
        meshctl.exists(),
        "{} is missing: build the workspace (cargo build --workspace) before this test",
        meshctl.display()
    );
    meshctl
}
