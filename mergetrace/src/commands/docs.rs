//! `mergetrace __docs --out DIR` (hidden): man pages and shell completions generated from the
//! command-line definition itself, so they never drift from `--help`. `cargo xtask dist` packs
//! them.
use std::{
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context, Result};
use clap::Args;
use clap_complete::Shell;

#[derive(Args, Debug)]
pub struct DocsArgs {
    /// Where to write man/man1/*.1 and completions/ (created if missing).
    #[arg(long, value_name = "DIR")]
    pub out: PathBuf,
}

/// Writes mergetrace.1, one mergetrace-<command>.1 per visible subcommand, and the bash, zsh
/// and fish completions.
pub fn run(args: &DocsArgs, cli: clap::Command) -> Result<()> {
    let man = args.out.join("man/man1");
    fs::create_dir_all(&man).with_context(|| format!("cannot create {}", man.display()))?;
    write_man(cli.clone(), "mergetrace", &man)?;
    for sub in cli.get_subcommands().filter(|s| !s.is_hide_set()) {
        write_man(sub.clone(), &format!("mergetrace-{}", sub.get_name()), &man)?;
    }
    let completions = args.out.join("completions");
    fs::create_dir_all(&completions)
        .with_context(|| format!("cannot create {}", completions.display()))?;
    for shell in [Shell::Bash, Shell::Zsh, Shell::Fish] {
        clap_complete::generate_to(shell, &mut cli.clone(), "mergetrace", &completions)
            .with_context(|| format!("cannot write the {shell} completions"))?;
    }
    Ok(())
}

fn write_man(cmd: clap::Command, name: &str, dir: &Path) -> Result<()> {
    let mut page = Vec::new();
    clap_mangen::Man::new(cmd)
        .title(name.to_uppercase())
        .render(&mut page)
        .context("cannot render a man page")?;
    let path = dir.join(format!("{name}.1"));
    fs::write(&path, page).with_context(|| format!("cannot write {}", path.display()))
}
