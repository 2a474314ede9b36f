//! Host side of shaders/elementwise.wgsl: residual-stream arithmetic.

use super::shader_params;
use crate::gpu::{Gpu, GpuError, Kernel, Profiler};

shader_params!(
    /// Mirrors `ElementwiseParams` in shaders/elementwise.wgsl.
    ElementwiseParams in "elementwise" { n: u32, _pad0: u32, _pad1: u32, _pad2: u32 }
);

pub const ADD: Kernel = Kernel::new("add", "elementwise", "add");
pub const KERNELS: &[Kernel] = &[ADD];

/// out [n] = a [n] + b [n] (out may not alias a or b: wgpu forbids a buffer bound twice
/// with write access).
pub fn add(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    n: usize,
    a: &wgpu::Buffer,
    b: &wgpu::Buffer,
    out: &wgpu::Buffer,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    let bytes = (n * 4) as u64;
    if a.size() < bytes || b.size() < bytes || out.size() < bytes {
        return Err(GpuError::Shape(format!("add: buffers too small for {n} values")));
    }
    let p = ElementwiseParams { n: n as u32, ..Default::default() };
    gpu.dispatch(enc, &ADD, &p, &[(1, a), (2, b), (3, out)], ((n as u32).div_ceil(256), 1), profiler)
}
