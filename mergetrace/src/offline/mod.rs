pub mod analysis;
pub mod lineage;
pub mod names;
#[cfg(test)]
pub mod synth;
