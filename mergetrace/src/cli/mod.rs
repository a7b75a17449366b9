//! What the command line shares: the flags several commands take ([`args`]), what ends a run
//! ([`stop`]), what a counting run traces ([`targets`]), and how an error is told in one line.
pub mod args;
pub mod stop;
pub mod targets;

/// The error and its causes on one line. Verifier logs and other multi-line causes keep only
/// their first line (set RUST_LOG=debug for the whole chain).
pub fn error_line(e: &anyhow::Error) -> String {
    log::debug!("{e:?}");
    let mut parts: Vec<String> = Vec::new();
    for cause in e.chain() {
        let text = cause.to_string();
        let first = text.lines().next().unwrap_or_default().trim();
        let first = first
            .split(". Verifier output:")
            .next()
            .unwrap_or(first)
            .trim()
            .to_string();
        // aya repeats its cause in its own message: skip a part already said.
        if !first.is_empty() && !parts.iter().any(|p| p.contains(&first)) {
            parts.push(first);
        }
    }
    parts.join(": ")
}
