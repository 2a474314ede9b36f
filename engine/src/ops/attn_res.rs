//! Host side of shaders/attn_res.wgsl: the Block AttnRes aggregation (spec 3.1).

use super::moe::dispatch;
use super::shader_params;
use crate::gpu::{Gpu, GpuError, Kernel, Profiler};

shader_params!(
    /// Mirrors `AttnResParams` in shaders/attn_res.wgsl.
    AttnResParams in "attn_res" {
        tokens: u32, d: u32, n_bank: u32, bank_stride: u32, eps: f32, _pad0: u32, _pad1: u32, _pad2: u32,
    }
);

pub const ATTN_RES_SUMS: Kernel = Kernel::new("attn_res_sums", "attn_res", "attn_res_sums");
pub const ATTN_RES_MIX: Kernel = Kernel::new("attn_res_mix", "attn_res", "attn_res_mix");
pub const KERNELS: &[Kernel] = &[ATTN_RES_SUMS, ATTN_RES_MIX];
/// Columns per partial sum of the first pass (CHUNK in the shader).
const CHUNK: usize = 1024;
/// Output columns per workgroup of the mixing pass (WG in the shader).
const MIX_COLUMNS: usize = 256;
/// Most sources one aggregation takes (MAX_SOURCES in the shader).
pub const MAX_SOURCES: usize = 16;

/// Floats the `alpha` buffer of [`attn_res`] needs: the [T, n] softmax weights, then the
/// per-chunk partial sums (scratch).
pub fn alpha_len(tokens: usize, d: usize, sources: usize) -> usize {
    tokens * sources * (1 + 2 * d.div_ceil(CHUNK))
}

/// out [T, d] = AttnRes(bank[0..n_bank] ∪ {cur}); alpha holds [`alpha_len`] floats, the
/// first T x (n_bank + 1) of them the softmax weights.
/// bank: n_bank entries of `bank_stride` f32 each ([T, d] used); gamma, proj: [d] bf16.
#[allow(clippy::too_many_arguments)]
pub fn attn_res(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    tokens: usize,
    d: usize,
    n_bank: usize,
    bank_stride: usize,
    eps: f32,
    bank: &wgpu::Buffer,
    cur: &wgpu::Buffer,
    gamma: &wgpu::Buffer,
    proj: &wgpu::Buffer,
    out: &wgpu::Buffer,
    alpha: &wgpu::Buffer,
    mut profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    let n = n_bank + 1;
    if n > MAX_SOURCES || d == 0 || bank_stride < tokens * d || n * d.div_ceil(CHUNK) > 256 {
        return Err(GpuError::Shape(format!(
            "attn_res: {n} sources (at most {MAX_SOURCES}), d {d} (sources x ceil(d / {CHUNK}) at most 256), bank stride {bank_stride} < {tokens} x {d}"
        )));
    }
    let td = (tokens * d * 4) as u64;
    if bank.size() < (n_bank * bank_stride * 4) as u64 || cur.size() < td || out.size() < td || alpha.size() < (alpha_len(tokens, d, n) * 4) as u64 || gamma.size() < (d * 2) as u64 || proj.size() < (d * 2) as u64 {
        return Err(GpuError::Shape(format!("attn_res: buffers too small for {tokens} tokens x {d} with {n} sources")));
    }
    let p = AttnResParams { tokens: tokens as u32, d: d as u32, n_bank: n_bank as u32, bank_stride: bank_stride as u32, eps, ..Default::default() };
    let logits = [(1, bank), (2, cur), (3, gamma), (4, proj), (6, alpha)];
    dispatch(gpu, enc, &ATTN_RES_SUMS, &p, &logits, ((n * d.div_ceil(CHUNK)) as u32, tokens as u32), profiler.as_deref_mut())?;
    let mix = [(1, bank), (2, cur), (5, out), (6, alpha)];
    dispatch(gpu, enc, &ATTN_RES_MIX, &p, &mix, (d.div_ceil(MIX_COLUMNS) as u32, tokens as u32), profiler)
}
