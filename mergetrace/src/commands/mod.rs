//! One module per subcommand. Each is a leaf: it imports the library and [`crate::cli::args`],
//! never another command.
pub mod check;
pub mod demo;
pub mod docs;
pub mod export;
pub mod live;
pub mod record;
pub mod report;
pub mod serve;
pub mod workload;
