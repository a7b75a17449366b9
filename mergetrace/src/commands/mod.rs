pub mod check;
pub mod demo;
pub mod export;
pub mod live;
pub mod record;
pub mod report;
pub mod serve;
