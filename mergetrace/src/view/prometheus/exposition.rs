//! The model as the Prometheus text exposition (format 0.0.4), family by family. The order of
//! the families and the help texts are part of the output: docs and dashboards read them.
use std::{collections::BTreeMap, fmt};

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeCounterValue, EncodeMetric, NoLabelSet},
    metrics::{counter::ConstCounter, gauge::ConstGauge, MetricType},
};

use mergetrace_common::latency::{lat_bucket_end_ns, LAT_BUCKETS};

use super::{bpr_bounds, size_bounds, Model, Row, SeriesKey, MERGE_PATHS};
use crate::model::latency::{Class, Latency, Stage};

#[derive(Debug)]
pub(super) struct Exposition(pub(super) Model);

type Rows = BTreeMap<SeriesKey, Row>;

impl Collector for Exposition {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let model = &self.0;
        info(&mut enc, model)?;
        bios_and_requests(&mut enc, &model.rows)?;
        throttle(&mut enc, &model.rows)?;
        meters_and_limits(&mut enc, &model.rows)?;
        histograms(&mut enc, &model.rows)?;
        losses_and_folding(&mut enc, model)
    }
}

fn info(enc: &mut DescriptorEncoder, model: &Model) -> fmt::Result {
    let mut m = enc.encode_descriptor(
        "mergetrace",
        "mergetrace is running: the probe tier in use and the version.",
        None,
        MetricType::Info,
    )?;
    m.encode_info(&[
        ("tier", model.tier.as_str()),
        ("version", env!("CARGO_PKG_VERSION")),
    ])
}

fn bios_and_requests(enc: &mut DescriptorEncoder, rows: &Rows) -> fmt::Result {
    counter(enc, "mergetrace_bios",
        "Bios submitted (as they leave blk-throttle, before merging; split remainders not counted again).",
        rows, |r| Some(r.bios))?;
    counter(
        enc,
        "mergetrace_bio_bytes",
        "Bytes in the bios submitted.",
        rows,
        |r| Some(r.bio_bytes),
    )?;
    labelled(enc, "mergetrace_merged",
        "Bios and requests merged into an existing request, by path (the sum over paths is what /proc/diskstats calls merges).",
        rows, "path", |r| MERGE_PATHS.iter().map(|p| p.to_string()).zip(r.merged).collect())?;
    counter(enc, "mergetrace_requests",
        "Requests issued to the device, each once (a requeued request issued again is one request).",
        rows, |r| Some(r.requests))?;
    counter(enc, "mergetrace_flush_only_writes",
        "Empty write bios with REQ_PREFLUSH/FUA (fsync, journal commits) completed by the flush machinery without a write request; /proc/diskstats counts them as writes.",
        rows, |r| Some(r.flush_only))?;
    counter(
        enc,
        "mergetrace_requeues",
        "Requests the driver handed back to be issued again.",
        rows,
        |r| Some(r.requeues),
    )?;
    counter(
        enc,
        "mergetrace_request_bytes",
        "Bytes in the requests issued to the device.",
        rows,
        |r| Some(r.request_bytes),
    )?;
    counter(
        enc,
        "mergetrace_splits",
        "Bios split into pieces.",
        rows,
        |r| Some(r.splits),
    )
}

fn throttle(enc: &mut DescriptorEncoder, rows: &Rows) -> fmt::Result {
    counter(enc, "mergetrace_throttle_charged_ios",
        "Ios blk-throttle charged (one per bio and per split remainder) where the cgroup has a rule for the direction.",
        rows, |r| Some(r.charged_ios))?;
    counter(enc, "mergetrace_throttle_charged_bytes",
        "Bytes blk-throttle charged (once per bio, 512 per discard) where the cgroup has a rule for the direction.",
        rows, |r| Some(r.charged_bytes))?;
    counter(
        enc,
        "mergetrace_throttled_bios",
        "Bios that waited in blk-throttle's queue.",
        rows,
        |r| Some(r.throttled_bios),
    )?;
    counter(enc, "mergetrace_throttle_delay_seconds",
        "Time the throttled bios waited in blk-throttle's queue, measured per bio (fentry tier); on the tracepoint tier only while it is known to be 0 (nothing waited), absent otherwise.",
        rows, |r| r.delay_ns.map(|ns| ns as f64 / 1e9))?;
    gauge(enc, "mergetrace_throttle_delay_estimated",
        "1 when mergetrace_throttle_delay_seconds_total of the same labels is not measured per bio (tracepoint tier: present only as 0 while nothing waited), 0 when it is (fentry tier).",
        rows, |r| r.delay_ns.map(|_| r.delay_estimated as u64))
}

fn meters_and_limits(enc: &mut DescriptorEncoder, rows: &Rows) -> fmt::Result {
    labelled(enc, "mergetrace_cloud_meter_units",
        "Units a cloud-volume meter counting each device request as ceil(size / unit_bytes), at least 1, would charge (--meter-unit).",
        rows, "unit_bytes", |r| r.cloud.iter().map(|(unit, n)| (unit.to_string(), *n)).collect())?;
    labelled(enc, "mergetrace_wbt_requests",
        "New requests of the cgroup under wbt, where wbt is on: wbt=\"slot\" took an in-flight slot (buffered writes, discards), wbt=\"passed\" were let by (O_DIRECT writes). Merged bios take none.",
        rows, "wbt", |r| if r.wbt_on { vec![("slot".into(), r.wbt[0]), ("passed".into(), r.wbt[1])] } else { Vec::new() })?;
    labelled(enc, "mergetrace_iocost_bios",
        "Bios io.cost charged, where io.cost is on: charge=\"base\" started a request (a base cost plus pages), charge=\"pages\" merged (pages only).",
        rows, "charge", |r| if r.iocost_on { vec![("base".into(), r.iocost_bios[0]), ("pages".into(), r.iocost_bios[1])] } else { Vec::new() })?;
    counter(enc, "mergetrace_iocost_charged_seconds",
        "Device time io.cost charged the cgroup, where io.cost is on, by its model at vrate 100 % (what io.stat cost.usage counts, in seconds).",
        rows, |r| r.iocost_on.then(|| r.iocost_cost_us / 1e6))?;
    gauge(enc, "mergetrace_throttle_limit_iops",
        "The blk-throttle IOPS limit in force for the cgroup and direction (the tightest of its own and its ancestors'); absent without one.",
        rows, |r| r.limit_iops)?;
    gauge(enc, "mergetrace_throttle_limit_bytes_per_second",
        "The blk-throttle bandwidth limit in force for the cgroup and direction (the tightest of its own and its ancestors'); absent without one.",
        rows, |r| r.limit_bps)
}

fn histograms(enc: &mut DescriptorEncoder, rows: &Rows) -> fmt::Result {
    histogram(
        enc,
        "mergetrace_request_size_bytes",
        "Size of the requests issued to the device (a requeued request counts again).",
        rows,
        &size_bounds(),
        |r| (&r.size_hist[..], r.request_bytes),
    )?;
    histogram(
        enc,
        "mergetrace_bios_per_request",
        "Bios (and split pieces) carried by each request issued; _sum is bios + splits.",
        rows,
        &bpr_bounds(),
        |r| (&r.bpr_hist[..], r.bios + r.splits),
    )?;
    for (stage, name, help) in [
        (
            Stage::Queue,
            "mergetrace_queue_latency_seconds",
            "--latency: time from a request's creation to its first issue, by whether it carried merged bios.",
        ),
        (
            Stage::Device,
            "mergetrace_device_latency_seconds",
            "--latency: time from a request's last issue to its completion, by whether it carried merged bios.",
        ),
    ] {
        latency_histogram(enc, name, help, rows, stage)?;
    }
    Ok(())
}

/// One latency histogram family: a series per row with `--latency` and request class
/// (`request="single"` or `"merged"`), log2 buckets in seconds, the exact sum.
fn latency_histogram(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &Rows,
    stage: Stage,
) -> fmt::Result {
    let bounds: Vec<f64> = (0..LAT_BUCKETS)
        .map(|b| match lat_bucket_end_ns(b) {
            u64::MAX => f64::INFINITY,
            ns => ns as f64 / 1e9,
        })
        .collect();
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (k, r) in rows.iter().filter(|(_, r)| r.latency_on) {
        let l = Latency(r.latency);
        for (class, value) in [(Class::Single, "single"), (Class::Merged, "merged")] {
            let counts = l.buckets(stage, class);
            let buckets: Vec<(f64, u64)> = bounds.iter().copied().zip(counts).collect();
            let [d, c, dir, n] = k.labels();
            let labels = [d, c, dir, n, ("request", value)];
            m.encode_family(&labels)?.encode_histogram::<NoLabelSet>(
                l.sum_ns(stage, class) as f64 / 1e9,
                l.count(stage, class),
                &buckets,
                None,
            )?;
        }
    }
    Ok(())
}

fn losses_and_folding(enc: &mut DescriptorEncoder, model: &Model) -> fmt::Result {
    let mut m = enc.encode_descriptor(
        "mergetrace_lost_events",
        "Events the kernel side could not count, by kind; not zero means the counts are low.",
        None,
        MetricType::Counter,
    )?;
    for (kind, n) in &model.lost {
        ConstCounter::new(*n).encode(m.encode_family(&[("kind", *kind)])?)?;
    }
    let mut m = enc.encode_descriptor(
        "mergetrace_kernel_skipped_runs",
        "Runs of an eBPF program the kernel skipped (it was already running on that CPU when an \
         interrupt reached the same hook): what they would have counted may be missing. A \
         series only for a program with skipped runs.",
        None,
        MetricType::Counter,
    )?;
    for (program, n) in &model.skipped_runs {
        ConstCounter::new(*n).encode(m.encode_family(&[("program", program.as_str())])?)?;
    }
    let m = enc.encode_descriptor(
        "mergetrace_cgroups_folded",
        "Cgroups summed into cgroup=\"(other)\" because --max-cgroups labels were taken.",
        None,
        MetricType::Gauge,
    )?;
    ConstGauge::new(model.folded_cgroups() as u64).encode(m)
}

/// One counter family: a value per row (rows with `None` have no series).
fn counter<V: EncodeCounterValue + fmt::Debug>(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &Rows,
    value: impl Fn(&Row) -> Option<V>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (k, r) in rows {
        if let Some(v) = value(r) {
            ConstCounter::new(v).encode(m.encode_family(&k.labels())?)?;
        }
    }
    Ok(())
}

/// One counter family with a fourth label: a series per (row, label value).
fn labelled(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &Rows,
    label: &'static str,
    values: impl Fn(&Row) -> Vec<(String, u64)>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (k, r) in rows {
        for (value, n) in values(r) {
            let [d, c, dir, name] = k.labels();
            let labels = [d, c, dir, name, (label, value.as_str())];
            ConstCounter::new(n).encode(m.encode_family(&labels)?)?;
        }
    }
    Ok(())
}

/// One gauge family: a value per row (rows with `None` have no series).
fn gauge(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &Rows,
    value: impl Fn(&Row) -> Option<u64>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (k, r) in rows {
        if let Some(v) = value(r) {
            ConstGauge::new(v).encode(m.encode_family(&k.labels())?)?;
        }
    }
    Ok(())
}

/// One histogram family from per-bucket counts.
fn histogram(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    rows: &Rows,
    bounds: &[f64],
    data: impl Fn(&Row) -> (&[u64], u64),
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (k, r) in rows {
        let (counts, sum) = data(r);
        let buckets: Vec<(f64, u64)> = bounds.iter().copied().zip(counts.iter().copied()).collect();
        let count = counts.iter().sum();
        m.encode_family(&k.labels())?
            .encode_histogram::<NoLabelSet>(sum as f64, count, &buckets, None)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::tests::*;
    use super::super::*;

    #[test]
    fn latency_histograms_per_request_class_only_where_counted() {
        use crate::model::latency::Latency;
        use mergetrace_common::latency::{lat_bucket, LatencyHist, MERGED, SINGLE};
        let mut h = LatencyHist::default();
        // Queue: 2 single requests of 1.5 µs, 1 merged of 100 µs; device: 1 merged of 1 ms.
        h.queue[SINGLE][lat_bucket(1_500)] = 2;
        h.queue_ns[SINGLE] = 3_000;
        h.queue[MERGED][lat_bucket(100_000)] = 1;
        h.queue_ns[MERGED] = 100_000;
        h.device[MERGED][lat_bucket(1_000_000)] = 1;
        h.device_ns[MERGED] = 1_000_000;
        let mut st = write_stats(96, 4);
        st.latency = Some(Latency(h));
        let mut m = Model::new(10, "tracepoint");
        m.update(&snapshot(&[("/mt", st), ("/other", write_stats(8, 8))]));
        let text = m.render();
        let l = "device=\"loop3\",cgroup=\"/mt\",direction=\"write\",name=\"\"";
        for want in [
            format!("mergetrace_queue_latency_seconds_count{{{l},request=\"single\"}} 2\n"),
            format!("mergetrace_queue_latency_seconds_sum{{{l},request=\"single\"}} 0.000003\n"),
            format!("mergetrace_queue_latency_seconds_count{{{l},request=\"merged\"}} 1\n"),
            format!("mergetrace_device_latency_seconds_count{{{l},request=\"merged\"}} 1\n"),
            format!("mergetrace_device_latency_seconds_bucket{{{l},request=\"merged\",le=\"+Inf\"}} 1\n"),
        ] {
            assert!(text.contains(&want), "no {want:?} in\n{text}");
        }
        // A row without --latency has no latency series.
        assert!(
            !text.contains("cgroup=\"/other\",direction=\"write\",name=\"\",request="),
            "{text}"
        );
    }

    #[test]
    fn cumulative_buckets_from_log2_counts() {
        let mut st = write_stats(96, 4);
        // 1 request of 4 KiB (bucket ≤ 4096), 3 of 128 KiB, and one over 8 MiB
        st.histograms.request_bytes = BTreeMap::from([(4096, 1), (131072, 3), (u64::MAX, 1)]);
        // 1 request with 1 bio, 3 with 32–63 bios
        st.histograms.bios_per_request = BTreeMap::from([(1, 1), (63, 3)]);
        let mut m = Model::new(10, "tracepoint");
        m.update(&snapshot(&[("/mt", st)]));
        let text = m.render();
        let b = sample_lines(&text, "mergetrace_request_size_bytes_bucket");
        assert_eq!(b.len(), SIZE_BUCKETS, "{text}");
        let want = [
            ("512", 0),
            ("1024", 0),
            ("2048", 0),
            ("4096", 1),
            ("8192", 1),
            ("65536", 1),
            ("131072", 4),
            ("4.194304e+06", 4),
            ("8.388608e+06", 4),
            ("+Inf", 5),
        ];
        for (le, n) in want {
            let line = b
                .iter()
                .find(|l| l.contains(&format!("le=\"{le}\"")))
                .unwrap_or_else(|| panic!("no le={le} bucket in {text}"));
            assert!(line.ends_with(&format!(" {n}")), "{line}: want {n}");
        }
        assert!(text.contains(
            "mergetrace_request_size_bytes_count{device=\"loop3\",cgroup=\"/mt\",direction=\"write\",name=\"\"} 5\n"
        ), "{text}");
        assert!(text.contains(
            "mergetrace_request_size_bytes_sum{device=\"loop3\",cgroup=\"/mt\",direction=\"write\",name=\"\"} 393216.0\n"
        ), "{text}");
        let b = sample_lines(&text, "mergetrace_bios_per_request_bucket");
        assert_eq!(b.len(), COUNT_BUCKETS);
        assert!(
            b[0].contains("le=\"1\"") && b[0].ends_with(" 1"),
            "{}",
            b[0]
        );
        assert!(
            b[1].contains("le=\"3\"") && b[1].ends_with(" 1"),
            "{}",
            b[1]
        );
        assert!(
            b[5].contains("le=\"63\"") && b[5].ends_with(" 4"),
            "{}",
            b[5]
        );
        assert!(b[10].contains("le=\"2047\"") && b[10].ends_with(" 4"));
        assert!(b[11].contains("le=\"+Inf\"") && b[11].ends_with(" 4"));
        assert!(text.contains("mergetrace_bios_per_request_sum{device=\"loop3\",cgroup=\"/mt\",direction=\"write\",name=\"\"} 96.0\n"));
        assert!(text.contains("# TYPE mergetrace_request_size_bytes histogram\n"));

        // a parser agrees
        let s = parse(&text);
        let h = s
            .samples
            .iter()
            .find(|s| s.metric == "mergetrace_request_size_bytes")
            .expect("histogram parsed");
        let prometheus_parse::Value::Histogram(hs) = &h.value else {
            panic!("not a histogram: {h:?}")
        };
        let mut last = 0.0;
        for c in hs {
            assert!(c.count >= last, "buckets are cumulative: {hs:?}");
            last = c.count;
        }
        assert_eq!(last, 5.0);
    }

    #[test]
    fn escapes_cgroup_paths() {
        let nasty = "/we\"ird\\name\nx";
        let mut m = Model::new(10, "tracepoint");
        m.update(&snapshot(&[(nasty, write_stats(8, 2))]));
        let text = m.render();
        let want = r#"mergetrace_bios_total{device="loop3",cgroup="/we\"ird\\name\nx",direction="write",name=""} 8"#;
        assert!(text.contains(want), "want {want} in:\n{text}");
        // no raw newline or quote breaks a sample line
        for l in text.lines() {
            assert!(
                l.starts_with('#') || l.starts_with("mergetrace"),
                "a line broken by the label value: {l:?}"
            );
        }
    }

    #[test]
    fn exposition_has_the_documented_families() {
        let mut st = write_stats(32, 1);
        st.charged_ios = 32;
        st.charged_bytes = 32 * 4096;
        st.throttled.bios = 5;
        st.throttled.delay_ns_total = Some(1_500_000_000);
        st.throttled.delay_estimated = true;
        st.limits.insert(
            "wiops",
            crate::model::meter::LimitUse {
                limit: 500,
                cgroup: "/mt".into(),
                used_pct: 1.0,
                used_pct_merge_aware: None,
                ..Default::default()
            },
        );
        st.limits.insert(
            "wbps",
            crate::model::meter::LimitUse {
                limit: 1 << 20,
                cgroup: "/".into(),
                used_pct: 1.0,
                used_pct_merge_aware: None,
                ..Default::default()
            },
        );
        st.meters.cloud = vec![crate::model::meter::CloudMeter {
            unit_bytes: 262144,
            units: 1,
        }];
        let mut s = snapshot(&[("/mt", st)]);
        s.lost_by_kind.insert("rq_issue", 3);
        s.unsaid.skipped_runs.insert("block_rq_complete".into(), 2);
        let mut m = Model::new(10, "tracepoint");
        m.update(&s);
        let text = m.render();
        let l = "{device=\"loop3\",cgroup=\"/mt\",direction=\"write\",name=\"\"}";
        for (ty, family, line) in [
            ("gauge", "mergetrace_info", "mergetrace_info{tier=\"tracepoint\",version=\"0.1.0\"} 1".to_string()),
            ("counter", "mergetrace_bios_total", format!("mergetrace_bios_total{l} 32")),
            ("counter", "mergetrace_bio_bytes_total", format!("mergetrace_bio_bytes_total{l} 131072")),
            ("counter", "mergetrace_merged_total", "mergetrace_merged_total{device=\"loop3\",cgroup=\"/mt\",direction=\"write\",name=\"\",path=\"plug\"} 31".into()),
            ("counter", "mergetrace_merged_total", "mergetrace_merged_total{device=\"loop3\",cgroup=\"/mt\",direction=\"write\",name=\"\",path=\"unknown\"} 0".into()),
            ("counter", "mergetrace_requests_total", format!("mergetrace_requests_total{l} 1")),
            ("counter", "mergetrace_request_bytes_total", format!("mergetrace_request_bytes_total{l} 131072")),
            ("counter", "mergetrace_splits_total", format!("mergetrace_splits_total{l} 0")),
            ("counter", "mergetrace_throttle_charged_ios_total", format!("mergetrace_throttle_charged_ios_total{l} 32")),
            ("counter", "mergetrace_throttle_charged_bytes_total", format!("mergetrace_throttle_charged_bytes_total{l} 131072")),
            ("counter", "mergetrace_throttled_bios_total", format!("mergetrace_throttled_bios_total{l} 5")),
            ("counter", "mergetrace_throttle_delay_seconds_total", format!("mergetrace_throttle_delay_seconds_total{l} 1.5")),
            ("gauge", "mergetrace_throttle_delay_estimated", format!("mergetrace_throttle_delay_estimated{l} 1")),
            ("counter", "mergetrace_cloud_meter_units_total", "mergetrace_cloud_meter_units_total{device=\"loop3\",cgroup=\"/mt\",direction=\"write\",name=\"\",unit_bytes=\"262144\"} 1".into()),
            ("gauge", "mergetrace_throttle_limit_iops", format!("mergetrace_throttle_limit_iops{l} 500")),
            ("gauge", "mergetrace_throttle_limit_bytes_per_second", format!("mergetrace_throttle_limit_bytes_per_second{l} 1048576")),
            ("counter", "mergetrace_lost_events_total", "mergetrace_lost_events_total{kind=\"rq_issue\"} 3".into()),
            ("counter", "mergetrace_lost_events_total", "mergetrace_lost_events_total{kind=\"counters_map_full\"} 0".into()),
            ("counter", "mergetrace_kernel_skipped_runs_total", "mergetrace_kernel_skipped_runs_total{program=\"block_rq_complete\"} 2".into()),
            ("gauge", "mergetrace_cgroups_folded", "mergetrace_cgroups_folded 0".into()),
        ] {
            assert!(text.contains(&format!("# TYPE {family} {ty}\n")), "no TYPE for {family} in:\n{text}");
            assert!(text.contains(&format!("{line}\n")), "no {line:?} in:\n{text}");
        }
        // all seven paths
        assert_eq!(sample_lines(&text, "mergetrace_merged_total{").len(), 7);
        // the parser reads every sample line
        let s = parse(&text);
        let bios = s
            .samples
            .iter()
            .find(|s| s.metric == "mergetrace_bios_total")
            .unwrap();
        assert_eq!(bios.labels.get("cgroup"), Some("/mt"));
        assert_eq!(bios.value, prometheus_parse::Value::Counter(32.0));
        // (other) never carries a limit
        let mut m = Model::new(1, "tracepoint");
        let mut s2 = snapshot(&[("/a", write_stats(1, 1)), ("/mt", write_stats(1, 1))]);
        s2.devices[0].cgroups[1].dirs.write.limits.insert(
            "wiops",
            crate::model::meter::LimitUse {
                limit: 5,
                cgroup: "/mt".into(),
                used_pct: 0.0,
                used_pct_merge_aware: None,
                ..Default::default()
            },
        );
        m.update(&s2);
        assert!(!m.render().contains("mergetrace_throttle_limit_iops{"));
    }
}
