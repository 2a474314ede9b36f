//! Host side of the DSA kernels: shaders/indexer.wgsl (lightning indexer scores),
//! shaders/topk.wgsl (radix top-k), shaders/mla.wgsl (absorbed sparse MLA) and
//! shaders/dsa_misc.wgsl (row norms, bf16 cache writes), plus the paged row store that
//! holds the per-sequence caches on the GPU.

use super::shader_params;
use crate::gpu::{Gpu, GpuError, GpuTensor, Kernel, Profiler};
use crate::layout::DType;
use std::collections::HashMap;
use std::sync::{Mutex, OnceLock};

shader_params!(
    /// Mirrors `IndexParams` in shaders/lib/index_params.wgsl.
    IndexParams in "indexer" {
        n_queries: u32, row_stride: u32, q_pos0: u32, n_pos: u32,
        page0: u32, shift_max: u32, w_scale: f32, q_bf16: u32,
    }
);
shader_params!(
    /// Mirrors `TopkParams` in shaders/topk.wgsl.
    TopkParams in "topk" {
        n_rows: u32, row_stride: u32, k: u32, pos0: u32, row_len: u32, _p0: u32, _p1: u32, _p2: u32,
    }
);
shader_params!(
    /// Mirrors `MlaParams` in shaders/mla.wgsl.
    MlaParams in "mla" {
        n_heads: u32, latent: u32, rope: u32, nope: u32,
        v_dim: u32, n_queries: u32, q_pos0: u32, k: u32,
        splits: u32, dense: u32, has_gate: u32, q_stride: u32,
        page0: u32, shift_max: u32, scale: f32, logit_stride: u32,
    }
);
shader_params!(
    /// Mirrors `NormParams` in shaders/dsa_misc.wgsl.
    NormParams in "dsa_misc" { rows: u32, stride: u32, offset: u32, n: u32, eps: f32, _p0: u32, _p1: u32, _p2: u32 }
);
shader_params!(
    /// Mirrors `PrepParams` in shaders/global_prep.wgsl.
    PrepParams in "global_prep" { q_n: u32, kv_width: u32, kv_n: u32, kv_row: u32, k_n: u32, k_row: u32, eps: f32, k_eps: f32 }
);

shader_params!(
    /// Mirrors `GlobalQParams` in shaders/global_q.wgsl.
    GlobalQParams in "global_q" {
        q_n: u32, kv_width: u32, kv_n: u32, kv_row: u32, k_n: u32, k_row: u32, eps: f32, k_eps: f32,
        rows_a: u32, rows_b: u32, blocks_a: u32, _pad: u32,
    }
);
shader_params!(
    /// Mirrors `CacheWriteParams` in shaders/dsa_misc.wgsl.
    CacheWriteParams in "dsa_misc" {
        rows: u32, src_stride: u32, src_offset: u32, width: u32, dst_row0: u32, _p0: u32, _p1: u32, _p2: u32,
    }
);

/// Indexer variants are specialised on (heads, head_dim); K3.1 and the tiny/test shapes are
/// validated in CI, others are built on demand by [`index_kernel`] and [`index_kernel_tiled`].
/// The indexer kernels run without wgpu's runtime checks: [`index_scores_kernel`] checks that
/// every position below n_pos lies in an allocated page and that q, w and the score rows are
/// large enough; workgroup-memory indices are bounded by the constants.
pub const INDEX_SCORES_K31: Kernel =
    Kernel::new("index_scores_32x128", "indexer", "index_scores").with_constants(&[("IH", 32.0), ("ID", 128.0)]).unchecked();
/// [`INDEX_SCORES_K31`] on 32-position tiles (8 head groups of 4): twice the workgroups.
pub const INDEX_SCORES_K31_T32: Kernel = Kernel::new("index_scores_32x128_t32", "indexer", "index_scores")
    .with_constants(&[("IH", 32.0), ("ID", 128.0), ("TILE", 32.0)])
    .unchecked();
/// Bench diagnostic: the scan's key reads alone (indexer.wgsl `index_keys_probe`), K3.1 rows.
pub const INDEX_KEYS_PROBE: Kernel =
    Kernel::new("index_keys_probe", "indexer", "index_keys_probe").with_constants(&[("IH", 32.0), ("ID", 128.0)]).unchecked();
pub const INDEX_SCORES_4X32: Kernel =
    Kernel::new("index_scores_4x32", "indexer", "index_scores").with_constants(&[("IH", 4.0), ("ID", 32.0)]).unchecked();
/// The register-tiled indexer (indexer.wgsl `index_scores_tiled`, [`IndexVariant::Tiled`]):
/// tiles of TW / 2 positions, 4 positions x 4 heads per thread; the SIMT kernel's checks.
pub const INDEX_SCORES_TILED_K31: Kernel = Kernel::new("index_scores_tiled_32x128", "indexer", "index_scores_tiled")
    .with_constants(&[("IH", 32.0), ("ID", 128.0), ("TW", TILED_THREADS as f64)])
    .unchecked();
pub const INDEX_SCORES_TILED_4X32: Kernel = Kernel::new("index_scores_tiled_4x32", "indexer", "index_scores_tiled")
    .with_constants(&[("IH", 4.0), ("ID", 32.0), ("TW", TILED_THREADS as f64)])
    .unchecked();
/// Bench variant of the tiled K3.1 indexer: workgroups of 128 threads, 64-position tiles (twice
/// the workgroups, q staged twice as often per position).
pub const INDEX_SCORES_TILED_T64: Kernel = Kernel::new("index_scores_tiled_t64", "indexer", "index_scores_tiled")
    .with_constants(&[("IH", 32.0), ("ID", 128.0), ("TW", 128.0)])
    .unchecked();
/// Threads per workgroup of the tiled indexer (indexer.wgsl TW), twice its positions per tile.
const TILED_THREADS: usize = 256;
/// The K3.1 indexer (32 x 128) on cooperative matrices, q scaled per head and split into two f16
/// parts by masking, keys scaled into the exact f16 range (f32 recomputation beyond it): within
/// ~6e-7 of the f32 kernel on the H200. 64-position tiles, each of the 4 subgroups 16 positions
/// x all 32 heads (two accumulator chains per key fragment), the next tile's keys loaded under
/// one branch per thread; the default from [`COOP_INDEX_MIN_POS`] positions (see
/// [`IndexVariant::Auto`]).
pub const INDEX_SCORES_COOP: Kernel =
    Kernel::new("index_scores_coop", "dsa_index_coop", "index_scores_coop")
        .with_constants(&[("QSPLIT", 1.0)])
        .coopmat()
        .subgroups()
        .unchecked();
/// [`INDEX_SCORES_COOP`] for [`IndexPrecision::Bf16`]: q rounded to bf16 is exact in f16 after
/// the per-head scale, so one product per fragment (no lo part) gives the same scores.
pub const INDEX_SCORES_COOP_BF16: Kernel =
    Kernel::new("index_scores_coop_bf16", "dsa_index_coop", "index_scores_coop")
        .with_constants(&[("QSPLIT", 0.0)])
        .coopmat()
        .subgroups()
        .unchecked();
/// [`INDEX_SCORES_COOP`] for blocks of queries (prefill): one workgroup per 8 queries
/// (dsa_index_coop_mq.wgsl), each staged 64-position key tile multiplied by all eight, where the
/// one-query kernel stages and converts every key once per query. Same scheme, same scores.
pub const INDEX_SCORES_COOP_MQ: Kernel =
    Kernel::new("index_scores_coop_mq", "dsa_index_coop_mq", "index_scores_coop_mq")
        .with_constants(&[("QSPLIT", 1.0)])
        .coopmat()
        .subgroups()
        .unchecked();
/// [`INDEX_SCORES_COOP_MQ`] for [`IndexPrecision::Bf16`] (one product per fragment).
pub const INDEX_SCORES_COOP_MQ_BF16: Kernel =
    Kernel::new("index_scores_coop_mq_bf16", "dsa_index_coop_mq", "index_scores_coop_mq")
        .with_constants(&[("QSPLIT", 0.0)])
        .coopmat()
        .subgroups()
        .unchecked();
/// Queries per workgroup of [`INDEX_SCORES_COOP_MQ`] (QB in the shader).
const COOP_MQ_QUERIES: usize = 8;
/// Workgroups of [`INDEX_SCORES_COOP_MQ`] in one wave on the H200 (one per SM: 219 registers x
/// 256 threads); a 264-workgroup grid measured 0-35 % slower.
const COOP_MQ_WAVE: usize = 132;
/// The original kernel, q rounded to f16 (~4e-4 of the largest score; moved 1-2 of 2048
/// selected positions on the H200). Its former hi+lo form measured the same: the driver folds
/// f32(f16(x)) to x, so lo was zero.
pub const INDEX_SCORES_COOP_F16: Kernel = Kernel::new("index_scores_coop_f16", "dsa_index_coop", "index_scores_coop")
    .with_constants(&[("QSPLIT", 0.0), ("EXACT", 0.0)])
    .coopmat()
    .subgroups()
    .unchecked();
// The top-k kernels run without wgpu's runtime checks: rows are below n_rows (host-checked
// against the scratch and the score buffer), positions below the valid length <= row_len <=
// row_stride, selection slots below k, workgroup-memory indices bounded by construction (the
// boundary copy also by BCAP), and the one data-dependent loop (the radix rounds) is bounded.
pub const TOPK_HIST: Kernel = Kernel::new("topk_hist", "topk", "topk_hist").unchecked();
pub const TOPK_GATHER: Kernel = Kernel::new("topk_gather", "topk", "topk_gather").unchecked();
pub const TOPK_RANK: Kernel = Kernel::new("topk_rank", "topk", "topk_rank").unchecked();
pub const TOPK_GATHER_SET: Kernel =
    Kernel::new("topk_gather_set", "topk", "topk_gather").with_constants(&[("ORDERED", 0.0)]).unchecked();
// The subgroup form (topk_sg.wgsl, same scratch and bindings): run wherever the adapter has
// subgroups (see [`set_topk_portable`]).
pub const TOPK_HIST_SG: Kernel = Kernel::new("topk_hist_sg", "topk_sg", "topk_hist").subgroups().unchecked();
pub const TOPK_GATHER_SG: Kernel = Kernel::new("topk_gather_sg", "topk_sg", "topk_gather").subgroups().unchecked();
pub const TOPK_GATHER_SET_SG: Kernel =
    Kernel::new("topk_gather_set_sg", "topk_sg", "topk_gather").with_constants(&[("ORDERED", 0.0)]).subgroups().unchecked();
/// Rows of at most TOPK_SMALL_MAX positions in one workgroup and one dispatch (topk_sg.wgsl),
/// ordered and as a set, 4 positions per thread (rows up to TOPK_CHUNK) or 8.
pub const TOPK_SMALL_SG: Kernel = small_topk("topk_small_sg", &[("SMALL_N", 4.0)]);
pub const TOPK_SMALL_SET_SG: Kernel = small_topk("topk_small_set_sg", &[("ORDERED", 0.0), ("SMALL_N", 4.0)]);
pub const TOPK_SMALL8_SG: Kernel = small_topk("topk_small8_sg", &[("SMALL_N", 8.0)]);
pub const TOPK_SMALL8_SET_SG: Kernel = small_topk("topk_small8_set_sg", &[("ORDERED", 0.0), ("SMALL_N", 8.0)]);
const fn small_topk(name: &'static str, c: &'static [(&'static str, f64)]) -> Kernel {
    Kernel::new(name, "topk_sg", "topk_small").with_constants(c).subgroups().unchecked()
}
/// Bench probe: an empty dispatch (launch and drain floor), see [`topk_probe`].
pub const TOPK_NOOP: Kernel = Kernel::new("topk_noop", "topk", "topk_noop");
// The decode-path MLA kernels run without wgpu's runtime checks (index clamping, forced loop
// bounds, division guards): every index is host-checked (shapes, buffer sizes, the cache
// capacity, splits <= 128) or bounded by construction, and selection entries are clamped to the
// causal limit in the shader. Their `_checked` twins (same shader) are bench diagnostics.
pub const MLA_ABSORB: Kernel = Kernel::new("mla_absorb", "mla", "mla_absorb").unchecked();
/// The simple per-head attention (one workgroup per split and head), kept for debugging.
pub const MLA_ATTEND: Kernel = Kernel::new("mla_attend", "mla", "mla_attend");
pub const MLA_ATTEND_TILED: Kernel = Kernel::new("mla_attend_tiled", "mla", "mla_attend_tiled").unchecked();
/// The attention on cooperative matrices (mla_coop.wgsl): q and p split into hi + lo f16 parts,
/// splits of at most [`MLA_COOP_ROWS`] rows; see [`MlaVariant::Coop`].
pub const MLA_ATTEND_COOP: Kernel = Kernel::new("mla_attend_coop", "mla_coop", "mla_attend_coop").coopmat().subgroups().unchecked();
pub const MLA_MERGE_OUT: Kernel = Kernel::new("mla_merge_out", "mla", "mla_merge_out").unchecked();
/// Bench variant: 64 W_UV rows per workgroup (half the workgroups, half the partial re-reads).
pub const MLA_MERGE_OUT_64: Kernel = Kernel::new("mla_merge_out_64", "mla", "mla_merge_out")
    .with_constants(&[("OUT_ROWS", 64.0)])
    .profile_as("mla_merge_out")
    .unchecked();
pub const MLA_ABSORB_CHECKED: Kernel = Kernel::new("mla_absorb_checked", "mla", "mla_absorb").profile_as("mla_absorb");
pub const MLA_ATTEND_TILED_CHECKED: Kernel =
    Kernel::new("mla_attend_tiled_checked", "mla", "mla_attend_tiled").profile_as("mla_attend_tiled");
pub const MLA_MERGE_OUT_CHECKED: Kernel = Kernel::new("mla_merge_out_checked", "mla", "mla_merge_out").profile_as("mla_merge_out");
pub const MLA_LOGITS: Kernel = Kernel::new("mla_logits", "mla", "mla_logits");
pub const RMS_NORM: Kernel = Kernel::new("dsa_rms_norm", "dsa_misc", "rms_norm");
pub const LAYER_NORM: Kernel = Kernel::new("dsa_layer_norm", "dsa_misc", "layer_norm");
pub const CACHE_WRITE: Kernel = Kernel::new("dsa_cache_write", "dsa_misc", "cache_write");
pub const GLOBAL_PREP: Kernel = Kernel::new("global_prep", "global_prep", "global_prep");
/// [`global_prep`]'s cache rows and the query projections in one dispatch (global_q.wgsl):
/// 32 rows per workgroup of 512, as the multi-matrix GEMV.
pub const GLOBAL_Q_PROJ: Kernel = Kernel::new("global_q_proj", "global_q", "global_q_proj")
    .with_constants(&[("RS", 2.0), ("RPW", GLOBAL_Q_RPW as f64)])
    .subgroups()
    .unchecked();
const GLOBAL_Q_RPW: usize = 32;
/// Widest c_q [`global_q_proj`] normalises in workgroup memory (4 * MAX_XQ in the shader).
const GLOBAL_Q_MAX_COLS: usize = 2048;

pub const KERNELS: &[Kernel] = &[
    INDEX_SCORES_K31,
    INDEX_SCORES_K31_T32,
    INDEX_SCORES_4X32,
    INDEX_SCORES_TILED_K31,
    INDEX_SCORES_TILED_4X32,
    INDEX_SCORES_TILED_T64,
    INDEX_KEYS_PROBE,
    INDEX_SCORES_COOP,
    INDEX_SCORES_COOP_BF16,
    INDEX_SCORES_COOP_F16,
    INDEX_SCORES_COOP_MQ,
    INDEX_SCORES_COOP_MQ_BF16,
    TOPK_HIST,
    TOPK_GATHER,
    TOPK_RANK,
    TOPK_GATHER_SET,
    TOPK_HIST_SG,
    TOPK_GATHER_SG,
    TOPK_GATHER_SET_SG,
    TOPK_SMALL_SG,
    TOPK_SMALL_SET_SG,
    TOPK_SMALL8_SG,
    TOPK_SMALL8_SET_SG,
    TOPK_NOOP,
    MLA_ABSORB,
    MLA_ATTEND,
    MLA_ATTEND_TILED,
    MLA_ATTEND_COOP,
    MLA_MERGE_OUT,
    MLA_MERGE_OUT_64,
    MLA_ABSORB_CHECKED,
    MLA_ATTEND_TILED_CHECKED,
    MLA_MERGE_OUT_CHECKED,
    MLA_LOGITS,
    RMS_NORM,
    LAYER_NORM,
    CACHE_WRITE,
    GLOBAL_PREP,
    GLOBAL_Q_PROJ,
];

pub fn params() -> Vec<super::ParamsLayout> {
    use super::layout_of;
    vec![
        layout_of::<IndexParams>(),
        layout_of::<TopkParams>(),
        layout_of::<MlaParams>(),
        layout_of::<NormParams>(),
        layout_of::<CacheWriteParams>(),
        layout_of::<PrepParams>(),
        layout_of::<GlobalQParams>(),
    ]
}

/// Largest supported top-k (the rank pass holds the selection in workgroup memory).
pub const MAX_TOPK: usize = 2048;
/// Page bindings of the paged caches (indexer.wgsl k0..k15, mla.wgsl c0..c15).
pub const MAX_PAGES: usize = 16;
/// Positions per top-k workgroup (topk.wgsl CHUNK).
const TOPK_CHUNK: usize = 4096;
/// Longest row `topk_small` selects alone (topk_sg.wgsl WG * SMALL_ITEMS).
const TOPK_SMALL_MAX: usize = 8192;
/// Selection entries ranked per workgroup (topk.wgsl RANK_E).
const TOPK_RANK_E: usize = 8;
/// Global histogram words per row (topk.wgsl / topk_sg.wgsl HSTRIDE: 4096 + 4096 bins).
const TOPK_HSTRIDE: usize = 8192;
/// Pages stop doubling at this size: very large buffers gained nothing and the first
/// H200 run slowed down past 1 GiB pages.
const PAGE_BYTES_CAP: u64 = 256 << 20;

/// The SIMT indexer kernel specialised on `heads` x `head_dim` (built once per shape).
pub fn index_kernel(heads: usize, head_dim: usize) -> Result<Kernel, GpuError> {
    index_kernel_of("index_scores", heads, head_dim)
}

/// The register-tiled indexer kernel ([`IndexVariant::Tiled`]) specialised likewise.
pub fn index_kernel_tiled(heads: usize, head_dim: usize) -> Result<Kernel, GpuError> {
    index_kernel_of("index_scores_tiled", heads, head_dim)
}

/// The specialisations validated in CI (K3.1 and the tiny/test shapes): (heads, head_dim, kernel).
const INDEX_PREBUILT: [(usize, usize, Kernel); 4] = [
    (32, 128, INDEX_SCORES_K31),
    (4, 32, INDEX_SCORES_4X32),
    (32, 128, INDEX_SCORES_TILED_K31),
    (4, 32, INDEX_SCORES_TILED_4X32),
];

/// Indexer entry point `entry` of indexer.wgsl specialised on `heads` x `head_dim`.
fn index_kernel_of(entry: &'static str, heads: usize, head_dim: usize) -> Result<Kernel, GpuError> {
    if heads == 0 || heads > 32 || !heads.is_multiple_of(4) || head_dim == 0 || !head_dim.is_multiple_of(8) || head_dim > 128 {
        return Err(GpuError::Shape(format!(
            "indexer: {heads} heads x {head_dim} unsupported (needs heads a multiple of 4 up to 32, head_dim a multiple of 8 up to 128)"
        )));
    }
    if let Some((_, _, k)) = INDEX_PREBUILT.iter().find(|(h, d, k)| (*h, *d) == (heads, head_dim) && k.entry == entry) {
        return Ok(*k);
    }
    // Keyed by (entry point, heads, head_dim).
    type Shapes = HashMap<(&'static str, usize, usize), Kernel>;
    static BUILT: OnceLock<Mutex<Shapes>> = OnceLock::new();
    let mut built = BUILT.get_or_init(Default::default).lock().unwrap_or_else(|p| p.into_inner());
    let k = built.entry((entry, heads, head_dim)).or_insert_with(|| {
        // One small leak per distinct indexer shape: pipeline names and constants are 'static.
        let name: &'static str = Box::leak(format!("{entry}_{heads}x{head_dim}").into_boxed_str());
        let mut constants = vec![("IH", heads as f64), ("ID", head_dim as f64)];
        if entry == INDEX_SCORES_TILED_K31.entry {
            constants.push(("TW", TILED_THREADS as f64));
        }
        Kernel::new(name, "indexer", entry).with_constants(Box::leak(constants.into_boxed_slice())).unchecked()
    });
    Ok(*k)
}

/// Positions per workgroup of an indexer kernel: TW / 2 for the tiled one (every tiled kernel
/// names TW), TILE where a SIMT kernel names it, 64 for the others.
fn index_tile(kernel: &Kernel) -> usize {
    kernel.constant("TILE").or(kernel.constant("TW").map(|tw| tw / 2.0)).map_or(64, |t| t as usize)
}

fn shape_err(msg: String) -> GpuError {
    GpuError::Shape(msg)
}

fn need(buf: &wgpu::Buffer, bytes: usize, what: &str) -> Result<(), GpuError> {
    if (buf.size() as usize) < bytes {
        return Err(shape_err(format!("{what}: buffer of {} bytes, needs {bytes}", buf.size())));
    }
    Ok(())
}

/// Records one labelled compute pass of `kernel` over `groups`.
fn run(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    kernel: &Kernel,
    entries: &[(u32, &wgpu::Buffer)],
    groups: [u32; 3],
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    gpu.record(enc, kernel, entries, groups, profiler)
}


fn check_groups(gpu: &Gpu, what: &str, groups: [u32; 3]) -> Result<(), GpuError> {
    let max = gpu.caps.max_workgroups_per_dim;
    if groups.iter().any(|&g| g > max) {
        return Err(shape_err(format!("{what}: grid {groups:?} exceeds {max} workgroups per dimension")));
    }
    Ok(())
}

/// Rows of `width` bf16 values in pages that never move: page i holds
/// `page0 << min(i, shift_max)` rows, so growth allocates a new page and copies nothing;
/// at most [`MAX_PAGES`] pages, each within one storage binding.
pub struct PagedRows {
    pub label: String,
    /// bf16 values per row.
    pub width: usize,
    pub page0: usize,
    pub shift_max: u32,
    pub max_rows: usize,
    pages: Vec<wgpu::Buffer>,
    dummy: wgpu::Buffer,
}

impl PagedRows {
    /// A store for up to `max_rows` rows whose first page holds `page0` rows (a power of two).
    pub fn new(gpu: &Gpu, label: &str, width: usize, page0: usize, max_rows: usize) -> Result<PagedRows, GpuError> {
        if width == 0 || !width.is_multiple_of(8) {
            return Err(shape_err(format!("{label}: row width {width} must be a positive multiple of 8")));
        }
        if page0 == 0 || !page0.is_power_of_two() || page0 > (1 << 20) {
            return Err(shape_err(format!("{label}: first page of {page0} rows must be a power of two <= 2^20")));
        }
        let row_bytes = (width * 2) as u64;
        if page0 as u64 * row_bytes > gpu.caps.max_binding {
            return Err(GpuError::TooLarge { what: format!("{label} page"), needed: page0 as u64 * row_bytes, limit: gpu.caps.max_binding });
        }
        // Double while the next page still fits one binding and the context is not covered.
        let mut shift_max = 0u32;
        loop {
            let covered = page0 * ((2usize << shift_max) - 1);
            let next = ((page0 as u64) << (shift_max + 1)) * row_bytes;
            if covered >= max_rows || next > gpu.caps.max_binding.min(PAGE_BYTES_CAP) || shift_max + 1 >= MAX_PAGES as u32 {
                break;
            }
            shift_max += 1;
        }
        let store = PagedRows {
            label: label.into(),
            width,
            page0,
            shift_max,
            max_rows,
            pages: Vec::new(),
            dummy: gpu.storage(&format!("{label} unused page"), 16),
        };
        let pages = store.pages_for(max_rows);
        if pages > MAX_PAGES {
            return Err(shape_err(format!(
                "{label}: {max_rows} rows of {width} bf16 need {pages} pages of at most {} bytes; the kernels bind {MAX_PAGES}. \
                 Lower the context length or use an adapter with larger storage bindings",
                gpu.caps.max_binding
            )));
        }
        Ok(store)
    }

    pub fn page_rows(&self, i: usize) -> usize {
        self.page0 << (i as u32).min(self.shift_max)
    }

    pub fn page_start(&self, i: usize) -> usize {
        (0..i).map(|j| self.page_rows(j)).sum()
    }

    /// (page, row within the page) of a position; the shaders' `locate`.
    pub fn locate(&self, pos: usize) -> (usize, usize) {
        let mut start = 0;
        let mut i = 0;
        loop {
            let n = self.page_rows(i);
            if pos < start + n {
                return (i, pos - start);
            }
            start += n;
            i += 1;
        }
    }

    fn pages_for(&self, rows: usize) -> usize {
        let mut covered = 0;
        let mut i = 0;
        while covered < rows {
            covered += self.page_rows(i);
            i += 1;
        }
        i
    }

    /// Rows the allocated pages hold.
    pub fn capacity(&self) -> usize {
        self.page_start(self.pages.len())
    }

    /// Allocates pages until `rows` rows fit (never moves existing rows).
    pub fn ensure(&mut self, gpu: &Gpu, rows: usize) -> Result<(), GpuError> {
        if rows > self.max_rows {
            return Err(shape_err(format!("{}: {rows} positions exceed the configured context of {}", self.label, self.max_rows)));
        }
        while self.capacity() < rows {
            let i = self.pages.len();
            let bytes = (self.page_rows(i) * self.width * 2) as u64;
            self.pages.push(gpu.storage(&format!("{} page {i}", self.label), bytes));
        }
        Ok(())
    }

    pub fn allocated_bytes(&self) -> u64 {
        self.pages.iter().map(|b| b.size()).sum()
    }

    pub fn pages(&self) -> &[wgpu::Buffer] {
        &self.pages
    }

    /// The 16 page bindings (unused slots bound to a placeholder).
    fn slots(&self) -> [&wgpu::Buffer; MAX_PAGES] {
        std::array::from_fn(|i| self.pages.get(i).unwrap_or(&self.dummy))
    }

    /// Records writes of `rows` rows (`width` f32 values each at `src_offset` of rows of
    /// `src_stride` in `src`, starting at row `src_row0`) to positions `pos0..pos0+rows`, rounded to bf16.
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &self,
        gpu: &Gpu,
        enc: &mut wgpu::CommandEncoder,
        src: &wgpu::Buffer,
        src_stride: usize,
        src_offset: usize,
        src_row0: usize,
        rows: usize,
        pos0: usize,
    ) -> Result<(), GpuError> {
        if pos0 + rows > self.capacity() {
            return Err(shape_err(format!("{}: write of rows {pos0}..{} beyond the allocated pages", self.label, pos0 + rows)));
        }
        if src_offset + self.width > src_stride {
            return Err(shape_err(format!("{}: source rows of {src_stride} cannot hold {} values at {src_offset}", self.label, self.width)));
        }
        need(src, (src_row0 + rows) * src_stride * 4, "cache write source")?;
        let mut done = 0;
        while done < rows {
            let (page, row) = self.locate(pos0 + done);
            let n = (self.page_rows(page) - row).min(rows - done);
            let params = CacheWriteParams {
                rows: n as u32,
                src_stride: src_stride as u32,
                src_offset: ((src_row0 + done) * src_stride + src_offset) as u32,
                width: self.width as u32,
                dst_row0: row as u32,
                ..Default::default()
            };
            let u = gpu.uniform("cache write params", &params);
            let threads = (n * self.width / 2) as u32;
            let (gx, gy) = gpu.grid(threads.div_ceil(256));
            run(gpu, enc, &CACHE_WRITE, &[(4, &u), (5, src), (6, &self.pages[page])], [gx, gy, 1], None)?;
            done += n;
        }
        Ok(())
    }

    /// Rows `0..rows` as their bf16 bytes (snapshots, diagnostics).
    pub fn download_bf16(&self, gpu: &Gpu, rows: usize) -> Result<Vec<u8>, GpuError> {
        let total = rows * self.width * 2;
        let mut out = Vec::with_capacity(total);
        let mut i = 0;
        while out.len() < total {
            let n = self.page_rows(i).min(rows - out.len() / (self.width * 2));
            out.extend(gpu.read_bytes(&self.pages[i], 0, (n * self.width * 2) as u64)?);
            i += 1;
        }
        Ok(out)
    }

    /// Writes bf16 rows (their bytes) to positions `0..rows`.
    pub fn upload_bf16(&mut self, gpu: &Gpu, bytes: &[u8]) -> Result<(), GpuError> {
        let row_bytes = self.width * 2;
        if !bytes.len().is_multiple_of(row_bytes) {
            return Err(shape_err(format!("{}: {} bytes are not whole rows of {row_bytes}", self.label, bytes.len())));
        }
        let rows = bytes.len() / row_bytes;
        self.ensure(gpu, rows)?;
        let mut at = 0;
        let mut i = 0;
        while at < rows {
            let n = self.page_rows(i).min(rows - at);
            gpu.queue.write_buffer(&self.pages[i], 0, &bytes[at * row_bytes..(at + n) * row_bytes]);
            at += n;
            i += 1;
        }
        Ok(())
    }

    /// Uploads f32 rows (rounded to bf16) to positions `0..rows` (tests and benchmarks).
    pub fn upload(&mut self, gpu: &Gpu, data: &[f32]) -> Result<(), GpuError> {
        let bytes: Vec<u8> = data.iter().flat_map(|&v| half::bf16::from_f32(v).to_le_bytes()).collect();
        self.upload_bf16(gpu, &bytes)
    }
}

/// Which indexer kernel runs (the benches and tests pick one; the layer uses `Auto`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndexVariant {
    /// By row length ([`auto_index`]): SIMT below [`TILED_INDEX_MIN_POS`] positions, tiled
    /// from there, coop from [`COOP_INDEX_MIN_POS`] (for blocks of queries at every length)
    /// where the adapter has it. `K31_DSA_COOP=1`
    /// picks coop at every length, `0` never; `K31_DSA_INDEX=simt` or `tiled` that kernel at
    /// every length.
    Auto,
    /// f32 SIMT (indexer.wgsl `index_scores`): every adapter, every supported shape (32-position
    /// tiles below [`SHORT_INDEX_MAX_POS`] for 32 x 128, 64 otherwise).
    Simt,
    /// f32 SIMT register-tiled (indexer.wgsl `index_scores_tiled`): every adapter, every
    /// supported shape.
    Tiled,
    /// Cooperative matrices (dsa_index_coop.wgsl), f32-exact scheme: q per head scaled and split
    /// hi + lo by masking, keys in the exact f16 range or recomputed in f32.
    Coop,
    /// The original coop kernel, q rounded to f16 (timing only: not f32-exact).
    CoopF16,
    /// [`IndexVariant::Coop`]'s one-query kernel for blocks of queries too (benchmarks: `Coop`
    /// runs blocks of queries through [`INDEX_SCORES_COOP_MQ`]).
    CoopPerQuery,
}

/// Workgroups of the one-query coop indexer per query (grid-strided over its 64-position tiles):
/// two per H200 SM, since two fit one (~250 registers x 128 threads) and each further wave repeats
/// the q prologue (H200, twenty-sixth session: 25.2 / 28.4 / 33.5 us at 128K positions with 264 /
/// 528 / 1056, 147.8 / 150.5 / 156.2 at 1M); [`set_index_coop_groups`] changes it (benchmarks).
static INDEX_COOP_GROUPS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(264);

/// Sets the coop indexer's workgroups per query (at least 1); returns the previous value.
pub fn set_index_coop_groups(n: usize) -> usize {
    INDEX_COOP_GROUPS.swap(n.max(1), std::sync::atomic::Ordering::Relaxed)
}

/// The coop indexers exist for 32 heads x 128 only, assume 32-wide subgroups (and subgroup
/// barriers) and need up to 42 KB of workgroup memory (the block kernel's).
pub fn coop_indexer_available(gpu: &Gpu, heads: usize, head_dim: usize) -> bool {
    gpu.caps.coopmat
        && gpu.caps.subgroups
        && gpu.caps.subgroup_barrier
        && gpu.caps.subgroup_min == 32
        && gpu.caps.subgroup_max == 32
        && heads == 32
        && head_dim == 128
        && gpu.pipelines.fits(gpu, &INDEX_SCORES_COOP).unwrap_or(false)
        && gpu.pipelines.fits(gpu, &INDEX_SCORES_COOP_MQ).unwrap_or(false)
}

/// The precision of the indexer's query (spec 5.3; index keys are bf16 either way, as stored).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum IndexPrecision {
    /// q and the head weights in f32, as the engine computes them.
    #[default]
    F32,
    /// q and the head weights rounded to bf16 (nearest even) first, as the reference model's
    /// bf16 Linear outputs are: the reference's own scores. Scores move by ~1e-3 relative
    /// against F32 and selections near the k-th boundary may change.
    Bf16,
}

impl std::str::FromStr for IndexPrecision {
    type Err = String;
    fn from_str(s: &str) -> Result<IndexPrecision, String> {
        match s {
            "f32" => Ok(IndexPrecision::F32),
            "bf16" => Ok(IndexPrecision::Bf16),
            _ => Err(format!("unknown index precision {s:?} (f32 or bf16)")),
        }
    }
}

/// Indexer scores for `n_queries` queries at positions `q_pos0..`: scores[t, s] for
/// s < n_pos (-inf beyond q_pos0 + t). q: [T, IH, ID] f32; w: [T, IH] f32 (raw weights_proj
/// output, scaled here by IH^-1/2 ID^-1/2); scores: [T, row_stride] f32.
#[allow(clippy::too_many_arguments)]
pub fn index_scores(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    keys: &PagedRows,
    heads: usize,
    precision: IndexPrecision,
    q: &wgpu::Buffer,
    w: &wgpu::Buffer,
    scores: &wgpu::Buffer,
    n_queries: usize,
    q_pos0: usize,
    n_pos: usize,
    row_stride: usize,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    index_scores_variant(gpu, enc, IndexVariant::Auto, keys, heads, precision, q, w, scores, n_queries, q_pos0, n_pos, row_stride, profiler)
}

/// Rows shorter than this run the SIMT indexer on 32-position tiles (K3.1's 32 x 128; twice the
/// workgroups of 64-position tiles, which a row of a few thousand positions leaves idle). H200
/// (2026-11-30, fourteenth session, model bench): 18.3-18.7 -> 17.0-17.1 us in-pass at a 2K
/// context, 18.5 against 18.7 at 6K.
pub const SHORT_INDEX_MAX_POS: usize = 4096;

/// Row length from which [`IndexVariant::Auto`] runs the tiled indexer instead of SIMT. H200
/// (2026-11-30, thirteenth session, `dsa --indexer`): tiled 13.1 / 17.8 / 50.8 / 191 / 771 us at
/// 4K / 32K / 128K / 512K / 1M positions, SIMT 11.4 / 26.2 / 89.6 / 351 / 1465, coop 11.0 / 28.9 /
/// 68.5 / 232 / 858; at 2K positions in the model SIMT 18.5 against tiled 19.4 us in-pass.
pub const TILED_INDEX_MIN_POS: usize = 8192;

/// Row length from which [`IndexVariant::Auto`] runs the coop indexer where the adapter has it
/// (in place of the tiled kernel). H200 (2026-11-30, seventeenth session, `dsa --indexer`): coop
/// 10.2 / 13.8 / 29.0 / 98.0 / 175 us at 4K / 32K / 128K / 512K / 1M positions, tiled 13.3 / 17.8
/// / 51.2 / 191 / 366, SIMT 11.6 / 26.3 / 89.2 / 350 / 689.
pub const COOP_INDEX_MIN_POS: usize = TILED_INDEX_MIN_POS;

/// The kernel [`IndexVariant::Auto`] runs for `n_queries` rows of `n_pos` positions, given the
/// values of `K31_DSA_COOP` ("1": the coop kernel wherever `coop_ok`; "0": never) and
/// `K31_DSA_INDEX` ("simt" or "tiled": that kernel at every length; unset or anything else: the
/// length rule). Blocks of queries (prefill) run coop at every length where the adapter has it:
/// its block kernel ([`INDEX_SCORES_COOP_MQ`]) stages each key tile once for 8 queries. H200
/// (2026-12-01, twenty-sixth session, `dsa --prefill-indexer`, 512 queries): 49.7 / 78.9 / 139 /
/// 256 / 1025 / 3985 us at 1K / 2K / 4K / 8K / 32K / 128K positions, tiled 148 / 319 / 656 / 1345
/// / 5429 / 21808, SIMT 391 / 880 / 1233 / 2527 / 10149 / 41194, the one-query coop kernel 244 /
/// 480 / 981 / 1888 / 3356 / 9726.
pub fn auto_index(n_pos: usize, n_queries: usize, coop_env: Option<&str>, index_env: Option<&str>, coop_ok: bool) -> IndexVariant {
    if coop_ok && coop_env == Some("1") {
        return IndexVariant::Coop;
    }
    match index_env {
        Some("simt") => IndexVariant::Simt,
        Some("tiled") => IndexVariant::Tiled,
        _ if coop_ok && coop_env != Some("0") && (n_pos >= COOP_INDEX_MIN_POS || n_queries > 1) => IndexVariant::Coop,
        _ if n_pos >= TILED_INDEX_MIN_POS => IndexVariant::Tiled,
        _ => IndexVariant::Simt,
    }
}

/// This process's `K31_DSA_COOP` and `K31_DSA_INDEX`, read once (the indexer runs for every
/// global layer of every token).
fn index_env() -> &'static (Option<String>, Option<String>) {
    static ENV: OnceLock<(Option<String>, Option<String>)> = OnceLock::new();
    ENV.get_or_init(|| {
        let index = std::env::var("K31_DSA_INDEX").ok();
        if let Some(v) = index.as_deref().filter(|v| !matches!(*v, "tiled" | "simt")) {
            eprintln!("k31: K31_DSA_INDEX={v:?} is neither \"tiled\" nor \"simt\"; choosing by row length");
        }
        (std::env::var("K31_DSA_COOP").ok(), index)
    })
}

/// [`index_scores`] with an explicit kernel choice.
#[allow(clippy::too_many_arguments)]
pub fn index_scores_variant(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    variant: IndexVariant,
    keys: &PagedRows,
    heads: usize,
    precision: IndexPrecision,
    q: &wgpu::Buffer,
    w: &wgpu::Buffer,
    scores: &wgpu::Buffer,
    n_queries: usize,
    q_pos0: usize,
    n_pos: usize,
    row_stride: usize,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    let id = keys.width;
    let coop_ok = coop_indexer_available(gpu, heads, id);
    let variant = match variant {
        IndexVariant::Auto => {
            let (coop_env, index) = index_env();
            auto_index(n_pos, n_queries, coop_env.as_deref(), index.as_deref(), coop_ok)
        }
        v => v,
    };
    let kernel = match variant {
        // (`auto_index` never returns Auto.)
        IndexVariant::Auto | IndexVariant::Simt if n_pos < SHORT_INDEX_MAX_POS && (heads, id) == (32, 128) => INDEX_SCORES_K31_T32,
        IndexVariant::Auto | IndexVariant::Simt => index_kernel(heads, id)?,
        IndexVariant::Tiled => index_kernel_tiled(heads, id)?,
        IndexVariant::Coop | IndexVariant::CoopF16 | IndexVariant::CoopPerQuery if !coop_ok => {
            return Err(shape_err(format!(
                "index_scores: no cooperative-matrix indexer for {heads} x {id} on this adapter (needs coop, 32-wide subgroups with barriers, 32 x 128 and 42 KB of workgroup memory)"
            )))
        }
        IndexVariant::Coop if n_queries > 1 && precision == IndexPrecision::Bf16 => INDEX_SCORES_COOP_MQ_BF16,
        IndexVariant::Coop if n_queries > 1 => INDEX_SCORES_COOP_MQ,
        IndexVariant::Coop | IndexVariant::CoopPerQuery if precision == IndexPrecision::Bf16 => INDEX_SCORES_COOP_BF16,
        IndexVariant::Coop | IndexVariant::CoopPerQuery => INDEX_SCORES_COOP,
        IndexVariant::CoopF16 => INDEX_SCORES_COOP_F16,
    };
    index_scores_kernel(gpu, enc, kernel, keys, heads, precision, q, w, scores, n_queries, q_pos0, n_pos, row_stride, profiler)
}

/// [`index_scores`] with a given kernel (one of the indexer kernels above; the bench times
/// diagnostic ones this way). The caller has checked that the adapter has what it needs.
#[allow(clippy::too_many_arguments)]
pub fn index_scores_kernel(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    kernel: Kernel,
    keys: &PagedRows,
    heads: usize,
    precision: IndexPrecision,
    q: &wgpu::Buffer,
    w: &wgpu::Buffer,
    scores: &wgpu::Buffer,
    n_queries: usize,
    q_pos0: usize,
    n_pos: usize,
    row_stride: usize,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    let id = keys.width;
    if n_pos > keys.capacity() || n_pos > row_stride || n_queries == 0 {
        return Err(shape_err(format!(
            "index_scores: {n_pos} positions with {} cached, row stride {row_stride}, {n_queries} queries",
            keys.capacity()
        )));
    }
    need(q, n_queries * heads * id * 4, "index_scores q")?;
    need(w, n_queries * heads * 4, "index_scores w")?;
    need(scores, n_queries * row_stride * 4, "index_scores scores")?;
    let params = IndexParams {
        n_queries: n_queries as u32,
        row_stride: row_stride as u32,
        q_pos0: q_pos0 as u32,
        n_pos: n_pos as u32,
        page0: keys.page0 as u32,
        shift_max: keys.shift_max,
        w_scale: ((heads * id) as f32).powf(-0.5),
        q_bf16: (precision == IndexPrecision::Bf16) as u32,
    };
    let slots = keys.slots();
    let mut entries = vec![(1, q), (2, w), (3, scores)];
    entries.extend(slots.iter().enumerate().map(|(i, b)| (4 + i as u32, *b)));
    let tiles = n_pos.div_ceil(index_tile(&kernel));
    let groups = if kernel.entry == INDEX_SCORES_COOP_MQ.entry {
        // One wave over all query groups (each grid-strides over the tiles).
        let qgroups = n_queries.div_ceil(COOP_MQ_QUERIES);
        [tiles.clamp(1, (COOP_MQ_WAVE / qgroups).max(1)) as u32, qgroups as u32, 1]
    } else if kernel.needs_coopmat {
        let cap = INDEX_COOP_GROUPS.load(std::sync::atomic::Ordering::Relaxed);
        [tiles.clamp(1, cap) as u32, n_queries as u32, 1]
    } else {
        [tiles as u32, n_queries as u32, 1]
    };
    check_groups(gpu, "index_scores", groups)?;
    gpu.dispatch_grid(enc, &kernel, &params, &entries, groups, profiler)
}

/// Scratch of the top-k select for up to `rows` rows of `row_len` positions.
pub struct TopkScratch {
    pub rows: usize,
    pub row_len: usize,
    pub k: usize,
    /// Global histograms [rows, 8192] (zero between calls).
    hist: wgpu::Buffer,
    /// Per-row state words [rows, 16] (done counters zero between calls).
    state: wgpu::Buffer,
    /// Candidates (keys in the boundary bin of the first digit) as (position, key) [rows, row_len, 2].
    cand: wgpu::Buffer,
    /// Unordered selection (key, position) [rows, 2k].
    list: wgpu::Buffer,
}

impl TopkScratch {
    pub fn new(gpu: &Gpu, rows: usize, row_len: usize, k: usize) -> Result<TopkScratch, GpuError> {
        if k == 0 || k > MAX_TOPK {
            return Err(shape_err(format!("top-k: k = {k} unsupported (1..={MAX_TOPK})")));
        }
        let cand_bytes = (rows * row_len.max(1) * 8) as u64;
        let hist_bytes = (rows * TOPK_HSTRIDE * 4) as u64;
        for (what, bytes) in [("top-k candidate lists", cand_bytes), ("top-k histograms", hist_bytes)] {
            if bytes > gpu.caps.max_binding {
                return Err(GpuError::TooLarge { what: what.into(), needed: bytes, limit: gpu.caps.max_binding });
            }
        }
        Ok(TopkScratch {
            rows,
            row_len,
            k,
            hist: gpu.storage("topk hist", hist_bytes),
            state: gpu.storage("topk state", (rows * 16 * 4) as u64),
            cand: gpu.storage("topk candidates", cand_bytes),
            list: gpu.storage("topk list", (rows * k * 2 * 4) as u64),
        })
    }
}

/// Top-k of `n_rows` score rows (stride `row_stride`), row r valid on
/// `[0, min(pos0 + r + 1, row_len))`. Writes sel [n_rows, k] i32 (score desc, position asc,
/// -1 padded) and sel_score [n_rows, k] f32. One labelled pass, three dispatches (topk_sg.wgsl
/// where the adapter has subgroups, else topk.wgsl).
#[allow(clippy::too_many_arguments)]
pub fn topk(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    scratch: &TopkScratch,
    scores: &wgpu::Buffer,
    row_stride: usize,
    n_rows: usize,
    pos0: usize,
    row_len: usize,
    sel: &wgpu::Buffer,
    sel_score: &wgpu::Buffer,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    topk_impl(gpu, enc, true, scratch, scores, row_stride, n_rows, pos0, row_len, sel, sel_score, profiler)
}

/// [`topk`]'s selection as a set: the same positions (and their scores), in no particular
/// order within the first min(k, valid) slots (-1 padded after). Two dispatches: what sparse
/// attention needs when nobody reads the selection in rank order.
#[allow(clippy::too_many_arguments)]
pub fn topk_set(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    scratch: &TopkScratch,
    scores: &wgpu::Buffer,
    row_stride: usize,
    n_rows: usize,
    pos0: usize,
    row_len: usize,
    sel: &wgpu::Buffer,
    sel_score: &wgpu::Buffer,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    topk_impl(gpu, enc, false, scratch, scores, row_stride, n_rows, pos0, row_len, sel, sel_score, profiler)
}

#[allow(clippy::too_many_arguments)]
fn topk_impl(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    ordered: bool,
    scratch: &TopkScratch,
    scores: &wgpu::Buffer,
    row_stride: usize,
    n_rows: usize,
    pos0: usize,
    row_len: usize,
    sel: &wgpu::Buffer,
    sel_score: &wgpu::Buffer,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    let k = scratch.k;
    if n_rows == 0 || row_len == 0 || n_rows > scratch.rows || row_len > scratch.row_len || row_len > row_stride {
        return Err(shape_err(format!(
            "topk: {n_rows} rows of {row_len} (stride {row_stride}) with scratch for {} rows of {}",
            scratch.rows, scratch.row_len
        )));
    }
    need(scores, n_rows * row_stride * 4, "topk scores")?;
    need(sel, n_rows * k * 4, "topk sel")?;
    need(sel_score, n_rows * k * 4, "topk sel_score")?;
    // Valid lengths never exceed row_len: clamped through the params' row_len.
    let params = TopkParams {
        n_rows: n_rows as u32,
        row_stride: row_stride as u32,
        k: k as u32,
        pos0: pos0 as u32,
        row_len: row_len as u32,
        ..Default::default()
    };
    let u = gpu.uniform("topk params", &params);
    let chunks = row_len.div_ceil(TOPK_CHUNK).max(1) as u32;
    let ranks = k.div_ceil(TOPK_RANK_E) as u32;
    let max = gpu.caps.max_workgroups_per_dim;
    let (ry, rz) = if n_rows as u32 <= max { (n_rows as u32, 1) } else { (max, (n_rows as u32).div_ceil(max)) };
    check_groups(gpu, "topk", [chunks, ry, rz])?;
    let (sc, st, cand, list) = (&scratch.hist, &scratch.state, &scratch.cand, &scratch.list);
    // Each entry point binds only what it uses (automatic layouts).
    let sg = gpu.caps.subgroups && !TOPK_PORTABLE.load(std::sync::atomic::Ordering::Relaxed);
    let (hist, gather) = match (sg, ordered) {
        (true, true) => (TOPK_HIST_SG, TOPK_GATHER_SG),
        (true, false) => (TOPK_HIST_SG, TOPK_GATHER_SET_SG),
        (false, true) => (TOPK_HIST, TOPK_GATHER),
        (false, false) => (TOPK_HIST, TOPK_GATHER_SET),
    };
    // A row that one workgroup holds is selected in one dispatch (no global round trips).
    let small = sg && row_len <= TOPK_SMALL_MAX && TOPK_SMALL.load(std::sync::atomic::Ordering::Relaxed);
    let small_kernel = match (ordered, row_len <= TOPK_CHUNK) {
        (true, true) => TOPK_SMALL_SG,
        (false, true) => TOPK_SMALL_SET_SG,
        (true, false) => TOPK_SMALL8_SG,
        (false, false) => TOPK_SMALL8_SET_SG,
    };
    // (kernel, bindings, workgroups along x) per dispatch.
    type Step<'b> = (Kernel, Vec<(u32, &'b wgpu::Buffer)>, u32);
    let steps: Vec<Step> = if small {
        vec![(small_kernel, vec![(0, &u), (1, scores), (5, list), (6, sel), (7, sel_score)], 1)]
    } else {
        vec![
            (hist, vec![(0, &u), (1, scores), (2, sc), (3, st)], chunks),
            // Bindings 2 and 8 are the same buffer, atomic and plain (topk.wgsl `histp`).
            (gather, vec![(0, &u), (1, scores), (2, sc), (3, st), (4, cand), (5, list), (6, sel), (7, sel_score), (8, sc)], chunks),
        ]
    }
    .into_iter()
    .chain(ordered.then(|| (TOPK_RANK, vec![(0, &u), (5, list), (6, sel), (7, sel_score)], ranks)))
    .collect();
    let mut prepared = Vec::with_capacity(steps.len());
    for (kernel, entries, gx) in &steps {
        let pipeline = gpu.pipelines.get(gpu, kernel)?;
        let bind = gpu.bind_group(kernel, &pipeline, entries)?;
        prepared.push((pipeline, bind, *gx));
    }
    if TOPK_SPLIT_PASSES.load(std::sync::atomic::Ordering::Relaxed) {
        // Diagnostic: one labelled pass per dispatch.
        let mut profiler = profiler;
        for ((pipeline, bind, gx), (kernel, _, _)) in prepared.iter().zip(&steps) {
            let timestamp_writes = profiler.as_deref_mut().and_then(|p| p.pass(kernel.name));
            let mut pass = gpu.begin_pass(enc, &wgpu::ComputePassDescriptor { label: Some(kernel.name), timestamp_writes });
            pass.set_pipeline(pipeline);
            pass.set_bind_group(0, bind, &[]);
            pass.dispatch_workgroups(*gx, ry, rz);
        }
        return Ok(());
    }
    let timestamp_writes = profiler.and_then(|p| p.pass("topk"));
    let mut pass = gpu.begin_pass(enc, &wgpu::ComputePassDescriptor { label: Some("topk"), timestamp_writes });
    for (pipeline, bind, gx) in &prepared {
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, bind, &[]);
        pass.dispatch_workgroups(*gx, ry, rz);
    }
    Ok(())
}

static TOPK_SPLIT_PASSES: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static TOPK_PORTABLE: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
static TOPK_SMALL: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(true);

/// Tests and bench: whether rows of at most one workgroup's positions take the one-dispatch
/// select (`topk_small`, the default where subgroups exist) or the two-dispatch path. Returns
/// the previous setting.
pub fn set_topk_small(on: bool) -> bool {
    TOPK_SMALL.swap(on, std::sync::atomic::Ordering::Relaxed)
}

/// Tests and bench: run the portable top-k kernels (topk.wgsl, no subgroups) even where the
/// adapter has subgroups. Returns the previous setting.
pub fn set_topk_portable(on: bool) -> bool {
    TOPK_PORTABLE.swap(on, std::sync::atomic::Ordering::Relaxed)
}

/// Bench diagnostic: record each top-k dispatch in its own labelled pass (per-dispatch times
/// in a profile; adds a pass boundary per dispatch). Returns the previous setting.
pub fn set_topk_split_passes(on: bool) -> bool {
    TOPK_SPLIT_PASSES.swap(on, std::sync::atomic::Ordering::Relaxed)
}

/// Bench probe: `n` empty one-workgroup dispatches in one labelled pass, each depending on the
/// last (they share a read-write binding): the launch and drain floor of a multi-dispatch op.
pub fn topk_probe(gpu: &Gpu, enc: &mut wgpu::CommandEncoder, n: usize, profiler: Option<&mut Profiler>) -> Result<(), GpuError> {
    let st = &gpu.storage("topk probe state", 64);
    let u = gpu.uniform("topk params", &TopkParams::default());
    let pipeline = gpu.pipelines.get(gpu, &TOPK_NOOP)?;
    let bind = gpu.bind_group(&TOPK_NOOP, &pipeline, &[(0, &u), (3, st)])?;
    let timestamp_writes = profiler.and_then(|p| p.pass("topk probe"));
    let mut pass = gpu.begin_pass(enc, &wgpu::ComputePassDescriptor { label: Some("topk probe"), timestamp_writes });
    pass.set_pipeline(&pipeline);
    pass.set_bind_group(0, &bind, &[]);
    for _ in 0..n {
        pass.dispatch_workgroups(1, 1, 1);
    }
    Ok(())
}

/// MLA dimensions the attention kernels need.
#[derive(Clone, Copy, Debug)]
pub struct MlaDims {
    pub heads: usize,
    pub latent: usize,
    pub rope: usize,
    pub nope: usize,
    pub v_dim: usize,
    pub scale: f32,
}

impl MlaDims {
    pub fn from_config(m: &crate::config::MlaConfig) -> MlaDims {
        MlaDims {
            heads: m.num_heads,
            latent: m.kv_lora_rank,
            rope: m.qk_rope_head_dim,
            nope: m.qk_nope_head_dim,
            v_dim: m.v_head_dim,
            scale: m.softmax_scale(),
        }
    }
    pub fn width(&self) -> usize {
        self.latent + self.rope
    }
    fn check(&self) -> Result<(), GpuError> {
        if !self.latent.is_multiple_of(2) || self.latent > 512 || self.width() > 576 || !self.width().is_multiple_of(8) {
            return Err(shape_err(format!(
                "MLA: latent {} + rope {} unsupported (latent even and <= 512, latent + rope a multiple of 8 and <= 576)",
                self.latent, self.rope
            )));
        }
        if self.nope == 0 || self.nope > 512 || self.v_dim == 0 {
            return Err(shape_err(format!("MLA: nope head dim {} (1..=512) or v head dim {} unsupported", self.nope, self.v_dim)));
        }
        Ok(())
    }
    fn params(&self, n_queries: usize, q_pos0: usize, cache: &PagedRows) -> MlaParams {
        MlaParams {
            n_heads: self.heads as u32,
            latent: self.latent as u32,
            rope: self.rope as u32,
            nope: self.nope as u32,
            v_dim: self.v_dim as u32,
            n_queries: n_queries as u32,
            q_pos0: q_pos0 as u32,
            q_stride: (self.heads * (self.nope + self.rope)) as u32,
            page0: cache.page0 as u32,
            shift_max: cache.shift_max,
            scale: self.scale,
            ..Default::default()
        }
    }
}

fn single_chunk<'a>(t: &'a GpuTensor, what: &str) -> Result<&'a wgpu::Buffer, GpuError> {
    match (t.dtype, t.chunks.as_slice()) {
        (DType::BF16, [c]) => Ok(&c.buffer),
        _ => Err(shape_err(format!("{what}: {} must be bf16 in one binding", t.label))),
    }
}

/// qa [T, H, R+E] = scale * [W_UK^T q_nope | q_pe] from q [T, H*(nope+rope)] and kv_b_proj.
#[allow(clippy::too_many_arguments)]
pub fn mla_absorb(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    dims: &MlaDims,
    cache: &PagedRows,
    q: &wgpu::Buffer,
    kv_b: &GpuTensor,
    qa: &wgpu::Buffer,
    n_queries: usize,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    dims.check()?;
    let wkv = single_chunk(kv_b, "mla_absorb")?;
    if kv_b.shape != [dims.heads * (dims.nope + dims.v_dim), dims.latent] {
        return Err(shape_err(format!("mla_absorb: kv_b_proj shape {:?} does not match the MLA dims", kv_b.shape)));
    }
    need(q, n_queries * dims.heads * (dims.nope + dims.rope) * 4, "mla_absorb q")?;
    need(qa, n_queries * dims.heads * dims.width() * 4, "mla_absorb qa")?;
    let params = dims.params(n_queries, 0, cache);
    let groups = [dims.latent.div_ceil(128) as u32, dims.heads as u32, n_queries as u32];
    check_groups(gpu, "mla_absorb", groups)?;
    let kernel = if mla_tuning().checked { MLA_ABSORB_CHECKED } else { MLA_ABSORB };
    gpu.dispatch_grid(enc, &kernel, &params, &[(1, q), (2, wkv), (3, qa), (28, wkv)], groups, profiler)
}

/// Heads per workgroup of `mla_attend_tiled` (mla.wgsl HG) and its rows per block (BR).
const MLA_HG: usize = 16;
const MLA_BLOCK: usize = 8;
/// Splits the partials layout and `mla_merge_out` allow (mla.wgsl MAX_SPLITS).
pub const MLA_MAX_SPLITS: usize = 128;

/// Sizing of the sparse-MLA grid: the attention aims at `target_groups` workgroups over all
/// queries (128: about one per H200 SM; fastest of 64..512 there at 2048 rows, and fewer splits
/// to merge), `out_rows` W_UV rows per `mla_merge_out` workgroup (32 or 64); `checked` runs the
/// kernels with wgpu's runtime checks (a diagnostic). [`set_mla_tuning`] changes it (benchmarks).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MlaTuning {
    pub target_groups: usize,
    pub out_rows: usize,
    pub checked: bool,
}

const MLA_TUNING_DEFAULT: MlaTuning = MlaTuning { target_groups: 128, out_rows: 32, checked: false };

impl Default for MlaTuning {
    fn default() -> Self {
        MLA_TUNING_DEFAULT
    }
}

static MLA_TUNING: Mutex<MlaTuning> = Mutex::new(MLA_TUNING_DEFAULT);

/// Sets the sparse-MLA grid sizing; returns the previous one.
pub fn set_mla_tuning(t: MlaTuning) -> MlaTuning {
    let mut cur = MLA_TUNING.lock().unwrap_or_else(|p| p.into_inner());
    let t = MlaTuning { target_groups: t.target_groups.max(1), out_rows: if t.out_rows >= 64 { 64 } else { 32 }, ..t };
    std::mem::replace(&mut *cur, t)
}

fn mla_tuning() -> MlaTuning {
    *MLA_TUNING.lock().unwrap_or_else(|p| p.into_inner())
}

/// Splits of the selection per (query, head group) for `n_queries` queries of at most `n_sel`
/// selected rows: about `target_groups` workgroups in all, at least a block of rows per split,
/// at most [`MLA_MAX_SPLITS`] (K3.1 decode at 2048 rows: 22 splits of 96 rows, 132 workgroups;
/// blocks of 22 queries and more: 1). Non-decreasing in `n_sel`, non-increasing in `n_queries`.
pub fn attend_splits(dims: &MlaDims, n_sel: usize, n_queries: usize) -> usize {
    let groups = dims.heads.div_ceil(MLA_HG) * n_queries.max(1);
    let target = mla_tuning().target_groups.div_ceil(groups).clamp(1, MLA_MAX_SPLITS);
    n_sel.div_ceil(MLA_BLOCK).clamp(1, target)
}

/// The partials [`mla_attention`] needs for any block of up to `max_queries` queries with up to
/// `n_sel` selected rows each.
pub fn partial_bytes_max(dims: &MlaDims, n_sel: usize, max_queries: usize) -> usize {
    // Past target_groups queries every block has one split, so the largest block is the worst.
    let small = max_queries.clamp(1, mla_tuning().target_groups);
    let at = |n: usize| partial_bytes(dims, n, attend_splits(dims, n_sel, n));
    (1..=small).map(at).max().unwrap_or(0).max(at(max_queries.max(1)))
}

/// Bytes of the partial-result buffer [T, H, splits, ceil(R/4) + 1] vec4 f32.
pub fn partial_bytes(dims: &MlaDims, n_queries: usize, splits: usize) -> usize {
    n_queries * dims.heads * splits * (dims.latent.div_ceil(4) + 1) * 16
}

/// Which attention kernel [`mla_attention`] runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MlaVariant {
    /// One workgroup per (split, head): every selected row staged once per head (simple;
    /// kept for debugging).
    PerHead,
    /// One workgroup per (split, 16 heads), register-tiled logits and p.c (the portable
    /// default; 28.5 KB of workgroup memory, so it fits 32 KiB adapters).
    Tiled,
    /// One workgroup per (split, 16 heads) on cooperative matrices, f32-accurate (q and p in
    /// hi + lo f16 parts): where [`coop_attention_available`], for calls whose splits have at
    /// most [`MLA_COOP_ROWS`] rows (decode); other calls run [`MlaVariant::Tiled`].
    Coop,
}

/// Rows a split of the coop attention may have (mla_coop.wgsl RMAX: a 16-row tile per subgroup).
pub const MLA_COOP_ROWS: usize = 128;

/// Rows per split of the coop attention (the share rounded up to its 16-row tiles).
fn coop_rows_per_split(n_sel: usize, splits: usize) -> usize {
    n_sel.div_ceil(splits.max(1)).div_ceil(16) * 16
}

/// The coop attention needs cooperative matrices, 32-wide subgroups (8 per workgroup), whole
/// 16-head groups, a latent width in whole 128-column steps (a 16-column tile per subgroup
/// each), and its 44 KB of workgroup memory.
pub fn coop_attention_available(gpu: &Gpu, dims: &MlaDims) -> bool {
    gpu.caps.coopmat
        && gpu.caps.subgroups
        && gpu.caps.subgroup_min == 32
        && gpu.caps.subgroup_max == 32
        && dims.heads.is_multiple_of(16)
        && dims.latent.is_multiple_of(128)
        && gpu.pipelines.fits(gpu, &MLA_ATTEND_COOP).unwrap_or(false)
}

impl MlaVariant {
    /// Tiled where its workgroup memory fits the adapter, else per head.
    pub fn default_for(gpu: &Gpu) -> Result<MlaVariant, GpuError> {
        Ok(if gpu.pipelines.fits(gpu, &MLA_ATTEND_TILED)? { MlaVariant::Tiled } else { MlaVariant::PerHead })
    }

    /// What the model runs: coop where [`coop_attention_available`] (unless `K31_MLA_COOP=0`),
    /// else [`MlaVariant::default_for`].
    pub fn auto(gpu: &Gpu, dims: &MlaDims) -> Result<MlaVariant, GpuError> {
        static OFF: OnceLock<bool> = OnceLock::new();
        let off = *OFF.get_or_init(|| std::env::var("K31_MLA_COOP").is_ok_and(|v| v == "0"));
        if !off && coop_attention_available(gpu, dims) {
            return Ok(MlaVariant::Coop);
        }
        MlaVariant::default_for(gpu)
    }

    /// The kernel a call of `n_sel` rows per query in `splits` splits runs with this variant.
    pub fn resolved(self, gpu: &Gpu, dims: &MlaDims, n_sel: usize, splits: usize) -> MlaVariant {
        match self {
            MlaVariant::Coop if !coop_attention_available(gpu, dims) || coop_rows_per_split(n_sel, splits) > MLA_COOP_ROWS => {
                MlaVariant::Tiled
            }
            v => v,
        }
    }
}

/// Sparse (sel = Some: [T, k] i32, -1 padded) or dense (sel = None: all s <= q_pos0 + t)
/// attention of qa over the latent cache, then the merge with W_UV and the optional gate:
/// o [T, H*Dv] f32, lse [T, H] f32 (log-sum-exp of the scaled logits). gate: [T, H*Dv] raw.
/// `part` holds [`partial_bytes`] for [`attend_splits`] of the largest selection and n_queries.
#[allow(clippy::too_many_arguments)]
pub fn mla_attention(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    dims: &MlaDims,
    cache: &PagedRows,
    qa: &wgpu::Buffer,
    sel: Option<(&wgpu::Buffer, usize)>,
    kv_b: &GpuTensor,
    gate: Option<&wgpu::Buffer>,
    part: &wgpu::Buffer,
    o: &wgpu::Buffer,
    lse: &wgpu::Buffer,
    n_queries: usize,
    q_pos0: usize,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    let variant = MlaVariant::auto(gpu, dims)?;
    mla_attention_variant(gpu, enc, variant, dims, cache, qa, sel, kv_b, gate, part, o, lse, n_queries, q_pos0, profiler, None)
}

/// Work recorded between the attention dispatch and the merge ([`mla_attention_variant`]'s
/// `between`): a dispatch that reads nothing the attention writes and whose outputs are new in
/// this encoder needs no barrier there, so the GPU runs it beside the latency-bound attention
/// (the global layer's gate projection: the merge reads it).
pub type Between<'a> = &'a mut dyn FnMut(&mut wgpu::CommandEncoder) -> Result<(), GpuError>;

/// [`mla_attention`] with an explicit attention kernel, and `between` recorded after the
/// attention dispatch, before the merge.
#[allow(clippy::too_many_arguments)]
pub fn mla_attention_variant(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    variant: MlaVariant,
    dims: &MlaDims,
    cache: &PagedRows,
    qa: &wgpu::Buffer,
    sel: Option<(&wgpu::Buffer, usize)>,
    kv_b: &GpuTensor,
    gate: Option<&wgpu::Buffer>,
    part: &wgpu::Buffer,
    o: &wgpu::Buffer,
    lse: &wgpu::Buffer,
    n_queries: usize,
    q_pos0: usize,
    mut profiler: Option<&mut Profiler>,
    between: Option<Between<'_>>,
) -> Result<(), GpuError> {
    dims.check()?;
    let wkv = single_chunk(kv_b, "mla_attention")?;
    if cache.width != dims.width() || q_pos0 + n_queries > cache.capacity() {
        return Err(shape_err(format!(
            "mla_attention: cache rows of {} (need {}), {} positions cached, queries up to {}",
            cache.width,
            dims.width(),
            cache.capacity(),
            q_pos0 + n_queries
        )));
    }
    let max_sel = match sel {
        Some((_, k)) => k.min(q_pos0 + n_queries),
        None => q_pos0 + n_queries,
    };
    let splits = attend_splits(dims, max_sel, n_queries);
    need(part, partial_bytes(dims, n_queries, splits), "mla_attention partials")?;
    need(qa, n_queries * dims.heads * dims.width() * 4, "mla_attention qa")?;
    need(o, n_queries * dims.heads * dims.v_dim * 4, "mla_attention o")?;
    need(lse, n_queries * dims.heads * 4, "mla_attention lse")?;
    let dummy = &cache.dummy;
    let (sel_buf, k) = match sel {
        Some((b, k)) => {
            need(b, n_queries * k * 4, "mla_attention sel")?;
            (b, k)
        }
        None => (dummy, 0),
    };
    if let Some(g) = gate {
        need(g, n_queries * dims.heads * dims.v_dim * 4, "mla_attention gate")?;
    }
    let mut params = dims.params(n_queries, q_pos0, cache);
    params.k = k as u32;
    params.splits = splits as u32;
    params.dense = sel.is_none() as u32;
    params.has_gate = gate.is_some() as u32;
    let slots = cache.slots();
    let tuning = mla_tuning();
    let tiled = if tuning.checked { MLA_ATTEND_TILED_CHECKED } else { MLA_ATTEND_TILED };
    let (kernel, head_groups, mut entries) = match variant.resolved(gpu, dims, max_sel, splits) {
        MlaVariant::PerHead => (MLA_ATTEND, dims.heads, vec![(3, qa), (4, sel_buf), (5, part)]),
        MlaVariant::Tiled => (tiled, dims.heads.div_ceil(MLA_HG), vec![(27, qa), (4, sel_buf), (26, part)]),
        MlaVariant::Coop => (MLA_ATTEND_COOP, dims.heads / MLA_HG, vec![(27, qa), (4, sel_buf), (5, part)]),
    };
    entries.extend(slots.iter().enumerate().map(|(i, b)| (6 + i as u32, *b)));
    let groups = [splits as u32, head_groups as u32, n_queries as u32];
    check_groups(gpu, "mla_attend", groups)?;
    gpu.dispatch_grid(enc, &kernel, &params, &entries, groups, profiler.as_deref_mut())?;
    if let Some(work) = between {
        work(enc)?;
    }
    let (out_kernel, out_rows) = match (tuning.out_rows >= 64, tuning.checked) {
        (true, _) => (MLA_MERGE_OUT_64, 64),
        (false, false) => (MLA_MERGE_OUT, 32),
        (false, true) => (MLA_MERGE_OUT_CHECKED, 32),
    };
    let entries = [(2, wkv), (28, wkv), (26, part), (22, gate.unwrap_or(dummy)), (23, o), (24, lse)];
    let groups = [(dims.heads * dims.v_dim.div_ceil(out_rows)) as u32, n_queries as u32, 1];
    check_groups(gpu, "mla_merge_out", groups)?;
    gpu.dispatch_grid(enc, &out_kernel, &params, &entries, groups, profiler)
}

/// Dense scaled logits [T, H, n_pos] of qa against cache rows 0..n_pos (-inf beyond
/// q_pos0 + t): the omitted-mass diagnostics' view of full attention.
#[allow(clippy::too_many_arguments)]
pub fn mla_logits(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    dims: &MlaDims,
    cache: &PagedRows,
    qa: &wgpu::Buffer,
    logits: &wgpu::Buffer,
    n_queries: usize,
    q_pos0: usize,
    n_pos: usize,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    dims.check()?;
    need(logits, n_queries * dims.heads * n_pos * 4, "mla_logits")?;
    let mut params = dims.params(n_queries, q_pos0, cache);
    params.logit_stride = n_pos as u32;
    let u = gpu.uniform("mla params", &params);
    let slots = cache.slots();
    let mut entries = vec![(0, &u), (3, qa), (25, logits)];
    entries.extend(slots.iter().enumerate().map(|(i, b)| (6 + i as u32, *b)));
    let groups = [n_pos.div_ceil(256) as u32, dims.heads as u32, n_queries as u32];
    check_groups(gpu, "mla_logits", groups)?;
    run(gpu, enc, &MLA_LOGITS, &entries, groups, profiler)
}

/// In-place RMSNorm (`beta` None) or LayerNorm of x[r, offset..offset+n] for r < rows;
/// gamma, beta: [n] f32.
#[allow(clippy::too_many_arguments)]
pub fn row_norm(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    x: &wgpu::Buffer,
    rows: usize,
    stride: usize,
    offset: usize,
    n: usize,
    eps: f32,
    gamma: &wgpu::Buffer,
    beta: Option<&wgpu::Buffer>,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    if offset + n > stride || n == 0 {
        return Err(shape_err(format!("row_norm: segment {offset}+{n} outside rows of {stride}")));
    }
    need(x, rows * stride * 4, "row_norm x")?;
    need(gamma, n * 4, "row_norm gamma")?;
    let params = NormParams { rows: rows as u32, stride: stride as u32, offset: offset as u32, n: n as u32, eps, ..Default::default() };
    match beta {
        Some(b) => {
            need(b, n * 4, "row_norm beta")?;
            gpu.dispatch_grid(enc, &LAYER_NORM, &params, &[(1, x), (2, gamma), (3, b)], [rows as u32, 1, 1], profiler)
        }
        None => gpu.dispatch_grid(enc, &RMS_NORM, &params, &[(1, x), (2, gamma)], [rows as u32, 1, 1], profiler),
    }
}

/// The index-key half of [`global_prep`]: ki [ID] f32, LayerNorm weight and bias [ID] f32, eps,
/// and the key cache.
pub struct KeyPrep<'a> {
    pub ki: &'a wgpu::Buffer,
    pub gamma: &'a wgpu::Buffer,
    pub beta: &'a wgpu::Buffer,
    pub eps: f32,
    pub keys: &'a PagedRows,
}

/// One decode token's row ops after a global layer's first projections, as one dispatch:
/// c_q = RMSNorm(c_q) in place (`cq` = (c_q [r], r, weight [r] f32), when the layer has q_a),
/// the latent cache row at `pos` = RMSNorm(kv[0..latent]) | kv[latent..] (kv [R+E] f32, weight
/// [latent] f32) and, with `key`, the index-key row at `pos` = LayerNorm(ki). Returns false
/// (nothing recorded) where the adapter binds fewer than 9 storage buffers per shader stage:
/// the caller then runs [`row_norm`] and [`PagedRows::write`].
#[allow(clippy::too_many_arguments)]
pub fn global_prep(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    cq: Option<(&wgpu::Buffer, usize, &wgpu::Buffer)>,
    kv: &wgpu::Buffer,
    kv_gamma: &wgpu::Buffer,
    latent_n: usize,
    latent: &PagedRows,
    key: Option<KeyPrep<'_>>,
    eps: f32,
    pos: usize,
    profiler: Option<&mut Profiler>,
) -> Result<bool, GpuError> {
    if gpu.caps.max_storage_buffers < 9 {
        return Ok(false);
    }
    let placeholders: Vec<wgpu::Buffer> = (0..6).map(|_| gpu.scratch("global_prep placeholder", 16)).collect();
    let rows = cache_rows("global_prep", kv, kv_gamma, latent_n, latent, key.as_ref(), pos, &placeholders[2..])?;
    let (cq_buf, q_n, g_q) = match cq {
        Some((b, n, g)) => {
            need(b, n * 4, "global_prep c_q")?;
            need(g, n * 4, "global_prep c_q norm")?;
            (b, n, g)
        }
        None => (&placeholders[0], 0, &placeholders[1]),
    };
    let [kv_width, kv_n, kv_row, k_n, k_row] = rows.fields;
    let params = PrepParams { q_n: q_n as u32, kv_width, kv_n, kv_row, k_n, k_row, eps, k_eps: rows.k_eps };
    let mut entries: Vec<(u32, &wgpu::Buffer)> = vec![(1, cq_buf), (2, g_q)];
    entries.extend(rows.entries);
    gpu.dispatch_grid(enc, &GLOBAL_PREP, &params, &entries, [3, 1, 1], profiler)?;
    Ok(true)
}

/// The cache rows' share of [`global_prep`] and [`global_q_proj`], checked: bindings 3-9
/// (`fill` for the key's four where there is none) and the params kv_width, kv_n, kv_row, k_n,
/// k_row (k_n = 0 without a key) and k_eps.
struct CacheRows<'a> {
    entries: Vec<(u32, &'a wgpu::Buffer)>,
    fields: [u32; 5],
    k_eps: f32,
}

#[allow(clippy::too_many_arguments)]
fn cache_rows<'a>(
    what: &str,
    kv: &'a wgpu::Buffer,
    kv_gamma: &'a wgpu::Buffer,
    latent_n: usize,
    latent: &'a PagedRows,
    key: Option<&KeyPrep<'a>>,
    pos: usize,
    fill: &'a [wgpu::Buffer],
) -> Result<CacheRows<'a>, GpuError> {
    let width = latent.width;
    if latent_n == 0 || latent_n > width || pos >= latent.capacity() {
        return Err(shape_err(format!("{what}: latent {latent_n} of rows of {width}, position {pos} of {}", latent.capacity())));
    }
    need(kv, width * 4, &format!("{what} kv"))?;
    need(kv_gamma, latent_n * 4, &format!("{what} kv norm"))?;
    let (kv_page, kv_row) = latent.locate(pos);
    let mut entries: Vec<(u32, &wgpu::Buffer)> = vec![(3, kv), (4, kv_gamma), (5, &latent.pages[kv_page])];
    let (mut k_n, mut k_row, mut k_eps) = (0, 0, 0.0);
    match key {
        Some(k) => {
            let id = k.keys.width;
            if pos >= k.keys.capacity() {
                return Err(shape_err(format!("{what}: position {pos} past the {} of {}", k.keys.capacity(), k.keys.label)));
            }
            need(k.ki, id * 4, &format!("{what} ki"))?;
            need(k.gamma, id * 4, &format!("{what} key norm"))?;
            need(k.beta, id * 4, &format!("{what} key norm bias"))?;
            let (page, row) = k.keys.locate(pos);
            (k_n, k_row, k_eps) = (id as u32, row as u32, k.eps);
            entries.extend([(6, k.ki), (7, k.gamma), (8, k.beta), (9, &k.keys.pages[page])]);
        }
        None => entries.extend([(6, &fill[0]), (7, &fill[1]), (8, &fill[2]), (9, &fill[3])]),
    }
    Ok(CacheRows { entries, fields: [width as u32, latent_n as u32, kv_row as u32, k_n, k_row], k_eps })
}

/// The query side of [`global_q_proj`]: c_q [r] f32 as the first projection pass wrote it (not
/// normalised), its RMSNorm weight [r] f32, and q = q_b RMSNorm(c_q) (plus, with an indexer,
/// qI = wq_b RMSNorm(c_q)), q_b and wq_b bf16 [rows, r].
pub struct QueryProj<'a> {
    pub cq: &'a wgpu::Buffer,
    pub norm: &'a wgpu::Buffer,
    pub q_b: &'a GpuTensor,
    pub q: &'a wgpu::Buffer,
    pub index: Option<(&'a GpuTensor, &'a wgpu::Buffer)>,
}

/// The one-binding bf16 matrix [rows, r] [`global_q_proj`] can read, if `w` is one.
fn q_matrix(w: &GpuTensor, r: usize) -> Option<&wgpu::Buffer> {
    match w.chunks.as_slice() {
        [c] if w.dtype == DType::BF16 && w.shape.len() == 2 && w.shape[1] == r && w.rows() > 0 => Some(&c.buffer),
        _ => None,
    }
}

/// One decode token's [`global_prep`] (the latent row, the index-key row) and the query
/// projections from RMSNorm(c_q) in one dispatch: each GEMV workgroup normalises c_q itself,
/// so the projections need not wait for a separate norm. Returns false (nothing recorded)
/// where it cannot run here (subgroups, workgroups of 512, 13 storage bindings, r a multiple
/// of 8 up to 2048, one-binding bf16 matrices): the caller then runs [`global_prep`] and the
/// projections as before.
#[allow(clippy::too_many_arguments)]
pub fn global_q_proj(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    query: &QueryProj<'_>,
    kv: &wgpu::Buffer,
    kv_gamma: &wgpu::Buffer,
    latent_n: usize,
    latent: &PagedRows,
    key: Option<KeyPrep<'_>>,
    eps: f32,
    pos: usize,
    profiler: Option<&mut Profiler>,
) -> Result<bool, GpuError> {
    let r = query.q_b.shape.get(1).copied().unwrap_or(0);
    let (Some(w_a), index_w) = (q_matrix(query.q_b, r), query.index.map(|(w, y)| (q_matrix(w, r), y))) else { return Ok(false) };
    let fits = gpu.caps.subgroups
        && gpu.caps.max_invocations >= 512
        && gpu.caps.max_storage_buffers >= 13
        && r.is_multiple_of(8)
        && r > 0
        && r <= GLOBAL_Q_MAX_COLS
        && index_w.as_ref().is_none_or(|(w, _)| w.is_some())
        && key.is_some() == query.index.is_some();
    if !fits {
        return Ok(false);
    }
    need(query.cq, r * 4, "global_q_proj c_q")?;
    need(query.norm, r * 4, "global_q_proj c_q norm")?;
    need(query.q, query.q_b.rows() * 4, "global_q_proj q")?;
    let placeholders: Vec<wgpu::Buffer> = (0..6).map(|_| gpu.scratch("global_q_proj placeholder", 16)).collect();
    let rows = cache_rows("global_q_proj", kv, kv_gamma, latent_n, latent, key.as_ref(), pos, &placeholders[..4])?;
    let (rows_a, rows_b) = (query.q_b.rows(), query.index.map_or(0, |(w, _)| w.rows()));
    let blocks_a = rows_a.div_ceil(GLOBAL_Q_RPW);
    let [kv_width, kv_n, kv_row, k_n, k_row] = rows.fields;
    let params = GlobalQParams {
        q_n: r as u32,
        kv_width,
        kv_n,
        kv_row,
        k_n,
        k_row,
        eps,
        k_eps: rows.k_eps,
        rows_a: rows_a as u32,
        rows_b: rows_b as u32,
        blocks_a: blocks_a as u32,
        _pad: 0,
    };
    let mut entries: Vec<(u32, &wgpu::Buffer)> = vec![(1, query.cq), (2, query.norm), (10, w_a), (12, query.q)];
    entries.extend(rows.entries);
    match index_w {
        Some((Some(w_b), y_b)) => {
            need(y_b, rows_b * 4, "global_q_proj qI")?;
            entries.extend([(11, w_b), (13, y_b)]);
        }
        _ => entries.extend([(11, &placeholders[4]), (13, &placeholders[5])]),
    }
    let blocks = 2 + blocks_a + rows_b.div_ceil(GLOBAL_Q_RPW);
    gpu.dispatch(enc, &GLOBAL_Q_PROJ, &params, &entries, (blocks as u32, 1), profiler)?;
    Ok(true)
}
