// Subgroup variant of kda_prep (kda.wgsl): conv + SiLU, l2 norm and scale of q and k, the
// gate and beta, with ONE SUBGROUP per (token, head) row: lanes stride over the channels
// (coalesced), the two norms come from subgroupAdd, so there is no barrier and no idle half
// of a 256-thread workgroup. A separate file because a module that uses subgroup operations
// needs the SUBGROUP feature as a whole; adapters without it keep kda.wgsl's kda_prep.
// Same parameters, bindings and preconditions as kda.wgsl.

#include "lib/kda_prep.wgsl"

const ROWS: u32 = 8u;     // (token, head) rows per workgroup
const KMAX: u32 = 256u;

var<workgroup> sh_q: array<f32, 2048>;  // [ROWS, KMAX] unnormalised q of each row
var<workgroup> sh_k: array<f32, 2048>;

@compute @workgroup_size(256)
fn kda_prep_sg(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sgs: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
) {
    let base = (wg.x + wg.y * nwg.x) * ROWS;
    let pd = p.heads * p.dk;
    for (var slot = sg; slot < ROWS; slot += nsg) {
        let row = base + slot;
        if (row >= p.t_len * p.heads) {
            break;
        }
        let t = row / p.heads;
        let h = row % p.heads;
        var nq = 0.0;
        var nk = 0.0;
        for (var c = lane; c < p.dk; c += sgs) {
            let ch = h * p.dk + c;
            let q = conv_silu(t, ch);
            let k = conv_silu(t, pd + ch);
            v_out[row * p.dk + c] = conv_silu(t, 2u * pd + ch);
            g_out[row * p.dk + c] = gate(h, c, fgate[t * pd + ch]);
            sh_q[slot * KMAX + c] = q;
            sh_k[slot * KMAX + c] = k;
            nq += q * q;
            nk += k * k;
        }
        let rq = inverseSqrt(subgroupAdd(nq) + 1e-6) * p.scale;
        let rk = inverseSqrt(subgroupAdd(nk) + 1e-6);
        for (var c = lane; c < p.dk; c += sgs) {
            q_out[row * p.dk + c] = sh_q[slot * KMAX + c] * rq;
            k_out[row * p.dk + c] = sh_k[slot * KMAX + c] * rk;
        }
        if (lane == 0u) {
            beta_out[row] = sigmoid(blog[row]);
        }
    }
}
