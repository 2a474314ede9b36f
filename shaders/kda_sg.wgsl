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
// 1 = k, 2 = v, 3 = the gate and beta (one read stream and one write stream each: with v and the
// gate in one part, that part was the long pole). Lane l owns channels l + sgs i (slots i <
// dk / sgs <= 4); q, k and v keep their conv weights and the last three inputs in registers, so
// each input is loaded once, not once per tap, and the weights once per run, not per token
// (kda_prep_sg re-reads both for every (token, head) row). The slots are the components of vec4s
// (one per tap, one per window position): with private arrays indexed in loops under runtime
// guards the kernel ran 2x slower on the H200 (most likely local memory). The next token's
// inputs load before the current one is computed. Runs are p.run tokens (the host shortens them
// for short prompts). Preconditions (host-checked): taps <= 4, dk % sgs == 0, dk / sgs <= 4, a
// fixed subgroup size, run >= 1.
const PREP_PARTS: u32 = 4u;

// Slot i's element of a row, at `base` + sgs i; slots past cpl repeat the last one (in range,
// never stored).
fn prep_row4(base: u32, sgs: u32, cpl: u32) -> vec4<f32> {
    return vec4<f32>(qkv[base], qkv[base + sgs * min(1u, cpl - 1u)], qkv[base + sgs * min(2u, cpl - 1u)], qkv[base + sgs * min(3u, cpl - 1u)]);
}

fn prep_gate4(base: u32, sgs: u32, cpl: u32) -> vec4<f32> {
    return vec4<f32>(fgate[base], fgate[base + sgs * min(1u, cpl - 1u)], fgate[base + sgs * min(2u, cpl - 1u)], fgate[base + sgs * min(3u, cpl - 1u)]);
}

// Weight of tap `back` tokens before the current one (0 = the current token) for slot channel ch.
fn prep_tap(ch: u32, back: u32) -> f32 {
    if (back >= min(p.taps, 4u)) {
        return 0.0;
    }
    return conv_w[ch * p.taps + p.taps - 1u - back];
}

// Stores slots < cpl of y at `base` + sgs i into q, k, v or (part 3) g.
fn prep_store(part: u32, base: u32, sgs: u32, cpl: u32, y: vec4<f32>) {
    for (var i = 0u; i < 4u; i++) {
        if (i < cpl) {
            let at = base + sgs * i;
            if (part == 0u) {
                q_out[at] = y[i];
            } else if (part == 1u) {
                k_out[at] = y[i];
            } else if (part == 2u) {
                v_out[at] = y[i];
            } else {
                g_out[at] = y[i];
            }
        }
    }
}

// kda_chunk.wgsl's chunk rows: with p.cumsum the gate part writes the within-chunk cumulative
// sum itself (kda_chunk_cumsum's job; the host asks for it only when runs are whole chunks).
const CUMSUM_ROWS: u32 = 64u;

// Part 3 of a run: the log decay of every channel (or its within-chunk cumulative sum) and beta.
fn prep_gate_run(h: u32, t0: u32, t1: u32, lane: u32, sgs: u32, cpl: u32) {
    let chan = h * p.dk + lane;
    let pd = p.heads * p.dk;
    let dtb = vec4<f32>(dt_bias[chan], dt_bias[chan + sgs * min(1u, cpl - 1u)], dt_bias[chan + sgs * min(2u, cpl - 1u)],
        dt_bias[chan + sgs * min(3u, cpl - 1u)]);
    let a = exp(a_log[h]);
    var nf = prep_gate4(t0 * pd + chan, sgs, cpl);
    var sum = vec4<f32>(0.0);
    for (var t = t0; t < t1; t++) {
        let zg = nf + dtb;
        nf = prep_gate4(min(t + 1u, t1 - 1u) * pd + chan, sgs, cpl);
        let row = t * p.heads + h;
        var y = vec4<f32>(log_decay(a, zg.x), log_decay(a, zg.y), log_decay(a, zg.z), log_decay(a, zg.w));
        if (p.cumsum != 0u) {
            // Summed in kda_chunk_cumsum's order, from the chunk's first row.
            sum = select(sum, vec4<f32>(0.0), t % CUMSUM_ROWS == 0u) + y;
            y = sum;
        }
        prep_store(3u, row * p.dk + lane, sgs, cpl, y);
        if (lane == 0u) {
            beta_out[row] = sigmoid(blog[row]);
        }
    }
}

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
    if (unit >= PREP_PARTS * p.heads * runs) {
        return;
    }
    let part = unit % PREP_PARTS;
    let h = (unit / PREP_PARTS) % p.heads;
    let t0 = (unit / (PREP_PARTS * p.heads)) * p.run;
    let t1 = min(t0 + p.run, p.t_len);
    let cpl = p.dk / sgs;
    if (part == 3u) {
        prep_gate_run(h, t0, t1, lane, sgs, cpl);
        return;
    }
    let pd = p.heads * p.dk;
    let n3 = 3u * pd;
    let chan = h * p.dk + lane;
    let live = vec4<f32>(1.0, select(0.0, 1.0, cpl > 1u), select(0.0, 1.0, cpl > 2u), select(0.0, 1.0, cpl > 3u));
    // wb[j]: slot weights of the tap j tokens back; xm[j]: inputs j tokens back.
    var wb0 = vec4<f32>(0.0);
    var wb1 = vec4<f32>(0.0);
    var wb2 = vec4<f32>(0.0);
    var wb3 = vec4<f32>(0.0);
    var xm1 = vec4<f32>(0.0);
    var xm2 = vec4<f32>(0.0);
    var xm3 = vec4<f32>(0.0);
    let ti = i32(t0);
    for (var i = 0u; i < 4u; i++) {
        let ch = part * pd + chan + sgs * min(i, cpl - 1u);
        wb0[i] = prep_tap(ch, 0u);
        wb1[i] = prep_tap(ch, 1u);
        wb2[i] = prep_tap(ch, 2u);
        wb3[i] = prep_tap(ch, 3u);
        xm1[i] = conv_input(ti - 1, ch);
        xm2[i] = conv_input(ti - 2, ch);
        xm3[i] = conv_input(ti - 3, ch);
    }
    let rs = select(1.0, p.scale, part == 0u);
    var nx = prep_row4(t0 * n3 + part * pd + chan, sgs, cpl);
    for (var t = t0; t < t1; t++) {
        let x = nx;
        // The next token's loads first (clamped to the run's last token).
        nx = prep_row4(min(t + 1u, t1 - 1u) * n3 + part * pd + chan, sgs, cpl);
        var y = x;
        if (p.post_conv == 0u) {
            let z = wb0 * x + wb1 * xm1 + wb2 * xm2 + wb3 * xm3;
            y = z / (1.0 + exp(-z));
            xm3 = xm2;
            xm2 = xm1;
            xm1 = x;
        }
        let base = (t * p.heads + h) * p.dk + lane;
        if (part == 2u) {
            prep_store(2u, base, sgs, cpl, y);
        } else {
            let ym = y * live;
            prep_store(part, base, sgs, cpl, y * (inverseSqrt(subgroupAdd(dot(ym, ym)) + 1e-6) * rs));
        }
    }
}
