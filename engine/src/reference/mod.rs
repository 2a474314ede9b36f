//! Plain CPU versions of every op, obviously right and slow (f64 accumulation), with the
//! same signatures on slices as the GPU ops. Used by tests and for debugging.

pub mod attn_res;
pub mod dsa;
pub mod gemv;
pub mod kda;
pub mod moe;
pub mod norm;
pub mod numerics;
