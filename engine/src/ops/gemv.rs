//! Matrix-vector products (decode projections): `y = W x` with W in its checkpoint dtype.

use super::{router, shader_params};
use crate::config::{Activation, RouterConfig};
use crate::gpu::{Gpu, GpuError, GpuTensor, Kernel, Profiler};
use crate::layout::DType;

shader_params!(
    /// Mirrors `GemvParams` in shaders/gemv.wgsl.
    GemvParams in "gemv" { rows: u32, cols: u32, row_offset: u32, accumulate: u32 }
);

shader_params!(
    /// Mirrors `NormGemvParams` in shaders/gemv_norm.wgsl.
    NormGemvParams in "gemv_norm" { rows: u32, cols: u32, row_offset: u32, accumulate: u32, eps: f32, cols_b: u32, has_addend: u32, _pad1: u32 }
);

shader_params!(
    /// Mirrors `MultiParams` in shaders/gemv_multi.wgsl.
    MultiParams in "gemv_multi" {
        cols: u32, glu: u32, beta: f32, linear_beta: f32, start: [u32; 4], rows: [u32; 4], row_offset: [u32; 4],
        top_k: u32, n_group: u32, topk_group: u32, renormalize: u32, scaling: f32, _pad0: u32, _pad1: u32, _pad2: u32,
    }
);

pub const GEMV_BF16: Kernel = Kernel::new("gemv_bf16", "gemv", "gemv_bf16");
pub const GEMV_F32: Kernel = Kernel::new("gemv_f32", "gemv", "gemv_f32");
/// 16-byte loads, `ROWS` rows per workgroup (cols % 8 == 0); variants for the bench.
pub const GEMV_BF16_V4_R1: Kernel = v4("gemv_bf16_v4_r1", &[("ROWS", 1.0)]);
pub const GEMV_BF16_V4_R2: Kernel = v4("gemv_bf16_v4_r2", &[("ROWS", 2.0)]);
pub const GEMV_BF16_V4_R4: Kernel = v4("gemv_bf16_v4_r4", &[("ROWS", 4.0)]);
pub const GEMV_BF16_V4_R8: Kernel = v4("gemv_bf16_v4_r8", &[("ROWS", 8.0)]);
// Every bf16 variant reports as gemv_bf16, so profiles stay comparable.
const fn v4(name: &'static str, c: &'static [(&'static str, f64)]) -> Kernel {
    Kernel::new(name, "gemv", "gemv_bf16_v4").with_constants(c).profile_as("gemv_bf16")
}
pub const GEMV_BF16_V4: Kernel = GEMV_BF16_V4_R4;
/// Subgroup kernels (gemv_sg.wgsl): RS rows per subgroup pass, RPW rows per workgroup.
const fn sg(name: &'static str, c: &'static [(&'static str, f64)]) -> Kernel {
    Kernel::new(name, "gemv_sg", "gemv_bf16_sg").with_constants(c).subgroups().unchecked().profile_as("gemv_bf16")
}
pub const GEMV_BF16_SG_RS1: Kernel = sg("gemv_bf16_sg_rs1", &[("RS", 1.0), ("RPW", 8.0)]);
pub const GEMV_BF16_SG_RS2: Kernel = sg("gemv_bf16_sg_rs2", &[("RS", 2.0), ("RPW", 16.0)]);
pub const GEMV_BF16_SG_RS4: Kernel = sg("gemv_bf16_sg_rs4", &[("RS", 4.0), ("RPW", 32.0)]);
/// Column parts (CS subgroups per row group, totals combined in workgroup memory): more,
/// shorter workgroups for matrices with few rows.
pub const GEMV_BF16_SG_CS2: Kernel = sg("gemv_bf16_sg_cs2", &[("RS", 2.0), ("RPW", 8.0), ("CS", 2.0)]);
pub const GEMV_BF16_SG_CS4: Kernel = sg("gemv_bf16_sg_cs4", &[("RS", 2.0), ("RPW", 4.0), ("CS", 4.0)]);
pub const GEMV_BF16_SG: Kernel = GEMV_BF16_SG_CS2;
/// Up to four matrices sharing x in one dispatch (gemv_multi.wgsl), 32 rows per workgroup of
/// 512 (the H200 ran the model's multi passes ~8 % faster than with 16 rows per 256; two
/// column parts as in GEMV_BF16_SG measured no faster in the model).
pub const GEMV_BF16_MULTI: Kernel = Kernel::new("gemv_bf16_multi", "gemv_multi", "gemv_bf16_sg_multi")
    .with_constants(&[("RS", 2.0), ("RPW", MULTI_RPW as f64), ("WGM", MULTI_THREADS as f64)])
    .subgroups()
    .unchecked();
/// The multi kernel whose router entry (entry 0) also selects the token's experts.
pub const GEMV_BF16_MULTI_ROUTE: Kernel = Kernel::new("gemv_bf16_multi_route", "gemv_multi", "gemv_bf16_sg_multi_route")
    .with_constants(&[("RS", 2.0), ("RPW", MULTI_RPW as f64), ("WGM", MULTI_THREADS as f64)])
    .subgroups()
    .unchecked();
/// Rows and threads per workgroup of the multi and normed GEMVs.
const MULTI_RPW: usize = 32;
// gemv_multi.wgsl keeps a gated pair's gate totals for up to 64 rows of a workgroup.
const _: () = assert!(MULTI_RPW <= 64);
const MULTI_THREADS: u32 = 512;
/// An RMS-normed input's GEMV (gemv_norm.wgsl): the norm and the product in one dispatch;
/// workgroups as GEMV_BF16_MULTI's (each normalises x itself: 16 rows per 256 threads were
/// ~12 % slower on the H200).
pub const GEMV_BF16_NORMED: Kernel = Kernel::new("gemv_bf16_normed", "gemv_norm", "gemv_bf16_sg_normed")
    .with_constants(&[("RS", 2.0), ("RPW", MULTI_RPW as f64), ("WGN", MULTI_THREADS as f64)])
    .subgroups()
    .unchecked();
/// Widest input the normed GEMV stages in workgroup memory (MAX_XV vec4 in the shader).
const NORMED_MAX_COLS: usize = 4096;
const MULTI_ENTRIES: usize = 4;
pub const KERNELS: &[Kernel] = &[
    GEMV_BF16,
    GEMV_F32,
    GEMV_BF16_V4_R1,
    GEMV_BF16_V4_R2,
    GEMV_BF16_V4_R4,
    GEMV_BF16_V4_R8,
    GEMV_BF16_SG_RS1,
    GEMV_BF16_SG_RS2,
    GEMV_BF16_SG_RS4,
    GEMV_BF16_SG_CS2,
    GEMV_BF16_SG_CS4,
    GEMV_BF16_MULTI,
    GEMV_BF16_MULTI_ROUTE,
    GEMV_BF16_NORMED,
];
/// Every bf16 fast-path variant (cols % 8 == 0), for tests and benches.
pub const FAST_VARIANTS: &[Kernel] =
    &[GEMV_BF16_V4_R1, GEMV_BF16_V4_R2, GEMV_BF16_V4_R4, GEMV_BF16_V4_R8, GEMV_BF16_SG_RS1, GEMV_BF16_SG_RS2, GEMV_BF16_SG_RS4, GEMV_BF16_SG_CS2, GEMV_BF16_SG_CS4];

/// Rows one workgroup of a fast-path variant covers.
fn rows_of(kernel: &Kernel) -> u32 {
    kernel.constant("RPW").or(kernel.constant("ROWS")).map_or(1, |v| v as u32)
}

/// Records `y[0..rows] = W x` into `enc`, one dispatch per chunk of W.
/// W: [rows, cols] (bf16 or f32); x: [cols] f32; y: [rows] f32.
pub fn gemv(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    gemv_into(gpu, enc, w, x, y, None, false, profiler)
}

/// [`gemv`] with an explicit bf16 fast-path variant (`fast`: one of [`FAST_VARIANTS`], for
/// benches and tests), writing y or adding to it (`accumulate`).
#[allow(clippy::too_many_arguments)]
pub fn gemv_into(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    y: &wgpu::Buffer,
    fast: Option<Kernel>,
    accumulate: bool,
    mut profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    let v4 = w.dtype == DType::BF16 && w.shape.len() == 2 && w.shape[1].is_multiple_of(8);
    let (kernel, binding) = match w.dtype {
        DType::BF16 if v4 => (fast.unwrap_or(if gpu.caps.subgroups { GEMV_BF16_SG } else { GEMV_BF16_V4 }), 5),
        DType::BF16 => (GEMV_BF16, 1),
        DType::F32 => (GEMV_F32, 4),
        d => return Err(GpuError::Shape(format!("gemv: {} has dtype {}, expected bf16 or f32", w.label, d.name()))),
    };
    if w.shape.len() != 2 {
        return Err(GpuError::Shape(format!("gemv: {} has shape {:?}, expected [rows, cols]", w.label, w.shape)));
    }
    let cols = w.shape[1];
    if x.size() < (cols * 4) as u64 || y.size() < (w.rows() * 4) as u64 {
        return Err(GpuError::Shape(format!(
            "gemv: {} [{}, {cols}] needs x of {cols} and y of {} f32 values",
            w.label,
            w.rows(),
            w.rows()
        )));
    }
    if kernel.needs_subgroups && !gpu.caps.subgroups {
        return Err(GpuError::Shape(format!("gemv: kernel {} needs subgroups, which this adapter lacks", kernel.name)));
    }
    let per = if v4 { rows_of(&kernel) } else { 1 };
    for chunk in &w.chunks {
        if chunk.rows == 0 {
            continue;
        }
        let params = GemvParams { rows: chunk.rows as u32, cols: cols as u32, row_offset: chunk.first_row as u32, accumulate: accumulate as u32 };
        let bufs = [(binding, &chunk.buffer), (if v4 { 6 } else { 2 }, x), (3, y)];
        gpu.dispatch(enc, &kernel, &params, &bufs, ((chunk.rows as u32).div_ceil(per), 1), profiler.as_deref_mut())?;
    }
    Ok(())
}

/// `y_i = W_i x` for every (W_i, y_i) of `pairs` (all bf16 with the same cols), in as few
/// dispatches as the multi-matrix kernel allows (decode: the projections of one normed
/// hidden state). Falls back to one [`gemv`] per matrix where that kernel cannot run.
pub fn gemv_many(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    pairs: &[(&GpuTensor, &wgpu::Buffer)],
    x: &wgpu::Buffer,
    mut profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    let cols = pairs.first().map_or(0, |(w, _)| w.shape.get(1).copied().unwrap_or(0));
    let fits = multi_runs_here(gpu)
        && cols.is_multiple_of(8)
        && pairs.iter().all(|(w, _)| w.dtype == DType::BF16 && w.shape.len() == 2 && w.shape[1] == cols);
    if !fits || pairs.len() < 2 {
        for (w, y) in pairs {
            gemv(gpu, enc, w, x, y, profiler.as_deref_mut())?;
        }
        return Ok(());
    }
    if x.size() < (cols * 4) as u64 {
        return Err(GpuError::Shape(format!("gemv: x holds {} bytes, [*, {cols}] needs {}", x.size(), cols * 4)));
    }
    // One entry per (chunk of a matrix, its output), four per dispatch.
    let mut entries = Vec::new();
    for (w, y) in pairs {
        if y.size() < (w.rows() * 4) as u64 {
            return Err(GpuError::Shape(format!("gemv: output for {} [{}, {cols}] is too small", w.label, w.rows())));
        }
        entries.extend(w.chunks.iter().filter(|c| c.rows > 0).map(|c| (c, *y)));
    }
    // Unused slots bind placeholders, a distinct one per binding (no aliasing in a dispatch).
    let placeholders: Vec<wgpu::Buffer> = (0..2 * MULTI_ENTRIES).map(|_| gpu.scratch("gemv_many placeholder", 16)).collect();
    for group in entries.chunks(MULTI_ENTRIES) {
        let mut p = MultiParams { cols: cols as u32, start: [u32::MAX; 4], ..Default::default() };
        let mut blocks = 0usize;
        let mut bufs: Vec<(u32, &wgpu::Buffer)> = vec![(1, x)];
        for (e, (chunk, y)) in group.iter().enumerate() {
            p.start[e] = blocks as u32;
            p.rows[e] = chunk.rows as u32;
            p.row_offset[e] = chunk.first_row as u32;
            blocks += chunk.rows.div_ceil(MULTI_RPW);
            bufs.push((2 + e as u32, &chunk.buffer));
            bufs.push((6 + e as u32, *y));
        }
        for e in group.len()..MULTI_ENTRIES {
            bufs.push((2 + e as u32, &placeholders[2 * e]));
            bufs.push((6 + e as u32, &placeholders[2 * e + 1]));
        }
        gpu.dispatch(enc, &GEMV_BF16_MULTI, &p, &bufs, (blocks as u32, 1), profiler.as_deref_mut())?;
    }
    Ok(())
}

/// Whether the multi kernel runs on this adapter: subgroups, workgroups of MULTI_THREADS and
/// its 9 storage bindings.
fn multi_runs_here(gpu: &Gpu) -> bool {
    gpu.caps.subgroups && gpu.caps.max_invocations >= MULTI_THREADS && gpu.caps.max_storage_buffers >= 9
}

/// A gated pair for [`gemv_many_glu`]: out [rows] = act(gate x, up x), gate and up bf16 of
/// one shape.
pub struct GluPair<'a> {
    pub gate: &'a GpuTensor,
    pub up: &'a GpuTensor,
    pub act: Activation,
    pub out: &'a wgpu::Buffer,
}

/// Whether [`gemv_many_glu`] runs here: the multi kernel's adapter needs, every matrix one
/// binding of bf16 with the same multiple-of-8 columns, at most two plain matrices beside the
/// pair (the pair takes entries 2 and 3 of one dispatch).
pub fn glu_fits(gpu: &Gpu, pairs: &[(&GpuTensor, &wgpu::Buffer)], glu: &GluPair) -> bool {
    let cols = glu.gate.shape.get(1).copied().unwrap_or(0);
    let one = |w: &GpuTensor| w.chunks.len() == 1 && w.dtype == DType::BF16 && w.shape.len() == 2 && w.shape[1] == cols && w.rows() > 0;
    multi_runs_here(gpu)
        && cols.is_multiple_of(8)
        && cols > 0
        && pairs.len() <= 2
        && pairs.iter().all(|(w, _)| one(w))
        && one(glu.gate)
        && one(glu.up)
        && glu.gate.shape == glu.up.shape
}

/// The token's expert selection for [`gemv_many_glu`] to make from its first matrix's output
/// (the router logits): idx / wts [top_k] as `router::router_select` writes them. `done` is a
/// counter of at least 4 bytes that starts zero and is left zero (one per MoE layer will do).
pub struct Route<'a> {
    pub cfg: &'a RouterConfig,
    pub top_k: usize,
    pub bias: &'a wgpu::Buffer,
    pub idx: &'a wgpu::Buffer,
    pub wts: &'a wgpu::Buffer,
    pub done: &'a wgpu::Buffer,
}

/// Storage bindings of the multi kernel's route entry.
const ROUTE_BINDINGS: u32 = 13;

/// Whether [`gemv_many_glu`] can select with `route` here, its router matrix `router` (the
/// first of its plain matrices): the selection's bounds, one more binding set, and the
/// matrix's rows as the expert count.
pub fn route_fits(gpu: &Gpu, router: &GpuTensor, route: &Route) -> bool {
    gpu.caps.max_storage_buffers >= ROUTE_BINDINGS && router::pick_params(route.cfg, router.rows(), route.top_k).is_ok()
}

/// [`gemv_many`] of up to two matrices plus a gated pair, in one dispatch: y_i = W_i x and
/// glu.out = act(gate x, up x) (one token's router logits, latent down-projection and shared
/// experts' activation); with `route`, the same dispatch also selects the token's experts
/// from the first matrix's output (the router logits), which saves the router's dependent
/// dispatch. Refused where [`glu_fits`] (or [`route_fits`]) is false.
pub fn gemv_many_glu(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    pairs: &[(&GpuTensor, &wgpu::Buffer)],
    glu: &GluPair,
    route: Option<&Route>,
    x: &wgpu::Buffer,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    if !glu_fits(gpu, pairs, glu) {
        return Err(GpuError::Shape(format!(
            "gemv_many_glu: {} and {} {:?} with {} more matrices need one-binding bf16 matrices of the same columns (a multiple of 8), at most two beside the pair, and subgroups",
            glu.gate.label,
            glu.up.label,
            glu.gate.shape,
            pairs.len()
        )));
    }
    let (rows, cols) = (glu.gate.rows(), glu.gate.shape[1]);
    if x.size() < (cols * 4) as u64 || glu.out.size() < (rows * 4) as u64 || pairs.iter().any(|(w, y)| y.size() < (w.rows() * 4) as u64) {
        return Err(GpuError::Shape(format!("gemv_many_glu: x needs {cols} f32, the gated output {rows}, each output its matrix's rows")));
    }
    let (act, beta, linear_beta) = super::norm::glu_code(glu.act);
    let mut p = MultiParams { cols: cols as u32, glu: 1 + act, beta, linear_beta, start: [u32::MAX; 4], ..Default::default() };
    let placeholders: Vec<wgpu::Buffer> = (0..2 * (2 - pairs.len())).map(|_| gpu.scratch("gemv_many_glu placeholder", 16)).collect();
    let mut bufs: Vec<(u32, &wgpu::Buffer)> = vec![(1, x)];
    let mut blocks = 0u32;
    for (e, (w, y)) in pairs.iter().enumerate() {
        p.start[e] = blocks;
        p.rows[e] = w.rows() as u32;
        blocks += (w.rows() as u32).div_ceil(MULTI_RPW as u32);
        bufs.extend([(2 + e as u32, &w.chunks[0].buffer), (6 + e as u32, *y)]);
    }
    for (i, e) in (pairs.len()..2).enumerate() {
        bufs.extend([(2 + e as u32, &placeholders[2 * i]), (6 + e as u32, &placeholders[2 * i + 1])]);
    }
    // Unused entries among 0 and 1 start where the used ones end: they own no blocks.
    if pairs.len() < 2 {
        p.start[pairs.len()..2].iter_mut().for_each(|s| *s = blocks);
    }
    p.start[2] = blocks;
    p.rows[2] = rows as u32;
    blocks += (rows as u32).div_ceil(MULTI_RPW as u32);
    // Entry 3 (the up projection) owns no blocks of its own; its output binding is unused.
    p.start[3] = blocks;
    let up_out = gpu.scratch("gemv_many_glu up placeholder", 16);
    bufs.extend([(4, &glu.gate.chunks[0].buffer), (5, &glu.up.chunks[0].buffer), (8, glu.out), (9, &up_out)]);
    let Some(r) = route else {
        return gpu.dispatch(enc, &GEMV_BF16_MULTI, &p, &bufs, (blocks, 1), profiler);
    };
    let Some((router, _)) = pairs.first() else {
        return Err(GpuError::Shape("gemv_many_glu: a route needs the router matrix as the first plain matrix".into()));
    };
    if gpu.caps.max_storage_buffers < ROUTE_BINDINGS {
        return Err(GpuError::Shape(format!("gemv_many_glu: a route needs {ROUTE_BINDINGS} storage bindings, the adapter has {}", gpu.caps.max_storage_buffers)));
    }
    let experts = router.rows();
    let pick = router::pick_params(r.cfg, experts, r.top_k)?;
    if r.bias.size() < (experts * 4) as u64 || r.idx.size() < (r.top_k * 4) as u64 || r.wts.size() < (r.top_k * 4) as u64 || r.done.size() < 4 {
        return Err(GpuError::Shape(format!("gemv_many_glu: route buffers too small for {experts} experts, top_k {}", r.top_k)));
    }
    (p.top_k, p.n_group, p.topk_group, p.renormalize, p.scaling) = (pick.top_k, pick.n_group, pick.topk_group, pick.renormalize, pick.scaling);
    bufs.extend([(10, r.bias), (11, r.idx), (12, r.wts), (13, r.done)]);
    gpu.dispatch(enc, &GEMV_BF16_MULTI_ROUTE, &p, &bufs, (blocks, 1), profiler)
}

/// Whether [`gemv_normed`] runs here for W (bf16, cols % 8 == 0 and at most 4096).
pub fn normed_fits(gpu: &Gpu, w: &GpuTensor) -> bool {
    gpu.caps.subgroups
        && gpu.caps.max_invocations >= MULTI_THREADS
        && w.dtype == DType::BF16
        && w.shape.len() == 2
        && w.shape[1].is_multiple_of(8)
        && w.shape[1] <= NORMED_MAX_COLS
}

/// Whether W_b can be [`gemv_normed`]'s second product beside W: both one chunk, bf16, the same
/// rows, W_b's columns a multiple of 8.
pub fn second_fits(w: &GpuTensor, wb: &GpuTensor) -> bool {
    w.chunks.len() == 1
        && wb.chunks.len() == 1
        && wb.dtype == DType::BF16
        && wb.shape.len() == 2
        && wb.rows() == w.rows()
        && wb.shape[1].is_multiple_of(8)
        && wb.shape[1] > 0
}

/// `y = W RMSNorm(x; gamma, eps) [+ W_b x_b]` for one token (x [cols] f32, gamma [cols] bf16;
/// `second` = (W_b, x_b), a bf16 matrix with W's rows and its input), or y += it (`accumulate`):
/// the norm is computed by every workgroup, so it costs no dispatch of its own, and the second
/// product shares the dispatch. A chunked W_b (or W, with a second product) is refused.
#[allow(clippy::too_many_arguments)]
pub fn gemv_normed(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    w: &GpuTensor,
    x: &wgpu::Buffer,
    gamma: &wgpu::Buffer,
    eps: f32,
    second: Option<(&GpuTensor, &wgpu::Buffer)>,
    addend: Option<&wgpu::Buffer>,
    y: &wgpu::Buffer,
    accumulate: bool,
    mut profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    if !normed_fits(gpu, w) {
        return Err(GpuError::Shape(format!(
            "gemv_normed: {} ({} {:?}) needs bf16 with a multiple of 8 columns up to {NORMED_MAX_COLS}, subgroups and workgroups of {MULTI_THREADS}",
            w.label,
            w.dtype.name(),
            w.shape
        )));
    }
    let cols = w.shape[1];
    if x.size() < (cols * 4) as u64 || gamma.size() < (cols * 2) as u64 || y.size() < (w.rows() * 4) as u64 {
        return Err(GpuError::Shape(format!(
            "gemv_normed: {} [{}, {cols}] needs x of {cols} f32, gamma of {cols} bf16 and y of {} f32 values",
            w.label,
            w.rows(),
            w.rows()
        )));
    }
    if let Some(a) = addend {
        if a.size() < (w.rows() * 4) as u64 {
            return Err(GpuError::Shape(format!("gemv_normed: the addend holds {} bytes, {} rows need {}", a.size(), w.rows(), w.rows() * 4)));
        }
    }
    let placeholders;
    let (w_b, x_b, cols_b) = match second {
        Some((wb, xb)) => {
            let cb = wb.shape.get(1).copied().unwrap_or(0);
            if !second_fits(w, wb) {
                return Err(GpuError::Shape(format!(
                    "gemv_normed: second matrix {} ({} {:?}) must be one-chunk bf16 [{}, cols % 8 == 0] beside a one-chunk {}",
                    wb.label,
                    wb.dtype.name(),
                    wb.shape,
                    w.rows(),
                    w.label
                )));
            }
            if xb.size() < (cb * 4) as u64 {
                return Err(GpuError::Shape(format!("gemv_normed: x_b holds {} bytes, {} needs {}", xb.size(), wb.label, cb * 4)));
            }
            (&wb.chunks[0].buffer, xb, cb)
        }
        None => {
            placeholders = [gpu.scratch("gemv_normed placeholder w", 16), gpu.scratch("gemv_normed placeholder x", 16)];
            (&placeholders[0], &placeholders[1], 0)
        }
    };
    for chunk in w.chunks.iter().filter(|c| c.rows > 0) {
        let params = NormGemvParams {
            rows: chunk.rows as u32,
            cols: cols as u32,
            row_offset: chunk.first_row as u32,
            accumulate: accumulate as u32,
            eps,
            cols_b: cols_b as u32,
            has_addend: addend.is_some() as u32,
            ..Default::default()
        };
        let bufs = [(1, x), (2, &chunk.buffer), (3, y), (4, gamma), (5, w_b), (6, x_b), (7, addend.unwrap_or(x))];
        gpu.dispatch(enc, &GEMV_BF16_NORMED, &params, &bufs, ((chunk.rows as u32).div_ceil(MULTI_RPW as u32), 1), profiler.as_deref_mut())?;
    }
    Ok(())
}
