use super::super::layout::{self, LineKind};
use super::super::tests::{SAMPLE_ROWS, sample};
use super::*;

/// A `<text …>` element of exactly `text`, as plotters writes it.
fn element(text: &str) -> String {
    format!(">\n{text}\n</text>")
}

/// Where each of `texts` is drawn in `svg`.
fn positions(svg: &str, texts: &[&str]) -> Vec<usize> {
    texts
        .iter()
        .map(|t| {
            svg.find(&element(t))
                .unwrap_or_else(|| panic!("{t:?} is not drawn:\n{svg}"))
        })
        .collect()
}

/// The `y` of the `<text>` element drawing `text`.
fn text_y(svg: &str, text: &str) -> i32 {
    let end = svg.find(&element(text)).expect("drawn");
    let start = svg[..end].rfind("<text").expect("a text element");
    let element = &svg[start..end];
    let y = element.split(" y=\"").nth(1).expect("a y attribute");
    y[..y.find('"').unwrap()].parse().unwrap()
}

/// A red line two pixels wide: a breaker's (or the legend's).
const RED_LINE: &str = "stroke=\"#D62728\" stroke-width=\"2\"";

#[test]
fn the_svg_draws_one_row_per_cluster_and_store_in_order() {
    let svg = svg(&layout::layout(&sample(false), "restart with the wait")).unwrap();
    assert!(svg.starts_with("<svg"), "{svg}");
    assert!(svg.contains(&element("restart with the wait")), "{svg}");
    // In document order and top to bottom: clusters by name, stores in status order.
    let at = positions(&svg, &SAMPLE_ROWS);
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{at:?}");
    let ys: Vec<i32> = SAMPLE_ROWS.iter().map(|row| text_y(&svg, row)).collect();
    assert!(ys.windows(2).all(|w| w[1] - w[0] == ROW_HEIGHT), "{ys:?}");
    // A bar per row in its store's colour, labelled with when it synced; no breaker.
    assert_eq!(
        svg.matches("fill=\"#1F77B4\"").count(),
        2 + 1,
        "two nodes bars and the legend's"
    );
    assert!(svg.contains(&element("230ms")), "c2's nodes synced last");
    assert!(!svg.contains("not synced"));
    assert_eq!(
        svg.matches(RED_LINE).count(),
        1,
        "no red line but the legend's"
    );
    positions(
        &svg,
        &["endpoint 1", "WG peers GC", "prune services", "agent"],
    );
}

#[test]
fn the_svg_shows_a_breaker_that_fired_as_a_red_labelled_line() {
    let layout = layout::layout(&sample(true), "restart without the wait");
    let svg = svg(&layout).unwrap();
    let at = positions(&svg, &SAMPLE_ROWS);
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{at:?}");
    let line = &layout.lines[0];
    assert_eq!(line.kind, LineKind::Breaker);
    let drawn = format!(
        "stroke=\"#D62728\" stroke-width=\"2\" points=\"{x},{top} {x},{bottom} \"",
        x = line.x,
        top = line.label_y,
        bottom = layout.lane.1
    );
    assert!(svg.contains(&drawn), "{drawn} in\n{svg}");
    assert_eq!(
        svg.matches(RED_LINE).count(),
        2,
        "the breaker's and the legend's"
    );
    assert!(
        svg.contains(&element("breaker: IPIdentitiesSynced (regeneration)")),
        "{svg}"
    );
    // c2 never listed: its four rows say so.
    assert_eq!(svg.matches(&element("not synced")).count(), 4);
}

#[test]
fn a_png_is_drawn_with_the_systems_font() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("timeline.png");
    let font = super::super::font::register(None)
        .expect("a font (`cargo xtask setup` installs fonts-dejavu-core)");
    png(&layout::layout(&sample(true), "t"), &path).unwrap();
    let bytes = std::fs::read(&path).unwrap();
    assert!(
        bytes.starts_with(b"\x89PNG\r\n\x1a\n"),
        "drawn with {}",
        font.display()
    );
}
