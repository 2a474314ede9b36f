//! Host side of the batched linear layer `y[t] = W x[t]` (prefill, T >= 2; one token goes
//! through the GEMV): shaders/linear.wgsl (SIMT, 16-byte loads), linear_any.wgsl (SIMT, any
//! cols), linear_coop.wgsl (cooperative matrices, the default where the adapter has them) and
//! linear_naive.wgsl (the first kernel, kept as the benchmark's baseline).

use super::moe::dispatch;
use super::shader_params;
use crate::gpu::{Gpu, GpuError, GpuTensor, Kernel, Profiler};
use crate::layout::DType;

shader_params!(
    /// Mirrors `LinearParams` in shaders/lib/linear_params.wgsl.
    LinearParams in "linear" {
        rows: u32, cols: u32, tokens: u32, row_offset: u32, y_stride: u32, accumulate: u32, _pad1: u32, _pad2: u32,
    }
);

/// SIMT kernels: rows aligned to 16 bytes (bf16: cols % 8 == 0, f32: cols % 4 == 0).
pub const LINEAR_BF16: Kernel = Kernel::new("linear_bf16", "linear", "linear_simt").unchecked();
pub const LINEAR_F32: Kernel = Kernel::new("linear_f32", "linear", "linear_simt").with_constants(&[("W_F32", 1.0)]).unchecked();
/// SIMT kernels for any cols (scalar loads).
pub const LINEAR_ANY_BF16: Kernel = Kernel::new("linear_any_bf16", "linear_any", "linear_simt").unchecked();
pub const LINEAR_ANY_F32: Kernel = Kernel::new("linear_any_f32", "linear_any", "linear_simt").with_constants(&[("W_F32", 1.0)]).unchecked();
/// Cooperative matrices: the per-token activation scale pre-pass and the GEMM.
pub const LINEAR_SCALE: Kernel = Kernel::new("linear_scale", "linear_coop", "linear_scale").coopmat().subgroups();
pub const LINEAR_COOP: Kernel = Kernel::new("linear_coop", "linear_coop", "linear_coop").coopmat().subgroups();
/// The first kernel (bf16 only), for benchmarks.
pub const LINEAR_NAIVE: Kernel = Kernel::new("linear_naive", "linear_naive", "linear_naive");
pub const KERNELS: &[Kernel] = &[LINEAR_BF16, LINEAR_F32, LINEAR_ANY_BF16, LINEAR_ANY_F32, LINEAR_SCALE, LINEAR_COOP, LINEAR_NAIVE];

/// Output tile of the SIMT and coop kernels: rows x tokens per workgroup.
const TILE: u32 = 128;

/// Which kernel family runs a linear layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LinearVariant {
    /// Cooperative matrices where [`coop_available`], else SIMT.
    Auto,
    Simt,
    Coop,
    /// The first kernel (benchmark baseline; bf16 only).
    Naive,
}

/// Widest input the coop kernel takes. Its error used to grow linearly with cols (~2.4e-9 *
/// cols); with the accumulators drained into f32 every 256 k it measured ~8e-7 at every
/// K3.1 shape up to 33792 on the H200, but wider inputs were never measured: they run SIMT.
pub const COOP_MAX_COLS: usize = 36864;

/// The coop kernel needs 16x16x16 f16 cooperative matrices, 32-wide subgroups (8 per
/// workgroup), bf16 weights (f32 weights would lose bits in f16), 16-byte aligned rows and
/// at most [`COOP_MAX_COLS`] inputs.
pub fn coop_available(gpu: &Gpu, w: &GpuTensor) -> bool {
    gpu.caps.coopmat
        && gpu.caps.subgroups
        && gpu.caps.subgroup_min == 32
        && gpu.caps.subgroup_max == 32
        && w.dtype == DType::BF16
        && w.shape.len() == 2
        && w.shape[1].is_multiple_of(8)
        && w.shape[1] <= COOP_MAX_COLS
}

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
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    if tokens == 1 {
        return super::gemv::gemv_into(gpu, enc, w, x, y, None, accumulate, profiler);
    }
    linear_variant(gpu, enc, w, tokens, x, y, accumulate, LinearVariant::Auto, profiler)
}

/// [`linear_into`] for T >= 1 tokens on a chosen kernel family (tests and benchmarks; errors
/// where the adapter or the shape does not allow it).
#[allow(clippy::too_many_arguments)]
pub fn linear_variant(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    w: &GpuTensor,
    tokens: usize,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    accumulate: bool,
    variant: LinearVariant,
    mut profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    if !matches!(w.dtype, DType::BF16 | DType::F32) || w.shape.len() != 2 {
        return Err(GpuError::Shape(format!("linear: {} must be a bf16 or f32 matrix, is {} {:?}", w.label, w.dtype.name(), w.shape)));
    }
    let (rows, cols) = (w.shape[0], w.shape[1]);
    if tokens == 0 || rows == 0 {
        return Ok(());
    }
    if x.size() < (tokens * cols * 4) as u64 || y.size() < (tokens * rows * 4) as u64 {
        return Err(GpuError::Shape(format!("linear: {} [{rows}, {cols}] needs x [{tokens}, {cols}] and y [{tokens}, {rows}]", w.label)));
    }
    let bf16 = w.dtype == DType::BF16;
    let coop = match variant {
        LinearVariant::Auto => coop_available(gpu, w),
        LinearVariant::Coop if !coop_available(gpu, w) => {
            return Err(GpuError::Shape(format!(
                "linear: no cooperative-matrix kernel for {} ({} [{rows}, {cols}]) on this adapter (needs coop, 32-wide subgroups, bf16, cols % 8 == 0, cols <= {COOP_MAX_COLS})",
                w.label,
                w.dtype.name()
            )));
        }
        LinearVariant::Coop => true,
        LinearVariant::Simt => false,
        LinearVariant::Naive if !bf16 => return Err(GpuError::Shape("linear: the naive kernel takes bf16 weights".into())),
        LinearVariant::Naive => false,
    };
    let aligned = cols.is_multiple_of(if bf16 { 8 } else { 4 });
    let (kernel, tile) = match (variant, coop, bf16, aligned) {
        (LinearVariant::Naive, ..) => (LINEAR_NAIVE, (64, 32)),
        (_, true, ..) => (LINEAR_COOP, (TILE, TILE)),
        (_, false, true, true) => (LINEAR_BF16, (TILE, TILE)),
        (_, false, false, true) => (LINEAR_F32, (TILE, TILE)),
        (_, false, true, false) => (LINEAR_ANY_BF16, (TILE, TILE)),
        (_, false, false, false) => (LINEAR_ANY_F32, (TILE, TILE)),
    };
    let base = LinearParams { cols: cols as u32, tokens: tokens as u32, y_stride: rows as u32, accumulate: accumulate as u32, ..Default::default() };
    let scale = if coop {
        // s_t and 1 / s_t per token (see linear_coop.wgsl): one pre-pass per call.
        let sc = gpu.scratch("linear scale", (tokens * 8) as u64);
        dispatch(gpu, enc, &LINEAR_SCALE, &base, &[(2, x), (4, &sc)], (tokens as u32, 1), profiler.as_deref_mut())?;
        Some(sc)
    } else {
        None
    };
    let token_tiles = (tokens as u32).div_ceil(tile.1);
    for chunk in w.chunks.iter().filter(|c| c.rows > 0) {
        let p = LinearParams { rows: chunk.rows as u32, row_offset: chunk.first_row as u32, ..base };
        let row_tiles = (chunk.rows as u32).div_ceil(tile.0);
        if row_tiles > gpu.caps.max_workgroups_per_dim || token_tiles > gpu.caps.max_workgroups_per_dim {
            return Err(GpuError::Shape(format!("linear: {} x {tokens} tokens needs more workgroups than the adapter allows", w.label)));
        }
        let mut buffers = vec![(1, &chunk.buffer), (2, x), (3, y)];
        if let Some(sc) = &scale {
            buffers.push((4, sc));
        }
        // groups.1 == 1 would fold a long x dimension into y: row_tiles is within the limit.
        gpu.dispatch_grid(enc, &kernel, &p, &buffers, [row_tiles, token_tiles, 1], profiler.as_deref_mut())?;
    }
    Ok(())
}
