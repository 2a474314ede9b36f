// Block Attention Residuals aggregation (spec 3.1), fused with the RMSNorm that follows it:
//   sources v_j: bank entries j < n_bank (bank[j, t, :]) then the current partial c[t, :],
//     c = cur, or c = cur + addend (the residual sum, also written to `part`) when `add`;
//   s_j = (v_j . (gamma * proj)) * rsqrt(mean(v_j^2) + eps);  alpha = softmax(s)
//   h[t, :] = sum_j alpha_j v_j;  out = RMSNorm(h; norm_w, eps) when `norm`, else out = h;
//   alpha[t, j] is written too.
// With n_bank = 0 this is RMSNorm(cur + addend) (alpha = 1): the plain-residual models' add
// and norm in the same two passes.
// Preconditions (host-checked): n_bank + 1 <= MAX_SOURCES; bank holds n_bank entries of
// bank_stride f32 (>= tokens * d); cur, addend, part and out hold tokens * d f32; gamma, proj,
// norm_w hold d bf16; alpha holds T * n + T * chunks * P f32 (P below); chunks * P <= 2048.
// Where `add` is off, addend may alias cur and part is a dummy.
//
// Decode: two wide passes (one workgroup per token was latency-bound: 36-108 us at d = 7168 on
// an H200 for a first kernel, 11.5-17.3 us for attn_res_one below, against ~4 us of launch per
// pass); prefill: attn_res_one (below).
//   attn_res_sums, grid (n * chunks, T): workgroup (j, c) sums, over the `chunk` columns of
//     chunk c, v_j . (gamma * proj) and the Gram entries v_j . v_k for k <= j;
//   attn_res_mix, grid (ceil(d / WG), T): every workgroup adds the chunks' partial sums,
//     takes the softmax and the mix's mean square sum_jk alpha_j alpha_k G_jk (so the norm
//     needs no third pass), and mixes and scales its WG columns.
// Partial sums of token t, chunk c: alpha[T * n + (t * chunks + c) * P + m], P = n + n(n+1)/2,
// m = j for the dot of source j, n + j(j+1)/2 + k for G_jk.

#include "lib/attn_res_common.wgsl"

// The softmax of the n scores in `weights`, in place: thread j < n takes source j, every sum
// in source order, so the bits are those of one thread doing it all (which took ~3 us at 9
// sources: a chain of dependent workgroup-memory reads quadratic in n). Returns thread j's
// weight (0 past n). Called from uniform control flow (it holds a barrier).
fn softmax_weights(lid: u32, n: u32) -> f32 {
    var w_mine = 0.0;
    if (lid < n) {
        var mx = -3.40282347e38;
        for (var j = 0u; j < n; j++) {
            mx = max(mx, weights[j]);
        }
        var sum = 0.0;
        for (var j = 0u; j < n; j++) {
            sum += exp(weights[j] - mx);
        }
        w_mine = exp(weights[lid] - mx) / sum;
    }
    workgroupBarrier();
    if (lid < n) {
        weights[lid] = w_mine;
    }
    return w_mine;
}

@compute @workgroup_size(256)
fn attn_res_sums(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let slot = sums_slot(wg);
    if (slot.w == 0u) {
        return;
    }
    let s = sums_share(slot.x, slot.y, slot.z, lid);
    red[lid] = s.x;
    red[WG + lid] = s.y;
    workgroupBarrier();
    for (var h = WG / 2u; h > 0u; h = h >> 1u) {
        if (lid < h) {
            red[lid] += red[lid + h];
            red[WG + lid] += red[WG + lid + h];
        }
        workgroupBarrier();
    }
    if (lid == 0u) {
        store_sums(slot.x, slot.y, slot.z, red[0], red[WG]);
    }
}

// The softmax weights into `weights` (alpha[t, :] too when `write_alpha`) from the partial
// totals at red[tot..], returning the mix's inverse RMS (1 without `norm`). Thread j < n takes
// source j; called from uniform control flow.
fn mix_weights(t: u32, lid: u32, tot: u32, write_alpha: bool) -> f32 {
    let n = p.n_bank + 1u;
    // The scores, then their softmax and the mix's inverse RMS (thread j < n for source j).
    if (lid < n) {
        weights[lid] = red[tot + lid] * inverseSqrt(red[tot + n + lid * (lid + 1u) / 2u + lid] / f32(p.d) + p.eps);
    }
    workgroupBarrier();
    let w_mine = softmax_weights(lid, n);
    if (lid < n && write_alpha) {
        alpha[t * n + lid] = w_mine;
    }
    workgroupBarrier();
    // The mix's mean square from the Gram matrix: ||sum_j a_j v_j||^2 = sum_jk a_j a_k G_jk
    // (the sources are residual states, strongly correlated, not cancelling: no precision
    // lost against summing h^2 directly, and no third pass); source j's term by thread j.
    if (lid < n) {
        var row = 0.0;
        for (var k = 0u; k < lid; k++) {
            row += weights[k] * red[tot + n + lid * (lid + 1u) / 2u + k];
        }
        hh_terms[lid] = w_mine * (2.0 * row + w_mine * red[tot + n + lid * (lid + 1u) / 2u + lid]);
    }
    workgroupBarrier();
    if (lid == 0u) {
        var hh = 0.0;
        for (var j = 0u; j < n; j++) {
            hh += hh_terms[j];
        }
        weights[MAX_SOURCES] = inverseSqrt(max(hh, 0.0) / f32(p.d) + p.eps);
    }
    workgroupBarrier();
    return select(1.0, weights[MAX_SOURCES], p.norm != 0u);
}

@compute @workgroup_size(256)
fn attn_res_mix(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.y;
    if (t >= p.tokens) {
        return;
    }
    let i = min(wg.x * WG + lid, p.d - 1u);
    let f = prefetch(t, i);
    let tot = partial_totals(t, lid, WG);
    let inv = mix_weights(t, lid, tot, wg.x == 0u);
    let o = mix_column(f, t, i, inv);
    if (wg.x * WG + lid < p.d) {
        out[t * p.d + i] = o;
    }
}

// One dispatch per aggregation, one workgroup of ONE_WG threads per token doing the sums, the
// softmax, the mix and its norm: for many tokens (prefill) 5x faster than the two passes on an
// H200; for one token (decode) a single workgroup's dependent load rounds make it no faster. Needs d % 4 == 0, d <= 8 * ONE_WG (each thread
// mixes at most two vec4 columns) and bank_stride % 4 == 0 (host-checked); writes alpha[t, :]
// and, with `add`, part[t, :] like the two passes.
//   phase 1: the sources split over the threads (ONE_WG / n each, whole source rows), each
//     thread summing v . (gamma * proj) and v . v over its vec4 columns of one source, then a
//     tree reduction within each source's threads;
//   phase 2: the softmax (thread j takes source j, sums in source order);
//   phase 3: each thread mixes its (at most two) vec4 columns from all sources, the mix's
//     mean square by a tree reduction, then the scaled output.
const ONE_WG: u32 = 1024u;
var<workgroup> one_dot: array<f32, 1024>;
var<workgroup> one_sq: array<f32, 1024>;

@group(0) @binding(1) var<storage, read> bank4: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> cur4: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read> addend4: array<vec4<f32>>;
@group(0) @binding(8) var<storage, read_write> part4: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read_write> out4: array<vec4<f32>>;

// The four bf16 of two words (low half first), as f32.
fn bf16x4(w0: u32, w1: u32) -> vec4<f32> {
    return vec4<f32>(bf16_of(w0, 0u), bf16_of(w0, 1u), bf16_of(w1, 0u), bf16_of(w1, 1u));
}

// gamma * proj at vec4 column g.
fn query4(g: u32) -> vec4<f32> {
    return bf16x4(gamma[2u * g], gamma[2u * g + 1u]) * bf16x4(proj[2u * g], proj[2u * g + 1u]);
}

fn norm4(g: u32) -> vec4<f32> {
    return bf16x4(norm_w[2u * g], norm_w[2u * g + 1u]);
}

// The current partial of token t at vec4 column g.
fn current4(t: u32, g: u32) -> vec4<f32> {
    let c = t * (p.d / 4u) + g;
    var v = cur4[c];
    if (p.add != 0u) {
        v += addend4[c];
    }
    return v;
}

// Bank entry j of token t at vec4 column g (j clamped to the bank: the caller drops it).
fn bank_at(j: u32, t: u32, g: u32) -> vec4<f32> {
    return bank4[(min(j, max(p.n_bank, 1u) - 1u) * p.bank_stride + t * p.d) / 4u + g];
}

// Source j of token t at vec4 column g (`last`: j is the current partial).
fn source4(j: u32, t: u32, g: u32, last: bool) -> vec4<f32> {
    if (last) {
        return current4(t, g);
    }
    return bank_at(j, t, g);
}

// Sum of weights[j] * source j at vec4 column g of token t (weights hold the softmax).
fn mix4(t: u32, g: u32, n: u32) -> vec4<f32> {
    let b0 = bank_at(0u, t, g);
    let b1 = bank_at(1u, t, g);
    let b2 = bank_at(2u, t, g);
    let b3 = bank_at(3u, t, g);
    let b4 = bank_at(4u, t, g);
    let b5 = bank_at(5u, t, g);
    let b6 = bank_at(6u, t, g);
    let b7 = bank_at(7u, t, g);
    var h = weights[n - 1u] * current4(t, g);
    if (p.n_bank > 0u) {
        h += weights[0] * b0;
    }
    if (p.n_bank > 1u) {
        h += weights[1] * b1;
    }
    if (p.n_bank > 2u) {
        h += weights[2] * b2;
    }
    if (p.n_bank > 3u) {
        h += weights[3] * b3;
    }
    if (p.n_bank > 4u) {
        h += weights[4] * b4;
    }
    if (p.n_bank > 5u) {
        h += weights[5] * b5;
    }
    if (p.n_bank > 6u) {
        h += weights[6] * b6;
    }
    if (p.n_bank > 7u) {
        h += weights[7] * b7;
    }
    for (var k = PREFETCH; k < p.n_bank; k++) {
        h += weights[k] * bank_at(k, t, g);
    }
    return h;
}

@compute @workgroup_size(1024)
fn attn_res_one(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.y;
    if (t >= p.tokens) {
        return;
    }
    let n = p.n_bank + 1u;
    let v4 = p.d / 4u;
    // Phase 1: threads [j * tps, (j + 1) * tps) take source j.
    let tps = ONE_WG / n;
    let j = min(lid / tps, n - 1u);
    let s = lid - j * tps;
    var dq = 0.0;
    var sq = 0.0;
    if (lid < n * tps) {
        // Four columns in flight per step, their loads issued before any arithmetic (named
        // registers: an indexed private array would go to local memory on some drivers).
        let last = j == n - 1u;
        for (var g0 = s; g0 < v4; g0 += 4u * tps) {
            let g1 = min(g0 + tps, v4 - 1u);
            let g2 = min(g0 + 2u * tps, v4 - 1u);
            let g3 = min(g0 + 3u * tps, v4 - 1u);
            let v0 = source4(j, t, g0, last);
            let v1 = source4(j, t, g1, last);
            let v2 = source4(j, t, g2, last);
            let v3 = source4(j, t, g3, last);
            let q0 = query4(g0);
            let q1 = query4(g1);
            let q2 = query4(g2);
            let q3 = query4(g3);
            dq += dot(v0, q0);
            sq += dot(v0, v0);
            if (g0 + tps < v4) {
                dq += dot(v1, q1);
                sq += dot(v1, v1);
            }
            if (g0 + 2u * tps < v4) {
                dq += dot(v2, q2);
                sq += dot(v2, v2);
            }
            if (g0 + 3u * tps < v4) {
                dq += dot(v3, q3);
                sq += dot(v3, v3);
            }
            if (p.add != 0u && last) {
                part4[t * v4 + g0] = v0;
                if (g0 + tps < v4) {
                    part4[t * v4 + g1] = v1;
                }
                if (g0 + 2u * tps < v4) {
                    part4[t * v4 + g2] = v2;
                }
                if (g0 + 3u * tps < v4) {
                    part4[t * v4 + g3] = v3;
                }
            }
        }
    }
    one_dot[lid] = dq;
    one_sq[lid] = sq;
    workgroupBarrier();
    // Tree reduction within each source's tps threads (the same order for every token).
    var span = 1u;
    while (span * 2u < tps) {
        span *= 2u;
    }
    for (var h = span; h > 0u; h = h >> 1u) {
        if (lid < n * tps && s < h && s + h < tps) {
            one_dot[lid] += one_dot[lid + h];
            one_sq[lid] += one_sq[lid + h];
        }
        workgroupBarrier();
    }
    // Phase 2: the softmax, thread j for source j, sums in source order.
    if (lid < n) {
        weights[lid] = one_dot[lid * tps] * inverseSqrt(one_sq[lid * tps] / f32(p.d) + p.eps);
    }
    workgroupBarrier();
    let w_mine = softmax_weights(lid, n);
    if (lid < n) {
        alpha[t * n + lid] = w_mine;
    }
    workgroupBarrier();
    // Phase 3: mix columns lid and lid + ONE_WG, each from all its sources' loads issued
    // together (the first 8 bank entries clamped and named, as in attn_res_mix).
    let ga = min(lid, v4 - 1u);
    let gb = min(lid + ONE_WG, v4 - 1u);
    let ha = mix4(t, ga, n);
    let hb = mix4(t, gb, n);
    var hh = 0.0;
    if (lid < v4) {
        hh += dot(ha, ha);
    }
    if (lid + ONE_WG < v4) {
        hh += dot(hb, hb);
    }
    one_sq[lid] = hh;
    workgroupBarrier();
    for (var h = ONE_WG / 2u; h > 0u; h = h >> 1u) {
        if (lid < h) {
            one_sq[lid] += one_sq[lid + h];
        }
        workgroupBarrier();
    }
    let inv = select(1.0, inverseSqrt(one_sq[0] / f32(p.d) + p.eps), p.norm != 0u);
    if (lid < v4) {
        var o = ha * inv;
        if (p.norm != 0u) {
            o *= norm4(ga);
        }
        out4[t * v4 + ga] = o;
    }
    if (lid + ONE_WG < v4) {
        var o = hb * inv;
        if (p.norm != 0u) {
            o *= norm4(gb);
        }
        out4[t * v4 + gb] = o;
    }
}
