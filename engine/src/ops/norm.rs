//! Host side of shaders/norm.wgsl (RMSNorm) and shaders/glu.wgsl (SiTU / SiLU gating).

use super::moe::dispatch;
use super::shader_params;
use crate::config::Activation;
use crate::gpu::{Gpu, GpuError, Kernel, Profiler};

shader_params!(
    /// Mirrors `NormParams` in shaders/norm.wgsl.
    NormParams in "norm" { rows: u32, n: u32, eps: f32, _pad: u32 }
);
shader_params!(
    /// Mirrors `GluParams` in shaders/glu.wgsl.
    GluParams in "glu" { n: u32, act: u32, beta: f32, linear_beta: f32 }
);

// Without wgpu's runtime checks: the host checks every buffer against [rows, n] / n, and every
// index is below them by construction.
pub const RMS_NORM: Kernel = Kernel::new("rms_norm", "norm", "rms_norm").unchecked();
pub const GLU: Kernel = Kernel::new("glu", "glu", "glu").unchecked();
pub const KERNELS: &[Kernel] = &[RMS_NORM, GLU];

/// out [rows, n] = RMSNorm(x [rows, n]; w [n] bf16, eps).
#[allow(clippy::too_many_arguments)]
pub fn rms_norm(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    rows: usize,
    n: usize,
    eps: f32,
    x: &wgpu::Buffer,
    w: &wgpu::Buffer,
    out: &wgpu::Buffer,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    if n == 0 || x.size() < (rows * n * 4) as u64 || out.size() < (rows * n * 4) as u64 || w.size() < (n * 2) as u64 {
        return Err(GpuError::Shape(format!("rms_norm: buffers too small for [{rows}, {n}]")));
    }
    if rows as u32 > gpu.caps.max_workgroups_per_dim {
        return Err(GpuError::Shape(format!("rms_norm: {rows} rows in one call (at most {})", gpu.caps.max_workgroups_per_dim)));
    }
    let p = NormParams { rows: rows as u32, n: n as u32, eps, _pad: 0 };
    // Few rows (decode): split each row's columns over workgroups of 256 (one column per
    // thread in the scaling loop; each workgroup sums the whole row's squares itself).
    let chunks = if rows < 32 { n.div_ceil(256).min(64) } else { 1 } as u32;
    dispatch(gpu, enc, &RMS_NORM, &p, &[(1, x), (2, w), (3, out)], (chunks, rows as u32), profiler)
}

/// out [n] = act(gate [n], up [n]).
#[allow(clippy::too_many_arguments)]
pub fn glu(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    act: Activation,
    n: usize,
    gate: &wgpu::Buffer,
    up: &wgpu::Buffer,
    out: &wgpu::Buffer,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    let bytes = (n * 4) as u64;
    if gate.size() < bytes || up.size() < bytes || out.size() < bytes {
        return Err(GpuError::Shape(format!("glu: buffers too small for {n} values")));
    }
    let (code, beta, linear_beta) = glu_code(act);
    let p = GluParams { n: n as u32, act: code, beta, linear_beta };
    dispatch(gpu, enc, &GLU, &p, &[(1, gate), (2, up), (3, out)], ((n as u32).div_ceil(256), 1), profiler)
}

/// `glu_act`'s (act, beta, linear_beta) arguments (lib/activation.wgsl) for `act`.
pub fn glu_code(act: Activation) -> (u32, f32, f32) {
    match act {
        Activation::Situ { beta, linear_beta } => (0, beta, linear_beta.unwrap_or(0.0)),
        Activation::Silu => (1, 0.0, 0.0),
    }
}
