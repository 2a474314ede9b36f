// A global layer's decode-time row ops after its first projection pass, in one dispatch (they
// were five dependent ones: two RMSNorms, a LayerNorm and two cache writes), one token:
//   workgroup 0: c_q = RMSNorm(c_q; g_q) in place (q_n = 0: no q_a, nothing to do);
//   workgroup 1: latent cache row = bf16(RMSNorm(kv[0..kv_n]; g_kv) | kv[kv_n..kv_width]);
//   workgroup 2: index-key cache row = bf16(LayerNorm(ki; g_k, b_k)) (k_n = 0: no indexer).
// f32 math as dsa_misc.wgsl's rms_norm / layer_norm / cache_write, which prefill keeps.
// Preconditions (host-checked): kv_width and k_n even; each destination row lies in the bound
// page; the weights hold their widths in f32.

struct PrepParams {
    q_n: u32,
    kv_width: u32,
    kv_n: u32,
    kv_row: u32,
    k_n: u32,
    k_row: u32,
    eps: f32,
    k_eps: f32,
}

const WG: u32 = 256u;

@group(0) @binding(0) var<uniform> p: PrepParams;
@group(0) @binding(1) var<storage, read_write> cq: array<f32>;
@group(0) @binding(2) var<storage, read> g_q: array<f32>;

#include "lib/wg_sum.wgsl"
#include "lib/bf16_bits.wgsl"

#include "lib/global_rows.wgsl"

@compute @workgroup_size(256)
fn global_prep(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    if (wg.x == 0u) {
        if (p.q_n == 0u) {
            return;
        }
        var ss = 0.0;
        for (var i = lid; i < p.q_n; i += WG) {
            ss += cq[i] * cq[i];
        }
        let r = inverseSqrt(wg_sum(lid, ss) / f32(p.q_n) + p.eps);
        for (var i = lid; i < p.q_n; i += WG) {
            cq[i] = cq[i] * r * g_q[i];
        }
        return;
    }
    if (wg.x == 1u) {
        latent_row(lid);
        return;
    }
    if (p.k_n == 0u) {
        return;
    }
    key_row(lid);
}
