//! Host side of shaders/router.wgsl: MoE expert selection on the GPU (spec 6.2).

use super::moe::dispatch;
use super::shader_params;
use super::norm::glu_code;
use crate::config::{Activation, RouterConfig};
use crate::gpu::{Gpu, GpuError, Kernel, Profiler};

shader_params!(
    /// Mirrors `RouterParams` in shaders/router.wgsl.
    RouterParams in "router" {
        tokens: u32, experts: u32, top_k: u32, n_group: u32, topk_group: u32, renormalize: u32,
        scaling: f32, glu_n: u32, act: u32, beta: f32, linear_beta: f32, _pad: u32,
    }
);

// Without wgpu's runtime checks: the host bounds experts (MAX_E), top_k (64), the group count
// (the workgroup's 256 group scores) and every buffer; the sort permutes indices below the
// padded size, so even NaN logits select in-range entries.
pub const ROUTER_SELECT: Kernel = Kernel::new("router_select", "router", "router_select").unchecked();
pub const KERNELS: &[Kernel] = &[ROUTER_SELECT];
/// Most experts one router workgroup holds (MAX_E in the shader).
pub const MAX_EXPERTS: usize = 1024;
/// Most expert groups under a group limit (the shader's per-group scores, one per thread).
pub const MAX_GROUPS: usize = 256;

/// lib/router_pick.wgsl's selection parameters (`RouterPick`), shared by [`router_select`] and
/// the MoE decode's projection pass (`gemv::gemv_many_glu` with a route).
#[derive(Clone, Copy, Debug)]
pub struct Pick {
    pub top_k: u32,
    pub n_group: u32,
    pub topk_group: u32,
    pub renormalize: u32,
    pub scaling: f32,
}

/// The selection's parameters for `experts` and `top_k` under `cfg`, or why the kernels cannot
/// select them.
pub fn pick_params(cfg: &RouterConfig, experts: usize, top_k: usize) -> Result<Pick, GpuError> {
    let groups = cfg.num_expert_group.max(1);
    let limited = groups > 1 && cfg.topk_group < groups;
    if experts == 0 || experts > MAX_EXPERTS || top_k == 0 || top_k > experts || top_k > 64 || !experts.is_multiple_of(groups) {
        return Err(GpuError::Shape(format!(
            "router: {experts} experts (at most {MAX_EXPERTS}, divisible by {groups} groups) with top_k {top_k} (1..=64)"
        )));
    }
    if limited && (cfg.topk_group == 0 || top_k > cfg.topk_group * (experts / groups)) {
        return Err(GpuError::Shape(format!("router: top_k {top_k} exceeds the experts of {} kept groups", cfg.topk_group)));
    }
    if limited && groups > MAX_GROUPS {
        return Err(GpuError::Shape(format!("router: {groups} expert groups (at most {MAX_GROUPS} with a group limit)")));
    }
    Ok(Pick {
        top_k: top_k as u32,
        n_group: groups as u32,
        topk_group: cfg.topk_group as u32,
        renormalize: cfg.renormalize as u32,
        scaling: cfg.routed_scaling_factor,
    })
}

/// A gated activation for the router's dispatch to compute alongside: out [n] = act(gate, up).
pub struct GluJob<'a> {
    pub act: Activation,
    pub n: usize,
    pub gate: &'a wgpu::Buffer,
    pub up: &'a wgpu::Buffer,
    pub out: &'a wgpu::Buffer,
}

/// idx/wts [T, top_k] from logits [T, experts] and the selection bias [experts]; with `glu`
/// (the shared experts' activation, which reads the same projection pass) computed by extra
/// workgroups of the same dispatch.
#[allow(clippy::too_many_arguments)]
pub fn router_select(
    gpu: &Gpu,
    enc: &mut wgpu::CommandEncoder,
    cfg: &RouterConfig,
    tokens: usize,
    experts: usize,
    top_k: usize,
    logits: &wgpu::Buffer,
    bias: &wgpu::Buffer,
    idx: &wgpu::Buffer,
    wts: &wgpu::Buffer,
    glu: Option<GluJob<'_>>,
    profiler: Option<&mut Profiler>,
) -> Result<(), GpuError> {
    let pick = pick_params(cfg, experts, top_k)?;
    if logits.size() < (tokens * experts * 4) as u64 || bias.size() < (experts * 4) as u64 || idx.size() < (tokens * top_k * 4) as u64 || wts.size() < (tokens * top_k * 4) as u64 {
        return Err(GpuError::Shape(format!("router: buffers too small for {tokens} tokens x {experts} experts, top_k {top_k}")));
    }
    let mut p = RouterParams {
        tokens: tokens as u32,
        experts: experts as u32,
        top_k: pick.top_k,
        n_group: pick.n_group,
        topk_group: pick.topk_group,
        renormalize: pick.renormalize,
        scaling: pick.scaling,
        ..Default::default()
    };
    let placeholders;
    let (gate, up, out) = match &glu {
        Some(j) => {
            let bytes = (j.n * 4) as u64;
            if j.gate.size() < bytes || j.up.size() < bytes || j.out.size() < bytes {
                return Err(GpuError::Shape(format!("router: GLU buffers too small for {} values", j.n)));
            }
            (p.act, p.beta, p.linear_beta) = glu_code(j.act);
            p.glu_n = j.n as u32;
            (j.gate, j.up, j.out)
        }
        None => {
            placeholders = [gpu.scratch("router glu gate", 16), gpu.scratch("router glu up", 16), gpu.scratch("router glu out", 16)];
            (&placeholders[0], &placeholders[1], &placeholders[2])
        }
    };
    let glu_groups = p.glu_n.div_ceil(256);
    let bufs = [(1, logits), (2, bias), (3, idx), (4, wts), (5, gate), (6, up), (7, out)];
    dispatch(gpu, enc, &ROUTER_SELECT, &p, &bufs, (tokens as u32 + glu_groups, 1), profiler)
}
