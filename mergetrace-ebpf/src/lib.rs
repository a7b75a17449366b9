//! Host-side stub: the programs live in `main.rs` and only build for `bpfel-unknown-none`.
#![no_std]
