//! Layers composed from ops, mirroring the reference model's module tree.

pub mod global_attn;
pub mod kda;
pub mod moe;
