// Gated activation of an MLP (spec 2.4): out[i] = act(gate[i], up[i]) elementwise, f32.
//   SiTU (act = 0): beta tanh(g / beta) sigmoid(g) * (linear_beta tanh(u / linear_beta), or u
//                   when linear_beta <= 0)
//   SiLU (act = 1): g sigmoid(g) u
// Preconditions (host-checked): gate, up, out hold n f32.

struct GluParams {
    n: u32,
    act: u32,
    beta: f32,
    linear_beta: f32,
}

@group(0) @binding(0) var<uniform> p: GluParams;
@group(0) @binding(1) var<storage, read> gate: array<f32>;
@group(0) @binding(2) var<storage, read> up: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;

#include "lib/activation.wgsl"

@compute @workgroup_size(256)
fn glu(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = gid.x + gid.y * nwg.x * 256u;
    if (i >= p.n) {
        return;
    }
    let g = gate[i];
    let u = up[i];
    let sg = sigmoid(g);
    if (p.act == 1u) {
        out[i] = g * sg * u;
        return;
    }
    var u2 = u;
    if (p.linear_beta > 0.0) {
        u2 = p.linear_beta * tanh_f(u / p.linear_beta);
    }
    out[i] = p.beta * tanh_f(g / p.beta) * sg * u2;
}
