//! Host side of shaders/linear.wgsl: `y[t] = W x[t]` for a batch of tokens (prefill);
//! one token goes through the GEMV instead.

use super::moe::dispatch;
use super::shader_params;
use crate::gpu::{Gpu, GpuError, GpuTensor, Kernel, Profiler};
use crate::layout::DType;

shader_params!(
    /// Mirrors `LinearParams` in shaders/linear.wgsl.
    LinearParams in "linear" {
        rows: u32, cols: u32, tokens: u32, row_offset: u32, y_stride: u32, accumulate: u32, _pad1: u32, _pad2: u32,
    }
);

pub const LINEAR_BF16: Kernel = Kernel::new("linear_bf16", "linear", "linear_bf16");
pub const LINEAR_F32: Kernel = Kernel::new("linear_f32", "linear", "linear_bf16").with_constants(&[("W_F32", 1.0)]);
pub const KERNELS: &[Kernel] = &[LINEAR_BF16, LINEAR_F32];

/// [`linear`] for several matrices reading the same x; T = 1 runs them together through
/// [`super::gemv::gemv_many`] (one dispatch per four matrices).
pub fn linear_many(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    pairs: &[(&GpuTensor, &wgpu::Buffer)],
    tokens: usize,
    x: &wgpu::Buffer,
    mut profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    if tokens == 1 {
        return super::gemv::gemv_many(gpu, enc, pairs, x, profiler);
    }
    for (w, y) in pairs {
        linear(gpu, enc, w, tokens, x, y, profiler.as_deref_mut())?;
    }
    Ok(())
}

/// y [T, rows] = x [T, cols] W^T with W [rows, cols] bf16; T = 1 runs the GEMV.
pub fn linear(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    w: &GpuTensor,
    tokens: usize,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    linear_into(gpu, enc, w, tokens, x, y, false, profiler)
}

/// [`linear`], or with `accumulate` y [T, rows] += x W^T: summed into what y holds (a
/// residual or a second branch, without a separate add pass).
#[allow(clippy::too_many_arguments)]
pub fn linear_into(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    w: &GpuTensor,
    tokens: usize,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    accumulate: bool,
    mut profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    if tokens == 1 {
        return super::gemv::gemv_into(gpu, enc, w, x, y, None, accumulate, profiler);
    }
    let kernel = match w.dtype {
        DType::BF16 => LINEAR_BF16,
        DType::F32 => LINEAR_F32,
        _ => LINEAR_BF16,
    };
    if !matches!(w.dtype, DType::BF16 | DType::F32) || w.shape.len() != 2 {
        return Err(GpuError::Shape(format!("linear: {} must be a bf16 or f32 matrix, is {} {:?}", w.label, w.dtype.name(), w.shape)));
    }
    let (rows, cols) = (w.shape[0], w.shape[1]);
    if x.size() < (tokens * cols * 4) as u64 || y.size() < (tokens * rows * 4) as u64 {
        return Err(GpuError::Shape(format!("linear: {} [{rows}, {cols}] needs x [{tokens}, {cols}] and y [{tokens}, {rows}]", w.label)));
    }
    for chunk in w.chunks.iter().filter(|c| c.rows > 0) {
        let p = LinearParams {
            rows: chunk.rows as u32,
            cols: cols as u32,
            tokens: tokens as u32,
            row_offset: chunk.first_row as u32,
            y_stride: rows as u32,
            accumulate: accumulate as u32,
            ..Default::default()
        };
        let groups = ((chunk.rows as u32).div_ceil(64), (tokens as u32).div_ceil(32));
        dispatch(gpu, enc, &kernel, &p, &[(1, &chunk.buffer), (2, x), (3, y)], groups, profiler.as_deref_mut())?;
    }
    Ok(())
}
