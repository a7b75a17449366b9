//! Numbers: medians and spreads, overheads paired by round, and how they are written.

/// Median, min and max of some samples.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub n: usize,
}

impl Summary {
    pub fn of(values: &[f64]) -> Option<Summary> {
        let mut v: Vec<f64> = values.iter().copied().filter(|x| x.is_finite()).collect();
        if v.is_empty() {
            return None;
        }
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let median = if n % 2 == 1 {
            v[n / 2]
        } else {
            (v[n / 2 - 1] + v[n / 2]) / 2.0
        };
        Some(Summary {
            median,
            min: v[0],
            max: v[n - 1],
            n,
        })
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::json!({"median": self.median, "min": self.min, "max": self.max, "n": self.n})
    }

    /// "median [min–max]" with `f` for each number.
    pub fn show(&self, f: impl Fn(f64) -> String) -> String {
        if self.n == 1 {
            return f(self.median);
        }
        format!("{} [{}–{}]", f(self.median), f(self.min), f(self.max))
    }
}

/// Overhead of an arm in each round where both it and the baseline ran: 1 − arm / baseline.
pub fn paired_overheads(arm: &[Option<f64>], baseline: &[Option<f64>]) -> Vec<f64> {
    arm.iter()
        .zip(baseline)
        .filter_map(|(a, b)| match (a, b) {
            (Some(a), Some(b)) if *b > 0.0 => Some(1.0 - a / b),
            _ => None,
        })
        .collect()
}

/// 412345.6 → "412.3k"; 3.2e6 → "3.20M".
pub fn si(x: f64) -> String {
    let a = x.abs();
    if a >= 1e9 {
        format!("{:.2}G", x / 1e9)
    } else if a >= 1e6 {
        format!("{:.2}M", x / 1e6)
    } else if a >= 1e3 {
        format!("{:.1}k", x / 1e3)
    } else {
        format!("{x:.0}")
    }
}

/// 0.0123 → "1.2 %" (overheads can be negative: the run was faster than the baseline).
pub fn pct(x: f64) -> String {
    format!("{:.1} %", x * 100.0)
}

/// A column layout: each row's cells padded to the widest cell of its column.
pub fn table(rows: &[Vec<String>]) -> String {
    let cols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..cols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in rows {
        let mut line = String::new();
        for (c, cell) in r.iter().enumerate() {
            if c + 1 == r.len() {
                line.push_str(cell);
            } else {
                line.push_str(cell);
                line.push_str(&" ".repeat(widths[c] - cell.chars().count() + 2));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

/// Seconds since the epoch as "YYYY-MM-DD HH:MM UTC" (no date crate for one line).
pub fn utc_date(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02} UTC",
        rem / 3600,
        rem % 3600 / 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries() {
        let s = Summary::of(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max, s.n), (2.0, 1.0, 3.0, 3));
        let s = Summary::of(&[4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(s.median, 2.5);
        assert!(Summary::of(&[]).is_none());
        assert!(Summary::of(&[f64::INFINITY]).is_none());
        assert_eq!(Summary::of(&[0.5]).unwrap().show(pct), "50.0 %");
    }

    #[test]
    fn overheads_pair_rounds() {
        let base = [Some(100.0), Some(200.0), None, Some(100.0)];
        let arm = [Some(98.0), None, Some(50.0), Some(101.0)];
        let o = paired_overheads(&arm, &base);
        assert_eq!(o.len(), 2);
        assert!((o[0] - 0.02).abs() < 1e-12);
        assert!((o[1] + 0.01).abs() < 1e-12);
    }

    #[test]
    fn formats() {
        assert_eq!(si(412_345.6), "412.3k");
        assert_eq!(si(3.2e6), "3.20M");
        assert_eq!(pct(0.0123), "1.2 %");
        assert_eq!(utc_date(0), "1970-01-01 00:00 UTC");
        assert_eq!(utc_date(1_709_210_096), "2024-02-29 12:34 UTC");
        assert_eq!(
            table(&[
                vec!["a".into(), "bb".into()],
                vec!["ccc".into(), "d".into()]
            ]),
            "a    bb\nccc  d\n"
        );
    }
}
