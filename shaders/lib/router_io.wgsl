// The router kernels' interface (router.wgsl, router_sg.wgsl): params, bindings, the GLU
// workgroups and the final weights.

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

const MAX_E: u32 = 1024u;

var<workgroup> score: array<f32, MAX_E>;  // unbiased sigmoid scores
var<workgroup> chosen: array<u32, 64>;    // expert ids in rank order

// Workgroup g past the tokens: its 256 elements of the GLU.
fn glu_workgroup(g: u32, lid: u32) {
    let i = g * 256u + lid;
    if (i < p.glu_n) {
        glu_out[i] = glu_act(glu_gate[i], glu_up[i], p.act, p.beta, p.linear_beta);
    }
}

// idx and wts of token t from `chosen` (complete before the call) and `score`.
fn write_routing(t: u32, lid: u32) {
    if (lid == 0u) {
        var sum = 0.0;
        for (var k = 0u; k < p.top_k; k++) {
            sum += score[chosen[k]];
        }
        let norm = select(1.0, 1.0 / (sum + 1e-20), p.renormalize != 0u && p.top_k > 1u);
        for (var k = 0u; k < p.top_k; k++) {
            idx[t * p.top_k + k] = chosen[k];
            wts[t * p.top_k + k] = score[chosen[k]] * norm * p.scaling;
        }
    }
}
