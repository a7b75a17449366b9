pub mod aggregate;
pub mod iocost;
pub mod limits;
pub mod meter;
pub mod snapshot;
