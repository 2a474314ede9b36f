// Gated activation of an MLP (spec 2.4): out[i] = glu_act(gate[i], up[i]) elementwise, f32
// (lib/activation.wgsl: SiTU for act = 0, SiLU for act = 1).
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
    out[i] = glu_act(gate[i], up[i], p.act, p.beta, p.linear_beta);
}
