//! Layers composed from ops, mirroring the reference model's module tree.

pub mod global_attn;
pub mod kda;
pub mod mlp;
pub mod moe;

use crate::checkpoint::TensorView;
use crate::config::{Ffn, ModelConfig};
use crate::gpu::{Gpu, GpuError, Profiler};
use crate::layout::DType;
use crate::model::FeedForward;

/// Whether a decode step records a memory-bound projection right after a latency-bound
/// kernel it does not depend on, with outputs new to the encoder, so that no barrier stands
/// between the two and the GPU runs them together (the global layer's gate projection beside
/// the sparse attention). `K31_OVERLAP=0` turns it off (experiments).
pub(crate) fn overlap_enabled() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    crate::ops::switch_on(&ON, "K31_OVERLAP")
}

/// Whether a one-token MoE decode computes the shared experts' activation in its projection
/// pass (the gate and up rows of a row block in one workgroup) instead of the router's dispatch;
/// `K31_GLU_IN_PASS=0` turns it off (experiments).
pub(crate) fn glu_in_pass() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    crate::ops::switch_on(&ON, "K31_GLU_IN_PASS")
}

/// Whether a one-token LatentMoE decode runs its shared experts' down-projection beside the
/// routed experts' first stage (summed in by the latent up-projection's normed pass) instead
/// of inside that pass; `K31_SHARED_BESIDE=0` turns it off (experiments).
pub(crate) fn shared_beside() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    crate::ops::switch_on(&ON, "K31_SHARED_BESIDE")
}

/// Whether a one-token MoE decode selects its experts in the projection pass that writes the
/// router logits (the last router workgroup selects) instead of the router's own dispatch;
/// `K31_ROUTE_IN_PASS=0` turns it off (experiments).
pub(crate) fn route_in_pass() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    crate::ops::switch_on(&ON, "K31_ROUTE_IN_PASS")
}

/// Whether a one-token global layer with an indexer runs the absorb beside the indexer
/// (after a touch of their inputs) instead of before it; `K31_ABSORB_BESIDE=0` turns it off
/// (experiments).
pub(crate) fn absorb_beside() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    crate::ops::switch_on(&ON, "K31_ABSORB_BESIDE")
}

/// Whether a one-token global layer runs its query projections in the dispatch that writes the
/// cache rows (`dsa::global_q_proj`: c_q normalised by each GEMV workgroup) instead of after a
/// separate `global_prep`; `K31_Q_WITH_PREP=0` turns it off (experiments).
pub(crate) fn q_with_prep() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    crate::ops::switch_on(&ON, "K31_Q_WITH_PREP")
}

/// A float tensor's values as f32, or an error naming it.
pub(crate) fn floats(v: &TensorView<'_>, name: &str) -> Result<Vec<f32>, GpuError> {
    v.floats().ok_or_else(|| GpuError::Shape(format!("{name}: dtype {} is not a float type", v.dtype.name())))
}

/// bf16 bytes of a float tensor (the norm kernels read bf16 weights; bf16 passes through).
pub(crate) fn bf16_bytes(v: &TensorView<'_>, name: &str) -> Result<Vec<u8>, GpuError> {
    if v.dtype == DType::BF16 {
        return Ok(v.data.to_vec());
    }
    Ok(floats(v, name)?.iter().flat_map(|x| half::bf16::from_f32(*x).to_le_bytes()).collect())
}

impl FeedForward for mlp::GluMlp {
    fn forward(&self, gpu: &Gpu, enc: &mut wgpu::CommandEncoder, x: &wgpu::Buffer, t: usize, out: &wgpu::Buffer, accumulate: bool, p: Option<&mut Profiler>) -> Result<(), GpuError> {
        mlp::GluMlp::forward(self, gpu, enc, x, t, out, accumulate, p)
    }
}

impl FeedForward for moe::MoeBlock {
    fn forward(&self, gpu: &Gpu, enc: &mut wgpu::CommandEncoder, x: &wgpu::Buffer, t: usize, out: &wgpu::Buffer, accumulate: bool, p: Option<&mut Profiler>) -> Result<(), GpuError> {
        moe::MoeBlock::forward(self, gpu, enc, x, t, out, accumulate, p)
    }
}

/// The FFN of `layer`: the dense SiTU/SiLU MLP or the MoE block, per the config.
pub fn load_ffn<'a>(
    gpu: &Gpu,
    cfg: &ModelConfig,
    layer: usize,
    lookup: &dyn Fn(&str) -> Option<TensorView<'a>>,
) -> Result<Box<dyn FeedForward>, GpuError> {
    match cfg.layers[layer].ffn {
        Ffn::Dense => {
            Ok(Box::new(mlp::GluMlp::load(gpu, lookup, layer, "mlp.", cfg.hidden_size, cfg.intermediate_size, cfg.activation)?))
        }
        Ffn::Moe => Ok(Box::new(moe::MoeBlock::load(gpu, cfg, layer, lookup)?)),
    }
}
