//! The MoE block (spec 6.2-6.4): sigmoid router on the full-width token, routed experts from
//! the expert store (in the latent width with LatentMoE, bf16 full width for Kimi Linear),
//! the latent norm and up-projection, plus the shared experts.

use super::mlp::{matrix, GluMlp};
use super::{bf16_bytes, floats};
use crate::checkpoint::TensorView;
use crate::config::{Activation, ExpertFormat, ModelConfig};
use crate::experts::{ExpertStore, ExpertWeights, SlotLayout};
use crate::gpu::{Gpu, GpuError, GpuTensor, Profiler};
use crate::layout::DType;
use crate::ops::{gemv, linear::{linear_into, linear_many}, moe, norm::rms_norm, router::{router_select, GluJob}};

struct Latent {
    down: GpuTensor,
    /// RMSNorm weight [latent] bf16, when `latent_moe_use_norm`.
    norm: Option<wgpu::Buffer>,
    up: GpuTensor,
}

/// A one-token MoE's buffers of its own for the shared experts' down-projection beside the
/// routed experts' first stage ([`super::shared_beside`]): new to every encoder, so no barrier
/// orders the two.
struct SharedBeside {
    /// The experts' intermediate activations [top_k, n_mid] f32.
    h: wgpu::Buffer,
    /// The shared experts' output [d] f32, summed in by the latent up-projection.
    down: wgpu::Buffer,
    /// The touch dispatch's sink (never written).
    sink: wgpu::Buffer,
}

pub struct MoeBlock {
    layer: usize,
    gate: GpuTensor,
    /// Selection bias [E] f32.
    bias: wgpu::Buffer,
    /// The projection pass's done counter when it selects the experts (zero between passes).
    route_done: wgpu::Buffer,
    latent: Option<Latent>,
    /// This layer's routed experts (the store's layer 0).
    store: ExpertStore,
    shared: Option<GluMlp>,
    beside: Option<SharedBeside>,
    cfg: crate::config::MoeConfig,
    act: Activation,
    hidden: usize,
    eps: f32,
}

impl MoeBlock {
    pub fn load<'a>(
        gpu: &Gpu,
        cfg: &ModelConfig,
        layer: usize,
        lookup: &dyn Fn(&str) -> Option<TensorView<'a>>,
    ) -> Result<MoeBlock, GpuError> {
        let m = cfg.moe.clone().ok_or_else(|| GpuError::Shape(format!("layer {layer}: MoE layer without an MoE config")))?;
        let d = cfg.hidden_size;
        let get = |n: &str| lookup(n).ok_or_else(|| GpuError::Shape(format!("layer {layer}: missing tensor {n}")));
        let p = "block_sparse_moe.";
        let gate = matrix(gpu, lookup, layer, &format!("{p}gate.weight"), m.num_experts, d)?;
        let bias_name = format!("{p}gate.e_score_correction_bias");
        let bias = gpu.storage_from("router bias", &floats(&get(&bias_name)?, &bias_name)?);
        let latent = match m.latent_size {
            Some(lat) => Some(Latent {
                down: matrix(gpu, lookup, layer, &format!("{p}routed_expert_down_proj.weight"), lat, d)?,
                norm: if m.latent_norm {
                    let n = format!("{p}routed_expert_norm.weight");
                    Some(gpu.storage_from("latent norm", &bf16_bytes(&get(&n)?, &n)?))
                } else {
                    None
                },
                up: matrix(gpu, lookup, layer, &format!("{p}routed_expert_up_proj.weight"), d, lat)?,
            }),
            None => None,
        };
        let n_in = m.expert_io(d);
        let layout = SlotLayout::new(m.expert_format, n_in, m.moe_intermediate_size)?;
        let mut store = ExpertStore::new(gpu, layout, 1, m.num_experts, m.num_experts)?;
        for e in 0..m.num_experts {
            let x = |w: &str, part: &str| -> Result<&'a [u8], GpuError> {
                Ok(get(&format!("{p}experts.{e}.{w}.{part}"))?.data)
            };
            let weights = match m.expert_format {
                ExpertFormat::Mxfp4 => ExpertWeights::Mxfp4 {
                    w1: (x("w1", "weight_packed")?, x("w1", "weight_scale")?),
                    w3: (x("w3", "weight_packed")?, x("w3", "weight_scale")?),
                    w2: (x("w2", "weight_packed")?, x("w2", "weight_scale")?),
                },
                ExpertFormat::Bf16 => {
                    let t = get(&format!("{p}experts.{e}.w1.weight"))?;
                    if t.dtype != DType::BF16 {
                        return Err(GpuError::Shape(format!(
                            "layer {layer}: expert weights in {} are not supported yet (bf16 or MXFP4)",
                            t.dtype.name()
                        )));
                    }
                    ExpertWeights::Bf16 { w1: x("w1", "weight")?, w3: x("w3", "weight")?, w2: x("w2", "weight")? }
                }
            };
            store.fill(gpu, 0, e, &weights)?;
        }
        let shared = if m.num_shared_experts > 0 {
            let inner = m.num_shared_experts * m.moe_intermediate_size;
            Some(GluMlp::load(gpu, lookup, layer, &format!("{p}shared_experts."), d, inner, cfg.activation)?)
        } else {
            None
        };
        let route_done = gpu.storage("router done counter", 16);
        let beside = (shared.is_some() && latent.as_ref().is_some_and(|l| l.norm.is_some())).then(|| SharedBeside {
            h: gpu.storage("experts h (decode)", (m.experts_per_token * m.moe_intermediate_size * 4) as u64),
            down: gpu.storage("shared experts out", (d * 4) as u64),
            sink: gpu.storage("touch sink", 16),
        });
        Ok(MoeBlock { layer, gate, bias, route_done, latent, store, shared, beside, cfg: m, act: cfg.activation, hidden: d, eps: cfg.rms_norm_eps })
    }

    /// out [T, d] = MoE(x), or out += MoE(x) (`accumulate`).
    #[allow(clippy::too_many_arguments)]
    pub fn forward(
        &self,
        gpu: &Gpu,
        enc: &mut wgpu::CommandEncoder,
        x: &wgpu::Buffer,
        t: usize,
        out: &wgpu::Buffer,
        accumulate: bool,
        mut prof: Option<&mut Profiler>,
    ) -> Result<(), GpuError> {
        // Internal scratch goes back to the pool when this layer returns.
        let _scratch = gpu.scratch_scope();
        let (d, e, k) = (self.hidden, self.cfg.num_experts, self.cfg.experts_per_token);
        let n_in = self.cfg.expert_io(d);
        let buf = |label: &str, n: usize| gpu.scratch(label, (n * 4) as u64);
        let (logits, idx, wts) = (buf("router logits", t * e), buf("router idx", t * k), buf("router weights", t * k));
        let z_owned = self.latent.as_ref().map(|_| buf("latent z", t * n_in));
        // Router logits, the latent down-projection and the shared experts' gate and up
        // projections all read x: one dispatch in decode.
        let mut from_x = vec![(&self.gate, &logits)];
        if let (Some(l), Some(z)) = (&self.latent, &z_owned) {
            from_x.push((&l.down, z));
        }
        let shared_act = self.shared.as_ref().map(|s| s.act_buffer(gpu, t));
        // One token: the projection pass writes the shared experts' activation itself (gate
        // and up rows of a row block in one workgroup), so the router's dispatch has no GLU to run.
        let in_pass = match (&self.shared, &shared_act) {
            (Some(s), Some(a)) if t == 1 && super::glu_in_pass() => {
                let (gate, up) = s.gate_up();
                Some(gemv::GluPair { gate, up, act: s.activation(), out: a }).filter(|pair| gemv::glu_fits(gpu, &from_x, pair))
            }
            _ => None,
        };
        if let Some(pair) = &in_pass {
            // The pass's last router workgroup selects the experts where it can.
            let route = gemv::Route { cfg: &self.cfg.router, top_k: k, bias: &self.bias, idx: &idx, wts: &wts, done: &self.route_done };
            let route = (super::route_in_pass() && gemv::route_fits(gpu, &self.gate, &route)).then_some(route);
            gemv::gemv_many_glu(gpu, enc, &from_x, pair, route.as_ref(), x, prof.as_deref_mut())?;
            if route.is_none() {
                router_select(gpu, enc, &self.cfg.router, t, e, k, &logits, &self.bias, &idx, &wts, None, prof.as_deref_mut())?;
            }
        } else {
            let shared_gu = self.shared.as_ref().map(|s| s.projection_buffers(gpu, t));
            if let (Some(s), Some((g, u))) = (&self.shared, &shared_gu) {
                from_x.extend(s.projections(g, u));
            }
            linear_many(gpu, enc, &from_x, t, x, prof.as_deref_mut())?;
            // The shared experts' activation runs in the router's dispatch (both read that pass).
            let glu = match (&self.shared, &shared_gu, &shared_act) {
                (Some(s), Some((g, u)), Some(a)) => Some(GluJob { act: s.activation(), n: t * s.inner(), gate: g, up: u, out: a }),
                _ => None,
            };
            router_select(gpu, enc, &self.cfg.router, t, e, k, &logits, &self.bias, &idx, &wts, glu, prof.as_deref_mut())?;
        }
        let z = match &z_owned {
            Some(z) => z,
            None => x,
        };
        let y_owned = self.latent.as_ref().map(|_| buf("experts out", t * n_in));
        let y = y_owned.as_ref().unwrap_or(out);
        // Without a latent projection the experts write (or add into) the output directly.
        let call = moe::ExpertCall { layer: 0, tokens: t, top_k: k, act: self.act, accumulate: accumulate && self.latent.is_none() };
        // One token: the shared experts' down-projection (memory-bound) beside the routed
        // experts' first stage (bound by the MXFP4 decode), where the latent up-projection's
        // normed pass can sum it in.
        let beside = match (&self.beside, &self.latent, &self.shared, &shared_act) {
            (Some(b), Some(l), Some(s), Some(a))
                if t == 1
                    && in_pass.is_some()
                    && super::shared_beside()
                    && gemv::normed_fits(gpu, &l.up)
                    && s.down().rows() == l.up.rows() =>
            {
                Some((b, s.down(), a))
            }
            _ => None,
        };
        if let Some((b, down, a)) = beside {
            // z, the routing and the activation reach the read state at the barrier before
            // this dispatch, so neither stage 1 nor the down-projection needs one of its own.
            crate::ops::copy::touch(gpu, enc, &[z, &idx, &wts, a], &b.sink)?;
            let mut shared_down = |enc: &mut wgpu::CommandEncoder| gemv::gemv(gpu, enc, down, a, &b.down, None);
            moe::experts_decode_beside(gpu, enc, &self.store, &call, None, z, &idx, &wts, &b.h, y, prof.as_deref_mut(), Some(&mut shared_down))?;
        } else if t == 1 {
            let h = buf("experts h", t * k * self.cfg.moe_intermediate_size);
            moe::experts_decode(gpu, enc, &self.store, &call, None, z, &idx, &wts, &h, y, prof.as_deref_mut())?;
        } else {
            let scratch = moe::GroupedScratch::new(gpu, &self.store, t, k);
            moe::experts_grouped(gpu, enc, &self.store, &call, z, &idx, &wts, &scratch, y, prof.as_deref_mut())?;
        }
        // The shared experts' down-projection, unless it joins the latent up-projection below.
        let mut shared_down = match (&self.shared, &shared_act) {
            (Some(s), Some(a)) if beside.is_none() => Some((s.down(), a)),
            _ => None,
        };
        if let Some(l) = &self.latent {
            match &l.norm {
                // Decode: the norm, the up-projection and (where the shapes allow) the shared
                // experts' down-projection in one dispatch.
                Some(w) if t == 1 && gemv::normed_fits(gpu, &l.up) => {
                    let second = shared_down.filter(|(wb, _)| gemv::second_fits(&l.up, wb));
                    if second.is_some() {
                        shared_down = None;
                    }
                    let addend = beside.map(|(b, _, _)| &b.down);
                    gemv::gemv_normed(gpu, enc, &l.up, y, w, self.eps, second, addend, out, accumulate, prof.as_deref_mut())?;
                }
                Some(w) => {
                    let normed = buf("latent normed", t * n_in);
                    rms_norm(gpu, enc, t, n_in, self.eps, y, w, &normed, prof.as_deref_mut())?;
                    linear_into(gpu, enc, &l.up, t, &normed, out, accumulate, prof.as_deref_mut())?;
                }
                None => linear_into(gpu, enc, &l.up, t, y, out, accumulate, prof.as_deref_mut())?,
            }
        }
        // The shared experts sum into the routed output in place.
        match shared_down {
            Some((wd, a)) => linear_into(gpu, enc, wd, t, a, out, true, prof),
            None => Ok(()),
        }
    }

    pub fn layer(&self) -> usize {
        self.layer
    }
}
