//! The font a PNG's text is rasterised with. plotters draws bitmap text through ab_glyph
//! from font bytes it is handed (its `ttf` feature would need fontconfig to build and to
//! run), so meshctl finds a TrueType/OpenType file itself: `--font`, else a well-known
//! sans-serif, else any font under the system's font directories. An SVG needs none.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, anyhow, bail};
use plotters::style::{FontStyle, register_font};

/// Sans-serif fonts where distributions install them (Debian's fonts-dejavu-core first).
const WELL_KNOWN: &[&str] = &[
    "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu/DejaVuSans.ttf",
    "/usr/share/fonts/TTF/DejaVuSans.ttf",
    "/usr/share/fonts/dejavu-sans-fonts/DejaVuSans.ttf",
    "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
    "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
    "/usr/share/fonts/truetype/noto/NotoSans-Regular.ttf",
    "/usr/share/fonts/noto/NotoSans-Regular.ttf",
];

/// Searched (a few levels deep) when no well-known font is there.
const FONT_DIRS: &[&str] = &["/usr/share/fonts", "/usr/local/share/fonts"];

/// Registers the font for plotters' `sans-serif`: `explicit`, else the first usable one
/// found; returns its path.
pub fn register(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        load(path).with_context(|| format!("--font {}", path.display()))?;
        return Ok(path.to_owned());
    }
    let found = WELL_KNOWN
        .iter()
        .map(PathBuf::from)
        .filter(|p| p.is_file())
        .chain(search(FONT_DIRS.iter().map(Path::new)));
    for path in found {
        if load(&path).is_ok() {
            return Ok(path);
        }
    }
    Err(anyhow!(
        "no TrueType/OpenType font for the PNG's text: none of DejaVu Sans, Liberation Sans or \
         Noto Sans is installed, and {} hold no usable .ttf/.otf — install one (Debian: \
         apt-get install fonts-dejavu-core), name one with --font FILE, or draw an SVG \
         (--svg), which needs no font",
        FONT_DIRS.join(" and ")
    ))
}

fn load(path: &Path) -> anyhow::Result<()> {
    let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    // plotters keeps fonts for the process' life; meshctl registers one, once.
    let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
    if register_font("sans-serif", FontStyle::Normal, bytes).is_err() {
        bail!("{} is not a TrueType/OpenType font", path.display());
    }
    Ok(())
}

/// Font files under `dirs`, regular sans-serif faces first.
pub fn search<'a>(dirs: impl Iterator<Item = &'a Path>) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for dir in dirs {
        walk(dir, 4, &mut found);
    }
    let rank = |path: &Path| {
        let name = path
            .file_name()
            .map(|n| n.to_string_lossy().to_lowercase())
            .unwrap_or_default();
        let plain = !["bold", "italic", "oblique", "mono", "light", "condensed"]
            .iter()
            .any(|style| name.contains(style));
        (!name.contains("sans"), !plain)
    };
    found.sort_by(|a, b| rank(a).cmp(&rank(b)).then_with(|| a.cmp(b)));
    found
}

fn walk(dir: &Path, depth: u32, found: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            if depth > 0 {
                walk(&path, depth - 1, found);
            }
        } else if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("ttf") || e.eq_ignore_ascii_case("otf"))
        {
            found.push(path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regular_sans_faces_come_first() {
        let dir = tempfile::tempdir().unwrap();
        let fonts = dir.path().join("truetype/some");
        std::fs::create_dir_all(&fonts).unwrap();
        for name in [
            "Serif.ttf",
            "Sans-Bold.ttf",
            "Sans.ttf",
            "notes.txt",
            "Mono.otf",
        ] {
            std::fs::write(fonts.join(name), b"").unwrap();
        }
        let found = search(std::iter::once(dir.path()));
        let names: Vec<_> = found
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            ["Sans.ttf", "Sans-Bold.ttf", "Serif.ttf", "Mono.otf"]
        );
    }

    #[test]
    fn a_file_that_is_no_font_is_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("fake.ttf");
        std::fs::write(&path, b"not a font").unwrap();
        let err = register(Some(&path)).unwrap_err();
        assert!(
            format!("{err:#}").contains("is not a TrueType/OpenType font"),
            "{err:#}"
        );
    }
}
