pub mod blktrace;
pub mod events;
pub mod perfetto;
