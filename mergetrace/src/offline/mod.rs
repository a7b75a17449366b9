pub mod analysis;
pub mod lineage;
pub mod load;
pub mod names;
