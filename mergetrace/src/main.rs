//! mergetrace: where does your I/O meter sit — before or after merging?
//!
//! Data path: `kernel` (probes → events) → `kernel::collector` → `aggregate` (pure) →
//! `snapshot` (named rows) → `view` (TUI, text, JSON).
mod aggregate;
mod cgroups;
mod cli;
mod device;
mod kernel;
mod limits;
mod live;
mod meter;
mod snapshot;
mod view;

use clap::Parser;

fn main() {
    let cli = cli::Cli::parse();
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
            None => live::run(cli.live).await,
            Some(c) => match c {},
        }
    });
    if let Err(e) = result {
        // One line: the error and its causes.
        let chain: Vec<String> = e.chain().map(|c| c.to_string()).collect();
        eprintln!("mergetrace: error: {}", chain.join(": "));
        std::process::exit(1);
    }
}
