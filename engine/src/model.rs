//! The model graph: embeddings, the layer schedule with Block AttnRes bookkeeping (spec 3.2)
//! or plain residuals (Kimi Linear), the final norm and the head. The only place that knows
//! the order of layers.

use crate::checkpoint::{Checkpoint, TensorView};
use crate::config::{Mixer, ModelConfig};
use crate::gpu::{Gpu, GpuError, GpuTensor, Profiler};
use crate::layers::global_attn::{DeferredSelections, ForwardOptions, GlobalAttn, TokenDiagnostics};
use crate::layers::bf16_bytes;
use crate::layers::kda::KdaLayer;
use crate::ops::attn_res::{attn_res_norm, Query, Sources};
use crate::ops::{embed::embed, linear::linear, norm::rms_norm};
use crate::session::Session;
use crate::trace::SelectionSink;
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error(transparent)]
    Gpu(#[from] GpuError),
    #[error("{0}")]
    Input(String),
}

/// A feed-forward block on the GPU: out [T, d] = ffn(x [T, d]), or out += ffn(x) with
/// `accumulate` (the residual sum in the block's last kernels, no separate add pass).
pub trait FeedForward: Send + Sync {
    #[allow(clippy::too_many_arguments)]
    fn forward(
        &self,
        gpu: &Gpu,
        enc: &mut wgpu::CommandEncoder,
        x: &wgpu::Buffer,
        tokens: usize,
        out: &wgpu::Buffer,
        accumulate: bool,
        profiler: Option<&mut Profiler>,
    ) -> Result<(), GpuError>;
}

// A few hundred bytes either way, one per layer: not worth a box.
#[allow(clippy::large_enum_variant)]
pub enum MixerWeights {
    Kda(KdaLayer),
    Global(GlobalAttn),
}

/// AttnRes pseudo-query of one aggregation point: norm weight and projection, both [d] bf16.
pub struct ResQuery {
    gamma: wgpu::Buffer,
    proj: wgpu::Buffer,
}

impl ResQuery {
    fn query(&self) -> Query<'_> {
        Query { gamma: &self.gamma, proj: &self.proj }
    }
}

pub struct Layer {
    pub index: usize,
    input_norm: wgpu::Buffer,
    post_attention_norm: wgpu::Buffer,
    /// (attention side, MLP side) when the model uses Block AttnRes.
    res: Option<(ResQuery, ResQuery)>,
    pub mixer: MixerWeights,
    pub ffn: Box<dyn FeedForward>,
}

pub struct Model {
    pub gpu: Arc<Gpu>,
    pub config: ModelConfig,
    embed: GpuTensor,
    pub layers: Vec<Layer>,
    norm: wgpu::Buffer,
    output_res: Option<ResQuery>,
    lm_head: GpuTensor,
    /// Largest context a session of this model may hold.
    pub max_context: usize,
    /// The global layers' indexer query precision (f32 by default; bf16 as the reference
    /// model rounds it).
    pub index_precision: crate::ops::dsa::IndexPrecision,
}

/// What a forward pass returns logits for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LogitsFor {
    /// Only the last token (generation).
    Last,
    /// Every token (scoring).
    All,
}

/// Optional observers of a forward pass.
#[derive(Default)]
pub struct Hooks<'a> {
    pub sink: Option<&'a mut dyn SelectionSink>,
    /// Omitted-mass diagnostics of the sparse global layers.
    pub diagnostics: bool,
    pub profiler: Option<&'a mut Profiler>,
}

/// Whether the forward submits what it recorded after layer `l`: after the first layer, so the
/// GPU starts while the host records on, then every LAYERS_PER_SUBMIT layers. Each queue
/// submission cost the H200 ~12-34 us of GPU time between the layers around it (docs/perf.md:
/// ~1.7 ms per K3.1 token at one per layer), and the host records a layer in about half the
/// time the GPU runs it, so batches of 4 keep the GPU fed. `K31_LAYERS_PER_SUBMIT=N` sets the
/// batch (experiments; 1: a submission per layer).
fn submit_after(l: usize) -> bool {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let n = *N.get_or_init(|| std::env::var("K31_LAYERS_PER_SUBMIT").ok().and_then(|v| v.parse().ok()).filter(|&n| n > 0).unwrap_or(LAYERS_PER_SUBMIT));
    l == 0 || (l + 1).is_multiple_of(n)
}
const LAYERS_PER_SUBMIT: usize = 4;

/// Output of one forward call.
pub struct Forward {
    /// [rows, vocab] f32: one row per token (All) or the last token's (Last).
    pub logits: Vec<f32>,
    pub diagnostics: Vec<TokenDiagnostics>,
    /// GPU memory reserved while this pass's buffers were alive (when profiling and the
    /// backend reports it).
    pub gpu_reserved_bytes: Option<u64>,
    /// Seconds the host spent recording and submitting this pass (up to the logits
    /// readback): when it approaches the wall time, decode is host-bound.
    pub host_record_s: f64,
}

/// Builds the FFN of a layer (the MoE / dense MLP owners provide this).
pub type FfnLoader = dyn for<'c> Fn(&Gpu, &ModelConfig, usize, &dyn Fn(&str) -> Option<TensorView<'c>>) -> Result<Box<dyn FeedForward>, GpuError>;

impl Model {
    /// Uploads every weight of a validated checkpoint. `progress(done, total)` counts layers.
    pub fn load(
        gpu: Arc<Gpu>,
        ck: &Checkpoint,
        max_context: usize,
        ffn_loader: &FfnLoader,
        mut progress: impl FnMut(usize, usize),
    ) -> Result<Model, ModelError> {
        let cfg = ck.config.clone();
        let g = &*gpu;
        let need = |name: &str| ck.tensor(name).ok_or_else(|| GpuError::Shape(format!("missing tensor `{name}`")));
        let upload = |name: &str| -> Result<GpuTensor, GpuError> {
            let v = need(name)?;
            GpuTensor::upload(g, name, v.dtype, v.shape, v.data, None)
        };
        // Norm-like vectors as bf16 (the norm and AttnRes kernels read bf16).
        let vector = |name: &str| -> Result<wgpu::Buffer, GpuError> { Ok(g.storage_from(name, &bf16_bytes(&need(name)?, name)?)) };
        let res_query = |prefix: &str| -> Result<ResQuery, GpuError> {
            Ok(ResQuery { gamma: vector(&format!("{prefix}_res_norm.weight"))?, proj: vector(&format!("{prefix}_res_proj.weight"))? })
        };
        let attn_res = cfg.attn_res_block_size.is_some();
        let embed = upload("model.embed_tokens.weight")?;
        let mut layers = Vec::with_capacity(cfg.num_layers());
        let total = cfg.num_layers() + 2;
        progress(1, total);
        for (l, spec) in cfg.layers.iter().enumerate() {
            let p = format!("model.layers.{l}.");
            let mixer = match spec.mixer {
                Mixer::Kda => MixerWeights::Kda(KdaLayer::from_checkpoint(g, ck, l)?),
                Mixer::Global => {
                    let prefix = format!("{p}self_attn.");
                    let lookup = |n: &str| ck.tensor(&format!("{prefix}{n}"));
                    MixerWeights::Global(GlobalAttn::load(g, &cfg, l, &lookup)?)
                }
            };
            let lookup = |n: &str| ck.tensor(&format!("{p}{n}"));
            let ffn = ffn_loader(g, &cfg, l, &lookup)?;
            let res = if attn_res {
                Some((res_query(&format!("{p}self_attention"))?, res_query(&format!("{p}mlp"))?))
            } else {
                None
            };
            layers.push(Layer {
                index: l,
                input_norm: vector(&format!("{p}input_layernorm.weight"))?,
                post_attention_norm: vector(&format!("{p}post_attention_layernorm.weight"))?,
                res,
                mixer,
                ffn,
            });
            progress(l + 2, total);
        }
        let output_res = if attn_res { Some(res_query("model.output_attn")?) } else { None };
        let model = Model {
            norm: vector("model.norm.weight")?,
            output_res,
            lm_head: upload("lm_head.weight")?,
            embed,
            layers,
            config: cfg,
            gpu: gpu.clone(),
            max_context,
            index_precision: Default::default(),
        };
        progress(total, total);
        Ok(model)
    }

    pub fn new_session(&self) -> Result<Session, ModelError> {
        Ok(Session::new(&self.gpu, &self.config, self.max_context)?)
    }

    /// Runs `tokens` through the model at the session's position, advancing the session.
    /// Long inputs should come in chunks (see `plan::PREFILL_CHUNK`); every chunk sees the
    /// state the previous chunks left.
    pub fn forward(
        &self,
        session: &mut Session,
        tokens: &[u32],
        want: LogitsFor,
        hooks: &mut Hooks<'_>,
    ) -> Result<Forward, ModelError> {
        let cfg = &self.config;
        let t = tokens.len();
        if t == 0 {
            return Err(ModelError::Input("no tokens to run: the input is empty".into()));
        }
        if let Some(&bad) = tokens.iter().find(|&&id| id as usize >= cfg.vocab_size) {
            return Err(ModelError::Input(format!("token id {bad} is outside the vocabulary of {}", cfg.vocab_size)));
        }
        if session.position + t > self.max_context {
            return Err(ModelError::Input(format!(
                "{} tokens at position {} exceed the context of {} tokens",
                t, session.position, self.max_context
            )));
        }
        let g = &*self.gpu;
        let started = std::time::Instant::now();
        let d = cfg.hidden_size;
        let td = t * d;
        g.begin_frame();
        let buf = |label: &str| g.scratch(label, (td * 4) as u64);
        let ids = g.storage_from("token ids", tokens);
        // The residual stream rotates through three buffers: a layer's carry, its mixer output
        // and its partial sum (into which the FFN adds); the partial becomes the next carry.
        let stream = [buf("residual a"), buf("residual b"), buf("residual c")];
        let normed = buf("normed");
        // Bank of completed blocks, [n, T, d]: the embedding plus one entry per block boundary.
        let block = cfg.attn_res_block_size.unwrap_or(usize::MAX);
        let bank_cap = if cfg.attn_res_block_size.is_some() { cfg.num_layers().div_ceil(block) + 1 } else { 0 };
        let bank = g.scratch("attn-res bank", (bank_cap.max(1) * td * 4) as u64);
        let alpha = g.scratch("attn-res weights", (crate::ops::attn_res::alpha_len(t, d, bank_cap + 1) * 4) as u64);
        let eps = cfg.rms_norm_eps;
        let mut prof = hooks.profiler.take();
        let mut diagnostics = Vec::new();
        let mut deferred = DeferredSelections::default();

        let mut enc = g.device.create_command_encoder(&Default::default());
        // Dispatches share compute passes (a pass each costs the GPU ~4.6 us); copies go
        // through `Gpu::copy_buffer`, which ends the open one first.
        let _batch = g.batch_passes();
        if let Some(p) = prof.as_deref_mut() {
            p.enter(g, &mut enc, Some("embed".into()));
        }
        let mut carry_at = 0usize;
        embed(g, &mut enc, &self.embed, t, &ids, &stream[0], prof.as_deref_mut())?;
        let mut n_bank = 0usize;
        let sources = |n_bank: usize, cur, add| Sources { bank: &bank, n_bank, bank_stride: td, cur, add };
        for layer in &self.layers {
            let l = layer.index;
            let kind = match layer.mixer {
                MixerWeights::Kda(_) => "kda",
                MixerWeights::Global(_) => "global",
            };
            if let Some(p) = prof.as_deref_mut() {
                p.enter(g, &mut enc, Some(format!("layer{l}.mixer.{kind}")));
            }
            let carry = &stream[carry_at];
            let mixed = &stream[(carry_at + 1) % 3];
            // Attention-side input (spec 3.2), normed.
            match &layer.res {
                Some((q, _)) if n_bank > 0 => {
                    attn_res_norm(g, &mut enc, t, d, eps, sources(n_bank, carry, None), q.query(), &layer.input_norm, &normed, &alpha, prof.as_deref_mut())?
                }
                _ => rms_norm(g, &mut enc, t, d, eps, carry, &layer.input_norm, &normed, prof.as_deref_mut())?,
            }
            let boundary = layer.res.is_some() && l % block == 0;
            if boundary {
                g.copy_buffer(&mut enc, carry, 0, &bank, (n_bank * td * 4) as u64, (td * 4) as u64);
                n_bank += 1;
            }
            match &layer.mixer {
                MixerWeights::Kda(k) => {
                    let st = session.kda_state(l)?;
                    k.forward(g, &mut enc, &normed, t, st, mixed, prof.as_deref_mut())?;
                }
                MixerWeights::Global(ga) => {
                    let cache = session.global_cache(l)?;
                    let mut opts = ForwardOptions {
                        sink: crate::trace::reborrow(&mut hooks.sink),
                        diagnostics: hooks.diagnostics,
                        profiler: prof.as_deref_mut(),
                        deferred: Some(&mut deferred),
                        index_precision: self.index_precision,
                        ..Default::default()
                    };
                    diagnostics.extend(ga.forward_in(g, &mut enc, &normed, t, cache, mixed, &mut opts)?);
                }
            }
            // The partial: a at a block start, else carry + a (written by the MLP-side pass);
            // without AttnRes the residual carry + a, normed in the same pass (no bank).
            let (part_at, part_sources) = if boundary {
                ((carry_at + 1) % 3, sources(n_bank, mixed, None))
            } else {
                let part_at = (carry_at + 2) % 3;
                let bank_now = if layer.res.is_some() { n_bank } else { 0 };
                (part_at, sources(bank_now, carry, Some((mixed, &stream[part_at]))))
            };
            let query = match &layer.res {
                Some((_, q)) => q.query(),
                // Unused with an empty bank (one source, weight 1).
                None => Query { gamma: &layer.post_attention_norm, proj: &layer.post_attention_norm },
            };
            attn_res_norm(g, &mut enc, t, d, eps, part_sources, query, &layer.post_attention_norm, &normed, &alpha, prof.as_deref_mut())?;
            if let Some(p) = prof.as_deref_mut() {
                p.enter(g, &mut enc, Some(format!("layer{l}.ffn.{}", match cfg.layers[l].ffn {
                    crate::config::Ffn::Dense => "dense",
                    crate::config::Ffn::Moe => "moe",
                })));
            }
            // The FFN adds into the partial, which becomes the next layer's carry.
            layer.ffn.forward(g, &mut enc, &normed, t, &stream[part_at], true, prof.as_deref_mut())?;
            carry_at = part_at;
            // Hand layers to the GPU while the CPU records the next ones (one submission per
            // token serialised the two), but not every layer: see `submit_after`.
            if submit_after(l) {
                g.flush(&mut enc);
            }
        }
        let carry = &stream[carry_at];
        if let Some(p) = prof.as_deref_mut() {
            p.enter(g, &mut enc, Some("head".into()));
        }
        match &self.output_res {
            Some(q) => attn_res_norm(g, &mut enc, t, d, eps, sources(n_bank, carry, None), q.query(), &self.norm, &normed, &alpha, prof.as_deref_mut())?,
            None => rms_norm(g, &mut enc, t, d, eps, carry, &self.norm, &normed, prof.as_deref_mut())?,
        }
        let vocab = cfg.vocab_size;
        let rows = match want {
            LogitsFor::All => t,
            LogitsFor::Last => 1,
        };
        let head_in = if rows == t {
            normed
        } else {
            let last = g.scratch("last hidden", (d * 4) as u64);
            g.copy_buffer(&mut enc, &normed, ((t - 1) * d * 4) as u64, &last, 0, (d * 4) as u64);
            last
        };
        let logits = g.scratch("logits", (rows * vocab * 4) as u64);
        linear(g, &mut enc, &self.lm_head, rows, &head_in, &logits, prof.as_deref_mut())?;
        if let Some(p) = prof.as_deref_mut() {
            p.end_span(g, &mut enc);
        }
        g.flush(&mut enc);
        let host_record_s = started.elapsed().as_secs_f64();
        let logits: Vec<f32> = g.read(&logits, rows * vocab)?;
        if let Some(sink) = hooks.sink.as_mut() {
            deferred.deliver(g, &mut **sink)?;
        }
        let mut gpu_reserved_bytes = None;
        if let Some(p) = prof.as_deref_mut() {
            p.set_scope(None);
            p.collect(g)?;
            gpu_reserved_bytes = g.device.generate_allocator_report().map(|r| r.total_reserved_bytes);
        }
        session.advance(tokens);
        hooks.profiler = prof;
        Ok(Forward { logits, diagnostics, gpu_reserved_bytes, host_record_s })
    }
}
