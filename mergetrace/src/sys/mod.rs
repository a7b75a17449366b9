pub mod cgroups;
pub mod device;
pub mod diskstats;
pub mod queue;
pub mod workload;
