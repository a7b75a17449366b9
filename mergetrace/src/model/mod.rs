pub mod aggregate;
pub mod dir_stats;
pub mod iocost;
pub mod limits;
pub mod meter;
pub mod snapshot;
pub mod wbt;
