//! The cache directory shared with the lab library (`meshwork_lab::paths::cache_dir`).

use std::path::PathBuf;

/// The cache directory, and which rule chose it.
pub struct CacheDir {
    /// The directory.
    pub path: PathBuf,
    /// Which rule chose it, for the report's header.
    pub source: &'static str,
}

impl CacheDir {
    /// `$MESHWORK_CACHE_DIR`, else `$XDG_CACHE_HOME/meshwork`, else `$HOME/.cache/meshwork`
    /// (`/root` if `HOME` is unset): the same precedence as the lab library.
    pub fn resolve() -> Self {
        if let Some(dir) = std::env::var_os("MESHWORK_CACHE_DIR") {
            return Self {
                path: PathBuf::from(dir),
                source: "from $MESHWORK_CACHE_DIR",
            };
        }
        if let Some(dir) = std::env::var_os("XDG_CACHE_HOME") {
            return Self {
                path: PathBuf::from(dir).join("meshwork"),
                source: "from $XDG_CACHE_HOME; set $MESHWORK_CACHE_DIR to change",
            };
        }
        let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("/root"), PathBuf::from);
        Self {
            path: home.join(".cache").join("meshwork"),
            source: "from $HOME; set $MESHWORK_CACHE_DIR to change",
        }
    }
}
