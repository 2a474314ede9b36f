//! One KDA layer (spec 4.2): projections, short conv, gates, delta-rule recurrence (fused
//! decode for one token, chunked WY/UT prefill otherwise), gated RMSNorm, o_proj.
//! The per-sequence state lives in [`KdaState`], owned by the caller (the session), so it
//! can be snapshotted and restored.

use crate::checkpoint::{Checkpoint, TensorView};
use crate::config::{KdaConfig, KdaOutputGate};
use crate::gpu::{Gpu, GpuError, GpuTensor, Profiler};
use crate::ops::linear::{linear, linear_many};
use crate::ops::kda::{self, ChunkScratch, KdaGeom, KdaInputs, Prepped};

/// Output-gate projection(s).
pub enum OutputGate {
    FullRank { g_proj: GpuTensor },
    LowRank { g_a: GpuTensor, g_b: GpuTensor },
}

/// Weights of one KDA layer on the GPU, projections in their checkpoint dtype.
pub struct KdaLayer {
    pub geom: KdaGeom,
    pub hidden: usize,
    /// [3P, d]: q_proj | k_proj | v_proj stacked so one product gives the conv input.
    qkv_proj: GpuTensor,
    /// [3P, W] f32 conv taps (q | k | v).
    conv_w: wgpu::Buffer,
    f_a: GpuTensor,
    f_b: GpuTensor,
    dt_bias: wgpu::Buffer,
    a_log: wgpu::Buffer,
    b_proj: GpuTensor,
    gate: OutputGate,
    /// [V] f32 (128 values: widened once instead of a bf16 variant of the norm kernel).
    o_norm: wgpu::Buffer,
    o_proj: GpuTensor,
    /// Longest prefill run in one piece; longer ones run as consecutive pieces (the chunk
    /// scratch must fit one storage binding). A multiple of the 64-token chunk.
    pub max_prefill_tokens: usize,
}

/// Prefill pieces are capped here to bound the scratch memory (~1.6 GB at K3.1 shapes).
const PREFILL_PIECE: usize = 8192;

/// Largest multiple of the chunk whose scratch buffers each fit one binding.
fn max_piece(gpu: &Gpu, geom: &KdaGeom, hidden: usize) -> usize {
    let (p, k, h) = (geom.proj() as u64, geom.head_dim as u64, geom.heads as u64);
    let per_token = (3 * p).max(hidden as u64) * 4;
    let per_chunk = h * k * k * 4;
    let limit = gpu.caps.max_binding;
    let by_rows = limit / per_token;
    let by_states = (limit / per_chunk) * kda::CHUNK as u64;
    let t = by_rows.min(by_states).min(PREFILL_PIECE as u64) as usize;
    (t / kda::CHUNK * kda::CHUNK).max(kda::CHUNK)
}

/// Per-sequence state of one KDA layer: the recurrent state, the conv ring and the position.
pub struct KdaState {
    /// [H, K, V] f32, rows = key channels.
    pub state: wgpu::Buffer,
    /// [W, 3P] f32: pre-conv input of position a in slot a % W.
    pub ring: wgpu::Buffer,
    /// Tokens seen so far.
    pub pos: u64,
    geom: KdaGeom,
}

/// Host copy of a [`KdaState`].
#[derive(Clone, Debug, PartialEq)]
pub struct KdaSnapshot {
    pub state: Vec<f32>,
    pub ring: Vec<f32>,
    pub pos: u64,
}

impl KdaState {
    /// Sequence start: zero state and window.
    pub fn new(gpu: &Gpu, geom: &KdaGeom) -> KdaState {
        let k = geom.head_dim;
        KdaState {
            state: gpu.storage("kda state", (geom.heads * k * k * 4) as u64),
            ring: gpu.storage("kda conv ring", (geom.taps * 3 * geom.proj() * 4) as u64),
            pos: 0,
            geom: *geom,
        }
    }

    fn lens(&self) -> (usize, usize) {
        let k = self.geom.head_dim;
        (self.geom.heads * k * k, self.geom.taps * 3 * self.geom.proj())
    }

    /// Bytes of the state and of the window (the buffers may be padded past them).
    pub(crate) fn byte_lens(&self) -> (usize, usize) {
        let (ns, nr) = self.lens();
        (ns * 4, nr * 4)
    }

    pub fn snapshot(&self, gpu: &Gpu) -> Result<KdaSnapshot, GpuError> {
        let (ns, nr) = self.lens();
        Ok(KdaSnapshot { state: gpu.read(&self.state, ns)?, ring: gpu.read(&self.ring, nr)?, pos: self.pos })
    }

    pub fn restore(&mut self, gpu: &Gpu, snap: &KdaSnapshot) -> Result<(), GpuError> {
        self.restore_bytes(gpu, bytemuck::cast_slice(&snap.state), bytemuck::cast_slice(&snap.ring), snap.pos)
    }

    /// Whether state and window bytes of these sizes fit this layer.
    pub fn check_bytes(&self, state: usize, ring: usize) -> Result<(), GpuError> {
        let (ns, nr) = self.lens();
        if state != ns * 4 || ring != nr * 4 {
            return Err(GpuError::Shape(format!(
                "kda restore: snapshot has {} state / {} window values, this layer needs {ns} / {nr}",
                state / 4,
                ring / 4
            )));
        }
        Ok(())
    }

    /// Restores from the f32 bytes of the state and the window.
    pub fn restore_bytes(&mut self, gpu: &Gpu, state: &[u8], ring: &[u8], pos: u64) -> Result<(), GpuError> {
        self.check_bytes(state.len(), ring.len())?;
        gpu.queue.write_buffer(&self.state, 0, state);
        gpu.queue.write_buffer(&self.ring, 0, ring);
        self.pos = pos;
        Ok(())
    }
}

impl KdaLayer {
    /// Loads layer `layer` (0-based) of a checkpoint.
    pub fn from_checkpoint(gpu: &Gpu, ckpt: &Checkpoint, layer: usize) -> Result<KdaLayer, GpuError> {
        let cfg = ckpt.config.kda.as_ref().ok_or_else(|| GpuError::Shape("kda: the config has no KDA layers".into()))?;
        let prefix = format!("model.layers.{layer}.self_attn.");
        Self::from_tensors(gpu, cfg, ckpt.config.hidden_size, &prefix, |n| ckpt.tensor(n))
    }

    /// Builds the layer from named tensors (`prefix` + `q_proj.weight` ...).
    pub fn from_tensors<'a>(
        gpu: &Gpu,
        cfg: &KdaConfig,
        hidden: usize,
        prefix: &str,
        get: impl Fn(&str) -> Option<TensorView<'a>>,
    ) -> Result<KdaLayer, GpuError> {
        let geom = KdaGeom { heads: cfg.num_heads, head_dim: cfg.head_dim, taps: cfg.conv_kernel, gate: cfg.gate, post_conv: false };
        geom.check()?;
        let (p, k, h) = (geom.proj(), geom.head_dim, geom.heads);
        let view = |n: &str, numel: usize| -> Result<TensorView<'a>, GpuError> {
            let name = format!("{prefix}{n}");
            let v = get(&name).ok_or_else(|| GpuError::Shape(format!("kda: checkpoint has no tensor {name}")))?;
            let have: usize = v.shape.iter().product();
            if have != numel {
                return Err(GpuError::Shape(format!("kda: {name} has shape {:?}, expected {numel} values", v.shape)));
            }
            Ok(v)
        };
        let matrix = |n: &str, rows: usize, cols: usize| -> Result<GpuTensor, GpuError> {
            let v = view(n, rows * cols)?;
            GpuTensor::upload(gpu, &format!("{prefix}{n}"), v.dtype, &[rows, cols], v.data, None)
        };
        let small = |n: &str, numel: usize| -> Result<wgpu::Buffer, GpuError> {
            let v = view(n, numel)?;
            Ok(gpu.storage_from(n, &super::floats(&v, n)?))
        };
        let (q, kk, v) = (view("q_proj.weight", p * hidden)?, view("k_proj.weight", p * hidden)?, view("v_proj.weight", p * hidden)?);
        if q.dtype != kk.dtype || q.dtype != v.dtype {
            return Err(GpuError::Shape(format!("kda: {prefix}q/k/v_proj must share one dtype")));
        }
        let qkv_bytes = [q.data, kk.data, v.data].concat();
        let qkv_proj = GpuTensor::upload(gpu, &format!("{prefix}qkv_proj"), q.dtype, &[3 * p, hidden], &qkv_bytes, None)?;
        let mut conv = Vec::with_capacity(3 * p * geom.taps);
        for n in ["q_conv1d.weight", "k_conv1d.weight", "v_conv1d.weight"] {
            conv.extend(super::floats(&view(n, p * geom.taps)?, n)?);
        }
        // A_log may be stored as [H], [1,1,H,1] or longer (spec Q5): the first H values.
        let a_log_view = get(&format!("{prefix}A_log")).ok_or_else(|| GpuError::Shape(format!("kda: no tensor {prefix}A_log")))?;
        let a_log = super::floats(&a_log_view, "A_log")?;
        if a_log.len() < h {
            return Err(GpuError::Shape(format!("kda: {prefix}A_log has {} values, needs {h}", a_log.len())));
        }
        let gate = match cfg.output_gate {
            KdaOutputGate::FullRank => OutputGate::FullRank { g_proj: matrix("g_proj.weight", p, hidden)? },
            KdaOutputGate::LowRank => {
                OutputGate::LowRank { g_a: matrix("g_a_proj.weight", k, hidden)?, g_b: matrix("g_b_proj.weight", p, k)? }
            }
        };
        Ok(KdaLayer {
            geom,
            hidden,
            qkv_proj,
            conv_w: gpu.storage_from("kda conv", &conv),
            f_a: matrix("f_a_proj.weight", k, hidden)?,
            f_b: matrix("f_b_proj.weight", p, k)?,
            dt_bias: small("dt_bias", p)?,
            a_log: gpu.storage_from("A_log", &a_log[..h]),
            b_proj: matrix("b_proj.weight", h, hidden)?,
            gate,
            o_norm: small("o_norm.weight", k)?,
            o_proj: matrix("o_proj.weight", hidden, p)?,
            max_prefill_tokens: max_piece(gpu, &geom, hidden),
        })
    }

    /// out [T, d] = layer(x [T, d]), advancing `st`. One token runs the fused decode kernel;
    /// more run the chunked prefill (never token by token).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        gpu: &Gpu,
        enc: &mut wgpu::CommandEncoder,
        x: &wgpu::Buffer,
        t_len: usize,
        st: &mut KdaState,
        out: &wgpu::Buffer,
        mut prof: Option<&mut Profiler>,
    ) -> Result<(), GpuError> {
        let d = self.hidden;
        let piece = self.max_prefill_tokens.max(1);
        if t_len <= piece {
            return self.forward_piece(gpu, enc, x, t_len, st, out, prof);
        }
        if x.size() < (t_len * d * 4) as u64 || out.size() < (t_len * d * 4) as u64 {
            return Err(GpuError::Shape(format!("kda layer: x and out must hold [{t_len}, {d}] f32")));
        }
        // Long prompts: consecutive pieces through staging rows; the state carries over.
        let xs = gpu.storage("kda piece x", (piece * d * 4) as u64);
        let os = gpu.storage("kda piece out", (piece * d * 4) as u64);
        let mut at = 0;
        while at < t_len {
            let n = piece.min(t_len - at);
            let (off, bytes) = ((at * d * 4) as u64, (n * d * 4) as u64);
            gpu.copy_buffer(enc, x, off, &xs, 0, bytes);
            self.forward_piece(gpu, enc, &xs, n, st, &os, prof.as_deref_mut())?;
            gpu.copy_buffer(enc, &os, 0, out, off, bytes);
            at += n;
        }
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    fn forward_piece(
        &self,
        gpu: &Gpu,
        enc: &mut wgpu::CommandEncoder,
        x: &wgpu::Buffer,
        t_len: usize,
        st: &mut KdaState,
        out: &wgpu::Buffer,
        mut prof: Option<&mut Profiler>,
    ) -> Result<(), GpuError> {
        // Internal scratch goes back to the pool when this layer returns.
        let _scratch = gpu.scratch_scope();
        let (g, d) = (&self.geom, self.hidden);
        let (p, k, h) = (g.proj(), g.head_dim, g.heads);
        if t_len == 0 || x.size() < (t_len * d * 4) as u64 || out.size() < (t_len * d * 4) as u64 {
            return Err(GpuError::Shape(format!("kda layer: x and out must hold [{t_len}, {d}] f32 with T >= 1")));
        }
        let buf = |label: &str, n: usize| gpu.scratch(label, (n * 4) as u64);
        let qkv = buf("kda qkv", t_len * 3 * p);
        let fa = buf("kda f_a", t_len * k);
        let f = buf("kda f", t_len * p);
        let b = buf("kda b", t_len * h);
        let gl = buf("kda gate", t_len * p);
        let y = buf("kda y", t_len * p);
        // The gate's first matrix reads x: g_proj straight into the gate logits, or g_a into
        // the low-rank intermediate that g_b maps to them.
        let (gate_w, gate_out) = match &self.gate {
            OutputGate::FullRank { g_proj } => (g_proj, gl.clone()),
            OutputGate::LowRank { g_a, .. } => (g_a, buf("kda g_a", t_len * k)),
        };
        // Everything that reads x: one dispatch per four matrices when decoding.
        linear_many(gpu, enc, &[(&self.qkv_proj, &qkv), (&self.f_a, &fa), (&self.b_proj, &b), (gate_w, &gate_out)], t_len, x, prof.as_deref_mut())?;
        // Decode: f_b's product, the recurrence and the gated norm in one dispatch where it fits.
        let one_dispatch = t_len == 1 && kda::gated_fits(gpu, g, &self.f_b);
        if !one_dispatch {
            linear(gpu, enc, &self.f_b, t_len, &fa, &f, prof.as_deref_mut())?;
        }
        if let OutputGate::LowRank { g_b, .. } = &self.gate {
            linear(gpu, enc, g_b, t_len, &gate_out, &gl, prof.as_deref_mut())?;
        }
        let inp = KdaInputs { qkv: &qkv, f: &f, b: &b, conv_w: &self.conv_w, a_log: &self.a_log, dt_bias: &self.dt_bias };
        if one_dispatch {
            let fb = kda::GateLowRank { w_fb: &self.f_b, f_a: &fa };
            kda::decode_gated(gpu, enc, g, st.pos, &inp, fb, &st.ring, &st.state, &gl, &self.o_norm, &y, prof.as_deref_mut())?;
            touch_pages(gpu, enc, &self.o_proj)?;
        } else {
            let o = buf("kda o", t_len * p);
            if t_len == 1 {
                kda::decode(gpu, enc, g, st.pos, &inp, &st.ring, &st.state, &o, prof.as_deref_mut())?;
            } else {
                let pre = Prepped::new(gpu, g, t_len);
                let scratch = ChunkScratch::new(gpu, g, t_len)?;
                kda::prep(gpu, enc, g, t_len, st.pos, &inp, &st.ring, &pre, prof.as_deref_mut())?;
                kda::chunk_prefill(gpu, enc, g, &pre, &scratch, &st.state, &o, prof.as_deref_mut())?;
            }
            kda::gated_norm(gpu, enc, g, t_len, &o, &gl, &self.o_norm, &y, prof.as_deref_mut())?;
        }
        linear(gpu, enc, &self.o_proj, t_len, &y, out, prof)?;
        st.pos += t_len as u64;
        Ok(())
    }
}

/// Warms the address translations of `w`'s pages (`ops::copy::page_touch`) before a one-token
/// forward's GEMV streams it: each matrix is read once per token, the model's weights far
/// exceed what the GPU's translation caches hold, and a GEMV whose single wave of workgroups
/// starts on all of a 176 MB matrix's pages at once stalled ~5 us on page walks (H200,
/// docs/perf.md). Recorded right after the fused recurrence (latency-bound, ~19 us, few pages
/// of its own) it runs beside it: o_proj then took ~2.7 us less per KDA layer. The same beside
/// the global layer's merge, or beside streaming kernels, cost more than it saved.
/// `K31_PAGE_TOUCH=0` turns it off (experiments).
fn touch_pages(gpu: &Gpu, enc: &mut wgpu::CommandEncoder, w: &GpuTensor) -> Result<(), GpuError> {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    if !crate::ops::switch_on(&ON, "K31_PAGE_TOUCH") {
        return Ok(());
    }
    crate::ops::copy::page_touch_tensor(gpu, enc, w, None)
}
