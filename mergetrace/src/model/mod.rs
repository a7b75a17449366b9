pub mod aggregate;
pub mod limits;
pub mod meter;
pub mod snapshot;
