//! Host side of shaders/kda.wgsl (per-token part, fused decode, gated norm) and
//! shaders/kda_chunk.wgsl (chunked WY/UT prefill). Spec 4.2-4.4.

use super::shader_params;
use crate::config::KdaGate;
use crate::gpu::{Gpu, GpuError, GpuTensor, Kernel, Profiler};
use crate::layout::DType;
use std::sync::atomic::{AtomicBool, Ordering};

shader_params!(
    /// Mirrors `KdaParams` in shaders/kda.wgsl.
    KdaParams in "kda" {
        t_len: u32, heads: u32, dk: u32, taps: u32, pos: u32, gate_kind: u32,
        lower_bound: f32, scale: f32, eps: f32, post_conv: u32, run: u32, cumsum: u32,
    }
);

shader_params!(
    /// Mirrors `KdaChunkParams` in shaders/kda_chunk.wgsl.
    KdaChunkParams in "kda_chunk" { t_len: u32, heads: u32, dk: u32, nchunks: u32 }
);

pub const KDA_PREP: Kernel = Kernel::new("kda_prep", "kda", "kda_prep");
/// kda_prep with one subgroup per (token, head) row (kda_sg.wgsl), where the adapter has subgroups.
pub const KDA_PREP_SG: Kernel = Kernel::new("kda_prep_sg", "kda_sg", "kda_prep_sg").subgroups();
/// (token, head) rows per kda_prep_sg workgroup (ROWS in kda_sg.wgsl).
const PREP_SG_ROWS: usize = 8;
/// kda_prep along token runs (kda_sg.wgsl): a subgroup per (q/k/v, head, run of tokens) keeps
/// its channels' conv weights and window in registers.
pub const KDA_PREP_RUN: Kernel = Kernel::new("kda_prep_run", "kda_sg", "kda_prep_run").subgroups().unchecked();
/// kda_prep_run's workgroup size.
const PREP_RUN_WG: usize = 256;

/// kda_prep_run's subgroups per (head, run): q, k, v, and the gate with beta (PREP_PARTS).
const PREP_RUN_PARTS: usize = 4;

/// Longest run of kda_prep_run.
const PREP_RUN_MAX: usize = 64;

/// Tokens per kda_prep_run subgroup: 64 where that still leaves ~16K subgroups (T = 8192 at
/// K3.1's 96 heads), shorter runs for shorter prompts so the GPU stays full (with runs of 64 a
/// 512-token chunk, 288 workgroups, ran 7 % slower than kda_prep_sg on the H200; with runs
/// of 8, 20 % faster); 8 at the least.
fn prep_run_tokens(t_len: usize, heads: usize) -> usize {
    let per_unit = (PREP_RUN_PARTS * heads * t_len / 16384).clamp(8, PREP_RUN_MAX);
    1 << per_unit.ilog2()
}

/// The prefill prep kernels: `Shared` (every adapter, kda.wgsl), `Subgroup` (a subgroup per
/// (token, head) row), `Run` (a subgroup per run of tokens of one head and one of q, k, v).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PrepKernel {
    Shared,
    Subgroup,
    Run,
}

impl PrepKernel {
    pub const ALL: [PrepKernel; 3] = [PrepKernel::Shared, PrepKernel::Subgroup, PrepKernel::Run];

    /// Whether the adapter runs this kernel for layers of `geom`.
    pub fn supported(self, gpu: &Gpu, geom: &KdaGeom) -> bool {
        let caps = &gpu.caps;
        match self {
            PrepKernel::Shared => true,
            PrepKernel::Subgroup => caps.subgroups,
            PrepKernel::Run => {
                let sgs = caps.subgroup_min as usize;
                caps.subgroups
                    && caps.subgroup_min == caps.subgroup_max
                    && sgs > 0
                    && PREP_RUN_WG.is_multiple_of(sgs)
                    && geom.taps <= 4
                    && geom.head_dim.is_multiple_of(sgs)
                    && geom.head_dim / sgs <= 4
            }
        }
    }

    /// The fastest supported kernel: `Run` (measured faster than `Subgroup` on the H200 at
    /// T = 8192 with runs of 64 and in 512-token chunks with runs of 8), else `Subgroup`.
    pub fn default_for(gpu: &Gpu, geom: &KdaGeom) -> PrepKernel {
        [PrepKernel::Run, PrepKernel::Subgroup].into_iter().find(|&k| k.supported(gpu, geom)).unwrap_or(PrepKernel::Shared)
    }
}
pub const KDA_CONV_SAVE: Kernel = Kernel::new("kda_conv_save", "kda", "kda_conv_save");
/// Every index of the decode kernel is within the host-checked extents (`decode` checks
/// all bindings), so it runs without wgpu's bounds checks.
pub const KDA_DECODE: Kernel = Kernel::new("kda_decode", "kda", "kda_decode").unchecked();
/// The decode kernel with 16 value columns per workgroup (twice the workgroups, half the rows
/// per thread); timed next to the default by benches/kda.rs.
pub const KDA_DECODE_C16: Kernel =
    Kernel::new("kda_decode_c16", "kda", "kda_decode").with_constants(&[("C4", 4.0)]).unchecked();
/// Tiled decode (kda_decode_t: branch-free conv prologue, workgroup size and tile as pipeline
/// constants): 8, 16 and 32 columns per 128-thread workgroup, ...
pub const KDA_DECODE_T8: Kernel = Kernel::new("kda_decode_t8", "kda", "kda_decode_t").with_constants(&[("TC4", 2.0)]).unchecked();
pub const KDA_DECODE_T16: Kernel = Kernel::new("kda_decode_t16", "kda", "kda_decode_t").with_constants(&[("TC4", 4.0)]).unchecked();
pub const KDA_DECODE_T32: Kernel = Kernel::new("kda_decode_t32", "kda", "kda_decode_t").with_constants(&[("TC4", 8.0)]).unchecked();
/// ... and 32 columns per 256 threads (kda_decode's tiling with the new prologue: the fastest
/// variant measured on the H200, docs/perf.md; 16 columns per 256 threads, 32 per 512 and an
/// early-prologue form measured slower and were removed).
/// DRMAX caps the rows per thread: a variant runs only where K <= DRG * DRMAX.
pub const KDA_DECODE_T32W256: Kernel = Kernel::new("kda_decode_t32w256", "kda", "kda_decode_t")
    .with_constants(&[("TC4", 8.0), ("DWG", 256.0), ("DRMAX", 8.0)])
    .unchecked();
/// Decode with whole-head tiles (128 columns per 512 threads) and the gated norm's output in
/// the same dispatch (`decode_gated`), for K <= 128.
pub const KDA_DECODE_TG: Kernel = Kernel::new("kda_decode_tg", "kda", "kda_decode_tg")
    .with_constants(&[("TC4", 32.0), ("DWG", 512.0), ("DRMAX", 8.0)])
    .unchecked();
/// Value columns (4 TC4) and threads (DWG) of a [`KDA_DECODE_TG`] workgroup: the widest head
/// it holds.
fn tg_shape() -> (usize, usize) {
    let c = |name| KDA_DECODE_TG.constant(name).map_or(0, |v| v as usize);
    (4 * c("TC4"), c("DWG"))
}
// Without runtime checks: `gated_norm` checks o, gate, norm_w and y; head_dim <= 256 = WG.
pub const KDA_GATED_NORM: Kernel = Kernel::new("kda_gated_norm", "kda", "kda_gated_norm").unchecked();
pub const KDA_CHUNK_CUMSUM: Kernel = Kernel::new("kda_chunk_cumsum", "kda_chunk", "kda_chunk_cumsum");
/// kda_chunk_intra, kda_chunk_state and kda_chunk_out run without wgpu's runtime bounds and
/// loop checks: their indexing stays within the host-checked extents by construction
/// (kda_chunk.wgsl) and the tests cover K = 16..256 and ragged chunks. On the H200 the checks
/// cost 1.3-1.8x (docs/perf.md, KDA).
pub const KDA_CHUNK_INTRA: Kernel = Kernel::new("kda_chunk_intra", "kda_chunk", "kda_chunk_intra").unchecked();
/// kda_chunk_intra with its diagonal blocks through a reference row (no pairwise exponents),
/// where the gate is bounded by a lower bound in [DIAG_REF_BOUND, 0] (see `intra_kernel`).
pub const KDA_CHUNK_INTRA_REF: Kernel =
    Kernel::new("kda_chunk_intra_ref", "kda_chunk", "kda_chunk_intra").with_constants(&[("DIAG_REF", 1.0)]).unchecked();
/// The lowest per-token log decay for which the reference-row intra cannot overflow: its
/// diagonal factors reach e^(15 * 5.5) = e^82.5, times up to 128 terms, under f32's e^88.7.
const DIAG_REF_BOUND: f32 = -5.5;

/// The intra-chunk kernel for this gate: the reference-row form where the bounded gate allows
/// it (on the H200 3.46 -> 2.95 ms at T = 8192 x 96 x 128), else pairwise.
fn intra_kernel(geom: &KdaGeom) -> &'static Kernel {
    let reference_row = matches!(geom.gate, KdaGate::Bounded { lower_bound } if (DIAG_REF_BOUND..=0.0).contains(&lower_bound));
    if reference_row { &KDA_CHUNK_INTRA_REF } else { &KDA_CHUNK_INTRA }
}

/// The state pass with w and kg staged (41 KB of workgroup memory, K <= STATE_KMAX).
pub const KDA_CHUNK_STATE: Kernel = Kernel::new("kda_chunk_state", "kda_chunk", "kda_chunk_state").unchecked();
/// The state pass for K > STATE_KMAX and for adapters where kda_chunk_state's workgroup
/// memory does not fit (16 columns per workgroup, S rows up to 256, 20 KB).
pub const KDA_CHUNK_STATE16: Kernel = Kernel::new("kda_chunk_state16", "kda_chunk", "kda_chunk_state16");
/// The state pass with S in registers (kda_chunk_state_r32): 32 value columns per workgroup of
/// 128 threads (8 x 4 register tiles), 16 KiB of workgroup memory; K <= 128. The default
/// where K <= 128.
pub const KDA_CHUNK_STATE_R32: Kernel = Kernel::new("kda_chunk_state_r32", "kda_chunk", "kda_chunk_state_r32").unchecked();
/// The state pass with S in registers and broadcast operands (lib/kda_state_b.wgsl): 32
/// value columns per workgroup of 64 threads, 16 KiB; K <= 128.
pub const KDA_CHUNK_STATE_B: Kernel = Kernel::new("kda_chunk_state_b", "kda_chunk", "kda_chunk_state_b").unchecked();
pub const KDA_CHUNK_OUT: Kernel = Kernel::new("kda_chunk_out", "kda_chunk", "kda_chunk_out").unchecked();
pub const KERNELS: &[Kernel] = &[
    KDA_PREP,
    KDA_PREP_SG,
    KDA_PREP_RUN,
    KDA_CONV_SAVE,
    KDA_DECODE,
    KDA_DECODE_C16,
    KDA_DECODE_T8,
    KDA_DECODE_T16,
    KDA_DECODE_T32,
    KDA_DECODE_T32W256,
    KDA_DECODE_TG,
    KDA_GATED_NORM,
    KDA_CHUNK_CUMSUM,
    KDA_CHUNK_INTRA,
    KDA_CHUNK_INTRA_REF,
    KDA_CHUNK_STATE,
    KDA_CHUNK_STATE16,
    KDA_CHUNK_STATE_R32,
    KDA_CHUNK_STATE_B,
    KDA_CHUNK_OUT,
];

pub fn params() -> Vec<super::ParamsLayout> {
    vec![
        super::layout_of::<KdaParams>(),
        super::ParamsLayout { shader: "kda_sg", ..super::layout_of::<KdaParams>() },
        super::layout_of::<KdaChunkParams>(),
    ]
}

/// Chunk rows of the WY/UT prefill (spec 4.4).
pub const CHUNK: usize = 64;
/// Decode kernel variants: the kernel and its value columns per workgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DecodeVariant {
    /// kda_decode, 32 columns per 256-thread workgroup (any conv width, no subgroups).
    C32,
    /// kda_decode, 16 columns per workgroup.
    C16,
    /// kda_decode_t (branch-free prologue), 8 / 16 / 32 columns per 128-thread workgroup.
    T8,
    T16,
    T32,
    /// kda_decode_t, 32 columns per 256 threads (C32's tiling, T's prologue): the default
    /// where it runs (conv width <= 4), measured fastest on the H200.
    T32w256,
}

/// Widest conv of the tiled decode kernels (DTAPS in kda.wgsl).
const DECODE_TAPS: usize = 4;

/// How a decode variant tiles the state.
struct DecodeShape {
    kernel: &'static Kernel,
    /// Value columns per workgroup.
    cols: usize,
    /// Threads per workgroup.
    threads: usize,
    /// Register rows per thread (K <= row groups * this).
    rows: usize,
    /// kda_decode_t (conv width <= DECODE_TAPS).
    tiled: bool,
}

impl DecodeVariant {
    pub const ALL: [DecodeVariant; 6] = [
        DecodeVariant::C32,
        DecodeVariant::C16,
        DecodeVariant::T8,
        DecodeVariant::T16,
        DecodeVariant::T32,
        DecodeVariant::T32w256,
    ];

    fn shape(self) -> DecodeShape {
        let t = |kernel, cols, threads, rows| DecodeShape { kernel, cols, threads, rows, tiled: true };
        match self {
            DecodeVariant::C32 => DecodeShape { kernel: &KDA_DECODE, cols: 32, threads: 256, rows: 8, tiled: false },
            DecodeVariant::C16 => DecodeShape { kernel: &KDA_DECODE_C16, cols: 16, threads: 256, rows: 4, tiled: false },
            DecodeVariant::T8 => t(&KDA_DECODE_T8, 8, 128, 4),
            DecodeVariant::T16 => t(&KDA_DECODE_T16, 16, 128, 8),
            DecodeVariant::T32 => t(&KDA_DECODE_T32, 32, 128, 16),
            DecodeVariant::T32w256 => t(&KDA_DECODE_T32W256, 32, 256, 8),
        }
    }

    fn kernel(self) -> (&'static Kernel, usize) {
        let sh = self.shape();
        (sh.kernel, sh.cols)
    }

    /// Whether this variant runs on `gpu` at `geom`: the tiled kernels need conv width <= 4,
    /// K within their register rows and the adapter's
    /// workgroup size and memory.
    pub fn runs_on(self, gpu: &Gpu, geom: &KdaGeom) -> bool {
        let sh = self.shape();
        let row_groups = sh.threads / (sh.cols / 4);
        if geom.head_dim > row_groups * sh.rows || sh.threads > gpu.caps.max_invocations as usize {
            return false;
        }
        if sh.tiled && tiled_shared_bytes(sh.threads, sh.cols) > gpu.caps.max_workgroup_storage as usize {
            return false;
        }
        !(sh.tiled && geom.taps > DECODE_TAPS)
    }

    /// The variants that run on `gpu` at `geom`.
    pub fn available(gpu: &Gpu, geom: &KdaGeom) -> Vec<DecodeVariant> {
        DecodeVariant::ALL.into_iter().filter(|v| v.runs_on(gpu, geom)).collect()
    }

    /// The variant [`decode`] uses: the first that runs of a preference order measured on the
    /// H200 (docs/perf.md, KDA); C32 runs everywhere.
    pub fn default_for(gpu: &Gpu, geom: &KdaGeom) -> DecodeVariant {
        const PREFERENCE: [DecodeVariant; 2] = [DecodeVariant::T32w256, DecodeVariant::C32];
        PREFERENCE.into_iter().find(|v| v.runs_on(gpu, geom)).unwrap_or(DecodeVariant::C32)
    }
}
/// Value columns per state workgroup (SBV in kda_chunk.wgsl).
const STATE_COLS: usize = 32;
/// Largest K of kda_chunk_state (rows of its workgroup-memory state tile); kda_chunk_state16
/// (16 columns per workgroup) beyond.
const STATE_KMAX: usize = 128;
/// Value columns per kda_chunk_state_r32 workgroup (R32_COLS in kda_chunk.wgsl).
const STATE_R32_COLS: usize = 32;
/// Value columns per kda_chunk_state_b workgroup (BC in lib/kda_state_b.wgsl's include).
const STATE_B_COLS: usize = 32;
/// Value columns per kda_chunk_state16 workgroup (LANES in kda_chunk.wgsl).
const STATE16_COLS: usize = 16;

/// State-pass kernels of the SIMT prefill.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateVariant {
    /// kda_chunk_state: 32 value columns per workgroup, w and kg staged in workgroup memory
    /// (41 KB: NVIDIA and AMD Vulkan, not Metal or DX12); K <= 128.
    Staged,
    /// kda_chunk_state16: 16 value columns per workgroup, w and kg read from global memory
    /// (20 KB); any K.
    Narrow,
    /// kda_chunk_state_r32: S in registers, 8 x 4 register tiles, 32 value columns per
    /// workgroup of 128 threads (16 KiB); K <= 128.
    Reg32,
    /// kda_chunk_state_b: S in registers (a column and 64 channels per thread), w and kg
    /// slices read as broadcasts, 32 value columns per workgroup of 64 threads (16 KiB); K <= 128.
    Bcast,
}

impl StateVariant {
    pub const ALL: [StateVariant; 4] = [StateVariant::Staged, StateVariant::Narrow, StateVariant::Reg32, StateVariant::Bcast];

    fn kernel(self) -> (&'static Kernel, usize) {
        match self {
            StateVariant::Staged => (&KDA_CHUNK_STATE, STATE_COLS),
            StateVariant::Narrow => (&KDA_CHUNK_STATE16, STATE16_COLS),
            StateVariant::Reg32 => (&KDA_CHUNK_STATE_R32, STATE_R32_COLS),
            StateVariant::Bcast => (&KDA_CHUNK_STATE_B, STATE_B_COLS),
        }
    }

    /// Whether the variant handles head dim K (the adapter's workgroup memory aside).
    pub fn supports(self, geom: &KdaGeom) -> bool {
        self == StateVariant::Narrow || geom.head_dim <= STATE_KMAX
    }

    /// Whether the variant runs here: K within its limit and its workgroup memory within the
    /// adapter's.
    pub fn runs_on(self, gpu: &Gpu, geom: &KdaGeom) -> Result<bool, GpuError> {
        Ok(self.supports(geom) && gpu.pipelines.runs_here(gpu, self.kernel().0))
    }

    /// The variant [`chunk_prefill`] uses: Reg32 where it runs (K <= 128, 16 KiB of workgroup
    /// memory), else Narrow. Staged (41 KB) and Bcast (16 KiB) have the same K limit and need
    /// at least as much memory, so wherever they run Reg32 does. On the H200 at T = 8192 x 96
    /// heads x 128 (2026-11-30, same process): Reg32 2.80 ms, Staged 3.90, Bcast 4.19, Narrow 89
    /// (and 3.79 for the 16-column register form Reg32 replaced). The others stay selectable for
    /// comparison on other adapters.
    pub fn default_for(gpu: &Gpu, geom: &KdaGeom) -> Result<StateVariant, GpuError> {
        Ok(if StateVariant::Reg32.runs_on(gpu, geom)? { StateVariant::Reg32 } else { StateVariant::Narrow })
    }
}

/// Value columns per output workgroup (OVT in kda_chunk.wgsl).
const OUT_COLS: usize = 64;

/// Shape of one KDA layer as the kernels see it (K = V = head_dim).
#[derive(Clone, Copy, Debug)]
pub struct KdaGeom {
    pub heads: usize,
    pub head_dim: usize,
    pub taps: usize,
    pub gate: KdaGate,
    /// Inputs are already convolved and SiLU'd (skips the conv; for the golden data).
    pub post_conv: bool,
}

impl KdaGeom {
    pub fn proj(&self) -> usize {
        self.heads * self.head_dim
    }

    /// The kernels' preconditions.
    pub fn check(&self) -> Result<(), GpuError> {
        let k = self.head_dim;
        if k == 0 || !k.is_multiple_of(16) || k > 256 {
            return Err(GpuError::Shape(format!("kda: head_dim {k} must be a multiple of 16 in 16..=256")));
        }
        if self.heads == 0 || self.taps == 0 {
            return Err(GpuError::Shape(format!("kda: {} heads and conv kernel {} must both be >= 1", self.heads, self.taps)));
        }
        Ok(())
    }

    fn params(&self, t_len: usize, pos: u64) -> KdaParams {
        // The shader needs pos mod W and whether W - 1 earlier tokens exist: past 2^30 any
        // value >= W with the same residue will do (keeps i32 arithmetic in range).
        let big = 1u64 << 30;
        let w = self.taps as u64;
        let pos = if pos < big { pos } else { big - big % w + pos % w };
        let (gate_kind, lower_bound) = match self.gate {
            KdaGate::Bounded { lower_bound } => (0, lower_bound),
            KdaGate::Softplus => (1, 0.0),
        };
        KdaParams {
            t_len: t_len as u32,
            heads: self.heads as u32,
            dk: self.head_dim as u32,
            taps: self.taps as u32,
            pos: pos as u32,
            gate_kind,
            lower_bound,
            scale: 1.0 / (self.head_dim as f32).sqrt(),
            eps: 1e-5,
            post_conv: self.post_conv as u32,
            ..Default::default()
        }
    }
}

/// Per-token inputs of the KDA core and the layer's small parameters.
pub struct KdaInputs<'a> {
    /// [T, 3P] pre-conv q | k | v.
    pub qkv: &'a wgpu::Buffer,
    /// [T, P] raw gate input (before dt_bias).
    pub f: &'a wgpu::Buffer,
    /// [T, H] raw beta logits.
    pub b: &'a wgpu::Buffer,
    /// [3P, W] f32 conv taps (q | k | v channels).
    pub conv_w: &'a wgpu::Buffer,
    /// [H] f32.
    pub a_log: &'a wgpu::Buffer,
    /// [P] f32.
    pub dt_bias: &'a wgpu::Buffer,
}

/// Outputs of `prep`: the recurrence inputs, [T, H, K] each, beta [T, H].
pub struct Prepped {
    pub q: wgpu::Buffer,
    pub k: wgpu::Buffer,
    pub v: wgpu::Buffer,
    /// The log decay g, or (once `gamma` is set) its within-chunk cumulative sum Gamma.
    pub g: wgpu::Buffer,
    pub beta: wgpu::Buffer,
    pub t_len: usize,
    /// `g` holds Gamma: the prep wrote it so (kda_prep_run with runs of whole chunks) or a
    /// chunked prefill already summed it; the prefill then skips kda_chunk_cumsum.
    gamma: AtomicBool,
}

impl Prepped {
    pub fn new(gpu: &Gpu, geom: &KdaGeom, t_len: usize) -> Prepped {
        let n = (t_len * geom.proj() * 4) as u64;
        Prepped {
            q: gpu.storage("kda q", n),
            k: gpu.storage("kda k", n),
            v: gpu.storage("kda v", n),
            g: gpu.storage("kda g", n),
            beta: gpu.storage("kda beta", (t_len * geom.heads * 4) as u64),
            t_len,
            gamma: AtomicBool::new(false),
        }
    }
}

/// Scratch of the chunked prefill for up to `t_len` tokens.
pub struct ChunkScratch {
    /// w, qg, kg [T, H, K].
    w: wgpu::Buffer,
    u: wgpu::Buffer,
    qg: wgpu::Buffer,
    kg: wgpu::Buffer,
    aqk: wgpu::Buffer,
    /// [N, H, K, V] state before each chunk.
    hs: wgpu::Buffer,
    t_len: usize,
}

impl ChunkScratch {
    /// Scratch for up to `t_len` tokens. Fails when one scratch buffer would exceed a
    /// storage binding (split the prefill).
    pub fn new(gpu: &Gpu, geom: &KdaGeom, t_len: usize) -> Result<ChunkScratch, GpuError> {
        let chunks = t_len.div_ceil(CHUNK);
        let hs = (chunks * geom.heads * geom.head_dim * geom.head_dim * 4) as u64;
        let n = (t_len * geom.proj() * 4) as u64;
        let big = hs.max(n);
        if big > gpu.caps.max_binding {
            return Err(GpuError::TooLarge { what: format!("kda prefill of {t_len} tokens (chunk scratch)"), needed: big, limit: gpu.caps.max_binding });
        }
        Ok(ChunkScratch {
            w: gpu.storage("kda w", n),
            u: gpu.storage("kda u", n),
            qg: gpu.storage("kda qg", n),
            kg: gpu.storage("kda kg", n),
            aqk: gpu.storage("kda A_qk", (chunks * geom.heads * CHUNK * CHUNK * 4) as u64),
            hs: gpu.storage("kda chunk states", hs),
            t_len,
        })
    }

    /// Bytes of GPU memory this scratch holds.
    pub fn bytes(&self) -> u64 {
        [&self.w, &self.u, &self.qg, &self.kg, &self.aqk, &self.hs].iter().map(|b| b.size()).sum()
    }
}

fn need(buf: &wgpu::Buffer, floats: usize, what: &str) -> Result<(), GpuError> {
    let bytes = (floats * 4) as u64;
    if buf.size() < bytes {
        return Err(GpuError::Shape(format!("kda: {what} holds {} bytes, needs {bytes}", buf.size())));
    }
    Ok(())
}

fn check_inputs(geom: &KdaGeom, t_len: usize, inp: &KdaInputs, ring: &wgpu::Buffer) -> Result<(), GpuError> {
    geom.check()?;
    if t_len == 0 {
        return Err(GpuError::Shape("kda: no tokens".into()));
    }
    let p = geom.proj();
    need(inp.qkv, t_len * 3 * p, "qkv [T, 3P]")?;
    need(inp.f, t_len * p, "f [T, P]")?;
    need(inp.b, t_len * geom.heads, "b [T, H]")?;
    need(inp.conv_w, 3 * p * geom.taps, "conv weights [3P, W]")?;
    need(inp.a_log, geom.heads, "A_log [H]")?;
    need(inp.dt_bias, p, "dt_bias [P]")?;
    need(ring, geom.taps * 3 * p, "conv ring [W, 3P]")
}

/// Records one dispatch of `kernel` over `groups` workgroups; the ops share one uniform.
fn dispatch(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    kernel: &Kernel,
    uniform: &wgpu::Buffer,
    buffers: &[(u32, &wgpu::Buffer)],
    groups: usize,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    gpu.record_with_uniform(enc, kernel, uniform, buffers, (groups as u32, 1), profiler)
}

/// Prefill preprocessing of `t_len` tokens starting at absolute position `pos`: conv + SiLU
/// (window from `ring`), l2 norm, scale, gate, beta into `out`; then the ring is advanced.
/// Uses the fastest prep kernel the adapter runs ([`PrepKernel::default_for`]).
#[allow(clippy::too_many_arguments)]
pub fn prep(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    geom: &KdaGeom,
    t_len: usize,
    pos: u64,
    inp: &KdaInputs,
    ring: &wgpu::Buffer,
    out: &Prepped,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    prep_with(gpu, enc, PrepKernel::default_for(gpu, geom), geom, t_len, pos, inp, ring, out, profiler)
}

/// [`prep`] through a chosen kernel.
#[allow(clippy::too_many_arguments)]
pub fn prep_with(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    kernel: PrepKernel,
    geom: &KdaGeom,
    t_len: usize,
    pos: u64,
    inp: &KdaInputs,
    ring: &wgpu::Buffer,
    out: &Prepped,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    let run = prep_run_tokens(t_len, geom.heads);
    prep_with_run(gpu, enc, kernel, geom, t_len, pos, inp, ring, out, run, profiler)
}

/// [`prep_with`] with kda_prep_run's tokens per subgroup chosen (a power of two, 1..=64;
/// ignored by the other kernels). Runs of a whole chunk (64) also write g as Gamma, the
/// within-chunk cumulative sum, so the chunked prefill skips kda_chunk_cumsum.
#[allow(clippy::too_many_arguments)]
pub fn prep_with_run(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    kernel: PrepKernel,
    geom: &KdaGeom,
    t_len: usize,
    pos: u64,
    inp: &KdaInputs,
    ring: &wgpu::Buffer,
    out: &Prepped,
    run: usize,
    mut profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    if !run.is_power_of_two() || run > PREP_RUN_MAX {
        return Err(GpuError::Shape(format!("kda prep: runs of {run} tokens (a power of two up to {PREP_RUN_MAX})")));
    }
    check_inputs(geom, t_len, inp, ring)?;
    if out.t_len < t_len {
        return Err(GpuError::Shape(format!("kda prep: outputs hold {} tokens, need {t_len}", out.t_len)));
    }
    if !kernel.supported(gpu, geom) {
        return Err(GpuError::Shape(format!("kda prep: the {kernel:?} kernel does not run here for head dim {}", geom.head_dim)));
    }
    let cumsum = kernel == PrepKernel::Run && run == CHUNK;
    let uniform = gpu.uniform("kda params", &KdaParams { run: run as u32, cumsum: cumsum as u32, ..geom.params(t_len, pos) });
    out.gamma.store(cumsum, Ordering::Relaxed);
    let bufs = [
        (1, inp.qkv),
        (2, inp.f),
        (3, inp.b),
        (4, inp.conv_w),
        (5, inp.a_log),
        (6, inp.dt_bias),
        (7, ring),
        (10, &out.q),
        (11, &out.k),
        (12, &out.v),
        (13, &out.g),
        (14, &out.beta),
    ];
    let rows = t_len * geom.heads;
    match kernel {
        PrepKernel::Run => {
            let units = PREP_RUN_PARTS * geom.heads * t_len.div_ceil(run);
            let per_group = PREP_RUN_WG / gpu.caps.subgroup_min as usize;
            dispatch(gpu, enc, &KDA_PREP_RUN, &uniform, &bufs, units.div_ceil(per_group), profiler.as_deref_mut())?;
        }
        PrepKernel::Subgroup => dispatch(gpu, enc, &KDA_PREP_SG, &uniform, &bufs, rows.div_ceil(PREP_SG_ROWS), profiler.as_deref_mut())?,
        PrepKernel::Shared => dispatch(gpu, enc, &KDA_PREP, &uniform, &bufs, rows, profiler.as_deref_mut())?,
    }
    let keep = t_len.min(geom.taps) * 3 * geom.proj();
    dispatch(gpu, enc, &KDA_CONV_SAVE, &uniform, &[(1, inp.qkv), (7, ring)], keep.div_ceil(256), profiler)
}

/// One decode token at absolute position `pos`: conv (advancing `ring`), gates, the state
/// update of `state` [H, K, V] in place and o [H, V], through [`DecodeVariant::default_for`].
#[allow(clippy::too_many_arguments)]
pub fn decode(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    geom: &KdaGeom,
    pos: u64,
    inp: &KdaInputs,
    ring: &wgpu::Buffer,
    state: &wgpu::Buffer,
    o: &wgpu::Buffer,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    decode_with(gpu, enc, DecodeVariant::default_for(gpu, geom), geom, pos, inp, ring, state, o, profiler)
}

/// The forget gate's second low-rank matrix for [`decode_gated`]: f = W_fb f_a, W_fb [P, K]
/// bf16, f_a [K] f32.
#[derive(Clone, Copy)]
pub struct GateLowRank<'a> {
    pub w_fb: &'a GpuTensor,
    pub f_a: &'a wgpu::Buffer,
}

/// One decode token: f = W_fb f_a, the decode of [`decode`] (conv, gates, the state update in
/// place) and y [H, V] = RMSNorm(o; norm_w, eps) * sigmoid(gate) as [`gated_norm`], in ONE
/// dispatch (`kda_decode_tg`, one workgroup per head) where [`gated_fits`]; the caller then
/// skips f_b's GEMV. Elsewhere it errors: run f_b, [`decode`] and [`gated_norm`] instead.
#[allow(clippy::too_many_arguments)]
pub fn decode_gated(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    geom: &KdaGeom,
    pos: u64,
    inp: &KdaInputs,
    fb: GateLowRank,
    ring: &wgpu::Buffer,
    state: &wgpu::Buffer,
    gate: &wgpu::Buffer,
    norm_w: &wgpu::Buffer,
    y: &wgpu::Buffer,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    if !gated_fits(gpu, geom, fb.w_fb) {
        return Err(GpuError::Shape(format!("kda decode_gated: head dim {} or f_b {:?} {:?} not supported in one dispatch here", geom.head_dim, fb.w_fb.dtype, fb.w_fb.shape)));
    }
    need(fb.f_a, geom.head_dim, "f_a [K]")?;
    need(gate, geom.proj(), "output gate [P]")?;
    need(norm_w, geom.head_dim, "o_norm [V]")?;
    need(y, geom.proj(), "y [P]")?;
    let mut bufs = core_bindings(geom, inp, ring, state)?.to_vec();
    bufs.extend([(15, gate), (16, norm_w), (17, y), (18, &fb.w_fb.chunks[0].buffer), (19, fb.f_a)]);
    gpu.dispatch(enc, &KDA_DECODE_TG, &geom.params(1, pos), &bufs, (decode_groups(geom, tg_shape().0), 1), profiler)
}

/// Whether [`decode_gated`] runs at `geom` with `w_fb` on `gpu`: K <= 128 (a head per
/// workgroup of 512, 4 threads per f_b row), conv width <= 4, W_fb bf16 [P, K] in one buffer,
/// and the workgroup memory of the tiled kernels (partials [3, threads] vec4, q / k / decay,
/// totals, v, f_b partials) plus the column sums.
pub fn gated_fits(gpu: &Gpu, geom: &KdaGeom, w_fb: &GpuTensor) -> bool {
    let (cols, threads) = tg_shape();
    // ... plus the f_b partials [threads] (sh_fp) and o . o per column vec4 (sh_sq).
    let shared = tiled_shared_bytes(threads, cols) + 4 * threads + 4 * (cols / 4);
    geom.head_dim <= cols
        && geom.taps <= DECODE_TAPS
        && w_fb.dtype == DType::BF16
        && w_fb.shape == [geom.proj(), geom.head_dim]
        && w_fb.chunks.len() == 1
        && threads <= gpu.caps.max_invocations as usize
        && shared <= gpu.caps.max_workgroup_storage as usize
}

/// Workgroup memory of kda_decode_t with `threads` threads and `cols` columns: partials
/// [3, threads] vec4, q / k / decay [3, 256], totals [3, cols / 4] vec4, v [cols].
fn tiled_shared_bytes(threads: usize, cols: usize) -> usize {
    16 * 3 * threads + 4 * 3 * 256 + 16 * 3 * cols / 4 + 4 * cols
}

/// [`decode`] through a given kernel variant.
#[allow(clippy::too_many_arguments)]
pub fn decode_with(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    variant: DecodeVariant,
    geom: &KdaGeom,
    pos: u64,
    inp: &KdaInputs,
    ring: &wgpu::Buffer,
    state: &wgpu::Buffer,
    o: &wgpu::Buffer,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    check_variant(gpu, geom, variant)?;
    let bufs = decode_bindings(geom, inp, ring, state, o)?;
    let (kernel, cols) = variant.kernel();
    // The per-forward uniform arena and bind-group cache: decode records this every token.
    gpu.dispatch(enc, kernel, &geom.params(1, pos), &bufs, (decode_groups(geom, cols), 1), profiler)
}

/// The decode kernels' storage bindings (1-9) for one step, after checking their sizes.
fn decode_bindings<'a>(
    geom: &KdaGeom,
    inp: &KdaInputs<'a>,
    ring: &'a wgpu::Buffer,
    state: &'a wgpu::Buffer,
    o: &'a wgpu::Buffer,
) -> Result<[(u32, &'a wgpu::Buffer); 9], GpuError> {
    need(o, geom.proj(), "o [H, V]")?;
    let [a, b, c, d, e, f, g, h] = core_bindings(geom, inp, ring, state)?;
    Ok([a, b, c, d, e, f, g, h, (9, o)])
}

/// Bindings 1-8 every decode kernel reads (inputs, conv ring, state), after checking them.
fn core_bindings<'a>(
    geom: &KdaGeom,
    inp: &KdaInputs<'a>,
    ring: &'a wgpu::Buffer,
    state: &'a wgpu::Buffer,
) -> Result<[(u32, &'a wgpu::Buffer); 8], GpuError> {
    check_inputs(geom, 1, inp, ring)?;
    need(state, geom.heads * geom.head_dim * geom.head_dim, "state [H, K, V]")?;
    Ok([(1, inp.qkv), (2, inp.f), (3, inp.b), (4, inp.conv_w), (5, inp.a_log), (6, inp.dt_bias), (7, ring), (8, state)])
}

/// Workgroups of one decode dispatch: every head's value columns in tiles of `cols`.
fn decode_groups(geom: &KdaGeom, cols: usize) -> u32 {
    (geom.heads * geom.head_dim.div_ceil(cols)) as u32
}

fn check_variant(gpu: &Gpu, geom: &KdaGeom, variant: DecodeVariant) -> Result<(), GpuError> {
    if !variant.runs_on(gpu, geom) {
        return Err(GpuError::Shape(format!("kda decode: variant {variant:?} does not run on this adapter at conv width {}", geom.taps)));
    }
    Ok(())
}

/// One layer's decode in [`decode_one_pass`].
pub struct DecodeStep<'a> {
    pub inp: KdaInputs<'a>,
    pub ring: &'a wgpu::Buffer,
    pub state: &'a wgpu::Buffer,
    pub o: &'a wgpu::Buffer,
    pub pos: u64,
}

/// The decodes of several layers recorded into ONE compute pass (one dispatch each, one
/// optional timestamp pair around all of them): what [`decode`] does per step, without a
/// pass per layer. wgpu still orders dispatches that share a written buffer.
pub fn decode_one_pass(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    geom: &KdaGeom,
    variant: DecodeVariant,
    steps: &[DecodeStep],
    timestamp_writes: Option<wgpu::ComputePassTimestampWrites>,
) -> Result<(), GpuError> {
    check_variant(gpu, geom, variant)?;
    let (kernel, cols) = variant.kernel();
    let pipeline = gpu.pipelines.get(gpu, kernel)?;
    let mut binds = Vec::with_capacity(steps.len());
    for st in steps {
        let bufs = decode_bindings(geom, &st.inp, st.ring, st.state, st.o)?;
        let uniform = gpu.uniform("kda params", &geom.params(1, st.pos));
        let e: Vec<(u32, &wgpu::Buffer)> = std::iter::once((0, &uniform)).chain(bufs).collect();
        binds.push(gpu.bind_group(kernel, &pipeline, &e)?);
    }
    let (gx, gy) = gpu.grid(decode_groups(geom, cols));
    let mut pass = gpu.begin_pass(enc, &wgpu::ComputePassDescriptor { label: Some("kda_decode x layers"), timestamp_writes });
    pass.set_pipeline(&pipeline);
    for b in &binds {
        pass.set_bind_group(0, b, &[]);
        pass.dispatch_workgroups(gx, gy, 1);
    }
    Ok(())
}

/// Chunked WY/UT prefill over the prepared inputs: o [T, H, V], `state` advanced in place.
/// `pre.g` ends up holding the within-chunk cumulative gate (summed here unless the prep
/// wrote it so). The state pass is [`StateVariant::default_for`] the adapter.
#[allow(clippy::too_many_arguments)]
pub fn chunk_prefill(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    geom: &KdaGeom,
    pre: &Prepped,
    scratch: &ChunkScratch,
    state: &wgpu::Buffer,
    o: &wgpu::Buffer,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    let sv = StateVariant::default_for(gpu, geom)?;
    chunk_prefill_inner(gpu, enc, sv, geom, pre, scratch, state, o, profiler)
}

/// The SIMT prefill with a given state-pass kernel, whether or not the adapter reports room
/// for its workgroup memory (tests run both on lavapipe, which reports 32 KiB and runs more).
#[allow(clippy::too_many_arguments)]
pub fn chunk_prefill_state(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    sv: StateVariant,
    geom: &KdaGeom,
    pre: &Prepped,
    scratch: &ChunkScratch,
    state: &wgpu::Buffer,
    o: &wgpu::Buffer,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    if !sv.supports(geom) {
        return Err(GpuError::Shape(format!("kda prefill: state kernel {sv:?} needs K <= {STATE_KMAX}, got {}", geom.head_dim)));
    }
    chunk_prefill_inner(gpu, enc, sv, geom, pre, scratch, state, o, profiler)
}

#[allow(clippy::too_many_arguments)]
fn chunk_prefill_inner(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    sv: StateVariant,
    geom: &KdaGeom,
    pre: &Prepped,
    scratch: &ChunkScratch,
    state: &wgpu::Buffer,
    o: &wgpu::Buffer,
    mut profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    geom.check()?;
    let t = pre.t_len;
    let k = geom.head_dim;
    if t == 0 || scratch.t_len < t {
        return Err(GpuError::Shape(format!("kda prefill: {t} tokens with scratch for {}", scratch.t_len)));
    }
    need(state, geom.heads * k * k, "state [H, K, V]")?;
    need(o, t * geom.proj(), "o [T, H, V]")?;
    let nchunks = t.div_ceil(CHUNK);
    let params = KdaChunkParams { t_len: t as u32, heads: geom.heads as u32, dk: k as u32, nchunks: nchunks as u32 };
    let uniform = gpu.uniform("kda chunk params", &params);
    let s = scratch;
    if !pre.gamma.load(Ordering::Relaxed) {
        dispatch(gpu, enc, &KDA_CHUNK_CUMSUM, &uniform, &[(4, &pre.g)], (nchunks * geom.proj()).div_ceil(256), profiler.as_deref_mut())?;
        pre.gamma.store(true, Ordering::Relaxed);
    }
    let intra = [
        (1, &pre.q),
        (2, &pre.k),
        (3, &pre.v),
        (4, &pre.g),
        (5, &pre.beta),
        (6, &s.w),
        (7, &s.u),
        (8, &s.qg),
        (9, &s.kg),
        (10, &s.aqk),
    ];
    dispatch(gpu, enc, intra_kernel(geom), &uniform, &intra, nchunks * geom.heads, profiler.as_deref_mut())?;
    let scan = [(4, &pre.g), (6, &s.w), (7, &s.u), (9, &s.kg), (11, state), (13, &s.hs)];
    let (state_kernel, cols) = sv.kernel();
    dispatch(gpu, enc, state_kernel, &uniform, &scan, geom.heads * k.div_ceil(cols), profiler.as_deref_mut())?;
    let out = [(7, &s.u), (8, &s.qg), (10, &s.aqk), (12, o), (13, &s.hs)];
    dispatch(gpu, enc, &KDA_CHUNK_OUT, &uniform, &out, nchunks * geom.heads * k.div_ceil(OUT_COLS), profiler)
}

/// y [rows, V] = RMSNorm(o; norm_w, 1e-5) * sigmoid(gate), rows = T * H.
#[allow(clippy::too_many_arguments)]
pub fn gated_norm(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    geom: &KdaGeom,
    t_len: usize,
    o: &wgpu::Buffer,
    gate: &wgpu::Buffer,
    norm_w: &wgpu::Buffer,
    y: &wgpu::Buffer,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    geom.check()?;
    let n = t_len * geom.proj();
    need(o, n, "o [T, H, V]")?;
    need(gate, n, "output gate [T, P]")?;
    need(norm_w, geom.head_dim, "o_norm [V]")?;
    need(y, n, "y [T, P]")?;
    let uniform = gpu.uniform("kda params", &geom.params(t_len, 0));
    dispatch(gpu, enc, &KDA_GATED_NORM, &uniform, &[(9, o), (15, gate), (16, norm_w), (17, y)], t_len * geom.heads, profiler)
}
