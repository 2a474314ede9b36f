// Sparse absorbed MLA attention (spec 5.4) over the paged latent cache.
//
//   mla_absorb   qa[t,h] = scale * [ W_UK,h^T q_nope[t,h] | q_pe[t,h] ]          [T, H, R+E]
//   mla_attend_grouped  as mla_attend for 8 heads per workgroup (each row staged once per 8 heads)
//   mla_attend   per (t, h, split): online softmax of qa[t,h] . row_s over its share of the
//                selected rows (or all s <= q_pos0 + t when dense), partial (m, l, sum p*c[0..R])
//   mla_merge    per (t, h, 128 columns): merge the splits into obar (over split 0's partial), lse
//   mla_out      per (t, W_UV row): o = W_UV,h obar, optional sigmoid gate
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

// mla_absorb: grid (ceil(R / 128), H, T); thread (word u of 64, row group g of 4) sums rows
// i = g, g + 4, ... of W_UK,h for two latent columns, eight independent loads per step (a
// thread per column looping over all rows waited on each load in turn).
var<workgroup> qn: array<f32, 512>;
var<workgroup> part2: array<vec2<f32>, 256>;

fn absorb_term(row0: u32, i: u32, w: u32, words: u32) -> vec2<f32> {
    let ic = min(i, p.nope - 1u);
    let x = wkv[(row0 + ic) * words + w];
    return select(0.0, qn[ic], i < p.nope) * vec2<f32>(lo(x), hi(x));
}

@compute @workgroup_size(256)
fn mla_absorb(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wg.y;
    let t = wg.z;
    let width = p.latent + p.rope;
    let words = p.latent / 2u;
    let qh = t * p.q_stride + h * (p.nope + p.rope);
    let out = (t * p.n_heads + h) * width;
    for (var i = lid; i < p.nope; i += WG) {
        qn[i] = q[qh + i];
    }
    if (wg.x == 0u) {
        for (var c = lid; c < p.rope; c += WG) {
            qa[out + p.latent + c] = q[qh + p.nope + c] * p.scale;
        }
    }
    workgroupBarrier();
    let u = lid % 64u;
    let g = lid / 64u;
    let w = min(wg.x * 64u + u, words - 1u);
    let row0 = h * (p.nope + p.v_dim);
    var acc = vec2<f32>(0.0);
    for (var i0 = g; i0 < p.nope; i0 += 32u) {
        let t0 = absorb_term(row0, i0, w, words);
        let t1 = absorb_term(row0, i0 + 4u, w, words);
        let t2 = absorb_term(row0, i0 + 8u, w, words);
        let t3 = absorb_term(row0, i0 + 12u, w, words);
        let t4 = absorb_term(row0, i0 + 16u, w, words);
        let t5 = absorb_term(row0, i0 + 20u, w, words);
        let t6 = absorb_term(row0, i0 + 24u, w, words);
        let t7 = absorb_term(row0, i0 + 28u, w, words);
        acc += ((t0 + t1) + (t2 + t3)) + ((t4 + t5) + (t6 + t7));
    }
    part2[lid] = acc;
    workgroupBarrier();
    if (g == 0u && wg.x * 64u + u < words) {
        let s = (part2[u] + part2[u + 64u]) + (part2[u + 128u] + part2[u + 192u]);
        qa[out + 2u * w] = s.x * p.scale;
        qa[out + 2u * w + 1u] = s.y * p.scale;
    }
}

@group(0) @binding(4) var<storage, read> sel: array<i32>;
@group(0) @binding(5) var<storage, read_write> part: array<f32>;
@group(0) @binding(6) var<storage, read> c0: array<vec4<u32>>;
@group(0) @binding(7) var<storage, read> c1: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read> c2: array<vec4<u32>>;
@group(0) @binding(9) var<storage, read> c3: array<vec4<u32>>;
@group(0) @binding(10) var<storage, read> c4: array<vec4<u32>>;
@group(0) @binding(11) var<storage, read> c5: array<vec4<u32>>;
@group(0) @binding(12) var<storage, read> c6: array<vec4<u32>>;
@group(0) @binding(13) var<storage, read> c7: array<vec4<u32>>;
@group(0) @binding(14) var<storage, read> c8: array<vec4<u32>>;
@group(0) @binding(15) var<storage, read> c9: array<vec4<u32>>;
@group(0) @binding(16) var<storage, read> c10: array<vec4<u32>>;
@group(0) @binding(17) var<storage, read> c11: array<vec4<u32>>;
@group(0) @binding(18) var<storage, read> c12: array<vec4<u32>>;
@group(0) @binding(19) var<storage, read> c13: array<vec4<u32>>;
@group(0) @binding(20) var<storage, read> c14: array<vec4<u32>>;
@group(0) @binding(21) var<storage, read> c15: array<vec4<u32>>;

// 16-byte unit i of page `page` (rows are (R + E) / 8 units; R + E is a multiple of 8).
fn page_unit(page: u32, i: u32) -> vec4<u32> {
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

fn page_word(page: u32, i: u32) -> u32 {
    return page_unit(page, i >> 2u)[i & 3u];
}

#include "lib/page_locate.wgsl"

var<workgroup> qsh: array<f32, 576>;
var<workgroup> rows_sh: array<u32, 4608>; // BLOCK rows staged with independent, coalesced loads
var<workgroup> red: array<f32, WG>;
var<workgroup> lg: array<f32, BLOCK>;
var<workgroup> rpage: array<u32, BLOCK>;
var<workgroup> rbase: array<u32, BLOCK>;

const NONE: u32 = 0xffffffffu;

// Position of selection entry idx of query t (every position when dense); NONE past r1 or
// for a -1 padding entry.
fn selected_pos(t: u32, idx: u32, r1: u32) -> u32 {
    if (idx >= r1) {
        return NONE;
    }
    if (p.dense != 0u) {
        return idx;
    }
    let s = sel[t * p.k + idx];
    return select(NONE, u32(s), s >= 0);
}

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
            let pos = selected_pos(t, b + lid, r1);
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

// mla_attend_grouped: the same partials as mla_attend, but one workgroup serves HG heads of a
// query, so each selected row is staged in workgroup memory once per HG heads (not once per
// head): grid (splits, ceil(H / HG), T). Per block of 16 rows: 16 threads per row stage it with
// 16-byte loads (one page lookup per thread; the next block's loads are in flight while this one
// is used); thread (half, head, row) forms half of one logit from 16-byte units; 128 threads
// (head, row) run the block's online-softmax step in parallel; then every thread owning latent
// word lid accumulates p * c for all HG heads (vec2 accumulators in registers).
const HG: u32 = 8u;
const QU: u32 = 144u;     // q vec4s per head in qv (>= (R + E) / 4)
const USTRIDE: u32 = 73u; // staged row stride in 16-byte units (odd: rows fall in different banks)
const SU: u32 = 5u;       // staged units per thread per block: ceil(72 / 16)

var<workgroup> rows_u: array<vec4<u32>, 1168>; // BLOCK x USTRIDE
var<workgroup> qv: array<vec4<f32>, 1152>;     // HG x QU
var<workgroup> lgb: array<f32, 256>;           // half-dot partials [half][head][row]
var<workgroup> pl: array<f32, 128>;            // logits [head][row] of the block
var<workgroup> pe: array<f32, 128>;            // p [head][row] of the block
var<workgroup> hm: array<f32, HG>;             // running max per head
var<workgroup> hl: array<f32, HG>;             // running sum per head
var<workgroup> hc: array<f32, HG>;             // this block's rescale per head
var<workgroup> rpg: array<u32, 32>;            // [2 slots][BLOCK] page of each row (NONE: no row)
var<workgroup> rbs: array<u32, 32>;            // [2 slots][BLOCK] first unit of each row in its page

// Selection entry idx (< r1) of query t as (page, first unit) in slot `slot`, row lid.
fn row_at(slot: u32, b: u32, r1: u32, t: u32, units: u32, lid: u32) {
    let pos = selected_pos(t, b + lid, r1);
    if (pos == NONE) {
        rpg[slot * BLOCK + lid] = NONE;
        rbs[slot * BLOCK + lid] = 0u;
    } else {
        let at = locate(pos);
        rpg[slot * BLOCK + lid] = at.x;
        rbs[slot * BLOCK + lid] = at.y * units;
    }
}

#include "lib/bf16_unit.wgsl"

@compute @workgroup_size(256)
fn mla_attend_grouped(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let split = wg.x;
    let h0 = wg.y * HG;
    let t = wg.z;
    let width = p.latent + p.rope;
    let units = width / 8u;
    let ninf = bitcast<f32>(0xff800000u);
    for (var i = lid; i < HG * QU; i += WG) {
        let hh = i / QU;
        let u = i - hh * QU;
        var v = vec4<f32>(0.0);
        if (h0 + hh < p.n_heads && u < 2u * units) {
            let qb = (t * p.n_heads + h0 + hh) * width + 4u * u;
            v = vec4<f32>(qa[qb], qa[qb + 1u], qa[qb + 2u], qa[qb + 3u]);
        }
        qv[i] = v;
    }
    if (lid < HG) {
        hm[lid] = ninf;
        hl[lid] = 0.0;
    }
    let n_sel = n_selected(t);
    let per = (n_sel + p.splits - 1u) / p.splits;
    let r0 = min(n_sel, split * per);
    let r1 = min(n_sel, r0 + per);
    // Staging role: row sr of the block, units su + 16 j.
    let sr = lid / 16u;
    let su = lid % 16u;
    // Logit role: (half, head lh, row lr).
    let lr = lid % BLOCK;
    let lh = (lid / BLOCK) % HG;
    let half = lid / (BLOCK * HG);
    let hu = (units + 1u) / 2u;
    let u_end = min(units, half * hu + hu);
    let owned = lid < p.latent / 2u;
    var a0 = vec2<f32>(0.0);
    var a1 = vec2<f32>(0.0);
    var a2 = vec2<f32>(0.0);
    var a3 = vec2<f32>(0.0);
    var a4 = vec2<f32>(0.0);
    var a5 = vec2<f32>(0.0);
    var a6 = vec2<f32>(0.0);
    var a7 = vec2<f32>(0.0);
    if (lid < BLOCK) {
        row_at(0u, r0, r1, t, units, lid);
    }
    workgroupBarrier();
    var xs: array<vec4<u32>, SU>;
    {
        let pg = rpg[sr];
        let rb = rbs[sr];
        for (var j = 0u; j < SU; j++) {
            let u = su + 16u * j;
            xs[j] = select(vec4<u32>(0u), page_unit(pg, rb + min(u, units - 1u)), pg != NONE && u < units);
        }
    }
    var slot = 0u;
    for (var b = r0; b < r1; b += BLOCK) {
        if (lid < BLOCK) {
            row_at(1u - slot, b + BLOCK, r1, t, units, lid);
        }
        for (var j = 0u; j < SU; j++) {
            let u = su + 16u * j;
            if (u < units) {
                rows_u[sr * USTRIDE + u] = xs[j];
            }
        }
        workgroupBarrier();
        if (b + BLOCK < r1) {
            let pg = rpg[(1u - slot) * BLOCK + sr];
            let rb = rbs[(1u - slot) * BLOCK + sr];
            for (var j = 0u; j < SU; j++) {
                let u = su + 16u * j;
                xs[j] = select(vec4<u32>(0u), page_unit(pg, rb + min(u, units - 1u)), pg != NONE && u < units);
            }
        }
        var d = 0.0;
        let rb = lr * USTRIDE;
        let qb = lh * QU;
        for (var u = half * hu; u < u_end; u++) {
            d += unit_dot(rows_u[rb + u], qv[qb + 2u * u], qv[qb + 2u * u + 1u]);
        }
        lgb[lid] = d;
        workgroupBarrier();
        // Online softmax step, thread (head sh, row sr2) for lid < 128.
        let sh = lid / BLOCK;
        let sr2 = lid % BLOCK;
        var mn = ninf;
        if (lid < BLOCK * HG) {
            pl[lid] = select(ninf, lgb[lid] + lgb[BLOCK * HG + lid], rpg[slot * BLOCK + sr2] != NONE);
        }
        workgroupBarrier();
        if (lid < BLOCK * HG) {
            var mb = ninf;
            for (var r = 0u; r < BLOCK; r++) {
                mb = max(mb, pl[sh * BLOCK + r]);
            }
            let mo = hm[sh];
            mn = max(mo, mb);
            pe[lid] = select(0.0, exp(pl[lid] - mn), mn > ninf);
            if (sr2 == 0u) {
                hc[sh] = select(1.0, exp(mo - mn), mn > ninf);
            }
        }
        workgroupBarrier();
        if (lid < BLOCK * HG && sr2 == 0u) {
            var sum = 0.0;
            for (var r = 0u; r < BLOCK; r++) {
                sum += pe[lid + r];
            }
            hl[sh] = hl[sh] * hc[sh] + sum;
            hm[sh] = mn;
        }
        if (owned) {
            a0 *= hc[0];
            a1 *= hc[1];
            a2 *= hc[2];
            a3 *= hc[3];
            a4 *= hc[4];
            a5 *= hc[5];
            a6 *= hc[6];
            a7 *= hc[7];
            let wu = lid >> 2u;
            let wc = lid & 3u;
            for (var r = 0u; r < BLOCK; r++) {
                let xw = rows_u[r * USTRIDE + wu][wc];
                let x = vec2<f32>(bitcast<f32>(xw << 16u), bitcast<f32>(xw & 0xffff0000u));
                a0 += pe[r] * x;
                a1 += pe[BLOCK + r] * x;
                a2 += pe[2u * BLOCK + r] * x;
                a3 += pe[3u * BLOCK + r] * x;
                a4 += pe[4u * BLOCK + r] * x;
                a5 += pe[5u * BLOCK + r] * x;
                a6 += pe[6u * BLOCK + r] * x;
                a7 += pe[7u * BLOCK + r] * x;
            }
        }
        workgroupBarrier();
        slot = 1u - slot;
    }
    workgroupBarrier();
    let stride = p.latent + 2u;
    for (var hh = 0u; hh < HG; hh++) {
        let h = h0 + hh;
        if (h >= p.n_heads) {
            break;
        }
        let out = ((t * p.n_heads + h) * p.splits + split) * stride;
        if (lid == 0u) {
            part[out] = hm[hh];
            part[out + 1u] = hl[hh];
        }
        if (owned) {
            var a = a0;
            switch hh {
                case 1u: { a = a1; }
                case 2u: { a = a2; }
                case 3u: { a = a3; }
                case 4u: { a = a4; }
                case 5u: { a = a5; }
                case 6u: { a = a6; }
                case 7u: { a = a7; }
                default: {}
            }
            part[out + 2u + 2u * lid] = a.x;
            part[out + 3u + 2u * lid] = a.y;
        }
    }
}

@group(0) @binding(22) var<storage, read> gate: array<f32>;
@group(0) @binding(23) var<storage, read_write> o: array<f32>;
@group(0) @binding(24) var<storage, read_write> lse: array<f32>;

// mla_merge: grid (ceil(R / 128), H, T). Merges the splits of (t, h) into obar (the softmax-
// weighted mean of the latent rows), written over split 0's partial, and the log-sum-exp.
// Thread (word u of 64, split group g of 4) adds splits g, g + 4, ... of its two columns
// (independent loads), then the four groups meet in workgroup memory.
var<workgroup> ms: array<f32, 32>;
var<workgroup> ls: array<f32, 32>;

@compute @workgroup_size(256)
fn mla_merge(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wg.y;
    let t = wg.z;
    let stride = p.latent + 2u;
    let base = (t * p.n_heads + h) * p.splits * stride;
    let ninf = bitcast<f32>(0xff800000u);
    if (lid < 32u) {
        let s = min(lid, p.splits - 1u);
        ms[lid] = select(ninf, part[base + s * stride], lid < p.splits);
        ls[lid] = select(0.0, part[base + s * stride + 1u], lid < p.splits);
    }
    workgroupBarrier();
    var mx = ninf;
    for (var s = 0u; s < 32u; s++) {
        mx = max(mx, ms[s]);
    }
    var total = 0.0;
    for (var s = 0u; s < 32u; s++) {
        total += select(0.0, ls[s] * exp(ms[s] - mx), ms[s] > ninf);
    }
    let inv = select(0.0, 1.0 / total, total > 0.0);
    let words = p.latent / 2u;
    let u = lid % 64u;
    let g = lid / 64u;
    let w = min(wg.x * 64u + u, words - 1u);
    var acc = vec2<f32>(0.0);
    for (var k = 0u; k < 8u; k++) {
        let s = g + 4u * k;
        let at = base + min(s, p.splits - 1u) * stride + 2u + 2u * w;
        let v = vec2<f32>(part[at], part[at + 1u]);
        let m = ms[min(s, 31u)];
        acc += select(vec2<f32>(0.0), exp(m - mx) * v, s < p.splits && m > ninf);
    }
    part2[lid] = acc;
    workgroupBarrier();
    if (g == 0u && wg.x * 64u + u < words) {
        let sum = (part2[u] + part2[u + 64u]) + (part2[u + 128u] + part2[u + 192u]);
        part[base + 2u + 2u * w] = sum.x * inv;
        part[base + 3u + 2u * w] = sum.y * inv;
    }
    if (wg.x == 0u && lid == 0u) {
        lse[t * p.n_heads + h] = mx + log(total);
    }
}

// mla_out: grid (ceil(H * Dv / 8), T). o[t, h, v] = W_UV[h, v] . obar[t, h] (optional sigmoid
// gate): 32 threads per row, eight independent loads each, then a 32-way sum.
var<workgroup> red_o: array<f32, 256>;

@compute @workgroup_size(256)
fn mla_out(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let t = wg.y;
    let lane = lid % 32u;
    let rows = p.n_heads * p.v_dim;
    let row = min(wg.x * 8u + lid / 32u, rows - 1u);
    let h = row / p.v_dim;
    let v = row - h * p.v_dim;
    let words = p.latent / 2u;
    let w0 = (h * (p.nope + p.v_dim) + p.nope + v) * words;
    let ob = (t * p.n_heads + h) * p.splits * (p.latent + 2u) + 2u;
    var acc = 0.0;
    for (var c0 = 0u; c0 < words; c0 += 256u) {
        var xs: array<u32, 8>;
        for (var j = 0u; j < 8u; j++) {
            xs[j] = wkv[w0 + min(c0 + lane + 32u * j, words - 1u)];
        }
        for (var j = 0u; j < 8u; j++) {
            let c = c0 + lane + 32u * j;
            let cc = min(c, words - 1u);
            let d = lo(xs[j]) * part[ob + 2u * cc] + hi(xs[j]) * part[ob + 2u * cc + 1u];
            acc += select(0.0, d, c < words);
        }
    }
    red_o[lid] = acc;
    workgroupBarrier();
    if (lid < 8u && wg.x * 8u + lid < rows) {
        var s = 0.0;
        for (var j = 0u; j < 32u; j++) {
            s += red_o[lid * 32u + j];
        }
        let r = wg.x * 8u + lid;
        let oi = t * rows + r;
        if (p.has_gate != 0u) {
            s *= 1.0 / (1.0 + exp(-gate[oi]));
        }
        o[oi] = s;
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
