//! Host side of shaders/attn_res.wgsl: the Block AttnRes aggregation (spec 3.1), fused with
//! the RMSNorm after it and, on the MLP side, with the residual sum before it.

use super::moe::dispatch;
use super::shader_params;
use crate::gpu::{Gpu, GpuError, Kernel, Profiler};

shader_params!(
    /// Mirrors `AttnResParams` in shaders/attn_res.wgsl.
    AttnResParams in "attn_res" {
        tokens: u32, d: u32, n_bank: u32, bank_stride: u32, eps: f32, add: u32, norm: u32, chunk: u32,
    }
);

// The sums pass runs without wgpu's runtime checks: `record` checks every buffer against the
// shape and binds `cur` as the bank where there is none (the pass loads a clamped bank entry
// whatever the source count). The mix pass keeps them: unchecked it measured slower on the
// H200 (51.3 -> 61.6 us per 3 layers in the model bench, 2026-11-30).
pub const ATTN_RES_SUMS: Kernel = Kernel::new("attn_res_sums", "attn_res", "attn_res_sums").unchecked();
pub const ATTN_RES_MIX: Kernel = Kernel::new("attn_res_mix", "attn_res", "attn_res_mix");
pub const ATTN_RES_ONE: Kernel = Kernel::new("attn_res_one", "attn_res", "attn_res_one");
/// The two passes on subgroups (attn_res_sg.wgsl): subgroups of at least the source count.
pub const ATTN_RES_SUMS_SG: Kernel = Kernel::new("attn_res_sums_sg", "attn_res_sg", "attn_res_sums_sg").subgroups().unchecked();
pub const ATTN_RES_MIX_SG: Kernel = Kernel::new("attn_res_mix_sg", "attn_res_sg", "attn_res_mix_sg").subgroups();
pub const KERNELS: &[Kernel] = &[ATTN_RES_SUMS, ATTN_RES_MIX, ATTN_RES_ONE, ATTN_RES_SUMS_SG, ATTN_RES_MIX_SG];
/// Threads of `attn_res_one`'s workgroup (ONE_WG in the shader); it mixes at most two vec4
/// columns per thread.
const ONE_WG: usize = 1024;

/// How an aggregation is dispatched.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttnResPath {
    /// `attn_res_one` for several tokens (prefill) where it fits ([`one_fits`]), else the two
    /// passes; `K31_ATTN_RES=one` / `two` picks either wherever it fits (experiments). On the
    /// H200 (2026-11-30) a 512-token chunk's aggregation took 0.05 ms in one dispatch against
    /// 0.25 in two passes, but one decode token's 11.5-17.3 us against 12.9-16.6 (2-9
    /// sources) and the decode spans +0.23 ms: a single workgroup's dependent load rounds.
    Auto,
    /// `attn_res_sums` (workgroups over source pairs and column chunks), then `attn_res_mix`:
    /// their subgroup forms where [`two_pass_sg_fits`] (`K31_ATTN_RES_SG=0` turns them off).
    TwoPass,
    /// The two passes without subgroups whatever the adapter (tests and benches compare them).
    TwoPassPortable,
    /// `attn_res_one`: one workgroup per token does the sums, the softmax and the mix.
    OneDispatch,
}

/// Whether `attn_res_one` takes this shape on this adapter: whole vec4 rows (d and the bank
/// stride multiples of 4), at most two vec4 columns per thread, 1024 invocations.
pub fn one_fits(gpu: &Gpu, d: usize, bank_stride: usize) -> bool {
    d.is_multiple_of(4) && bank_stride.is_multiple_of(4) && d <= 8 * ONE_WG && gpu.caps.max_invocations as usize >= ONE_WG
}
/// Whether the two passes run on subgroups here for `sources` sources: subgroups of at least
/// that many lanes (the mix's softmax holds source j in lane j).
pub fn two_pass_sg_fits(gpu: &Gpu, sources: usize) -> bool {
    gpu.caps.subgroups && gpu.caps.subgroup_min as usize >= sources
}

/// Most sources one aggregation takes (MAX_SOURCES in the shader).
pub const MAX_SOURCES: usize = 16;
/// Workgroup size of both passes, and floats of the shader's workgroup array.
const WG: usize = 256;
const SHARED_FLOATS: usize = 4352;

/// Partial sums per column chunk of `sources` sources: the dots and the Gram matrix's
/// lower triangle.
fn partials(sources: usize) -> usize {
    sources + sources * (sources + 1) / 2
}

/// Columns per chunk of the sums pass: 1024, or more where the mix pass's workgroup array
/// (every chunk's partial sums and their totals) would not hold them.
fn chunk(d: usize, sources: usize) -> usize {
    let max_chunks = SHARED_FLOATS / partials(sources) - 1;
    d.div_ceil(max_chunks).next_multiple_of(WG).max(1024)
}

/// Floats the `alpha` buffer of [`attn_res`] needs: the [T, n] softmax weights, then the
/// per-chunk partial sums (scratch).
pub fn alpha_len(tokens: usize, d: usize, sources: usize) -> usize {
    tokens * (sources + d.div_ceil(chunk(d, sources)) * partials(sources))
}

/// The sources of one aggregation: `n_bank` completed blocks (entries of `bank_stride` f32,
/// [T, d] used each) and the current partial, `cur` or, with `add = Some((addend, part))`,
/// cur + addend (the residual sum, also written to `part`).
#[derive(Clone, Copy)]
pub struct Sources<'a> {
    pub bank: &'a wgpu::Buffer,
    pub n_bank: usize,
    pub bank_stride: usize,
    pub cur: &'a wgpu::Buffer,
    pub add: Option<(&'a wgpu::Buffer, &'a wgpu::Buffer)>,
}

/// One aggregation point's pseudo-query: RMSNorm weight and projection, both [d] bf16.
#[derive(Clone, Copy)]
pub struct Query<'a> {
    pub gamma: &'a wgpu::Buffer,
    pub proj: &'a wgpu::Buffer,
}

/// out [T, d] = AttnRes(sources); alpha holds [`alpha_len`] floats, the [T, n] softmax weights.
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
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    let sources = Sources { bank, n_bank, bank_stride, cur, add: None };
    record(gpu, enc, AttnResPath::Auto, tokens, d, eps, sources, Query { gamma, proj }, None, out, alpha, profiler)
}

/// out [T, d] = RMSNorm(AttnRes(sources); norm_w [d] bf16, eps): an FFN's or mixer's input
/// in one pass. With `n_bank = 0` (and any query) it is RMSNorm(c).
#[allow(clippy::too_many_arguments)]
pub fn attn_res_norm(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    tokens: usize,
    d: usize,
    eps: f32,
    sources: Sources<'_>,
    query: Query<'_>,
    norm_w: &wgpu::Buffer,
    out: &wgpu::Buffer,
    alpha: &wgpu::Buffer,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    record(gpu, enc, AttnResPath::Auto, tokens, d, eps, sources, query, Some(norm_w), out, alpha, profiler)
}

/// [`attn_res_norm`] through a chosen path (tests and benches compare them); `OneDispatch`
/// where [`one_fits`] says no is an error.
#[allow(clippy::too_many_arguments)]
pub fn attn_res_norm_via(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    path: AttnResPath,
    tokens: usize,
    d: usize,
    eps: f32,
    sources: Sources<'_>,
    query: Query<'_>,
    norm_w: &wgpu::Buffer,
    out: &wgpu::Buffer,
    alpha: &wgpu::Buffer,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    record(gpu, enc, path, tokens, d, eps, sources, query, Some(norm_w), out, alpha, profiler)
}

/// The path `Auto` takes for this shape.
fn auto_path(gpu: &Gpu, tokens: usize, d: usize, bank_stride: usize) -> AttnResPath {
    if !one_fits(gpu, d, bank_stride) {
        return AttnResPath::TwoPass;
    }
    // Read once per process: this runs for every aggregation of every token.
    static FORCED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    match FORCED.get_or_init(|| std::env::var("K31_ATTN_RES").ok()).as_deref() {
        Some("one") => AttnResPath::OneDispatch,
        Some("two") => AttnResPath::TwoPass,
        _ if tokens > 1 => AttnResPath::OneDispatch,
        _ => AttnResPath::TwoPass,
    }
}

#[allow(clippy::too_many_arguments)]
fn record(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    path: AttnResPath,
    tokens: usize,
    d: usize,
    eps: f32,
    s: Sources<'_>,
    q: Query<'_>,
    norm_w: Option<&wgpu::Buffer>,
    out: &wgpu::Buffer,
    alpha: &wgpu::Buffer,
    mut profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    let n = s.n_bank + 1;
    if n > MAX_SOURCES || d == 0 || tokens == 0 || (s.n_bank > 0 && s.bank_stride < tokens * d) || tokens as u32 > gpu.caps.max_workgroups_per_dim {
        return Err(GpuError::Shape(format!(
            "attn_res: {n} sources (at most {MAX_SOURCES}), {tokens} tokens (at most {}) x d {d}, bank stride {} < {tokens} x {d}",
            gpu.caps.max_workgroups_per_dim, s.bank_stride
        )));
    }
    let td = (tokens * d * 4) as u64;
    let vectors = [q.gamma, q.proj].into_iter().chain(norm_w);
    let part_small = s.add.is_some_and(|(a, part)| a.size() < td || part.size() < td);
    if s.bank.size() < (s.n_bank * s.bank_stride * 4) as u64
        || s.cur.size() < td
        || part_small
        || out.size() < td
        || alpha.size() < (alpha_len(tokens, d, n) * 4) as u64
        || vectors.into_iter().any(|v| v.size() < (d * 2) as u64)
    {
        return Err(GpuError::Shape(format!("attn_res: buffers too small for {tokens} tokens x {d} with {n} sources")));
    }
    let p = AttnResParams {
        tokens: tokens as u32,
        d: d as u32,
        n_bank: s.n_bank as u32,
        bank_stride: s.bank_stride as u32,
        eps,
        add: s.add.is_some() as u32,
        norm: norm_w.is_some() as u32,
        chunk: chunk(d, n) as u32,
    };
    // Without a sum the addend binding reads cur and `part` is never written (a dummy).
    let dummy;
    let (addend, part) = match s.add {
        Some(pair) => pair,
        None => {
            dummy = gpu.scratch("attn-res no part", 16);
            (s.cur, &dummy)
        }
    };
    // The sums pass reads bank entry 0 even without a bank (and drops it): give it rows.
    let bank = if s.n_bank == 0 { s.cur } else { s.bank };
    let stride = if s.n_bank == 0 { 0 } else { s.bank_stride };
    let path = if path == AttnResPath::Auto { auto_path(gpu, tokens, d, stride) } else { path };
    if path == AttnResPath::OneDispatch {
        if !one_fits(gpu, d, stride) {
            return Err(GpuError::Shape(format!("attn_res_one: d {d} and bank stride {stride} must be multiples of 4, d at most {}, on an adapter with {ONE_WG} invocations per workgroup", 8 * ONE_WG)));
        }
        let one = [(1, bank), (2, s.cur), (3, q.gamma), (4, q.proj), (5, out), (6, alpha), (7, addend), (8, part), (9, norm_w.unwrap_or(q.gamma))];
        return dispatch(gpu, enc, &ATTN_RES_ONE, &p, &one, (1, tokens as u32), profiler);
    }
    static SG_ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let (sums_kernel, mix_kernel) = if path == AttnResPath::TwoPass && super::switch_on(&SG_ON, "K31_ATTN_RES_SG") && two_pass_sg_fits(gpu, n) {
        (ATTN_RES_SUMS_SG, ATTN_RES_MIX_SG)
    } else {
        (ATTN_RES_SUMS, ATTN_RES_MIX)
    };
    let sums = [(1, bank), (2, s.cur), (3, q.gamma), (4, q.proj), (6, alpha), (7, addend), (8, part)];
    // One workgroup per (Gram entry, column chunk).
    let groups = (n * (n + 1) / 2 * d.div_ceil(chunk(d, n))) as u32;
    dispatch(gpu, enc, &sums_kernel, &p, &sums, (groups, tokens as u32), profiler.as_deref_mut())?;
    let mix = [(1, bank), (2, s.cur), (5, out), (6, alpha), (7, addend), (9, norm_w.unwrap_or(q.gamma))];
    dispatch(gpu, enc, &mix_kernel, &p, &mix, (d.div_ceil(WG) as u32, tokens as u32), profiler)
}
