//! How numbers read to people: counts, sizes, rates and spans, every formatter in one place.
//! Each keeps the exact text its output has always had (text tables, verdicts, `check`).

const KIB: f64 = 1024.0;
const MIB: f64 = 1024.0 * 1024.0;

/// 3282202 → "3,282,202".
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes as MiB with one decimal, without the unit (table columns): "23.4".
pub fn mib(bytes: u64) -> String {
    format!("{:.1}", bytes as f64 / MIB)
}

/// A size to one decimal: "512 B", "4.0 KiB", "1.5 MiB".
pub fn size(bytes: u64) -> String {
    if bytes >= 1 << 20 {
        format!("{:.1} MiB", bytes as f64 / MIB)
    } else if bytes >= 1024 {
        format!("{:.1} KiB", bytes as f64 / KIB)
    } else {
        format!("{bytes} B")
    }
}

/// An average size to one decimal, never below KiB: "0.5 KiB", "114.3 KiB", "1.2 MiB".
pub fn avg_size(bytes: f64) -> String {
    if bytes >= MIB {
        format!("{:.1} MiB", bytes / MIB)
    } else {
        format!("{:.1} KiB", bytes / KIB)
    }
}

/// The upper bound of a log2 latency bucket given in µs, as "≤262 µs", "≤4.2 ms", "≤1.07 s":
/// "at most", the histograms know no finer.
pub fn latency_bound(us: f64) -> String {
    if us >= 1_000_000.0 {
        format!("≤{:.2} s", us / 1_000_000.0)
    } else if us >= 10_000.0 {
        format!("≤{:.0} ms", us / 1000.0)
    } else if us >= 1000.0 {
        format!("≤{:.1} ms", us / 1000.0)
    } else {
        format!("≤{us:.0} µs")
    }
}

/// A size in the largest unit that divides it: "4 GiB", "64 KiB", "1000 B".
pub fn exact_size(b: u64) -> String {
    if b >= 1 << 30 && b.is_multiple_of(1 << 30) {
        format!("{} GiB", b >> 30)
    } else if b >= 1 << 20 && b.is_multiple_of(1 << 20) {
        format!("{} MiB", b >> 20)
    } else if b >= 1024 {
        format!("{} KiB", b / 1024)
    } else {
        format!("{b} B")
    }
}

/// A size in KiB, whole and grouped where it divides, else two decimals: "1,280 KiB",
/// "1.50 KiB".
pub fn kib(bytes: u64) -> String {
    if bytes.is_multiple_of(1024) {
        format!("{} KiB", thousands(bytes / 1024))
    } else {
        format!("{:.2} KiB", bytes as f64 / KIB)
    }
}

/// `sectors` over `requests`, in KiB with two decimals: "6.36 KiB".
pub fn kib_per(sectors: u64, requests: u64) -> String {
    if requests == 0 {
        return "n/a (no requests)".into();
    }
    format!("{:.2} KiB", sectors as f64 / requests as f64 / 2.0)
}

/// A byte rate to one decimal in MiB/s, else whole KiB/s: "8.0 MiB/s", "512 KiB/s".
pub fn rate(bytes_per_s: u64) -> String {
    let b = bytes_per_s as f64;
    if b >= MIB {
        format!("{:.1} MiB/s", b / MIB)
    } else {
        format!("{:.0} KiB/s", b / KIB)
    }
}

/// A byte rate in the largest unit that divides it, grouped: "1 MiB/s", "1,000 B/s".
pub fn exact_rate(v: u64) -> String {
    if v >= 1 << 20 && v.is_multiple_of(1 << 20) {
        format!("{} MiB/s", thousands(v >> 20))
    } else if v >= 1 << 10 && v.is_multiple_of(1 << 10) {
        format!("{} KiB/s", thousands(v >> 10))
    } else {
        format!("{} B/s", thousands(v))
    }
}

/// Nanoseconds the wall clock (CLOCK_REALTIME) is ahead of CLOCK_MONOTONIC, the clock of the
/// events: this machine's now, unless a capture's recording says what it was there
/// ([`set_clock_of_recording`]).
static CLOCK_OFFSET_NS: std::sync::OnceLock<i128> = std::sync::OnceLock::new();

fn clock_offset_ns() -> i128 {
    *CLOCK_OFFSET_NS.get_or_init(|| {
        let now = |clock| {
            let mut ts = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: a valid timespec to fill.
            unsafe { libc::clock_gettime(clock, &mut ts) };
            ts.tv_sec as i128 * 1_000_000_000 + ts.tv_nsec as i128
        };
        now(libc::CLOCK_REALTIME) - now(libc::CLOCK_MONOTONIC)
    })
}

/// Times of a capture are told by the clocks of the machine that recorded it: its
/// CLOCK_MONOTONIC and wall clock at the same moment. Call before any time is formatted.
pub fn set_clock_of_recording(monotonic_ns: u64, unix_ns: u64) {
    let _ = CLOCK_OFFSET_NS.set(unix_ns as i128 - monotonic_ns as i128);
}

/// A CLOCK_MONOTONIC time as the local wall clock says it: "12:03:04".
pub fn clock(monotonic_ns: u64) -> String {
    let unix = ((monotonic_ns as i128 + clock_offset_ns()) / 1_000_000_000) as libc::time_t;
    // SAFETY: localtime_r fills the tm it is given; a zeroed tm is a valid one.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&unix, &mut tm) }.is_null() {
        return format!("{unix} s");
    }
    format!("{:02}:{:02}:{:02}", tm.tm_hour, tm.tm_min, tm.tm_sec)
}

/// A span of seconds: "41 s", "20 min", "11.5 h", "3.2 days".
pub fn span(secs: f64) -> String {
    if secs < 120.0 {
        format!("{secs:.0} s")
    } else if secs < 7200.0 {
        format!("{:.0} min", secs / 60.0)
    } else if secs < 3.0 * 86400.0 {
        format!("{:.1} h", secs / 3600.0)
    } else {
        format!("{:.1} days", secs / 86400.0)
    }
}

/// A latency target in µs as people say it: "2 ms", "1.5 ms", "500 µs".
pub fn latency_us(us: u64) -> String {
    if us.is_multiple_of(1000) {
        format!("{} ms", us / 1000)
    } else if us >= 1000 {
        format!("{:.1} ms", us as f64 / 1000.0)
    } else {
        format!("{us} µs")
    }
}

/// Microseconds in a table cell: whole from 100 up, else one decimal.
pub fn micros(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else {
        format!("{v:.1}")
    }
}

/// Nanoseconds between two timestamps, in µs with one decimal: "12.5 µs".
pub fn micros_between(a: u64, b: u64) -> String {
    format!("{:.1} µs", b.saturating_sub(a) as f64 / 1000.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_formatter_keeps_its_text() {
        assert_eq!(thousands(0), "0");
        assert_eq!(thousands(999), "999");
        assert_eq!(thousands(1000), "1,000");
        assert_eq!(thousands(13918839), "13,918,839");
        assert_eq!(mib(24_536_678), "23.4");
        assert_eq!(
            (size(512), size(4096), size(3 << 19)),
            ("512 B".into(), "4.0 KiB".into(), "1.5 MiB".into())
        );
        assert_eq!(avg_size(117_043.2), "114.3 KiB");
        assert_eq!(exact_size(4 << 30), "4 GiB");
        assert_eq!(exact_size(65536), "64 KiB");
        assert_eq!(kib(512 << 10), "512 KiB");
        assert_eq!(kib(1536), "1.50 KiB");
        assert_eq!(kib_per(135302774, 10636637), "6.36 KiB");
        assert_eq!(kib_per(1, 0), "n/a (no requests)");
        assert_eq!(rate(8 << 20), "8.0 MiB/s");
        assert_eq!(exact_rate(1 << 20), "1 MiB/s");
        assert_eq!(exact_rate(1000), "1,000 B/s");
        assert_eq!(span(41.0), "41 s");
        assert_eq!(span(1217.0), "20 min");
        assert_eq!(span(41242.0), "11.5 h");
        assert_eq!(span(5.0 * 86400.0), "5.0 days");
        assert_eq!(
            (micros(123.4), micros(12.34)),
            ("123".into(), "12.3".into())
        );
        assert_eq!(micros_between(1000, 13_500), "12.5 µs");
    }
}
