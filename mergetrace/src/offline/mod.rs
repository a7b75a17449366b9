pub mod analysis;
pub mod lineage;
pub mod load;
pub mod names;
#[cfg(test)]
pub mod synth;
