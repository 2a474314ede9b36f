// MoE router selection (spec 6.2), one workgroup per token, decided on the GPU: idx and wts
// [t, :] = lib/router_pick.wgsl's choice from logits [t, :] and the selection bias.
// Workgroups past the tokens compute glu_out = glu_act(gate, up) for glu_n elements (the
// shared experts' gated activation, which reads the same projection pass as the router: one
// dependent dispatch less per MoE layer); glu_n = 0 binds placeholders.
// Preconditions (host-checked): experts <= MAX_E; experts % n_group == 0; top_k <= experts.
// logits: [tokens, experts] f32; bias: [experts] f32; idx: [tokens, top_k] u32; wts: same f32.

struct RouterParams {
    tokens: u32,
    experts: u32,
    top_k: u32,
    n_group: u32,
    topk_group: u32,
    renormalize: u32,
    scaling: f32,
    glu_n: u32,
    act: u32,
    beta: f32,
    linear_beta: f32,
    _pad: u32,
}

@group(0) @binding(0) var<uniform> p: RouterParams;
@group(0) @binding(1) var<storage, read> logits: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> idx: array<u32>;
@group(0) @binding(4) var<storage, read_write> wts: array<f32>;
@group(0) @binding(5) var<storage, read> glu_gate: array<f32>;
@group(0) @binding(6) var<storage, read> glu_up: array<f32>;
@group(0) @binding(7) var<storage, read_write> glu_out: array<f32>;

#include "lib/activation.wgsl"

const WG: u32 = 256u;
const RP_WG: u32 = WG;
var<private> token: u32;
fn router_logit(i: u32) -> f32 {
    return logits[token * p.experts + i];
}
fn router_bias(i: u32) -> f32 {
    return bias[i];
}
fn router_emit(k: u32, e: u32, w: f32) {
    idx[token * p.top_k + k] = e;
    wts[token * p.top_k + k] = w;
}
#include "lib/router_pick.wgsl"

@compute @workgroup_size(256)
fn router_select(@builtin(workgroup_id) wg: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.x + wg.y * nwg.x;
    if (t >= p.tokens) {
        let i = (t - p.tokens) * WG + lid;
        if (i < p.glu_n) {
            glu_out[i] = glu_act(glu_gate[i], glu_up[i], p.act, p.beta, p.linear_beta);
        }
        return;
    }
    token = t;
    router_pick(lid, RouterPick(p.experts, p.top_k, p.n_group, p.topk_group, p.renormalize, p.scaling));
}
