//! Host side of shaders/moe.wgsl: routed experts read through the expert store, with the
//! routing taken from GPU memory (decode: one dispatch per stage for all selected experts;
//! prefill: pairs grouped by expert on the GPU, tiled over each expert's tokens).

use super::shader_params;
use crate::config::{Activation, ExpertFormat};
use crate::experts::{ExpertStore, SlotLayout};
use crate::gpu::{Gpu, GpuError, Kernel, Profiler};

shader_params!(
    /// Mirrors `ExpertParams` in shaders/moe.wgsl.
    ExpertParams in "moe" {
        tokens: u32, top_k: u32, n_in: u32, n_mid: u32, table_base: u32, num_experts: u32,
        slot_words4: u32, act: u32, off_w1: u32, off_w3: u32, off_w2: u32, off_s1: u32,
        off_s3: u32, off_s2: u32, beta: f32, linear_beta: f32, accumulate: u32, _pad0: u32, _pad1: u32,
        _pad2: u32,
    }
);

const MX: &[(&str, f64)] = &[("MXFP4", 1.0)];
const BF: &[(&str, f64)] = &[("MXFP4", 0.0)];
const MX_R1: &[(&str, f64)] = &[("MXFP4", 1.0), ("ROWS", 1.0)];
const MX_R4: &[(&str, f64)] = &[("MXFP4", 1.0), ("ROWS", 4.0)];

pub const EXPERT_UP_MXFP4: Kernel = Kernel::new("expert_up_mxfp4", "moe", "expert_up").with_constants(MX);
pub const EXPERT_UP_MXFP4_R1: Kernel = Kernel::new("expert_up_mxfp4_r1", "moe", "expert_up").with_constants(MX_R1);
pub const EXPERT_UP_MXFP4_R4: Kernel = Kernel::new("expert_up_mxfp4_r4", "moe", "expert_up").with_constants(MX_R4);
pub const EXPERT_UP_BF16: Kernel = Kernel::new("expert_up_bf16", "moe", "expert_up").with_constants(BF);
pub const EXPERT_DOWN_MXFP4: Kernel = Kernel::new("expert_down_mxfp4", "moe", "expert_down").with_constants(MX);
pub const EXPERT_DOWN_MXFP4_R1: Kernel = Kernel::new("expert_down_mxfp4_r1", "moe", "expert_down").with_constants(MX_R1);
pub const EXPERT_DOWN_MXFP4_R4: Kernel = Kernel::new("expert_down_mxfp4_r4", "moe", "expert_down").with_constants(MX_R4);
pub const EXPERT_DOWN_BF16: Kernel = Kernel::new("expert_down_bf16", "moe", "expert_down").with_constants(BF);
/// Subgroup decode kernels reading activations group-transposed (moe_sg.wgsl): 4 + 4 rows per
/// team pass, 96 rows per workgroup of 384 in stage 1 (one pass per subgroup when
/// half-subgroup teams cover 8 rows); 4 rows x all experts per workgroup of 512 in stage 2
/// (one item per subgroup). Sizes measured on the H200 (docs/perf.md).
pub const EXPERT_UP_MXFP4_SGT: Kernel = Kernel::new("expert_up_mxfp4_sgt", "moe_sg", "expert_up_sgt")
    .with_constants(&[("RPW2", 96.0), ("WG1", SGT_UP_THREADS as f64)])
    .subgroups()
    .unchecked();
/// Stage 1 for experts wider than its workgroup array: z read in place (scattered).
pub const EXPERT_UP_MXFP4_SGT_WIDE: Kernel = Kernel::new("expert_up_mxfp4_sgt_wide", "moe_sg", "expert_up_sgt")
    .with_constants(&[("RPW2", 64.0), ("STAGE_Z", 0.0)])
    .subgroups()
    .unchecked();
pub const EXPERT_DOWN_MXFP4_SGT: Kernel = Kernel::new("expert_down_mxfp4_sgt", "moe_sg", "expert_down_sgt")
    .with_constants(&[("RPW2", 4.0), ("WG2", SGT_DOWN_THREADS as f64)])
    .subgroups()
    .unchecked();
/// Workgroup sizes of `sgt`'s stage 1 (WG1; the wide form keeps the shader's 256) and stage 2 (WG2).
const SGT_UP_THREADS: u32 = 384;
const SGT_DOWN_THREADS: u32 = 512;
/// Stage 1 of `sgt` stages z in a workgroup array of this many floats (moe_sg.wgsl MAX_XT * 4).
const SGT_MAX_IN: usize = 4096;
pub const MOE_GROUP: Kernel = Kernel::new("moe_group", "moe", "moe_group");
pub const EXPERT_UP_GROUPED_MXFP4: Kernel = Kernel::new("expert_up_grouped_mxfp4", "moe", "expert_up_grouped").with_constants(MX);
pub const EXPERT_UP_GROUPED_BF16: Kernel = Kernel::new("expert_up_grouped_bf16", "moe", "expert_up_grouped").with_constants(BF);
pub const EXPERT_DOWN_GROUPED_MXFP4: Kernel =
    Kernel::new("expert_down_grouped_mxfp4", "moe", "expert_down_grouped").with_constants(MX);
pub const EXPERT_DOWN_GROUPED_BF16: Kernel = Kernel::new("expert_down_grouped_bf16", "moe", "expert_down_grouped").with_constants(BF);
pub const MOE_COMBINE: Kernel = Kernel::new("moe_combine", "moe", "moe_combine");
/// Tile list of the tiled and coop grouped kernels (moe_grouped.wgsl, lib/moe_tiles.wgsl).
pub const MOE_TILES: Kernel = Kernel::new("moe_tiles", "moe_grouped", "moe_tiles");
const UP_MX: &[(&str, f64)] = &[("UP", 1.0), ("MXFP4", 1.0)];
const DOWN_MX: &[(&str, f64)] = &[("UP", 0.0), ("MXFP4", 1.0)];
const UP_BF: &[(&str, f64)] = &[("UP", 1.0), ("MXFP4", 0.0)];
const DOWN_BF: &[(&str, f64)] = &[("UP", 0.0), ("MXFP4", 0.0)];
const UP: &[(&str, f64)] = &[("UP", 1.0)];
const DOWN: &[(&str, f64)] = &[("UP", 0.0)];
/// SIMT tiled grouped kernels (every adapter): 64 routed pairs x 128 weight rows per workgroup.
/// (Unchecked: every index is guarded against the host-checked extents; the tests cover the
/// tile edges.)
pub const EXPERT_UP_TILED_MXFP4: Kernel =
    Kernel::new("expert_up_tiled_mxfp4", "moe_grouped", "expert_tiled").with_constants(UP_MX).unchecked();
pub const EXPERT_DOWN_TILED_MXFP4: Kernel =
    Kernel::new("expert_down_tiled_mxfp4", "moe_grouped", "expert_tiled").with_constants(DOWN_MX).unchecked();
pub const EXPERT_UP_TILED_BF16: Kernel =
    Kernel::new("expert_up_tiled_bf16", "moe_grouped", "expert_tiled").with_constants(UP_BF).unchecked();
pub const EXPERT_DOWN_TILED_BF16: Kernel =
    Kernel::new("expert_down_tiled_bf16", "moe_grouped", "expert_tiled").with_constants(DOWN_BF).unchecked();
/// Cooperative-matrix grouped kernels (moe_coop.wgsl), MXFP4 only, 32-wide subgroups; the same
/// indexing as the tiled kernels (checked against the f64 reference in the moe bench).
pub const EXPERT_UP_COOP_MXFP4: Kernel =
    Kernel::new("expert_up_coop_mxfp4", "moe_coop", "expert_coop").with_constants(UP).coopmat().subgroups().unchecked();
pub const EXPERT_DOWN_COOP_MXFP4: Kernel =
    Kernel::new("expert_down_coop_mxfp4", "moe_coop", "expert_coop").with_constants(DOWN).coopmat().subgroups().unchecked();
/// Power-of-two activation scales per row for the coop kernels: z rows (stage 1), h rows (stage 2).
pub const MOE_ROW_SCALE_Z: Kernel = Kernel::new("moe_row_scale_z", "moe_coop", "moe_row_scale").with_constants(UP).coopmat();
pub const MOE_ROW_SCALE_H: Kernel = Kernel::new("moe_row_scale_h", "moe_coop", "moe_row_scale").with_constants(DOWN).coopmat();
pub const MXFP4_DEQUANT: Kernel = Kernel::new("mxfp4_dequant", "moe", "mxfp4_dequant");

pub const KERNELS: &[Kernel] = &[
    EXPERT_UP_MXFP4,
    EXPERT_UP_MXFP4_R1,
    EXPERT_UP_MXFP4_R4,
    EXPERT_UP_BF16,
    EXPERT_DOWN_MXFP4,
    EXPERT_DOWN_MXFP4_R1,
    EXPERT_DOWN_MXFP4_R4,
    EXPERT_DOWN_BF16,
    EXPERT_UP_MXFP4_SGT,
    EXPERT_UP_MXFP4_SGT_WIDE,
    EXPERT_DOWN_MXFP4_SGT,
    MOE_GROUP,
    EXPERT_UP_GROUPED_MXFP4,
    EXPERT_UP_GROUPED_BF16,
    EXPERT_DOWN_GROUPED_MXFP4,
    EXPERT_DOWN_GROUPED_BF16,
    MOE_COMBINE,
    MXFP4_DEQUANT,
    MOE_TILES,
    EXPERT_UP_TILED_MXFP4,
    EXPERT_DOWN_TILED_MXFP4,
    EXPERT_UP_TILED_BF16,
    EXPERT_DOWN_TILED_BF16,
    EXPERT_UP_COOP_MXFP4,
    EXPERT_DOWN_COOP_MXFP4,
    MOE_ROW_SCALE_Z,
    MOE_ROW_SCALE_H,
];

pub fn params() -> Vec<super::ParamsLayout> {
    vec![
        super::layout_of::<ExpertParams>(),
        // moe_sg.wgsl, moe_grouped.wgsl and moe_coop.wgsl mirror the same struct.
        super::ParamsLayout { shader: "moe_sg", ..super::layout_of::<ExpertParams>() },
        super::ParamsLayout { shader: "moe_grouped", ..super::layout_of::<ExpertParams>() },
        super::ParamsLayout { shader: "moe_coop", ..super::layout_of::<ExpertParams>() },
        super::layout_of::<super::router::RouterParams>(),
        super::layout_of::<super::norm::NormParams>(),
        super::layout_of::<super::norm::GluParams>(),
        super::layout_of::<super::attn_res::AttnResParams>(),
        super::layout_of::<super::linear::LinearParams>(),
    ]
}

/// [`Gpu::dispatch`] under the name the MoE-family ops call.
pub(crate) fn dispatch<P: bytemuck::Pod>(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    kernel: &Kernel,
    params: &P,
    buffers: &[(u32, &wgpu::Buffer)],
    groups: (u32, u32),
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    gpu.dispatch(enc, kernel, params, buffers, groups, profiler)
}

/// One pair of decode kernels (up stage, down stage).
#[derive(Clone, Copy, Debug)]
pub struct DecodeKernels {
    pub name: &'static str,
    pub up: Kernel,
    pub down: Kernel,
}

impl DecodeKernels {
    /// Weight rows each stage-1 workgroup covers.
    pub fn up_rows(&self) -> u32 {
        rows_per_workgroup(&self.up)
    }

    /// Weight rows each stage-2 workgroup covers.
    pub fn down_rows(&self) -> u32 {
        rows_per_workgroup(&self.down)
    }
}

/// Rows per workgroup of a decode kernel, from its constants: RPW2 (moe_sg.wgsl) or ROWS
/// (moe.wgsl, whose default is 2).
fn rows_per_workgroup(k: &Kernel) -> u32 {
    k.constant("RPW2").or(k.constant("ROWS")).unwrap_or(2.0) as u32
}

/// Shared-memory kernels (every adapter), `ROWS` = 2 / 1 / 4.
pub const DECODE_SHARED: DecodeKernels =
    DecodeKernels { name: "shared r2", up: EXPERT_UP_MXFP4, down: EXPERT_DOWN_MXFP4 };
pub const DECODE_R1: DecodeKernels =
    DecodeKernels { name: "shared r1", up: EXPERT_UP_MXFP4_R1, down: EXPERT_DOWN_MXFP4_R1 };
pub const DECODE_R4: DecodeKernels =
    DecodeKernels { name: "shared r4", up: EXPERT_UP_MXFP4_R4, down: EXPERT_DOWN_MXFP4_R4 };
/// Subgroup kernels with the paired-f16 nibble decode, activations read group-transposed
/// (coalesced across lanes) and experts spread over subgroups in stage 2.
pub const DECODE_SGT: DecodeKernels =
    DecodeKernels { name: "sgt", up: EXPERT_UP_MXFP4_SGT, down: EXPERT_DOWN_MXFP4_SGT };
/// [`DECODE_SGT`] for any expert width (stage 1 reads z in place).
pub const DECODE_SGT_WIDE: DecodeKernels =
    DecodeKernels { name: "sgt wide", up: EXPERT_UP_MXFP4_SGT_WIDE, down: EXPERT_DOWN_MXFP4_SGT };
/// Every MXFP4 decode variant, for tests and benches.
pub const DECODE_VARIANTS: &[DecodeKernels] =
    &[DECODE_SHARED, DECODE_R1, DECODE_R4, DECODE_SGT, DECODE_SGT_WIDE];

/// The fastest MXFP4 decode kernels this adapter can run at this expert width.
/// `K31_MOE_DECODE=NAME` picks a supported variant of [`DECODE_VARIANTS`] by name instead.
pub fn decode_default(gpu: &Gpu, layout: &SlotLayout) -> DecodeKernels {
    // Read once per process: this runs for every MoE layer of every token.
    static FORCED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    static WARNED: std::sync::Once = std::sync::Once::new();
    if let Some(name) = FORCED.get_or_init(|| std::env::var("K31_MOE_DECODE").ok()) {
        match DECODE_VARIANTS.iter().find(|k| k.name == name && decode_supported(gpu, layout, k)) {
            Some(k) => return *k,
            None => WARNED.call_once(|| eprintln!("k31: K31_MOE_DECODE={name:?} names no MXFP4 decode variant this adapter runs here; using the default")),
        }
    }
    if decode_supported(gpu, layout, &DECODE_SGT) {
        DECODE_SGT
    } else if decode_supported(gpu, layout, &DECODE_SGT_WIDE) {
        DECODE_SGT_WIDE
    } else {
        DECODE_SHARED
    }
}

/// Whether the adapter can run `k` on experts of this layout.
pub fn decode_supported(gpu: &Gpu, layout: &SlotLayout, k: &DecodeKernels) -> bool {
    // The subgroup kernels run workgroups of SGT_UP_THREADS and SGT_DOWN_THREADS.
    (!k.up.needs_subgroups || (gpu.caps.subgroups && gpu.caps.max_invocations >= SGT_UP_THREADS.max(SGT_DOWN_THREADS)))
        && (k.up.name != EXPERT_UP_MXFP4_SGT.name || layout.n_in <= SGT_MAX_IN)
}

/// Per-call shape and activation of a routed-expert run.
#[derive(Clone, Copy, Debug)]
pub struct ExpertCall {
    pub layer: usize,
    pub tokens: usize,
    pub top_k: usize,
    pub act: Activation,
    /// Add the weighted expert sum to what y holds (a residual) instead of writing it.
    pub accumulate: bool,
}

fn expert_params(store: &ExpertStore, c: &ExpertCall) -> Result<ExpertParams, GpuError> {
    let l = &store.layout;
    if c.layer >= store.num_layers || c.top_k == 0 || c.top_k > store.num_experts || c.tokens == 0 {
        return Err(GpuError::Shape(format!(
            "experts: layer {} of {}, top_k {} of {} experts, {} tokens",
            c.layer, store.num_layers, c.top_k, store.num_experts, c.tokens
        )));
    }
    let (act, beta, linear_beta) = match c.act {
        Activation::Situ { beta, linear_beta } => (0, beta, linear_beta.unwrap_or(0.0)),
        Activation::Silu => (1, 0.0, 0.0),
    };
    Ok(ExpertParams {
        tokens: c.tokens as u32,
        top_k: c.top_k as u32,
        n_in: l.n_in as u32,
        n_mid: l.n_mid as u32,
        table_base: store.table_base(c.layer),
        num_experts: store.num_experts as u32,
        slot_words4: (l.slot_bytes / 16) as u32,
        act,
        off_w1: l.off_w[0],
        off_w3: l.off_w[1],
        off_w2: l.off_w[2],
        off_s1: l.off_s[0],
        off_s3: l.off_s[1],
        off_s2: l.off_s[2],
        beta,
        linear_beta,
        accumulate: c.accumulate as u32,
        ..Default::default()
    })
}

fn need(buf: &wgpu::Buffer, bytes: usize, what: &str) -> Result<(), GpuError> {
    if buf.size() < bytes as u64 {
        return Err(GpuError::Shape(format!("experts: {what} has {} bytes, needs {bytes}", buf.size())));
    }
    Ok(())
}

/// Decode path (any token count, per-token weight reads): for each token t and selected
/// expert j, h[t, j] = act(w1 z_t, w3 z_t); then y[t] = sum_j wts[t, j] w2 h[t, j].
/// z: [T, n_in] f32; idx: [T, top_k] u32; wts: [T, top_k] f32; h: [T * top_k, n_mid] f32
/// scratch; y: [T, n_in] f32.
#[allow(clippy::too_many_arguments)]
pub fn experts_decode(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    store: &ExpertStore,
    call: &ExpertCall,
    kernels: Option<DecodeKernels>,
    z: &wgpu::Buffer,
    idx: &wgpu::Buffer,
    wts: &wgpu::Buffer,
    h: &wgpu::Buffer,
    y: &wgpu::Buffer,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    experts_decode_beside(gpu, enc, store, call, kernels, z, idx, wts, h, y, profiler, None)
}

/// Work recorded between the experts' two stages ([`experts_decode_beside`]): with every
/// buffer it reads already in the read state and outputs new to the encoder, no barrier stands
/// between it and stage 1, so a memory-bound product runs beside the decode-bound experts.
pub type BesideStage1<'a> = &'a mut dyn FnMut(&mut wgpu::CommandEncoder) -> Result<(), GpuError>;

/// [`experts_decode`] with `beside` recorded right after stage 1.
#[allow(clippy::too_many_arguments)]
pub fn experts_decode_beside(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    store: &ExpertStore,
    call: &ExpertCall,
    kernels: Option<DecodeKernels>,
    z: &wgpu::Buffer,
    idx: &wgpu::Buffer,
    wts: &wgpu::Buffer,
    h: &wgpu::Buffer,
    y: &wgpu::Buffer,
    mut profiler: Option<&mut Profiler>,
    beside: Option<BesideStage1<'_>>,
) -> Result<(), GpuError> {
    let p = expert_params(store, call)?;
    let (t, k, n_in, n_mid) = (call.tokens, call.top_k, store.layout.n_in, store.layout.n_mid);
    need(z, t * n_in * 4, "z")?;
    need(idx, t * k * 4, "idx")?;
    need(wts, t * k * 4, "wts")?;
    need(h, t * k * n_mid * 4, "h")?;
    need(y, t * n_in * 4, "y")?;
    let k_sel = match store.layout.format {
        ExpertFormat::Mxfp4 => kernels.unwrap_or_else(|| decode_default(gpu, &store.layout)),
        ExpertFormat::Bf16 => DecodeKernels { name: "bf16", up: EXPERT_UP_BF16, down: EXPERT_DOWN_BF16 },
    };
    // The subgroup kernels (moe_sg.wgsl, the only ones that need subgroups) keep stage-2
    // partial sums in a 2048-float workgroup array, read scale bytes through binding 7 and
    // pass h between their stages group-transposed.
    let sg = k_sel.up.needs_subgroups;
    if !decode_supported(gpu, &store.layout, &k_sel) {
        return Err(GpuError::Shape(format!("experts: decode kernels {} do not run here at expert width {n_in}", k_sel.name)));
    }
    if sg && k * k_sel.down_rows() as usize > 2048 {
        return Err(GpuError::Shape(format!("experts: top_k {k} x {} rows exceeds the stage-2 workgroup buffer", k_sel.down_rows())));
    }
    let pairs = (t * k) as u32;
    dispatch(
        gpu,
        enc,
        &k_sel.up,
        &p,
        &with_scales(sg, &[(1, &store.pool), (2, &store.table), (3, idx), (5, z), (6, h)], &store.pool),
        ((n_mid as u32).div_ceil(k_sel.up_rows()), pairs),
        profiler.as_deref_mut(),
    )?;
    if let Some(work) = beside {
        work(enc)?;
    }
    dispatch(
        gpu,
        enc,
        &k_sel.down,
        &p,
        &with_scales(sg, &[(1, &store.pool), (2, &store.table), (3, idx), (4, wts), (5, h), (6, y)], &store.pool),
        ((n_in as u32).div_ceil(k_sel.down_rows()), t as u32),
        profiler,
    )
}

/// `b`, plus the pool as words (binding 7, the scale bytes) for the subgroup kernels.
fn with_scales<'a>(sg: bool, b: &[(u32, &'a wgpu::Buffer)], pool: &'a wgpu::Buffer) -> Vec<(u32, &'a wgpu::Buffer)> {
    let mut v = b.to_vec();
    if sg {
        v.push((7, pool));
    }
    v
}

/// The kernels of the grouped (prefill) path, for tests and benches: `Old` = the first tiled
/// kernels (moe.wgsl, 64 rows x 16 pairs, weights decoded per 16 pairs), `Tiled` = SIMT
/// 64 pairs x 128 weight rows (moe_grouped.wgsl, every adapter), `Coop` = the same tiles on
/// cooperative matrices (moe_coop.wgsl: MXFP4, 16x16x16 f16, 32-wide subgroups).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GroupedKernels {
    Old,
    Tiled,
    Coop,
}

impl GroupedKernels {
    pub fn name(self) -> &'static str {
        match self {
            GroupedKernels::Old => "old",
            GroupedKernels::Tiled => "tiled simt",
            GroupedKernels::Coop => "coop",
        }
    }
}

pub const GROUPED_VARIANTS: &[GroupedKernels] = &[GroupedKernels::Old, GroupedKernels::Tiled, GroupedKernels::Coop];

/// Pairs per tile of the tiled and coop kernels (lib/moe_tiles.wgsl BM).
const TILE_PAIRS: usize = 64;

/// Whether the adapter runs `k` on experts of this layout.
pub fn grouped_supported(gpu: &Gpu, layout: &SlotLayout, k: GroupedKernels) -> bool {
    match k {
        GroupedKernels::Old | GroupedKernels::Tiled => true,
        GroupedKernels::Coop => {
            layout.format == ExpertFormat::Mxfp4
                && gpu.caps.coopmat
                && gpu.caps.subgroups
                && gpu.caps.subgroup_min == 32
                && gpu.caps.subgroup_max == 32
        }
    }
}

/// Cooperative matrices where the adapter has them (MXFP4), else the SIMT tiles.
pub fn grouped_default(gpu: &Gpu, layout: &SlotLayout) -> GroupedKernels {
    if grouped_supported(gpu, layout, GroupedKernels::Coop) {
        GroupedKernels::Coop
    } else {
        GroupedKernels::Tiled
    }
}

/// Upper bound on the tiles of `tokens` x `top_k` pairs over `experts` lists: each list of
/// c pairs has ceil(c / 64) <= c / 64 + 1 tiles, and no list exceeds `tokens`.
fn max_tiles(tokens: usize, top_k: usize, experts: usize) -> usize {
    (experts * tokens.div_ceil(TILE_PAIRS)).min((tokens * top_k).div_ceil(TILE_PAIRS) + experts)
}

/// GPU scratch of the prefill path for `tokens` x `top_k` pairs.
pub struct GroupedScratch {
    /// [num_experts, tokens] u32 pair lists.
    pub list: wgpu::Buffer,
    /// [num_experts] u32.
    pub count: wgpu::Buffer,
    /// [1 + 2 * max tiles] u32: the tile count, then (expert, first list index) per tile.
    pub tiles: wgpu::Buffer,
    /// [tokens * top_k] f32 power-of-two activation scales per row (coop kernels).
    pub xscale: wgpu::Buffer,
    /// [tokens * top_k, n_mid] f32.
    pub h: wgpu::Buffer,
    /// [tokens * top_k, n_in] f32 per-pair expert outputs.
    pub yk: wgpu::Buffer,
}

impl GroupedScratch {
    pub fn new(gpu: &Gpu, store: &ExpertStore, tokens: usize, top_k: usize) -> GroupedScratch {
        let l = &store.layout;
        GroupedScratch {
            list: gpu.storage("moe list", (store.num_experts * tokens * 4) as u64),
            count: gpu.storage("moe count", (store.num_experts * 4) as u64),
            tiles: gpu.storage("moe tiles", ((1 + 2 * max_tiles(tokens, top_k, store.num_experts)) * 4) as u64),
            xscale: gpu.storage("moe xscale", (tokens * top_k * 4) as u64),
            h: gpu.storage("moe h", (tokens * top_k * l.n_mid * 4) as u64),
            yk: gpu.storage("moe yk", (tokens * top_k * l.n_in * 4) as u64),
        }
    }
}

/// Prefill path with the adapter's default kernels ([`grouped_default`]).
#[allow(clippy::too_many_arguments)]
pub fn experts_grouped(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    store: &ExpertStore,
    call: &ExpertCall,
    z: &wgpu::Buffer,
    idx: &wgpu::Buffer,
    wts: &wgpu::Buffer,
    s: &GroupedScratch,
    y: &wgpu::Buffer,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    experts_grouped_with(gpu, enc, store, call, None, z, idx, wts, s, y, profiler)
}

/// Prefill path: pairs grouped by expert on the GPU and cut into tiles of 64 pairs, each
/// expert's weights decoded once per tile (read from memory once per chunk, the rest from
/// cache), then a fixed-order weighted combine. `kernels`: None = [`grouped_default`].
#[allow(clippy::too_many_arguments)]
pub fn experts_grouped_with(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    store: &ExpertStore,
    call: &ExpertCall,
    kernels: Option<GroupedKernels>,
    z: &wgpu::Buffer,
    idx: &wgpu::Buffer,
    wts: &wgpu::Buffer,
    s: &GroupedScratch,
    y: &wgpu::Buffer,
    mut profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    let p = expert_params(store, call)?;
    let (t, k, n_in, n_mid, e) = (call.tokens, call.top_k, store.layout.n_in, store.layout.n_mid, store.num_experts);
    need(z, t * n_in * 4, "z")?;
    need(idx, t * k * 4, "idx")?;
    need(wts, t * k * 4, "wts")?;
    need(&s.list, e * t * 4, "list")?;
    need(&s.h, t * k * n_mid * 4, "h")?;
    need(&s.yk, t * k * n_in * 4, "yk")?;
    need(y, t * n_in * 4, "y")?;
    let kind = kernels.unwrap_or_else(|| grouped_default(gpu, &store.layout));
    if !grouped_supported(gpu, &store.layout, kind) {
        return Err(GpuError::Shape(format!("experts: grouped kernels {} do not run here for {:?} experts", kind.name(), store.layout.format)));
    }
    let mx = store.layout.format == ExpertFormat::Mxfp4;
    dispatch(gpu, enc, &MOE_GROUP, &p, &[(3, idx), (7, &s.list), (8, &s.count)], (e as u32, 1), profiler.as_deref_mut())?;
    let (up, down) = match (kind, mx) {
        (GroupedKernels::Old, true) => (EXPERT_UP_GROUPED_MXFP4, EXPERT_DOWN_GROUPED_MXFP4),
        (GroupedKernels::Old, false) => (EXPERT_UP_GROUPED_BF16, EXPERT_DOWN_GROUPED_BF16),
        (GroupedKernels::Tiled, true) => (EXPERT_UP_TILED_MXFP4, EXPERT_DOWN_TILED_MXFP4),
        (GroupedKernels::Tiled, false) => (EXPERT_UP_TILED_BF16, EXPERT_DOWN_TILED_BF16),
        (GroupedKernels::Coop, _) => (EXPERT_UP_COOP_MXFP4, EXPERT_DOWN_COOP_MXFP4),
    };
    if kind == GroupedKernels::Old {
        let up_bufs = [(1, &store.pool), (2, &store.table), (5, z), (6, &s.h), (7, &s.list), (8, &s.count)];
        dispatch(gpu, enc, &up, &p, &up_bufs, ((n_mid as u32).div_ceil(64), e as u32), profiler.as_deref_mut())?;
        let down_bufs = [(1, &store.pool), (2, &store.table), (5, &s.h), (6, &s.yk), (7, &s.list), (8, &s.count)];
        dispatch(gpu, enc, &down, &p, &down_bufs, ((n_in as u32).div_ceil(64), e as u32), profiler.as_deref_mut())?;
    } else {
        let bound = max_tiles(t, k, e);
        need(&s.tiles, (1 + 2 * bound) * 4, "tiles")?;
        need(&s.xscale, t * k * 4, "xscale")?;
        if bound > 65535 {
            return Err(GpuError::Shape(format!("experts: {bound} tiles exceed one dispatch dimension ({t} tokens x top-{k})")));
        }
        let coop = kind == GroupedKernels::Coop;
        dispatch(gpu, enc, &MOE_TILES, &p, &[(8, &s.count), (9, &s.tiles)], (1, 1), profiler.as_deref_mut())?;
        let tiled = [(1, &store.pool), (2, &store.table), (7, &s.list), (8, &s.count), (9, &s.tiles)];
        if coop {
            dispatch(gpu, enc, &MOE_ROW_SCALE_Z, &p, &[(5, z), (10, &s.xscale)], (t as u32, 1), profiler.as_deref_mut())?;
        }
        let mut up_bufs = tiled.to_vec();
        up_bufs.extend([(5, z), (6, &s.h)]);
        if coop {
            up_bufs.push((10, &s.xscale));
        }
        // Stage 1: 64 output rows (of w1 and w3) per workgroup; stage 2: 128 rows of w2.
        dispatch(gpu, enc, &up, &p, &up_bufs, ((n_mid as u32).div_ceil(64), bound as u32), profiler.as_deref_mut())?;
        if coop {
            dispatch(gpu, enc, &MOE_ROW_SCALE_H, &p, &[(5, &s.h), (10, &s.xscale)], ((t * k) as u32, 1), profiler.as_deref_mut())?;
        }
        let mut down_bufs = tiled.to_vec();
        down_bufs.extend([(5, &s.h), (6, &s.yk)]);
        if coop {
            down_bufs.push((10, &s.xscale));
        }
        dispatch(gpu, enc, &down, &p, &down_bufs, ((n_in as u32).div_ceil(128), bound as u32), profiler.as_deref_mut())?;
    }
    dispatch(gpu, enc, &MOE_COMBINE, &p, &[(4, wts), (5, &s.yk), (6, y)], (((t * n_in) as u32).div_ceil(128), 1), profiler)
}

/// Dequantises w1 of (layer, expert) to f32 bits [n_mid, n_in] in `out` (bit-exact decode check).
pub fn mxfp4_dequant(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    store: &ExpertStore,
    layer: usize,
    expert: usize,
    out: &wgpu::Buffer,
) -> Result<(), GpuError> {
    if store.layout.format != ExpertFormat::Mxfp4 || expert >= store.num_experts {
        return Err(GpuError::Shape("mxfp4_dequant: needs an MXFP4 store and a valid expert".into()));
    }
    let call = ExpertCall { layer, tokens: 1, top_k: 1, act: Activation::Silu, accumulate: false };
    let mut p = expert_params(store, &call)?;
    p.table_base += expert as u32;
    let n = (store.layout.n_in * store.layout.n_mid) as u32;
    need(out, n as usize * 4, "out")?;
    dispatch(gpu, enc, &MXFP4_DEQUANT, &p, &[(1, &store.pool), (2, &store.table), (6, out)], (n.div_ceil(128), 1), None)
}
