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

// Prefill prep along token runs: one subgroup per (part, head, run of p.run tokens), part 0 = q,
// 1 = k, 2 = v (plus the gate and beta). Lane l owns channels l + sgs i (i < dk / sgs <= 4) and
// keeps their conv weights and the last three inputs in registers, so each input is loaded
// once, not once per tap, and the weights once per run, not per token (kda_prep_sg re-reads
// both for every (token, head) row). The next token's inputs load before the current one is
// computed. Runs are p.run tokens (the host shortens them for short prompts). Preconditions
// (host-checked): taps <= 4, dk % sgs == 0, dk / sgs <= 4, a fixed subgroup size, run >= 1.

@compute @workgroup_size(256)
fn kda_prep_run(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sgs: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
) {
    let unit = (wg.x + wg.y * nwg.x) * nsg + sg;
    let runs = (p.t_len + p.run - 1u) / p.run;
    if (unit >= 3u * p.heads * runs) {
        return;
    }
    let part = unit % 3u;
    let h = (unit / 3u) % p.heads;
    let t0 = (unit / (3u * p.heads)) * p.run;
    let t1 = min(t0 + p.run, p.t_len);
    let cpl = p.dk / sgs;
    let pd = p.heads * p.dk;
    let n3 = 3u * pd;
    let chan = h * p.dk + lane;
    // Taps right-aligned (tap W-1 multiplies the current token), the window x[t-3..t-1].
    var w: array<vec4<f32>, 4>;
    var win: array<vec3<f32>, 4>;
    var nx: array<f32, 4>;
    var dtb: array<f32, 4>;
    let a = exp(a_log[h]);
    let lead = 4u - min(p.taps, 4u);
    for (var i = 0u; i < 4u; i++) {
        if (i < cpl) {
            let ch = part * pd + chan + sgs * i;
            var wv = vec4<f32>(0.0);
            for (var j = 0u; j < min(p.taps, 4u); j++) {
                wv[lead + j] = conv_w[ch * p.taps + j];
            }
            w[i] = wv;
            let ti = i32(t0);
            win[i] = vec3<f32>(conv_input(ti - 3, ch), conv_input(ti - 2, ch), conv_input(ti - 1, ch));
            nx[i] = qkv[t0 * n3 + ch];
            dtb[i] = dt_bias[chan + sgs * i];
        }
    }
    var nf: array<f32, 4>;
    if (part == 2u) {
        for (var i = 0u; i < 4u; i++) {
            if (i < cpl) {
                nf[i] = fgate[t0 * pd + chan + sgs * i];
            }
        }
    }
    for (var t = t0; t < t1; t++) {
        let x = nx;
        let f = nf;
        // The next token's loads first (clamped to the run's last token).
        let tn = min(t + 1u, t1 - 1u);
        for (var i = 0u; i < 4u; i++) {
            if (i < cpl) {
                nx[i] = qkv[tn * n3 + part * pd + chan + sgs * i];
                if (part == 2u) {
                    nf[i] = fgate[tn * pd + chan + sgs * i];
                }
            }
        }
        let row = t * p.heads + h;
        var y: array<f32, 4>;
        var ss = 0.0;
        for (var i = 0u; i < 4u; i++) {
            if (i < cpl) {
                var v = x[i];
                if (p.post_conv == 0u) {
                    v = silu(dot(w[i], vec4<f32>(win[i], x[i])));
                    win[i] = vec3<f32>(win[i].y, win[i].z, x[i]);
                }
                y[i] = v;
                ss += v * v;
            }
        }
        if (part == 2u) {
            for (var i = 0u; i < 4u; i++) {
                if (i < cpl) {
                    v_out[row * p.dk + lane + sgs * i] = y[i];
                    g_out[row * p.dk + lane + sgs * i] = log_decay(a, f[i] + dtb[i]);
                }
            }
            if (lane == 0u) {
                beta_out[row] = sigmoid(blog[row]);
            }
        } else {
            let r = inverseSqrt(subgroupAdd(ss) + 1e-6) * select(1.0, p.scale, part == 0u);
            for (var i = 0u; i < 4u; i++) {
                if (i < cpl) {
                    if (part == 0u) {
                        q_out[row * p.dk + lane + sgs * i] = y[i] * r;
                    } else {
                        k_out[row * p.dk + lane + sgs * i] = y[i] * r;
                    }
                }
            }
        }
    }
}
