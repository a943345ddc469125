//! Draws a [`Layout`] with plotters: as SVG text (no font needed: the viewer renders the
//! text) or as a PNG (its text rasterised from a font file, see [`super::font`]). Only
//! plotters' primitives are used, at the layout's pixels, so nothing here measures text.

use std::path::Path;

use anyhow::{Context as _, anyhow};
use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::layout::{BAR_HEIGHT, LEFT, Layout, LineKind, MarkerKind, RIGHT, ROW_HEIGHT};
use meshwork_proto::agent::v1::TimelineResource;

const FONT: &str = "sans-serif";
const INK: RGBColor = RGBColor(33, 33, 33);
const MUTED: RGBColor = RGBColor(110, 110, 110);
const GRID: RGBColor = RGBColor(225, 225, 225);
const STRIPE: RGBColor = RGBColor(246, 246, 246);
const UNSYNCED: RGBColor = RGBColor(200, 200, 200);
/// The breaker's red.
pub const BREAKER: RGBColor = RGBColor(214, 39, 40);
const READY: RGBColor = RGBColor(44, 160, 44);
const NODES: RGBColor = RGBColor(31, 119, 180);
const SERVICES: RGBColor = RGBColor(255, 127, 14);
const IDENTITIES: RGBColor = RGBColor(148, 103, 189);
const IPCACHE: RGBColor = RGBColor(23, 190, 207);
const REGENERATED: RGBColor = RGBColor(44, 160, 44);
const WIREGUARD: RGBColor = RGBColor(140, 86, 75);
const PRUNED: RGBColor = RGBColor(127, 127, 127);

/// The picture as an SVG document.
pub fn svg(layout: &Layout) -> anyhow::Result<String> {
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, size(layout)).into_drawing_area();
        draw(&root, layout).map_err(|e| anyhow!("drawing the SVG: {e}"))?;
        root.present()
            .map_err(|e| anyhow!("writing the SVG: {e}"))?;
    }
    Ok(out)
}

/// Writes the picture as a PNG to `path`; its text needs the font [`super::font`] registered.
pub fn png(layout: &Layout, path: &Path) -> anyhow::Result<()> {
    let root = BitMapBackend::new(path, size(layout)).into_drawing_area();
    draw(&root, layout).map_err(|e| anyhow!("drawing the PNG: {e}"))?;
    root.present()
        .map_err(|e| anyhow!("{e}"))
        .with_context(|| format!("writing {}", path.display()))
}

fn size(layout: &Layout) -> (u32, u32) {
    let dim = |v: i32| u32::try_from(v.max(1)).unwrap_or(1);
    (dim(layout.width), dim(layout.height))
}

type Drawn<DB> = Result<(), DrawingAreaErrorKind<<DB as DrawingBackend>::ErrorType>>;

/// Text of `size` pixels (plotters draws a font of size s at s / 1.24 px per em).
fn font(size: u32) -> FontDesc<'static> {
    (FONT, f64::from(size) * 1.24).into_font()
}

fn text(size: u32, color: &'static RGBColor, h: HPos) -> TextStyle<'static> {
    TextStyle::from(font(size))
        .color(color)
        .pos(Pos::new(h, VPos::Center))
}

fn resource_color(resource: TimelineResource) -> &'static RGBColor {
    match resource {
        TimelineResource::Nodes => &NODES,
        TimelineResource::Services => &SERVICES,
        TimelineResource::Identities => &IDENTITIES,
        TimelineResource::Ipcache | TimelineResource::Unspecified => &IPCACHE,
    }
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, layout: &Layout) -> Drawn<DB> {
    root.fill(&WHITE)?;
    let title = TextStyle::from(font(18).style(FontStyle::Bold)).color(&INK);
    root.draw(&Text::new(layout.title.as_str(), (16, 10), title))?;
    root.draw(&Text::new(
        layout.subtitle.as_str(),
        (16, 44),
        text(13, &MUTED, HPos::Left),
    ))?;
    let bottom = layout.lane.1;
    // The grid first, so everything else is drawn over it.
    for tick in &layout.ticks {
        root.draw(&PathElement::new(
            vec![(tick.x, layout.rows_top), (tick.x, bottom)],
            GRID.stroke_width(1),
        ))?;
        root.draw(&PathElement::new(
            vec![(tick.x, layout.axis_y), (tick.x, layout.axis_y + 5)],
            INK.stroke_width(1),
        ))?;
        root.draw(&Text::new(
            tick.label.as_str(),
            (tick.x, layout.axis_y + 16),
            text(12, &INK, HPos::Center),
        ))?;
    }
    root.draw(&PathElement::new(
        vec![(LEFT, layout.axis_y), (RIGHT, layout.axis_y)],
        INK.stroke_width(1),
    ))?;
    draw_rows(root, layout)?;
    draw_lane(root, layout)?;
    for line in &layout.lines {
        let color = match line.kind {
            LineKind::Breaker => &BREAKER,
            LineKind::Ready => &READY,
        };
        root.draw(&PathElement::new(
            vec![(line.x, line.label_y), (line.x, bottom)],
            color.stroke_width(2),
        ))?;
        // Labels near the right edge grow leftwards.
        let (h, dx) = if line.x > RIGHT - 300 {
            (HPos::Right, -5)
        } else {
            (HPos::Left, 5)
        };
        root.draw(&Text::new(
            line.label.as_str(),
            (line.x + dx, line.label_y),
            text(12, color, h),
        ))?;
    }
    draw_legend(root, layout)
}

fn draw_rows<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, layout: &Layout) -> Drawn<DB> {
    for (i, row) in layout.rows.iter().enumerate() {
        let (top, bottom) = (row.y - ROW_HEIGHT / 2, row.y + ROW_HEIGHT / 2);
        if i % 2 == 0 {
            root.draw(&Rectangle::new(
                [(LEFT, top), (RIGHT, bottom)],
                STRIPE.filled(),
            ))?;
        }
        root.draw(&Text::new(
            row.label.as_str(),
            (LEFT - 10, row.y),
            text(13, &INK, HPos::Right),
        ))?;
        let (bar_top, bar_bottom) = (row.y - BAR_HEIGHT / 2, row.y + BAR_HEIGHT / 2);
        match &row.synced {
            Some((x, label)) => {
                root.draw(&Rectangle::new(
                    [(LEFT, bar_top), ((*x).max(LEFT + 1), bar_bottom)],
                    resource_color(row.resource).filled(),
                ))?;
                root.draw(&Text::new(
                    label.as_str(),
                    (x + 6, row.y),
                    text(11, &INK, HPos::Left),
                ))?;
            }
            None => {
                root.draw(&Rectangle::new(
                    [(LEFT, bar_top), (RIGHT, bar_bottom)],
                    UNSYNCED.stroke_width(1),
                ))?;
                root.draw(&Text::new(
                    "not synced",
                    (RIGHT - 6, row.y),
                    text(11, &MUTED, HPos::Right),
                ))?;
            }
        }
        if let Some(x) = row.connected_x {
            root.draw(&Circle::new((x, row.y), 3, INK.filled()))?;
        }
    }
    Ok(())
}

fn draw_lane<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, layout: &Layout) -> Drawn<DB> {
    let (top, _) = layout.lane;
    let y = top + 10;
    root.draw(&Text::new(
        "agent",
        (LEFT - 10, y),
        text(13, &INK, HPos::Right),
    ))?;
    for marker in &layout.markers {
        let (x, color) = (marker.x, marker_color(marker.kind));
        root.draw(&PathElement::new(
            vec![(x, layout.rows_top), (x, y)],
            color.mix(0.35).stroke_width(1),
        ))?;
        marker_shape(root, marker.kind, (x, y))?;
        root.draw(&Text::new(
            marker.label.as_str(),
            (x, marker.label_y),
            text(11, color, HPos::Center),
        ))?;
    }
    Ok(())
}

fn marker_color(kind: MarkerKind) -> &'static RGBColor {
    match kind {
        MarkerKind::Regenerated => &REGENERATED,
        MarkerKind::RegenerationFailed => &BREAKER,
        MarkerKind::WireguardGc => &WIREGUARD,
        MarkerKind::Pruned => &PRUNED,
    }
}

/// ▲ regeneration, ● WireGuard GC, ■ prune.
fn marker_shape<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    kind: MarkerKind,
    (x, y): (i32, i32),
) -> Drawn<DB> {
    let style = marker_color(kind).filled();
    match kind {
        MarkerKind::Regenerated | MarkerKind::RegenerationFailed => root.draw(&Polygon::new(
            vec![(x, y - 6), (x - 6, y + 5), (x + 6, y + 5)],
            style,
        )),
        MarkerKind::WireguardGc => root.draw(&Circle::new((x, y), 5, style)),
        MarkerKind::Pruned => root.draw(&Rectangle::new([(x - 5, y - 5), (x + 5, y + 5)], style)),
    }
}

fn draw_legend<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, layout: &Layout) -> Drawn<DB> {
    let y = layout.legend_y;
    let mut x = LEFT;
    root.draw(&Circle::new((x, y), 3, INK.filled()))?;
    x = legend_label(root, x + 8, y, "connected")?;
    root.draw(&Rectangle::new(
        [(x, y - 5), (x + 18, y + 5)],
        NODES.filled(),
    ))?;
    x = legend_label(root, x + 24, y, "start → synced")?;
    for kind in [
        MarkerKind::Regenerated,
        MarkerKind::WireguardGc,
        MarkerKind::Pruned,
    ] {
        marker_shape(root, kind, (x + 6, y))?;
        let label = match kind {
            MarkerKind::Regenerated | MarkerKind::RegenerationFailed => "endpoint regenerated",
            MarkerKind::WireguardGc => "WireGuard GC",
            MarkerKind::Pruned => "prune pass",
        };
        x = legend_label(root, x + 16, y, label)?;
    }
    root.draw(&PathElement::new(
        vec![(x, y - 7), (x, y + 7)],
        BREAKER.stroke_width(2),
    ))?;
    legend_label(root, x + 6, y, "breaker / timeout fired")?;
    Ok(())
}

/// Draws a legend label at `x`; returns where the next item goes (a fixed width per
/// character: nothing measures text, so an SVG needs no font).
fn legend_label<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    x: i32,
    y: i32,
    label: &str,
) -> Result<i32, DrawingAreaErrorKind<DB::ErrorType>> {
    root.draw(&Text::new(label, (x, y), text(12, &INK, HPos::Left)))?;
    Ok(x + 7 * i32::try_from(label.chars().count()).unwrap_or(0) + 18)
}

#[cfg(test)]
#[path = "render_tests.rs"]
mod tests;
