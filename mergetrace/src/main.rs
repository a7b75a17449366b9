//! The `mergetrace` command: parses the command line and runs the command it names. Everything
//! else is the library (lib.rs).
use clap::{Parser, Subcommand};
use mergetrace::{cli, commands};

#[derive(Parser, Debug)]
#[command(
    name = "mergetrace",
    version,
    about = "Per-cgroup view of what blk-throttle charged, what merged (and how), and what the device saw",
    after_long_help = "On a terminal the live view is full-screen. Keys: t the last interval or the \
        whole run so far; s sort by the next column shown, r reverse; / filter by cgroup (Enter \
        keeps it, Esc clears it); Up/Down select a row: its counts, the blk-throttle limit that \
        binds it and its verdict below the table; q, Esc or Ctrl-C stop (the whole-run table \
        stays on the screen).",
    args_conflicts_with_subcommands = true,
    subcommand_negates_reqs = true
)]
struct Cli {
    #[command(flatten)]
    live: commands::live::LiveArgs,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Record every event of a run to a capture file, for `report` and `export`.
    Record(commands::record::RecordArgs),
    /// Read a capture: the same per-cgroup tables as the live view, and distributions.
    Report(commands::report::ReportArgs),
    /// Convert a capture for other tools: Perfetto/Chrome trace JSON, blktrace binary
    /// (for blkparse, btt), CSV or JSON lines.
    Export(commands::export::ExportArgs),
    /// A merge checklist for one device, without tracing: scheduler and what nomerges
    /// does here, merge rate and request size per operation (since the disk was added, and
    /// over a short sample), merge ceilings, throttled cgroups, and which tier mergetrace can
    /// run.
    Check(commands::check::CheckArgs),
    /// A merging lab, built in: a loop device in /dev/shm, a built-in workload, tables of
    /// what nomerges, batching and a throttle limit do, and a self-check against /proc/diskstats. Needs root; cleans up after itself.
    Demo(commands::demo::DemoArgs),
    /// The fleet view: count in the kernel continuously and serve the running totals on
    /// /metrics in the Prometheus text format (loopback by default). Needs root.
    Serve(commands::serve::ServeArgs),
    /// Run the built-in O_DIRECT workload (used by `demo` and the tests; no fio needed).
    #[command(hide = true, name = "__workload")]
    Workload(commands::workload::WorkloadArgs),
    /// Write the man pages and shell completions (used by `cargo xtask dist`).
    #[command(hide = true, name = "__docs")]
    Docs(commands::docs::DocsArgs),
}

fn main() {
    let cli = Cli::parse();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mergetrace: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            None => commands::live::run(cli.live).await,
            Some(Command::Workload(w)) => commands::workload::run(&w),
            Some(Command::Docs(d)) => {
                commands::docs::run(&d, <Cli as clap::CommandFactory>::command())
            }
            Some(Command::Demo(d)) => commands::demo::run(&d),
            Some(Command::Check(c)) => commands::check::run(&c),
            Some(Command::Record(r)) => commands::record::run(r).await,
            Some(Command::Report(r)) => commands::report::run(&r),
            Some(Command::Export(e)) => commands::export::run(&e),
            Some(Command::Serve(s)) => commands::serve::run(s).await,
        }
    });
    if let Err(e) = result {
        eprintln!("mergetrace: error: {}", cli::error_line(&e));
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use clap::CommandFactory;

    use super::*;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn man_pages_and_completions_come_from_the_cli() {
        let dir = tempfile::tempdir().unwrap();
        let args = commands::docs::DocsArgs {
            out: dir.path().to_path_buf(),
        };
        commands::docs::run(&args, Cli::command()).unwrap();
        let man = |n: &str| std::fs::read_to_string(dir.path().join("man/man1").join(n)).unwrap();
        assert!(
            man("mergetrace.1").contains("blk\\-throttle"),
            "{}",
            man("mergetrace.1")
        );
        let check = man("mergetrace-check.1");
        assert!(check.contains("merge checklist"), "{check}");
        assert!(!dir.path().join("man/man1/mergetrace-__workload.1").exists());
        for f in ["mergetrace.bash", "_mergetrace", "mergetrace.fish"] {
            let c = std::fs::read_to_string(dir.path().join("completions").join(f)).unwrap();
            assert!(c.contains("meter-unit"), "{f}");
        }
    }

    #[test]
    fn parses_live_flags() {
        let c = Cli::try_parse_from([
            "mergetrace",
            "-d",
            "vda",
            "-d",
            "7:3",
            "-i",
            "500ms",
            "--json",
            "--duration",
            "10s",
            "-c",
            "/mt",
        ])
        .unwrap();
        assert_eq!(c.live.trace.devices, ["vda", "7:3"]);
        assert_eq!(c.live.run.interval, Duration::from_millis(500));
        assert_eq!(c.live.run.duration, Some(Duration::from_secs(10)));
        assert!(c.live.json);
        assert_eq!(c.live.subtree.cgroup.as_deref(), Some("/mt"));
    }

    #[test]
    fn rejects_bad_values() {
        assert!(Cli::try_parse_from(["mergetrace", "-d", "vda", "-i", "0s"]).is_err());
        assert!(Cli::try_parse_from(["mergetrace", "-d", "vda", "-i", "soon"]).is_err());
        assert!(Cli::try_parse_from(["mergetrace", "-d", "vda", "--json", "--text"]).is_err());
        assert!(Cli::try_parse_from(["mergetrace", "-d", "vda", "--ring-mib", "3"]).is_err());
        assert!(Cli::try_parse_from(["mergetrace"]).is_err());
        assert!(Cli::try_parse_from(["mergetrace", "-d", "vda", "--meter-unit", "0"]).is_err());
    }

    #[test]
    fn the_shared_flags_mean_the_same_everywhere() {
        let live = Cli::try_parse_from(["mergetrace", "-d", "vda"])
            .unwrap()
            .live;
        let Some(Command::Record(rec)) =
            Cli::try_parse_from(["mergetrace", "record", "-d", "vda", "-o", "x.mtr"])
                .unwrap()
                .command
        else {
            panic!("not record")
        };
        assert_eq!(live.run.ring_mib, rec.run.ring_mib);
        assert_eq!(live.trace.meter_unit, vec![256 << 10, 1 << 20]);
        assert_eq!(live.trace.meter_unit, rec.trace.meter_unit);
        for sub in [&["record", "-o", "x.mtr"][..], &[][..]] {
            let mut argv = vec!["mergetrace"];
            argv.extend_from_slice(sub);
            argv.extend(["-d", "vda", "--ring-mib", "2048"]);
            assert!(Cli::try_parse_from(&argv).is_err(), "{argv:?}");
        }
        let c = Cli::try_parse_from(["mergetrace", "-d", "vda", "--meter-unit", "128k,1m"]);
        assert_eq!(c.unwrap().live.trace.meter_unit, vec![128 << 10, 1 << 20]);
        // Cloud presets by name, beside sizes; an unknown name is refused with the list.
        let c = Cli::try_parse_from([
            "mergetrace",
            "-d",
            "vda",
            "--meter-unit",
            "aws-gp3,AWS-st1,64k",
        ]);
        assert_eq!(
            c.unwrap().live.trace.meter_unit,
            vec![256 << 10, 1 << 20, 64 << 10]
        );
        let e = Cli::try_parse_from(["mergetrace", "-d", "vda", "--meter-unit", "aws-gp9"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("'aws-gp9' is neither a size nor a cloud preset; presets: aws-gp2, aws-gp3"),
            "{e}"
        );
    }
}
