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

pub(super) const BIOS_BAND: RGBColor = RGBColor(158, 202, 236);
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
pub(super) const CHARGED: RGBColor = RGBColor(214, 39, 40);
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

/// One line of a [`line_chart`].
pub(super) struct Line<'a> {
    pub(super) name: &'a str,
    pub(super) values: &'a [u64],
    pub(super) color: RGBColor,
    pub(super) width: u32,
    pub(super) dashed: bool,
}

/// Lines over seconds, drawn as steps (a second's value across the whole second).
pub(super) fn line_chart(
    title: &str,
    y_desc: &str,
    buckets: usize,
    lines: &[Line],
) -> Result<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (560, 300)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let max = lines
            .iter()
            .flat_map(|l| l.values.iter())
            .copied()
            .max()
            .unwrap_or(0);
        let x_end = buckets.max(1) as u64;
        let mut chart = frame(&root, title)
            .build_cartesian_2d(0u64..x_end, 0u64..y_max(max, true))
            .map_err(err)?;
        draw_mesh(
            chart
                .configure_mesh()
                .x_desc("seconds since the capture's start")
                .y_desc(y_desc)
                .x_labels(x_end.min(12) as usize + 1),
            12,
        )?;
        for l in lines {
            let mut pts = Vec::with_capacity(l.values.len() * 2);
            for (i, v) in l.values.iter().enumerate() {
                pts.push((i as u64, *v));
                pts.push((i as u64 + 1, *v));
            }
            let style = l.color.stroke_width(l.width);
            let anno = if l.dashed {
                chart
                    .draw_series(DashedLineSeries::new(pts, 6, 4, style))
                    .map_err(err)?
            } else {
                chart
                    .draw_series(LineSeries::new(pts, style))
                    .map_err(err)?
            };
            anno.label(l.name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], style));
        }
        legend(&mut chart, 0.9)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
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
        let lines = line_chart(
            "t",
            "per second",
            3,
            &[Line {
                name: "bios",
                values: &[1, 5, 2],
                color: BIOS_BAND,
                width: 2,
                dashed: true,
            }],
        )
        .unwrap();
        assert!(lines.contains("bios"));
        for svg in [&bars, &lines] {
            assert!(!svg.contains("http://") || svg.contains("http://www.w3.org/2000/svg"));
            assert!(!svg.contains("<script"));
        }
        assert_eq!(esc("<a & 'b'>"), "&lt;a &amp; &#39;b&#39;&gt;");
    }
}
