//! The charts of the HTML report, drawn by `plotters`' SVG backend: lines over seconds and
//! (stacked) bars over labelled buckets.
use anyhow::{anyhow, Result};
use plotters::{
    chart::MeshStyle,
    coord::{
        ranged1d::{SegmentedCoord, ValueFormatter},
        types::{RangedCoordu64, RangedCoordusize},
    },
    prelude::*,
    style::text_anchor::{HPos, Pos, VPos},
};

pub(super) const BIOS: RGBColor = RGBColor(31, 119, 180);
/// Colours of cgroups in stacked bars (category10); the last stands for the rest.
pub(super) const CGROUP_COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
    RGBColor(127, 127, 127),
];
pub(super) const REQUESTS: RGBColor = RGBColor(255, 127, 14);
pub(super) const MERGED: RGBColor = RGBColor(44, 160, 44);
pub(super) const CHARGED: RGBColor = RGBColor(148, 103, 189);
/// A limit in force: the one red on the page.
pub(super) const LIMIT: RGBColor = RGBColor(214, 39, 40);
pub(super) const EXPLICIT: RGBColor = RGBColor(31, 119, 180);
pub(super) const SCHEDULE: RGBColor = RGBColor(255, 187, 120);

const FONT: &str = "sans-serif";

fn err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing a chart: {e:?}")
}

/// Draws the grid and axes with the text and line styles every chart here shares (tick labels
/// of `label_size`).
fn draw_mesh<X, Y, XT, YT, DB>(mesh: &mut MeshStyle<X, Y, DB>, label_size: u32) -> Result<()>
where
    X: Ranged<ValueType = XT> + ValueFormatter<XT>,
    Y: Ranged<ValueType = YT> + ValueFormatter<YT>,
    DB: DrawingBackend,
{
    mesh.label_style((FONT, label_size))
        .axis_desc_style((FONT, 13))
        .max_light_lines(1)
        .light_line_style(RGBColor(240, 240, 240))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()
        .map_err(err)
}

/// A y range with headroom (more under a legend), at least 1.
fn y_max(m: u64, legend: bool) -> u64 {
    if m == 0 {
        1
    } else if legend {
        m + m.div_ceil(3)
    } else {
        m + m.div_ceil(8)
    }
}

/// Every chart's frame: its caption, margins and room for the axis labels.
fn frame<'a, 'b>(
    root: &'a DrawingArea<SVGBackend<'b>, plotters::coord::Shift>,
    title: &'b str,
) -> ChartBuilder<'a, 'b, SVGBackend<'b>> {
    let mut b = ChartBuilder::on(root);
    b.caption(title, (FONT, 16))
        .margin(10)
        .x_label_area_size(40)
        .y_label_area_size(60);
    b
}

/// The legend, upper right, on a white background of `opacity`.
fn legend<'a, 'b: 'a, X: Ranged, Y: Ranged>(
    chart: &mut ChartContext<'a, SVGBackend<'b>, Cartesian2d<X, Y>>,
    opacity: f64,
) -> Result<()> {
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .label_font((FONT, 12))
        .background_style(WHITE.mix(opacity))
        .border_style(RGBColor(180, 180, 180))
        .draw()
        .map_err(err)
}

/// One panel of a [`small_multiples`] row: one series alone, so that series with equal
/// values (bios and charged ios under blk-throttle) each stay visible.
pub(super) struct Panel<'a> {
    pub(super) name: &'a str,
    pub(super) values: &'a [u64],
    pub(super) color: RGBColor,
    /// The limit line is drawn in this panel (the series it limits).
    pub(super) limited: bool,
}

/// A limit in force, drawn as a horizontal dashed line at `value` (per second).
pub(super) struct LimitLine {
    pub(super) label: String,
    pub(super) value: u64,
}

/// Width of one panel of a [`small_multiples`] row.
const PANEL_W: u32 = 280;
const PANEL_H: u32 = 260;

/// Series over seconds side by side, one panel each, on one y scale (the limit's included),
/// drawn as steps (a second's value across the whole second) over a pale area.
pub(super) fn small_multiples(
    title: &str,
    y_desc: &str,
    buckets: usize,
    panels: &[Panel],
    limit: Option<&LimitLine>,
) -> Result<String> {
    let mut svg = String::new();
    {
        let width = PANEL_W * panels.len().max(1) as u32;
        let root = SVGBackend::with_string(&mut svg, (width, PANEL_H + 30)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let root = root.titled(title, (FONT, 16)).map_err(err)?;
        let max = panels
            .iter()
            .flat_map(|p| p.values.iter())
            .copied()
            .chain(limit.map(|l| l.value))
            .max()
            .unwrap_or(0);
        let y_end = y_max(max, limit.is_some());
        for (i, (p, area)) in panels
            .iter()
            .zip(root.split_evenly((1, panels.len().max(1))))
            .enumerate()
        {
            let limit = limit.filter(|_| p.limited);
            panel(
                &area,
                p,
                buckets,
                y_end,
                if i == 0 { y_desc } else { "" },
                limit,
            )?;
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// One series of a [`small_multiples`] row, with the limit line where it applies.
fn panel(
    area: &DrawingArea<SVGBackend, plotters::coord::Shift>,
    p: &Panel,
    buckets: usize,
    y_end: u64,
    y_desc: &str,
    limit: Option<&LimitLine>,
) -> Result<()> {
    let x_end = buckets.max(1) as u64;
    let mut chart = ChartBuilder::on(area)
        .caption(p.name, (FONT, 16))
        .margin(8)
        .x_label_area_size(36)
        .y_label_area_size(if y_desc.is_empty() { 44 } else { 60 })
        .build_cartesian_2d(0u64..x_end, 0u64..y_end)
        .map_err(err)?;
    draw_mesh(
        chart
            .configure_mesh()
            .x_desc("seconds")
            .y_desc(y_desc)
            .x_labels(x_end.min(6) as usize + 1)
            .y_labels(6),
        13,
    )?;
    let mut pts = Vec::with_capacity(p.values.len() * 2);
    for (i, v) in p.values.iter().enumerate() {
        pts.push((i as u64, *v));
        pts.push((i as u64 + 1, *v));
    }
    chart
        .draw_series(
            AreaSeries::new(pts, 0, p.color.mix(0.2).filled())
                .border_style(p.color.stroke_width(2)),
        )
        .map_err(err)?;
    if let Some(l) = limit {
        let style = LIMIT.stroke_width(2);
        chart
            .draw_series(DashedLineSeries::new(
                [(0, l.value), (x_end, l.value)],
                8,
                5,
                style,
            ))
            .map_err(err)?
            .label(l.label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        legend(&mut chart, 0.9)?;
    }
    Ok(())
}

/// Bars over labelled buckets, stacked when several series are given.
pub(super) fn bar_chart<S: AsRef<str>>(
    title: &str,
    x_desc: &str,
    y_desc: &str,
    labels: &[String],
    series: &[(S, Vec<u64>, RGBColor)],
) -> Result<String> {
    let mut svg = String::new();
    {
        let n = labels.len().max(1);
        let root = SVGBackend::with_string(&mut svg, (560, 300)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let totals: Vec<u64> = (0..n)
            .map(|i| {
                series
                    .iter()
                    .map(|s| s.1.get(i).copied().unwrap_or(0))
                    .sum()
            })
            .collect();
        let max = totals.iter().copied().max().unwrap_or(0);
        let mut chart = frame(&root, title)
            // an inclusive range: n segments
            .build_cartesian_2d(
                (0..n - 1).into_segmented(),
                0u64..y_max(max, series.len() > 1),
            )
            .map_err(err)?;
        let label = |v: &SegmentValue<usize>| match v {
            SegmentValue::CenterOf(i) | SegmentValue::Exact(i) => {
                labels.get(*i).cloned().unwrap_or_default()
            }
            SegmentValue::Last => String::new(),
        };
        draw_mesh(
            chart
                .configure_mesh()
                .disable_x_mesh()
                .x_desc(x_desc)
                .y_desc(y_desc)
                .x_labels(n)
                .x_label_formatter(&label),
            11,
        )?;
        stack(&mut chart, series, n)?;
        label_totals(&mut chart, &totals)?;
        if series.len() > 1 {
            legend(&mut chart, 0.85)?;
        }
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// A bar chart's plot area: segments over the buckets, counts up.
type Bars<'a, 'b> =
    ChartContext<'a, SVGBackend<'b>, Cartesian2d<SegmentedCoord<RangedCoordusize>, RangedCoordu64>>;

/// Each series' bars on top of the ones before it, with its legend entry.
fn stack<S: AsRef<str>>(
    chart: &mut Bars,
    series: &[(S, Vec<u64>, RGBColor)],
    n: usize,
) -> Result<()> {
    let mut base = vec![0u64; n];
    for (name, values, color) in series {
        let below = base.clone();
        let color = *color;
        chart
            .draw_series(
                Histogram::vertical(chart)
                    .style(color.filled())
                    .margin(6)
                    .baseline_func(move |v| match v {
                        SegmentValue::Exact(i) | SegmentValue::CenterOf(i) => {
                            below.get(*i).copied().unwrap_or(0)
                        }
                        SegmentValue::Last => 0,
                    })
                    .data(values.iter().enumerate().map(|(i, v)| (i, base[i] + v))),
            )
            .map_err(err)?
            .label(name.as_ref())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
        for (i, v) in values.iter().enumerate() {
            base[i] += v;
        }
    }
    Ok(())
}

/// The total above each bar, so that small bars can still be read.
fn label_totals(chart: &mut Bars, totals: &[u64]) -> Result<()> {
    let label = TextStyle::from((FONT, 11).into_font())
        .color(&RGBColor(60, 60, 60))
        .pos(Pos::new(HPos::Center, VPos::Bottom));
    chart
        .draw_series(
            totals
                .iter()
                .enumerate()
                .filter(|(_, t)| **t > 0)
                .map(|(i, t)| {
                    Text::new(
                        t.to_string(),
                        (SegmentValue::CenterOf(i), *t),
                        label.clone(),
                    )
                }),
        )
        .map_err(err)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::html::esc;

    #[test]
    fn html_charts_are_inline_svg_without_external_resources() {
        let bars = bar_chart(
            "t",
            "x",
            "y",
            &["≤ 4 KiB".into(), "≤ 8 KiB".into()],
            &[("a", vec![3, 0], EXPLICIT), ("b", vec![1, 2], SCHEDULE)],
        )
        .unwrap();
        assert!(bars.starts_with("<svg"), "{bars}");
        assert!(bars.contains("≤ 4 KiB"));
        let lines = small_multiples(
            "t",
            "per second",
            3,
            &[Panel {
                name: "bios",
                values: &[1, 5, 2],
                color: BIOS,
                limited: false,
            }],
            None,
        )
        .unwrap();
        assert!(lines.contains("bios"));
        for svg in [&bars, &lines] {
            assert!(!svg.contains("http://") || svg.contains("http://www.w3.org/2000/svg"));
            assert!(!svg.contains("<script"));
        }
        assert_eq!(esc("<a & 'b'>"), "&lt;a &amp; &#39;b&#39;&gt;");
    }

    /// Each `<polyline>` of `svg`: its stroke colour and its points.
    fn polylines(svg: &str) -> Vec<(String, Vec<(i64, i64)>)> {
        let attr = |tag: &str, name: &str| -> String {
            let from = tag.find(&format!(" {name}=\"")).unwrap() + name.len() + 3;
            tag[from..][..tag[from..].find('"').unwrap()].to_string()
        };
        svg.split("<polyline")
            .skip(1)
            .map(|t| {
                let tag = &t[..t.find("/>").unwrap()];
                let points = attr(tag, "points")
                    .split_whitespace()
                    .map(|p| {
                        let (x, y) = p.split_once(',').unwrap();
                        (x.parse().unwrap(), y.parse().unwrap())
                    })
                    .collect();
                (attr(tag, "stroke"), points)
            })
            .collect()
    }

    /// The text of each `<text>` of `svg`.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .map(|t| {
                let body = &t[t.find('>').unwrap() + 1..t.find("</text>").unwrap()];
                body.trim().to_string()
            })
            .collect()
    }

    fn hex(c: RGBColor) -> String {
        format!("#{:02X}{:02X}{:02X}", c.0, c.1, c.2)
    }

    #[test]
    fn coinciding_series_get_a_panel_each_and_the_limit_a_line_at_its_value() {
        // bios and charged equal, at the limit for two seconds
        let bios = [0, 1000, 1000, 0];
        let merged = [0, 960, 970, 0];
        let requests = [0, 40, 30, 0];
        let panel = |name, values, color, limited| Panel {
            name,
            values,
            color,
            limited,
        };
        let panels = [
            panel("bios submitted", &bios[..], BIOS, true),
            panel("ios charged", &bios[..], CHARGED, true),
            panel("merged", &merged[..], MERGED, false),
            panel("requests", &requests[..], REQUESTS, false),
        ];
        let limit = LimitLine {
            label: "wiops limit 1,000".into(),
            value: 1000,
        };
        let svg =
            small_multiples("loop0 /a write", "per second", 4, &panels, Some(&limit)).unwrap();
        let lines = polylines(&svg);
        // one line per series, each its own colour: four series, four panels
        for (p, c) in panels.iter().map(|p| (p.name, hex(p.color))) {
            assert_eq!(lines.iter().filter(|l| l.0 == c).count(), 1, "{p}: {svg}");
            assert!(texts(&svg).contains(&p.to_string()), "{p} has no caption");
        }
        // the limit: horizontal dashes in the two limited panels, at the height bios reach
        // when they are at the limit (one scale), and its legend
        let dashes: Vec<_> = lines.iter().filter(|l| l.0 == hex(LIMIT)).collect();
        assert!(dashes.len() > 10, "{svg}");
        assert!(dashes.iter().all(|d| d.1.iter().all(|p| p.1 == d.1[0].1)));
        let at_limit = |c: RGBColor| {
            let line = &lines.iter().find(|l| l.0 == hex(c)).unwrap().1;
            line.iter().map(|p| p.1).min().unwrap()
        };
        assert_eq!(at_limit(BIOS), at_limit(CHARGED));
        let limit_y = at_limit(BIOS);
        let on_limit = dashes.iter().filter(|d| d.1[0].1 == limit_y).count();
        assert!(
            on_limit >= dashes.len() - 2,
            "{on_limit} of {}",
            dashes.len()
        );
        let x_of = |c: RGBColor| lines.iter().find(|l| l.0 == hex(c)).unwrap().1[0].0;
        let in_panel = |x0: i64| {
            dashes
                .iter()
                .filter(|d| d.1[0].1 == limit_y && (x0..x0 + PANEL_W as i64).contains(&d.1[0].0))
                .count()
        };
        assert!(in_panel(x_of(BIOS)) > 0 && in_panel(x_of(CHARGED)) > 0);
        assert_eq!(in_panel(x_of(MERGED)), 0, "the limit is not the merges'");
        let labels = texts(&svg);
        assert_eq!(
            labels.iter().filter(|t| *t == "wiops limit 1,000").count(),
            2
        );
        // without a limit, no limit line
        let svg = small_multiples("t", "per second", 4, &panels, None).unwrap();
        assert!(!polylines(&svg).iter().any(|l| l.0 == hex(LIMIT)));
    }
}
