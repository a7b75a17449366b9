//! What only the unit tests use: synthetic event streams and fixtures of the system's state.
pub mod fixtures;
pub mod intervals;
pub mod synth;
pub mod tls;
