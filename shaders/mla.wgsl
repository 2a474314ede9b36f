// Sparse absorbed MLA attention (spec 5.4) over the paged latent cache.
//
//   mla_absorb   qa[t,h] = scale * [ W_UK,h^T q_nope[t,h] | q_pe[t,h] ]          [T, H, R+E]
//   mla_attend   per (t, h, split): online softmax of qa[t,h] . row_s over its share of the
//                selected rows (or all s <= q_pos0 + t when dense), partial (m, l, sum p*c[0..R])
//   mla_combine  per (t, h): merge the splits, o = W_UV,h obar, optional sigmoid gate, lse
//   mla_logits   dense logits qa[t,h] . row_s for diagnostics, -inf beyond the causal limit
// Preconditions (host): q [T, q_stride] f32 with head h at h*(Dn+E) (nope then pe); kv_b_proj
// bf16 [H*(Dn+Dv), R] packed two per u32; R even, R <= 512, R+E <= 576, (R+E) % 8 == 0; the latent
// cache rows are R+E bf16 (c then k_pe) in pages c0..c15 (page i holds page0 << min(i,
// shift_max) rows); sel [T, k] i32 with -1 padding; part [T, H, splits, R+2] f32.

struct MlaParams {
    n_heads: u32,
    latent: u32,
    rope: u32,
    nope: u32,
    v_dim: u32,
    n_queries: u32,
    q_pos0: u32,
    k: u32,
    splits: u32,
    dense: u32,
    has_gate: u32,
    q_stride: u32,
    page0: u32,
    shift_max: u32,
    scale: f32,
    logit_stride: u32,
}

const WG: u32 = 256u;
const BLOCK: u32 = 16u;
const ROW_WORDS_MAX: u32 = 288u; // (R + E) / 2 <= 288, i.e. R + E <= 576

@group(0) @binding(0) var<uniform> p: MlaParams;
@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> wkv: array<u32>;
@group(0) @binding(3) var<storage, read_write> qa: array<f32>;

fn lo(x: u32) -> f32 {
    return bitcast<f32>(x << 16u);
}

fn hi(x: u32) -> f32 {
    return bitcast<f32>(x & 0xffff0000u);
}

fn wkv_at(i: u32) -> f32 {
    let word = wkv[i >> 1u];
    return select(lo(word), hi(word), (i & 1u) == 1u);
}

@compute @workgroup_size(256)
fn mla_absorb(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let c = wg.x * WG + lid;
    let h = wg.y;
    let t = wg.z;
    let width = p.latent + p.rope;
    if (c >= width) {
        return;
    }
    let qh = t * p.q_stride + h * (p.nope + p.rope);
    var acc = 0.0;
    if (c < p.latent) {
        let row0 = h * (p.nope + p.v_dim);
        for (var i = 0u; i < p.nope; i++) {
            acc += q[qh + i] * wkv_at((row0 + i) * p.latent + c);
        }
    } else {
        acc = q[qh + p.nope + c - p.latent];
    }
    qa[(t * p.n_heads + h) * width + c] = acc * p.scale;
}

@group(0) @binding(4) var<storage, read> sel: array<i32>;
@group(0) @binding(5) var<storage, read_write> part: array<f32>;
@group(0) @binding(6) var<storage, read> c0: array<u32>;
@group(0) @binding(7) var<storage, read> c1: array<u32>;
@group(0) @binding(8) var<storage, read> c2: array<u32>;
@group(0) @binding(9) var<storage, read> c3: array<u32>;
@group(0) @binding(10) var<storage, read> c4: array<u32>;
@group(0) @binding(11) var<storage, read> c5: array<u32>;
@group(0) @binding(12) var<storage, read> c6: array<u32>;
@group(0) @binding(13) var<storage, read> c7: array<u32>;
@group(0) @binding(14) var<storage, read> c8: array<u32>;
@group(0) @binding(15) var<storage, read> c9: array<u32>;
@group(0) @binding(16) var<storage, read> c10: array<u32>;
@group(0) @binding(17) var<storage, read> c11: array<u32>;
@group(0) @binding(18) var<storage, read> c12: array<u32>;
@group(0) @binding(19) var<storage, read> c13: array<u32>;
@group(0) @binding(20) var<storage, read> c14: array<u32>;
@group(0) @binding(21) var<storage, read> c15: array<u32>;

fn page_word(page: u32, i: u32) -> u32 {
    switch page {
        case 0u: { return c0[i]; }
        case 1u: { return c1[i]; }
        case 2u: { return c2[i]; }
        case 3u: { return c3[i]; }
        case 4u: { return c4[i]; }
        case 5u: { return c5[i]; }
        case 6u: { return c6[i]; }
        case 7u: { return c7[i]; }
        case 8u: { return c8[i]; }
        case 9u: { return c9[i]; }
        case 10u: { return c10[i]; }
        case 11u: { return c11[i]; }
        case 12u: { return c12[i]; }
        case 13u: { return c13[i]; }
        case 14u: { return c14[i]; }
        default: { return c15[i]; }
    }
}

// Page geometry (same as indexer.wgsl): returns (page, row in page).
fn locate(pos: u32) -> vec2<u32> {
    let doubling_end = p.page0 * ((2u << p.shift_max) - 1u);
    if (pos < doubling_end) {
        let i = firstLeadingBit(pos / p.page0 + 1u);
        return vec2<u32>(i, pos - p.page0 * ((1u << i) - 1u));
    }
    let big = p.page0 << p.shift_max;
    let j = (pos - doubling_end) / big;
    return vec2<u32>(p.shift_max + 1u + j, pos - doubling_end - j * big);
}

var<workgroup> qsh: array<f32, 576>;
var<workgroup> rows_sh: array<u32, 4608>; // BLOCK rows staged with independent, coalesced loads
var<workgroup> red: array<f32, WG>;
var<workgroup> lg: array<f32, BLOCK>;
var<workgroup> rpage: array<u32, BLOCK>;
var<workgroup> rbase: array<u32, BLOCK>;

const NONE: u32 = 0xffffffffu;

fn n_selected(t: u32) -> u32 {
    let n_valid = p.q_pos0 + t + 1u;
    return select(min(p.k, n_valid), n_valid, p.dense != 0u);
}

@compute @workgroup_size(256)
fn mla_attend(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let split = wg.x;
    let h = wg.y;
    let t = wg.z;
    let width = p.latent + p.rope;
    let words = width / 2u;
    let qbase = (t * p.n_heads + h) * width;
    for (var i = lid; i < width; i += WG) {
        qsh[i] = qa[qbase + i];
    }
    let n_sel = n_selected(t);
    let per = (n_sel + p.splits - 1u) / p.splits;
    let r0 = min(n_sel, split * per);
    let r1 = min(n_sel, r0 + per);
    let sub = lid & 15u;
    let r = lid >> 4u;
    let ninf = bitcast<f32>(0xff800000u);
    var m = ninf;
    var l = 0.0;
    var acc: array<f32, 2>;
    for (var b = r0; b < r1; b += BLOCK) {
        if (lid < BLOCK) {
            let idx = b + lid;
            var pos = NONE;
            if (idx < r1) {
                if (p.dense != 0u) {
                    pos = idx;
                } else {
                    let s = sel[t * p.k + idx];
                    pos = select(NONE, u32(s), s >= 0);
                }
            }
            if (pos == NONE) {
                rpage[lid] = NONE;
                rbase[lid] = 0u;
            } else {
                let at = locate(pos);
                rpage[lid] = at.x;
                rbase[lid] = at.y * words;
            }
        }
        workgroupBarrier();
        for (var i = lid; i < BLOCK * words; i += WG) {
            let rr = i / words;
            let pg = rpage[rr];
            var x = 0u;
            if (pg != NONE) {
                x = page_word(pg, rbase[rr] + i - rr * words);
            }
            rows_sh[i] = x;
        }
        workgroupBarrier();
        var d = 0.0;
        for (var w = sub; w < words; w += 16u) {
            let x = rows_sh[r * words + w];
            d += lo(x) * qsh[2u * w] + hi(x) * qsh[2u * w + 1u];
        }
        red[lid] = d;
        workgroupBarrier();
        if (sub == 0u) {
            var s = 0.0;
            for (var i = 0u; i < 16u; i++) {
                s += red[lid + i];
            }
            lg[r] = select(ninf, s, rpage[r] != NONE);
        }
        workgroupBarrier();
        var mb = ninf;
        for (var i = 0u; i < BLOCK; i++) {
            mb = max(mb, lg[i]);
        }
        let mn = max(m, mb);
        if (mn > ninf) {
            let corr = exp(m - mn);
            l *= corr;
            acc[0] *= corr;
            acc[1] *= corr;
            let owned = 2u * lid < p.latent;
            for (var i = 0u; i < BLOCK; i++) {
                if (rpage[i] == NONE) {
                    continue;
                }
                let pi = exp(lg[i] - mn);
                l += pi;
                if (owned) {
                    let x = rows_sh[i * words + lid];
                    acc[0] += pi * lo(x);
                    acc[1] += pi * hi(x);
                }
            }
            m = mn;
        }
        workgroupBarrier();
    }
    let out = ((t * p.n_heads + h) * p.splits + split) * (p.latent + 2u);
    if (lid == 0u) {
        part[out] = m;
        part[out + 1u] = l;
    }
    if (2u * lid < p.latent) {
        part[out + 2u + 2u * lid] = acc[0];
        part[out + 3u + 2u * lid] = acc[1];
    }
}

@group(0) @binding(22) var<storage, read> gate: array<f32>;
@group(0) @binding(23) var<storage, read_write> o: array<f32>;
@group(0) @binding(24) var<storage, read_write> lse: array<f32>;

var<workgroup> ob: array<f32, 512>;
var<workgroup> msum: array<f32, 2>;

@compute @workgroup_size(256)
fn mla_combine(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wg.x;
    let t = wg.y;
    let stride = p.latent + 2u;
    let base = (t * p.n_heads + h) * p.splits * stride;
    let ninf = bitcast<f32>(0xff800000u);
    var mx = ninf;
    for (var s = 0u; s < p.splits; s++) {
        mx = max(mx, part[base + s * stride]);
    }
    var total = 0.0;
    for (var s = 0u; s < p.splits; s++) {
        let ms = part[base + s * stride];
        if (ms > ninf) {
            total += part[base + s * stride + 1u] * exp(ms - mx);
        }
    }
    let inv = select(0.0, 1.0 / total, total > 0.0);
    for (var c = lid; c < p.latent; c += WG) {
        var v = 0.0;
        for (var s = 0u; s < p.splits; s++) {
            let ms = part[base + s * stride];
            if (ms > ninf) {
                v += part[base + s * stride + 2u + c] * exp(ms - mx);
            }
        }
        ob[c] = v * inv;
    }
    workgroupBarrier();
    for (var v = lid; v < p.v_dim; v += WG) {
        let row = h * (p.nope + p.v_dim) + p.nope + v;
        let w0 = row * p.latent / 2u;
        var acc = 0.0;
        for (var c = 0u; c < p.latent / 2u; c++) {
            let x = wkv[w0 + c];
            acc += lo(x) * ob[2u * c] + hi(x) * ob[2u * c + 1u];
        }
        let oi = (t * p.n_heads + h) * p.v_dim + v;
        if (p.has_gate != 0u) {
            acc *= 1.0 / (1.0 + exp(-gate[oi]));
        }
        o[oi] = acc;
    }
    if (lid == 0u) {
        lse[t * p.n_heads + h] = mx + log(total);
    }
}

@group(0) @binding(25) var<storage, read_write> logits: array<f32>;

@compute @workgroup_size(256)
fn mla_logits(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let s = wg.x * WG + lid;
    let h = wg.y;
    let t = wg.z;
    if (s >= p.logit_stride) {
        return;
    }
    let width = p.latent + p.rope;
    let out = (t * p.n_heads + h) * p.logit_stride + s;
    if (s > p.q_pos0 + t) {
        logits[out] = bitcast<f32>(0xff800000u);
        return;
    }
    let qbase = (t * p.n_heads + h) * width;
    let at = locate(s);
    let rb = at.y * (width / 2u);
    var d = 0.0;
    for (var w = 0u; w < width / 2u; w++) {
        let x = page_word(at.x, rb + w);
        d += lo(x) * qa[qbase + 2u * w] + hi(x) * qa[qbase + 2u * w + 1u];
    }
    logits[out] = d;
}
