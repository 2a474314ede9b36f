//! A global attention layer (spec 5): gated NoPE MLA with DeepSeek sparse attention, or dense
//! MLA when the model has no indexer (K3, Kimi Linear). One code path for prefill (T tokens)
//! and decode (T = 1): projections, cache append, then per block of queries the indexer
//! scores [Tb, S], top-k and the absorbed sparse attention, so no [T, S] matrix exists for
//! long prompts. Per-sequence state lives in [`GlobalCache`] (owned by the session).

use crate::checkpoint::TensorView;
use crate::config::{IndexerConfig, MlaConfig, ModelConfig};
use crate::gpu::{Gpu, GpuError, GpuTensor, Profiler};
use crate::ops::dsa::{self, MlaDims, PagedRows, TopkScratch};
use crate::ops::linear::{linear, linear_many};
use crate::trace::{Selection, SelectionSink};

/// Scores held per query block: Tb * S <= this many values (64 MiB of f32).
const SCORE_BUDGET: usize = 16 << 20;
/// Bytes of the attention partials [Tb, H, splits, ceil(R/4)+1] vec4 per query block; splits
/// shrink as blocks grow (K3.1: 4.4 MB for one query, 51 MB for a block of 256, so blocks of
/// ~1300 queries; without the limit a long prompt would pass any binding).
const PARTIALS_BUDGET: usize = 256 << 20;

/// Positions the kept top-k scratch grows by.
const TOPK_ROW_STEP: usize = 8192;

/// The caches of one global layer for one sequence: the latent rows (c 512 | k_pe 64 for
/// K3.1) and the index keys (128), both bf16, in pages that grow without copying.
pub struct GlobalCache {
    pub latent: PagedRows,
    pub keys: Option<PagedRows>,
    /// Positions written.
    pub len: usize,
    /// The decode's top-k scratch (one row), kept from token to token (its kernels leave it
    /// zeroed): fresh buffers each token cost their allocation and wgpu's zero fill. Prefill
    /// blocks take theirs per forward (several rows of the whole context: kept, 24 layers' of
    /// them would hold gigabytes at 1M). Not part of a snapshot.
    topk: Option<Box<TopkScratch>>,
}

impl GlobalCache {
    /// Caches for up to `max_context` positions whose first page holds `page0` rows
    /// (a power of two; 1024 is a good default).
    pub fn new(gpu: &Gpu, mla: &MlaConfig, indexer: Option<&IndexerConfig>, max_context: usize, page0: usize) -> Result<GlobalCache, GpuError> {
        let latent = PagedRows::new(gpu, "latent cache", mla.cache_row(), page0, max_context)?;
        let keys = match indexer {
            Some(ix) => Some(PagedRows::new(gpu, "index-key cache", ix.head_dim, page0, max_context)?),
            None => None,
        };
        Ok(GlobalCache { latent, keys, len: 0, topk: None })
    }

    /// Bytes per position of one layer's caches (bf16): (R + E + ID) * 2.
    pub fn bytes_per_position(mla: &MlaConfig, indexer: Option<&IndexerConfig>) -> usize {
        2 * (mla.cache_row() + indexer.map_or(0, |i| i.head_dim))
    }

    /// Bytes per token over all global layers of the model (33,792 for K3.1).
    pub fn model_bytes_per_token(cfg: &ModelConfig) -> usize {
        let Some(mla) = &cfg.mla else { return 0 };
        let layers = cfg.layers.iter().filter(|l| matches!(l.mixer, crate::config::Mixer::Global)).count();
        layers * Self::bytes_per_position(mla, cfg.indexer.as_ref())
    }

    /// Bytes the positions written so far occupy.
    pub fn used_bytes(&self) -> u64 {
        (self.len * 2 * (self.latent.width + self.keys.as_ref().map_or(0, |k| k.width))) as u64
    }

    /// Bytes allocated on the GPU (doubling pages: under three times `used_bytes` past the first page).
    pub fn allocated_bytes(&self) -> u64 {
        self.latent.allocated_bytes() + self.keys.as_ref().map_or(0, |k| k.allocated_bytes())
    }

    /// Makes the kept one-row top-k scratch hold `row_len` positions (grown in steps of
    /// TOPK_ROW_STEP positions, so a decode reallocates it once per step, not per token).
    fn ensure_decode_topk(&mut self, gpu: &Gpu, row_len: usize, k: usize) -> Result<(), GpuError> {
        if !self.topk.as_ref().is_some_and(|s| s.row_len >= row_len && s.k == k) {
            self.topk = Some(Box::new(TopkScratch::new(gpu, 1, row_len.next_multiple_of(TOPK_ROW_STEP), k)?));
        }
        Ok(())
    }

    fn ensure(&mut self, gpu: &Gpu, rows: usize) -> Result<(), GpuError> {
        self.latent.ensure(gpu, rows)?;
        if let Some(k) = &mut self.keys {
            k.ensure(gpu, rows)?;
        }
        Ok(())
    }
}

/// Omitted-mass diagnostics of one head for one token (spec 5.3 consequence 3).
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct HeadDiagnostics {
    /// Full-softmax probability mass on positions outside the selection.
    pub omitted_mass: f32,
    /// ||y_dense - y_sparse|| of the head's attention output (before gate and o_proj).
    pub err: f32,
    /// The same divided by ||y_dense||.
    pub rel_err: f32,
    /// Fraction of the dense attention's own top-k (by logit) that the indexer selected.
    pub recall: f32,
}

/// Diagnostics of one token in one global layer.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct TokenDiagnostics {
    pub layer: usize,
    pub position: usize,
    pub heads: Vec<HeadDiagnostics>,
}

/// Per-call options: the selection sink, the opt-in diagnostics and the profiler.
#[derive(Default)]
pub struct ForwardOptions<'a> {
    pub sink: Option<&'a mut dyn SelectionSink>,
    /// Also run dense attention for every query and report [`TokenDiagnostics`].
    pub diagnostics: bool,
    pub profiler: Option<&'a mut Profiler>,
    /// Upper bound on queries per block (0: from the score budget).
    pub max_query_block: usize,
    /// Where selections for `sink` wait until the caller has synchronised anyway (None: the
    /// layer reads them back itself, a GPU round trip per call).
    pub deferred: Option<&'a mut DeferredSelections>,
    /// The indexer query's precision (spec 5.3).
    pub index_precision: dsa::IndexPrecision,
}

/// Selections copied to host-visible buffers inside the forward's command stream and
/// handed to the sink after the forward's final readback, so listening costs no extra
/// GPU/CPU synchronisation per global layer.
#[derive(Default)]
pub struct DeferredSelections {
    pending: Vec<PendingBlock>,
}

struct PendingBlock {
    layer: usize,
    first_position: usize,
    queries: usize,
    k: usize,
    /// [queries * k] i32 positions then [queries * k] f32 scores.
    staging: wgpu::Buffer,
}

impl DeferredSelections {
    /// Maps every pending block (the GPU work that filled them must have been submitted) and
    /// feeds them to `sink` in forward order.
    pub fn deliver(&mut self, gpu: &Gpu, sink: &mut dyn SelectionSink) -> Result<(), GpuError> {
        let blocks = std::mem::take(&mut self.pending);
        for b in &blocks {
            b.staging.slice(..).map_async(wgpu::MapMode::Read, |_| {});
        }
        gpu.wait()?;
        for b in &blocks {
            let view = b.staging.slice(..).get_mapped_range().map_err(|e| GpuError::Readback(e.to_string()))?;
            let n = b.queries * b.k;
            let pos: &[i32] = bytemuck::cast_slice(&view[..n * 4]);
            let sc: &[f32] = bytemuck::cast_slice(&view[n * 4..2 * n * 4]);
            for i in 0..b.queries {
                let m = b.k.min(b.first_position + i + 1);
                sink.record(Selection { layer: b.layer, position: b.first_position + i, positions: &pos[i * b.k..i * b.k + m], scores: &sc[i * b.k..i * b.k + m] });
            }
            drop(view);
            b.staging.unmap();
        }
        Ok(())
    }
}

struct IndexerWeights {
    wq_b: GpuTensor,
    wk: GpuTensor,
    k_norm_w: wgpu::Buffer,
    k_norm_b: wgpu::Buffer,
    weights_proj: GpuTensor,
    heads: usize,
    head_dim: usize,
    topk: usize,
    eps: f32,
}

/// One global layer's weights on the GPU and its shapes.
pub struct GlobalAttn {
    pub layer: usize,
    pub dims: MlaDims,
    hidden: usize,
    eps: f32,
    q_a: Option<(GpuTensor, wgpu::Buffer)>,
    q_b: GpuTensor,
    kv_a: GpuTensor,
    kv_a_norm: wgpu::Buffer,
    kv_b: GpuTensor,
    g_proj: Option<GpuTensor>,
    o_proj: GpuTensor,
    indexer: Option<IndexerWeights>,
    /// A one-token forward's buffers of its own for the absorb beside the indexer.
    beside: Option<AbsorbBeside>,
    decode_gate: Option<DecodeGate>,
}

/// A one-token forward's absorbed query and touch sink ([`super::absorb_beside`]): qa is new
/// to every encoder, so the absorb writing it needs no barrier after the indexer's dispatch.
struct AbsorbBeside {
    /// The absorbed query [H, R+E] f32.
    qa: wgpu::Buffer,
    /// The touch dispatch's sink (never written).
    sink: wgpu::Buffer,
}

/// A one-token forward's gate [H*V] f32: the layer's own, so the gate GEMV beside the attention
/// needs no barrier even when earlier layers of the same encoder wrote the scratch pool's
/// buffers (a pool buffer written twice in one encoder takes one).
struct DecodeGate(wgpu::Buffer);

fn err(msg: String) -> GpuError {
    GpuError::Shape(msg)
}


impl GlobalAttn {
    /// Uploads layer `layer`'s weights; `lookup` maps a name relative to `…self_attn.` (for
    /// example `q_a_proj.weight`) to the checkpoint tensor.
    pub fn load<'a>(
        gpu: &Gpu,
        cfg: &ModelConfig,
        layer: usize,
        lookup: &dyn Fn(&str) -> Option<TensorView<'a>>,
    ) -> Result<GlobalAttn, GpuError> {
        let mla = cfg.mla.as_ref().ok_or_else(|| err("global layer: the config has no MLA section".into()))?;
        let dims = MlaDims::from_config(mla);
        let get = |name: &str| lookup(name).ok_or_else(|| err(format!("layer {layer}: missing tensor self_attn.{name}")));
        let mat = |name: &str, rows: usize, cols: usize| -> Result<GpuTensor, GpuError> {
            let v = get(name)?;
            if v.shape != [rows, cols] {
                return Err(err(format!("layer {layer}: self_attn.{name} has shape {:?}, expected [{rows}, {cols}]", v.shape)));
            }
            GpuTensor::upload(gpu, &format!("layers.{layer}.self_attn.{name}"), v.dtype, v.shape, v.data, None)
        };
        let vec = |name: &str, n: usize| -> Result<wgpu::Buffer, GpuError> {
            let v = get(name)?;
            let f = super::floats(&v, name)?;
            if f.len() != n {
                return Err(err(format!("layer {layer}: self_attn.{name} has {} values, expected {n}", f.len())));
            }
            Ok(gpu.storage_from(name, &f))
        };
        let d = cfg.hidden_size;
        let h = dims.heads;
        let q_out = h * (dims.nope + dims.rope);
        let (q_a, q_b) = match mla.q_lora_rank {
            Some(r) => (Some((mat("q_a_proj.weight", r, d)?, vec("q_a_layernorm.weight", r)?)), mat("q_b_proj.weight", q_out, r)?),
            None => (None, mat("q_proj.weight", q_out, d)?),
        };
        let indexer = match &cfg.indexer {
            Some(ix) => {
                let q_in = mla.q_lora_rank.unwrap_or(d);
                Some(IndexerWeights {
                    wq_b: mat("indexer.wq_b.weight", ix.n_heads * ix.head_dim, q_in)?,
                    wk: mat("indexer.wk.weight", ix.head_dim, d)?,
                    k_norm_w: vec("indexer.k_norm.weight", ix.head_dim)?,
                    k_norm_b: match lookup("indexer.k_norm.bias") {
                        Some(_) => vec("indexer.k_norm.bias", ix.head_dim)?,
                        None => gpu.storage_from("k_norm.bias", &vec![0f32; ix.head_dim]),
                    },
                    weights_proj: mat("indexer.weights_proj.weight", ix.n_heads, d)?,
                    heads: ix.n_heads,
                    head_dim: ix.head_dim,
                    topk: ix.topk,
                    eps: ix.key_norm_eps,
                })
            }
            None => None,
        };
        Ok(GlobalAttn {
            layer,
            dims,
            hidden: d,
            eps: mla.latent_norm_eps,
            q_a,
            q_b,
            kv_a: mat("kv_a_proj_with_mqa.weight", dims.width(), d)?,
            kv_a_norm: vec("kv_a_layernorm.weight", dims.latent)?,
            kv_b: mat("kv_b_proj.weight", h * (dims.nope + dims.v_dim), dims.latent)?,
            g_proj: if mla.output_gate { Some(mat("g_proj.weight", h * dims.v_dim, d)?) } else { None },
            decode_gate: mla.output_gate.then(|| DecodeGate(gpu.storage("gate (decode)", (h * dims.v_dim * 4) as u64))),
            o_proj: mat("o_proj.weight", d, h * dims.v_dim)?,
            beside: indexer.is_some().then(|| AbsorbBeside {
                qa: gpu.storage("qa (decode)", (h * dims.width() * 4) as u64),
                sink: gpu.storage("touch sink", 16),
            }),
            indexer,
        })
    }

    /// Runs the layer on `x` [T, hidden] f32 for the next T positions of `cache`, writes
    /// out [T, hidden] f32 and submits the work. Returns the diagnostics when asked for.
    pub fn forward(
        &self,
        gpu: &Gpu,
        x: &wgpu::Buffer,
        n_tokens: usize,
        cache: &mut GlobalCache,
        out: &wgpu::Buffer,
        opts: &mut ForwardOptions<'_>,
    ) -> Result<Vec<TokenDiagnostics>, GpuError> {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        let diags = self.forward_in(gpu, &mut enc, x, n_tokens, cache, out, opts)?;
        gpu.flush(&mut enc);
        Ok(diags)
    }

    /// [`GlobalAttn::forward`] recorded into `enc` (submitted by the caller, or here where a
    /// selection sink or the diagnostics need results back: then with what `enc` held before).
    #[allow(clippy::too_many_arguments)]
    pub fn forward_in(
        &self,
        gpu: &Gpu,
        enc: &mut wgpu::CommandEncoder,
        x: &wgpu::Buffer,
        n_tokens: usize,
        cache: &mut GlobalCache,
        out: &wgpu::Buffer,
        opts: &mut ForwardOptions<'_>,
    ) -> Result<Vec<TokenDiagnostics>, GpuError> {
        // Internal scratch goes back to the pool when this layer returns.
        let _scratch = gpu.scratch_scope();
        let t_n = n_tokens;
        let d = self.hidden;
        let dm = self.dims;
        let h = dm.heads;
        if t_n == 0 {
            return Ok(Vec::new());
        }
        if (x.size() as usize) < t_n * d * 4 || (out.size() as usize) < t_n * d * 4 {
            return Err(err(format!("global layer {}: x and out must hold [{t_n}, {d}] f32", self.layer)));
        }
        if self.indexer.is_some() != cache.keys.is_some() {
            return Err(err(format!("global layer {}: cache and layer disagree on the indexer", self.layer)));
        }
        let pos0 = cache.len;
        let n_pos = pos0 + t_n;
        cache.ensure(gpu, n_pos)?;
        let q_w = h * (dm.nope + dm.rope);
        let vo = h * dm.v_dim;
        let r = self.q_a.as_ref().map_or(d, |(w, _)| w.rows());
        let buf = |label: &str, n: usize| gpu.scratch(label, (n * 4) as u64);
        let cq = buf("c_q [T, r]", t_n * r);
        let q = buf("q [T, H*(nope+rope)]", t_n * q_w);
        let kv = buf("kv [T, R+E]", t_n * dm.width());
        let g = match &self.decode_gate {
            Some(DecodeGate(b)) if t_n == 1 => b.clone(),
            _ => buf("gate [T, H*V]", t_n * vo),
        };
        let (ih, id) = self.indexer.as_ref().map_or((1, 8), |i| (i.heads, i.head_dim));
        let qi = buf("qI [T, IH, ID]", t_n * ih * id);
        let ki = buf("kI [T, ID]", t_n * id);
        let wi = buf("wI [T, IH]", t_n * ih);
        let mut prof = opts.profiler.as_deref_mut();
        // Projections of all T tokens at once (one token: the GEMV).
        // Every projection of x in as few dispatches as the GEMV allows (they share x).
        let mut from_x: Vec<(&GpuTensor, &wgpu::Buffer)> = Vec::with_capacity(5);
        if let Some((qa, _)) = &self.q_a {
            from_x.push((qa, &cq));
        }
        from_x.push((&self.kv_a, &kv));
        // Decode: the output gate's projection runs beside the sparse attention instead (see
        // the attention call below).
        let gate_beside = t_n == 1 && super::overlap_enabled();
        if let Some(gp) = self.g_proj.as_ref().filter(|_| !gate_beside) {
            from_x.push((gp, &g));
        }
        if let Some(ix) = &self.indexer {
            from_x.push((&ix.wk, &ki));
            from_x.push((&ix.weights_proj, &wi));
        }
        linear_many(gpu, enc, &from_x, t_n, x, prof.as_deref_mut())?;
        let key_prep = || match (&self.indexer, &cache.keys) {
            (Some(ix), Some(keys)) => Some(dsa::KeyPrep { ki: &ki, gamma: &ix.k_norm_w, beta: &ix.k_norm_b, eps: ix.eps, keys }),
            _ => None,
        };
        // Decode: both cache rows and the query projections of RMSNorm(c_q) in one dispatch
        // where it runs, else c_q's norm and both cache rows in one, the projections after.
        let fused = t_n == 1
            && super::q_with_prep()
            && match &self.q_a {
                Some((_, norm)) => {
                    let index = self.indexer.as_ref().map(|ix| (&ix.wq_b, &qi));
                    let query = dsa::QueryProj { cq: &cq, norm, q_b: &self.q_b, q: &q, index };
                    dsa::global_q_proj(gpu, enc, &query, &kv, &self.kv_a_norm, dm.latent, &cache.latent, key_prep(), self.eps, pos0, prof.as_deref_mut())?
                }
                None => false,
            };
        let prepped = fused || t_n == 1 && {
            let cq_norm = self.q_a.as_ref().map(|(_, norm)| (&cq, r, norm));
            dsa::global_prep(gpu, enc, cq_norm, &kv, &self.kv_a_norm, dm.latent, &cache.latent, key_prep(), self.eps, pos0, prof.as_deref_mut())?
        };
        let q_src = match &self.q_a {
            Some((_, norm)) => {
                if !prepped {
                    dsa::row_norm(gpu, enc, &cq, t_n, r, 0, r, self.eps, norm, None, prof.as_deref_mut())?;
                }
                &cq
            }
            None => x,
        };
        if !fused {
            let mut from_q: Vec<(&GpuTensor, &wgpu::Buffer)> = vec![(&self.q_b, &q)];
            if let Some(ix) = &self.indexer {
                from_q.push((&ix.wq_b, &qi));
            }
            linear_many(gpu, enc, &from_q, t_n, q_src, prof.as_deref_mut())?;
        }
        // Cache rows: normalised latent | raw k_pe, and the LayerNorm'd index key.
        if !prepped {
            dsa::row_norm(gpu, enc, &kv, t_n, dm.width(), 0, dm.latent, self.eps, &self.kv_a_norm, None, prof.as_deref_mut())?;
            cache.latent.write(gpu, enc, &kv, dm.width(), 0, 0, t_n, pos0)?;
            if let (Some(ix), Some(keys)) = (&self.indexer, &cache.keys) {
                dsa::row_norm(gpu, enc, &ki, t_n, id, 0, id, ix.eps, &ix.k_norm_w, Some(&ix.k_norm_b), prof.as_deref_mut())?;
                keys.write(gpu, enc, &ki, id, 0, 0, t_n, pos0)?;
            }
        }
        cache.len = n_pos;
        // One token with an indexer: the absorb needs only q, so it runs beside the indexer
        // (both latency-bound) instead of before it.
        let beside = self.beside.as_ref().filter(|_| t_n == 1 && !opts.diagnostics && cache.keys.is_some() && super::absorb_beside());
        let qa = match beside {
            Some(b) => b.qa.clone(),
            None => {
                let qa = buf("qa [T, H, R+E]", t_n * h * dm.width());
                dsa::mla_absorb(gpu, enc, &dm, &cache.latent, &q, &self.kv_b, &qa, t_n, prof.as_deref_mut())?;
                qa
            }
        };
        let o = buf("o [T, H*V]", t_n * vo);
        let lse = buf("lse [T, H]", t_n * h);
        let gate = self.g_proj.as_ref().map(|_| &g);
        // Query blocks: the scores of one block are [Tb, S].
        let n_sel_max = self.indexer.as_ref().map_or(n_pos, |i| i.topk.min(n_pos));
        let part_budget = PARTIALS_BUDGET.min(gpu.caps.max_binding as usize);
        let mut tb = (SCORE_BUDGET / n_pos).clamp(1, t_n);
        if opts.max_query_block > 0 {
            tb = tb.min(opts.max_query_block);
        }
        if opts.diagnostics {
            tb = 1;
        }
        // Splits shrink as blocks grow (a block's queries fill the GPU themselves).
        while tb > 1 && dsa::partial_bytes_max(&dm, n_sel_max, tb) > part_budget {
            tb = (tb * 3 / 4).max(1);
        }
        let mut diags = Vec::new();
        let part = gpu.scratch("mla partials", dsa::partial_bytes_max(&dm, n_sel_max, tb) as u64);
        // One block covering every query (decode) works on the whole-T buffers in place: no
        // block copies, which would also split the layer's compute passes.
        let single = tb >= t_n;
        let block_buf = |whole: &wgpu::Buffer, label: &str, n: usize| if single { whole.clone() } else { buf(label, n) };
        let qa_b = block_buf(&qa, "qa block", tb * h * dm.width());
        let o_b = block_buf(&o, "o block", tb * vo);
        let g_b = block_buf(&g, "gate block", tb * vo);
        let lse_b = block_buf(&lse, "lse block", tb * h);
        let topk_rows = tb.max(if opts.diagnostics { h } else { 1 });
        let block_topk = match &self.indexer {
            Some(ix) if topk_rows == 1 => {
                cache.ensure_decode_topk(gpu, n_pos, ix.topk)?;
                None
            }
            Some(ix) => Some(TopkScratch::new(gpu, topk_rows, n_pos, ix.topk)?),
            None => None,
        };
        let ix_state = match &self.indexer {
            Some(ix) => {
                // A prefill block's own scratch, else the decode's kept one (made just above).
                let scratch = block_topk.as_ref().or(cache.topk.as_deref()).ok_or_else(|| err(format!("global layer {}: no top-k scratch", self.layer)))?;
                Some((ix, scratch, buf("scores [Tb, S]", tb * n_pos), block_buf(&qi, "qI block", tb * ih * id), block_buf(&wi, "wI block", tb * ih)))
            }
            None => None,
        };
        let sel = buf("sel [Tb, k]", tb * ix_state.as_ref().map_or(1, |s| s.0.topk));
        let sel_score = buf("sel scores [Tb, k]", tb * ix_state.as_ref().map_or(1, |s| s.0.topk));
        let copy_rows = |enc: &mut wgpu::CommandEncoder, src: &wgpu::Buffer, dst: &wgpu::Buffer, row: usize, t0: usize, n: usize, back: bool| {
            if single {
                return;
            }
            let (a, b) = ((t0 * row * 4) as u64, (n * row * 4) as u64);
            if back {
                gpu.copy_buffer(enc, src, 0, dst, a, b);
            } else {
                gpu.copy_buffer(enc, src, a, dst, 0, b);
            }
        };
        let mut t0 = 0;
        while t0 < t_n {
            let nb = tb.min(t_n - t0);
            let qpos = pos0 + t0;
            copy_rows(enc, &qa, &qa_b, h * dm.width(), t0, nb, false);
            if gate.is_some() {
                copy_rows(enc, &g, &g_b, vo, t0, nb, false);
            }
            let sel_arg = match (&ix_state, &cache.keys) {
                (Some((ix, scratch, scores, qi_b, wi_b)), Some(keys)) => {
                    copy_rows(enc, &qi, qi_b, ih * id, t0, nb, false);
                    copy_rows(enc, &wi, wi_b, ih, t0, nb, false);
                    let s_len = qpos + nb;
                    if let Some(b) = beside {
                        // q, the index query and weights and the new key row reach the read
                        // state at this dispatch's barrier; neither the indexer nor the absorb
                        // (into a buffer new to the encoder) then takes one of its own.
                        let key_page = &keys.pages()[keys.locate(pos0).0];
                        crate::ops::copy::touch(gpu, enc, &[&q, qi_b, wi_b, key_page], &b.sink)?;
                    }
                    dsa::index_scores(gpu, enc, keys, ix.heads, opts.index_precision, qi_b, wi_b, scores, nb, qpos, s_len, s_len, prof.as_deref_mut())?;
                    if beside.is_some() {
                        dsa::mla_absorb(gpu, enc, &dm, &cache.latent, &q, &self.kv_b, &qa, t_n, prof.as_deref_mut())?;
                    }
                    // Rank order only for a sink that reads this layer; attention needs the set.
                    if opts.sink.as_ref().is_some_and(|s| s.wants(self.layer)) {
                        dsa::topk(gpu, enc, scratch, scores, s_len, nb, qpos, s_len, &sel, &sel_score, prof.as_deref_mut())?;
                    } else {
                        dsa::topk_set(gpu, enc, scratch, scores, s_len, nb, qpos, s_len, &sel, &sel_score, prof.as_deref_mut())?;
                    }
                    Some((&sel, ix.topk))
                }
                _ => None,
            };
            let gate_b = gate.map(|_| &g_b);
            // The gate GEMV (176 MB for K3.1, memory-bound) needs no barrier after the
            // attention (latency-bound, little memory traffic): the GPU overlaps the two.
            let gate_proj = self.g_proj.as_ref().filter(|_| gate_beside);
            let mut gate_gemv = |enc: &mut wgpu::CommandEncoder| match gate_proj {
                Some(gp) => crate::ops::gemv::gemv(gpu, enc, gp, x, &g, None),
                None => Ok(()),
            };
            let between: Option<dsa::Between> = match gate_proj {
                Some(_) => Some(&mut gate_gemv),
                None => None,
            };
            let variant = dsa::MlaVariant::auto(gpu, &dm)?;
            let (latent, kv_b) = (&cache.latent, &self.kv_b);
            dsa::mla_attention_variant(gpu, enc, variant, &dm, latent, &qa_b, sel_arg, kv_b, gate_b, &part, &o_b, &lse_b, nb, qpos, prof.as_deref_mut(), between)?;
            copy_rows(enc, &o_b, &o, vo, t0, nb, true);
            copy_rows(enc, &lse_b, &lse, h, t0, nb, true);
            let listening = opts.sink.as_ref().is_some_and(|s| s.wants(self.layer)) && sel_arg.is_some();
            // Selections go through staging buffers: held by the caller until its own readback,
            // or (no caller holder) delivered right after this block's submission.
            let mut own = DeferredSelections::default();
            if let (true, Some((_, k))) = (listening, sel_arg) {
                let bytes = (nb * k * 4) as u64;
                let staging = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                    label: Some("selection staging"),
                    size: 2 * bytes,
                    usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
                    mapped_at_creation: false,
                });
                gpu.copy_buffer(enc, &sel, 0, &staging, 0, bytes);
                gpu.copy_buffer(enc, &sel_score, 0, &staging, bytes, bytes);
                let holder = match opts.deferred.as_deref_mut() {
                    Some(d) => d,
                    None => &mut own,
                };
                holder.pending.push(PendingBlock { layer: self.layer, first_position: qpos, queries: nb, k, staging });
            }
            let deliver_now = !own.pending.is_empty();
            if deliver_now || (opts.diagnostics && sel_arg.is_some()) {
                gpu.flush(enc);
            }
            if let (true, Some(sink)) = (deliver_now, opts.sink.as_deref_mut()) {
                own.deliver(gpu, sink)?;
            }
            if let (true, Some((ix, scratch, ..))) = (opts.diagnostics, &ix_state) {
                diags.push(self.diagnose(gpu, cache, &qa_b, &sel, ix.topk, scratch, &part, qpos)?);
            }
            t0 += nb;
        }
        linear(gpu, enc, &self.o_proj, t_n, &o, out, prof)?;
        Ok(diags)
    }

    /// Dense vs sparse attention for one query at `qpos` (qa holds its [H, R+E] row and sel
    /// its selection): omitted mass, output error and the indexer's recall, per head.
    #[allow(clippy::too_many_arguments)]
    fn diagnose(
        &self,
        gpu: &Gpu,
        cache: &GlobalCache,
        qa: &wgpu::Buffer,
        sel: &wgpu::Buffer,
        k: usize,
        scratch: &TopkScratch,
        part: &wgpu::Buffer,
        qpos: usize,
    ) -> Result<TokenDiagnostics, GpuError> {
        let dm = self.dims;
        let h = dm.heads;
        let n_pos = qpos + 1;
        let vo = h * dm.v_dim;
        let buf = |label: &str, n: usize| gpu.storage(label, (n * 4) as u64);
        let (o_s, l_s, o_d, l_d) = (buf("o sparse", vo), buf("lse sparse", h), buf("o dense", vo), buf("lse dense", h));
        let part_d = gpu.storage("dense partials", dsa::partial_bytes_max(&dm, n_pos, 1) as u64);
        let logits = buf("logits [H, S]", h * n_pos);
        let (asel, ascore) = (buf("attn top-k", h * k), buf("attn top-k scores", h * k));
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        dsa::mla_attention(gpu, &mut enc, &dm, &cache.latent, qa, Some((sel, k)), &self.kv_b, None, part, &o_s, &l_s, 1, qpos, None)?;
        dsa::mla_attention(gpu, &mut enc, &dm, &cache.latent, qa, None, &self.kv_b, None, &part_d, &o_d, &l_d, 1, qpos, None)?;
        dsa::mla_logits(gpu, &mut enc, &dm, &cache.latent, qa, &logits, 1, qpos, n_pos, None)?;
        // Every head row is fully valid: pos0 = n_pos makes valid = n_pos for all rows.
        dsa::topk_set(gpu, &mut enc, scratch, &logits, n_pos, h, n_pos, n_pos, &asel, &ascore, None)?;
        gpu.flush(&mut enc);
        let (os, ls, od, ld): (Vec<f32>, Vec<f32>, Vec<f32>, Vec<f32>) =
            (gpu.read(&o_s, vo)?, gpu.read(&l_s, h)?, gpu.read(&o_d, vo)?, gpu.read(&l_d, h)?);
        let chosen: Vec<i32> = gpu.read(sel, k)?;
        let attn_top: Vec<i32> = gpu.read(&asel, h * k)?;
        let k_eff = k.min(n_pos);
        let chosen: std::collections::HashSet<i32> = chosen[..k_eff].iter().copied().collect();
        let heads = (0..h)
            .map(|i| {
                let (ys, yd) = (&os[i * dm.v_dim..(i + 1) * dm.v_dim], &od[i * dm.v_dim..(i + 1) * dm.v_dim]);
                let e = ys.iter().zip(yd).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>().sqrt();
                let nd = yd.iter().map(|b| (*b as f64).powi(2)).sum::<f64>().sqrt();
                let top = &attn_top[i * k..i * k + k_eff];
                let hit = top.iter().filter(|p| chosen.contains(p)).count();
                HeadDiagnostics {
                    omitted_mass: (1.0 - ((ls[i] - ld[i]) as f64).exp()).max(0.0) as f32,
                    err: e as f32,
                    rel_err: if nd > 0.0 { (e / nd) as f32 } else { 0.0 },
                    recall: hit as f32 / k_eff.max(1) as f32,
                }
            })
            .collect();
        Ok(TokenDiagnostics { layer: self.layer, position: qpos, heads })
    }
}

/// Mean and worst value of each diagnostic per head over tokens (the per-layer report).
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct DiagnosticsSummary {
    pub layer: usize,
    pub tokens: usize,
    pub mean: Vec<HeadDiagnostics>,
    /// Largest omitted mass / errors, smallest recall.
    pub worst: Vec<HeadDiagnostics>,
}

pub fn summarize(layer: usize, tokens: &[TokenDiagnostics]) -> DiagnosticsSummary {
    let h = tokens.first().map_or(0, |t| t.heads.len());
    let n = tokens.len().max(1) as f32;
    let mut mean = vec![HeadDiagnostics::default(); h];
    let mut worst = vec![HeadDiagnostics { recall: 1.0, ..Default::default() }; h];
    for t in tokens {
        for (i, d) in t.heads.iter().enumerate().take(h) {
            mean[i].omitted_mass += d.omitted_mass / n;
            mean[i].err += d.err / n;
            mean[i].rel_err += d.rel_err / n;
            mean[i].recall += d.recall / n;
            worst[i].omitted_mass = worst[i].omitted_mass.max(d.omitted_mass);
            worst[i].err = worst[i].err.max(d.err);
            worst[i].rel_err = worst[i].rel_err.max(d.rel_err);
            worst[i].recall = worst[i].recall.min(d.recall);
        }
    }
    DiagnosticsSummary { layer, tokens: tokens.len(), mean, worst }
}
