pub mod cgroups;
pub mod container;
pub mod device;
pub mod diskstats;
pub mod iocost;
pub mod local_names;
pub mod queue;
pub mod workload;
