//! `report --html` read back as structure, never as pixels: the per-cgroup table's cells, and
//! each chart's SVG by the texts it draws (title, panel captions, the limit's legend) and the
//! colours of its lines.

/// The cells of the per-cgroup table's row whose cells include `cgroup` and `dir`.
pub(crate) fn table_row(page: &str, cgroup: &str, dir: &str) -> Option<Vec<String>> {
    let table = &page[page.find("<table>")?..];
    let table = &table[..table.find("</table>")?];
    table.split("<tr").skip(1).find_map(|row| {
        let cells: Vec<String> = row
            .split("<td")
            .skip(1)
            .map(|c| {
                let body = &c[c.find('>')? + 1..];
                Some(body[..body.find("</td>")?].to_string())
            })
            .collect::<Option<_>>()?;
        (cells.iter().any(|c| c == cgroup) && cells.iter().any(|c| c == dir)).then_some(cells)
    })
}

/// One inline SVG chart of the page: the texts it draws, in order.
pub(crate) struct Chart {
    pub texts: Vec<String>,
    pub svg: String,
}

/// Every chart of the page.
pub(crate) fn charts(page: &str) -> Vec<Chart> {
    page.split("<svg")
        .skip(1)
        .map(|s| {
            let svg = s[..s.find("</svg>").unwrap_or(s.len())].to_string();
            let texts = svg
                .split("<text")
                .skip(1)
                .filter_map(|t| {
                    let body = &t[t.find('>')? + 1..];
                    Some(body[..body.find("</text>")?].trim().to_string())
                })
                .collect();
            Chart { texts, svg }
        })
        .collect()
}

impl Chart {
    /// The chart whose title is `title`.
    pub(crate) fn titled<'a>(charts: &'a [Chart], title: &str) -> Option<&'a Chart> {
        charts
            .iter()
            .find(|c| c.texts.first().is_some_and(|t| t == title))
    }

    pub(crate) fn has_text(&self, text: &str) -> bool {
        self.texts.iter().any(|t| t == text)
    }

    /// The distinct stroke colours of its `<polyline>`s (series lines, limit dashes, legend
    /// swatches; the grid is drawn with `<line>` and rectangles).
    pub(crate) fn line_colours(&self) -> std::collections::BTreeSet<String> {
        self.svg
            .split("<polyline")
            .skip(1)
            .filter_map(|p| {
                let at = p.find(" stroke=\"")? + 9;
                Some(p[at..at + p[at..].find('"')?].to_string())
            })
            .collect()
    }
}

/// The charts titled `limited` and `free`: every series in a panel of its own (bios and
/// charged ios coincide under a limit), the limit as a line labelled `limit` in the bios and
/// charged panels, in a colour of its own; `free`, without a limit, has neither the charged
/// panel nor a limit.
pub(crate) fn check_series_charts(page: &str, limited: &str, free: &str, limit: &str) {
    let charts = charts(page);
    let ca = Chart::titled(&charts, limited).expect("the limited cgroup's chart");
    let cb = Chart::titled(&charts, free).expect("the other cgroup's chart");
    let panels = [
        "bios submitted",
        "ios charged by blk-throttle",
        "merged",
        "requests the device saw",
    ];
    for p in panels {
        assert!(ca.has_text(p), "{limited}: no {p:?} panel: {:?}", ca.texts);
        assert_eq!(
            cb.has_text(p),
            p != panels[1],
            "{free}: {p:?}: {:?}",
            cb.texts
        );
    }
    assert_eq!(
        ca.texts.iter().filter(|t| *t == limit).count(),
        2,
        "{:?}",
        ca.texts
    );
    assert!(
        !cb.texts.iter().any(|t| t.contains("limit")),
        "{:?}",
        cb.texts
    );
    // the free one's lines (three series, the axes) are the limited one's too, which adds
    // charged ios and the limit
    let (la, lb) = (ca.line_colours(), cb.line_colours());
    assert_eq!(lb.len(), 4, "{lb:?}");
    assert!(
        lb.is_subset(&la) && la.len() == lb.len() + 2,
        "{la:?} {lb:?}"
    );
}
