pub mod analysis;
pub mod latency;
pub mod lineage;
pub mod load;
pub mod names;
