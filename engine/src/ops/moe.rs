//! Host side of shaders/moe.wgsl (being written: see the open issue).

use crate::gpu::Kernel;

pub const KERNELS: &[Kernel] = &[];

pub fn params() -> Vec<super::ParamsLayout> {
    Vec::new()
}
