// Sparse absorbed MLA attention (spec 5.4) over the paged latent cache, decode and prefill.
//
//   mla_absorb        qa[t,h] = scale * [ W_UK,h^T q_nope[t,h] | q_pe[t,h] ]           [T, H, R+E]
//   mla_attend_tiled  per (split, 16 heads, t): online softmax of qa[t,h] . row_s over the split's
//                     share of the selected rows (all s <= q_pos0 + t when dense) -> partials
//   mla_attend        the same partials per (split, head, t) (simple fallback, for debugging)
//   mla_merge_out     per (32 W_UV rows of head h, t): merges the splits into obar in workgroup
//                     memory, o = W_UV,h obar (optional sigmoid gate), lse
//   mla_logits        dense logits qa[t,h] . row_s for diagnostics, -inf beyond the causal limit
// Preconditions (host): q [T, q_stride] f32 with head h at h*(Dn+E) (nope then pe); kv_b_proj
// bf16 [H*(Dn+Dv), R] packed two per u32 (also bound as vec4s); R even, R <= 512, R+E <= 576,
// (R+E) % 8 == 0, Dn <= 512; the latent cache rows are R+E bf16 (c then k_pe) in pages c0..c15
// (page i holds page0 << min(i, shift_max) rows); sel [T, k] i32 with -1 padding; partials
// [T, H, splits, ceil(R/4) + 1] vec4: sum p*c[0..R] (padded to whole vec4s), then (m, l, -, -);
// splits <= 128.

#include "lib/mla_cache.wgsl"

const WG: u32 = 256u;
const BLOCK: u32 = 16u;
const ROW_WORDS_MAX: u32 = 288u; // (R + E) / 2 <= 288, i.e. R + E <= 576

@group(0) @binding(1) var<storage, read> q: array<f32>;
@group(0) @binding(2) var<storage, read> wkv: array<u32>;
@group(0) @binding(3) var<storage, read_write> qa: array<f32>;
@group(0) @binding(26) var<storage, read_write> part4: array<vec4<f32>>;
@group(0) @binding(27) var<storage, read> qa4: array<vec4<f32>>;
@group(0) @binding(28) var<storage, read> wkv4: array<vec4<u32>>;

// Unit u (columns 8u..8u+8, zero past column R) of kv_b_proj row `row`: one 16-byte load when
// rows start on 16 bytes (R % 8 == 0), else word by word.
fn wkv_unit(row: u32, u: u32) -> vec4<u32> {
    let words = p.latent / 2u;
    if (p.latent % 8u == 0u) {
        return wkv4[row * (words / 4u) + u];
    }
    var x = vec4<u32>(0u);
    for (var k = 0u; k < 4u; k++) {
        let w = 4u * u + k;
        if (w < words) {
            x[k] = wkv[row * words + w];
        }
    }
    return x;
}

// mla_absorb: grid (ceil(R / 128), H, T). Thread (unit cu of 16, row group g of 16) sums rows
// g, g + 16, ... of W_UK,h for eight latent columns, eight 16-byte loads in flight; the 16 row
// groups meet in workgroup memory.
var<workgroup> qn: array<f32, 512>;
var<workgroup> absorb_red: array<vec4<f32>, 512>; // [row group][unit][half]

// W_UK,h row i's unit u scaled by q_nope[i] (zero past Dn), as elements 0-3 and 4-7.
fn absorb_load(row0: u32, i: u32, u: u32) -> vec4<u32> {
    return wkv_unit(row0 + min(i, p.nope - 1u), u);
}

fn absorb_coef(i: u32) -> f32 {
    return select(0.0, qn[min(i, p.nope - 1u)], i < p.nope);
}

@compute @workgroup_size(256)
fn mla_absorb(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let h = wg.y;
    let t = wg.z;
    let width = p.latent + p.rope;
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
    let cu = lid % 16u;
    let g = lid / 16u;
    let units = (p.latent + 7u) / 8u;
    let u = min(wg.x * 16u + cu, units - 1u);
    let row0 = h * (p.nope + p.v_dim);
    var a = vec4<f32>(0.0);
    var b = vec4<f32>(0.0);
    for (var i0 = g; i0 < p.nope; i0 += 128u) {
        let x0 = absorb_load(row0, i0, u);
        let x1 = absorb_load(row0, i0 + 16u, u);
        let x2 = absorb_load(row0, i0 + 32u, u);
        let x3 = absorb_load(row0, i0 + 48u, u);
        let x4 = absorb_load(row0, i0 + 64u, u);
        let x5 = absorb_load(row0, i0 + 80u, u);
        let x6 = absorb_load(row0, i0 + 96u, u);
        let x7 = absorb_load(row0, i0 + 112u, u);
        let c0 = absorb_coef(i0);
        let c1 = absorb_coef(i0 + 16u);
        let c2 = absorb_coef(i0 + 32u);
        let c3 = absorb_coef(i0 + 48u);
        let c4 = absorb_coef(i0 + 64u);
        let c5 = absorb_coef(i0 + 80u);
        let c6 = absorb_coef(i0 + 96u);
        let c7 = absorb_coef(i0 + 112u);
        a += ((c0 * first4(x0) + c1 * first4(x1)) + (c2 * first4(x2) + c3 * first4(x3)))
            + ((c4 * first4(x4) + c5 * first4(x5)) + (c6 * first4(x6) + c7 * first4(x7)));
        b += ((c0 * last4(x0) + c1 * last4(x1)) + (c2 * last4(x2) + c3 * last4(x3)))
            + ((c4 * last4(x4) + c5 * last4(x5)) + (c6 * last4(x6) + c7 * last4(x7)));
    }
    absorb_red[(g * 16u + cu) * 2u] = a;
    absorb_red[(g * 16u + cu) * 2u + 1u] = b;
    workgroupBarrier();
    if (lid < 32u) {
        var s = vec4<f32>(0.0);
        for (var gg = 0u; gg < 16u; gg++) {
            s += absorb_red[gg * 32u + lid];
        }
        let c0 = wg.x * 128u + lid * 4u;
        for (var k = 0u; k < 4u; k++) {
            if (c0 + k < p.latent) {
                qa[out + c0 + k] = s[k] * p.scale;
            }
        }
    }
}

@group(0) @binding(5) var<storage, read_write> part: array<f32>;


var<workgroup> qsh: array<f32, 576>;
var<workgroup> rows_sh: array<u32, 4608>; // BLOCK rows staged with independent, coalesced loads
var<workgroup> red: array<f32, WG>;
var<workgroup> lg: array<f32, BLOCK>;
var<workgroup> rpage: array<u32, BLOCK>;
var<workgroup> rbase: array<u32, BLOCK>;


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
    // Partial layout of mla_merge_out: sum p*c in vec4s 0..ceil(R/4), then (m, l).
    let r4v = (p.latent + 3u) / 4u;
    let out = ((t * p.n_heads + h) * p.splits + split) * (r4v + 1u) * 4u;
    if (lid == 0u) {
        part[out + 4u * r4v] = m;
        part[out + 4u * r4v + 1u] = l;
    }
    if (2u * lid < p.latent) {
        part[out + 2u * lid] = acc[0];
        part[out + 2u * lid + 1u] = acc[1];
    }
}

#include "lib/bf16_unit.wgsl"

// mla_attend_tiled: grid (splits, ceil(H / 16), T); a workgroup owns 16 heads of a query and a
// split of the selection, in blocks of 8 rows. Per block: the rows (loaded into registers one
// block ahead, 16-byte loads, one page lookup per row) are widened to f32 in workgroup memory;
// logits: thread (2 heads, dim slice of 16, half of the block's rows) keeps both heads' slices
// of q in registers (72 f32) and forms partial dots for its 4 rows, every row vec4 it reads
// serving 2 heads (one head per thread read each twice as often: 39.3 -> 36.9 us on the H200),
// which 128 threads (head, row) sum; online softmax per head; p.c: thread (8 heads, 4 latent
// columns) accumulates 32 values per row from one vec4 of the row and two of p. 5 barriers per
// block; 28.5 KB of workgroup memory (fits 32 KiB adapters). On the H200 the logits are bound by
// workgroup-memory reads (a broadcast vec4 read still costs a full warp's 512 bytes, here for 8
// FMAs per lane; docs/perf.md).
const HG: u32 = 16u;         // heads per workgroup
const BR: u32 = 8u;          // selected rows per block
const KS: u32 = 16u;         // dim slices of a logit
const ROW_V: u32 = 144u;     // f32 vec4s per staged row (R + E <= 576)
const PL_STRIDE: u32 = 272u; // part_l row stride: KS * HG + 16 (rows r, r+1 in other banks)

var<workgroup> rows_f: array<vec4<f32>, 1152>; // [row][ROW_V] the block's rows in f32
var<workgroup> part_l: array<f32, 2176>;       // [row][slice][head] partial logits
var<workgroup> lgt: array<f32, 128>;           // [row][head] logits of the block
var<workgroup> pb: array<vec4<f32>, 32>;       // [row][head quad] softmax weights
var<workgroup> corr_q: array<vec4<f32>, 4>;    // [head quad] rescale of the accumulators
var<workgroup> head_ml: array<vec2<f32>, 16>;  // final (m, l) per head
var<workgroup> row_pg: array<u32, 16>;         // [slot][row] page of each row (NONE: no row)
var<workgroup> row_bs: array<u32, 16>;         // [slot][row] first 16-byte unit in its page

fn put_row(slot: u32, i: u32, pos: u32, units: u32) {
    if (pos == NONE) {
        row_pg[slot * BR + i] = NONE;
        row_bs[slot * BR + i] = 0u;
    } else {
        let at = locate(pos);
        row_pg[slot * BR + i] = at.x;
        row_bs[slot * BR + i] = at.y * units;
    }
}

// Unit u of the row in `slot`, row sr (zero for no row or past the row).
fn row_unit(slot: u32, sr: u32, u: u32, units: u32) -> vec4<u32> {
    let pg = row_pg[slot * BR + sr];
    var x = vec4<u32>(0u);
    if (pg != NONE && u < units) {
        x = page_unit(pg, row_bs[slot * BR + sr] + u);
    }
    return x;
}

fn stage_unit(sr: u32, u: u32, x: vec4<u32>) {
    if (u < ROW_V / 2u) {
        rows_f[sr * ROW_V + 2u * u] = first4(x);
        rows_f[sr * ROW_V + 2u * u + 1u] = last4(x);
    }
}

fn q_slice(base: u32, v: u32, ok: bool, width_v: u32) -> vec4<f32> {
    var x = vec4<f32>(0.0);
    if (ok && v < width_v) {
        x = qa4[base + v];
    }
    return x;
}

// One logit thread's dim slice (vec4s ks + 16 j, j < 9) of a q row or a staged row, as named
// values (arrays indexed in loops spilled on the NVIDIA compile).
struct Slices {
    v0: vec4<f32>,
    v1: vec4<f32>,
    v2: vec4<f32>,
    v3: vec4<f32>,
    v4: vec4<f32>,
    v5: vec4<f32>,
    v6: vec4<f32>,
    v7: vec4<f32>,
    v8: vec4<f32>,
}

fn q_slices(base: u32, ks: u32, ok: bool, width_v: u32) -> Slices {
    return Slices(q_slice(base, ks, ok, width_v), q_slice(base, ks + 16u, ok, width_v), q_slice(base, ks + 32u, ok, width_v),
        q_slice(base, ks + 48u, ok, width_v), q_slice(base, ks + 64u, ok, width_v), q_slice(base, ks + 80u, ok, width_v),
        q_slice(base, ks + 96u, ok, width_v), q_slice(base, ks + 112u, ok, width_v), q_slice(base, ks + 128u, ok, width_v));
}

fn row_slices(rb: u32) -> Slices {
    return Slices(rows_f[rb], rows_f[rb + 16u], rows_f[rb + 32u], rows_f[rb + 48u], rows_f[rb + 64u], rows_f[rb + 80u],
        rows_f[rb + 96u], rows_f[rb + 112u], rows_f[rb + 128u]);
}

fn slice_dot(q: Slices, y: Slices) -> vec4<f32> {
    return q.v0 * y.v0 + q.v1 * y.v1 + q.v2 * y.v2 + q.v3 * y.v3 + q.v4 * y.v4 + q.v5 * y.v5 + q.v6 * y.v6 + q.v7 * y.v7 + q.v8 * y.v8;
}

fn put_partial(t: u32, head: u32, split: u32, cv: u32, r4v: u32, a: vec4<f32>, ml: vec2<f32>) {
    if (head >= p.n_heads) {
        return;
    }
    let base = ((t * p.n_heads + head) * p.splits + split) * (r4v + 1u);
    if (cv < r4v) {
        part4[base + cv] = a;
    }
    if (cv == 0u) {
        part4[base + r4v] = vec4<f32>(ml, 0.0, 0.0);
    }
}

@compute @workgroup_size(256)
fn mla_attend_tiled(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let split = wg.x;
    let h0 = wg.y * HG;
    let t = wg.z;
    let width = p.latent + p.rope;
    let units = width / 8u;
    let r4v = (p.latent + 3u) / 4u;
    let ninf = bitcast<f32>(0xff800000u);
    let n_sel = n_selected(t);
    let per = ((n_sel + p.splits - 1u) / p.splits + BR - 1u) / BR * BR;
    let r0 = min(n_sel, split * per);
    let r1 = min(n_sel, r0 + per);
    // Logit role: heads 2 hp and 2 hp + 1, dim slice ks (vec4s ks + 16 j), rows 4 rh .. 4 rh + 3;
    // softmax role (lid < 128): head h1, row sr1.
    let hp = lid % (HG / 2u);
    let ks = (lid / (HG / 2u)) % 16u;
    let rh = lid / (8u * HG);
    let h1 = lid % HG;
    let sr1 = lid / HG;
    // Staging role: row sr, units su + 32 j.
    let sr = lid / 32u;
    let su = lid % 32u;
    // p.c role: columns 4 cv..4 cv + 4 of heads 8 hq .. 8 hq + 8.
    let cv = lid % 128u;
    let hq = lid / 128u;
    let wv = width / 4u;
    let qa_base = (t * p.n_heads + h0 + 2u * hp) * wv;
    let qa_ok = h0 + 2u * hp < p.n_heads;
    let qb_base = qa_base + wv;
    let qb_ok = h0 + 2u * hp + 1u < p.n_heads;
    let qa = q_slices(qa_base, ks, qa_ok, wv);
    let qb = q_slices(qb_base, ks, qb_ok, wv);
    // Selection entries are read one block ahead of their lookup, rows one block ahead of use.
    var pos_ahead = NONE;
    if (lid < BR) {
        put_row(0u, lid, selected_pos(t, r0 + lid, r1), units);
        pos_ahead = selected_pos(t, r0 + BR + lid, r1);
    }
    workgroupBarrier();
    var x0 = row_unit(0u, sr, su, units);
    var x1 = row_unit(0u, sr, su + 32u, units);
    var x2 = row_unit(0u, sr, su + 64u, units);
    var m_run = ninf;
    var l_run = 0.0;
    var a0 = vec4<f32>(0.0);
    var a1 = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var a3 = vec4<f32>(0.0);
    var a4 = vec4<f32>(0.0);
    var a5 = vec4<f32>(0.0);
    var a6 = vec4<f32>(0.0);
    var a7 = vec4<f32>(0.0);
    var slot = 0u;
    for (var b = r0; b < r1; b += BR) {
        if (lid < BR) {
            put_row(1u - slot, lid, pos_ahead, units);
            pos_ahead = selected_pos(t, b + 2u * BR + lid, r1);
        }
        stage_unit(sr, su, x0);
        stage_unit(sr, su + 32u, x1);
        stage_unit(sr, su + 64u, x2);
        workgroupBarrier();
        x0 = row_unit(1u - slot, sr, su, units);
        x1 = row_unit(1u - slot, sr, su + 32u, units);
        x2 = row_unit(1u - slot, sr, su + 64u, units);
        for (var r = rh * (BR / 2u); r < (rh + 1u) * (BR / 2u); r++) {
            let rb = r * ROW_V + ks;
            let y = row_slices(rb);
            let sa = slice_dot(qa, y);
            let sb = slice_dot(qb, y);
            let at = r * PL_STRIDE + ks * HG + 2u * hp;
            part_l[at] = (sa.x + sa.y) + (sa.z + sa.w);
            part_l[at + 1u] = (sb.x + sb.y) + (sb.z + sb.w);
        }
        workgroupBarrier();
        if (lid < BR * HG) {
            var s = 0.0;
            for (var k = 0u; k < KS; k++) {
                s += part_l[sr1 * PL_STRIDE + k * HG + h1];
            }
            lgt[lid] = select(ninf, s, row_pg[slot * BR + sr1] != NONE);
        }
        workgroupBarrier();
        if (lid < BR * HG) {
            var mb = ninf;
            for (var r = 0u; r < BR; r++) {
                mb = max(mb, lgt[r * HG + h1]);
            }
            let mn = max(m_run, mb);
            let live = mn > ninf;
            pb[sr1 * 4u + h1 / 4u][h1 % 4u] = select(0.0, exp(lgt[lid] - mn), live);
            if (sr1 == 0u) {
                let c = select(1.0, exp(m_run - mn), live);
                corr_q[h1 / 4u][h1 % 4u] = c;
                var sum = 0.0;
                for (var r = 0u; r < BR; r++) {
                    sum += select(0.0, exp(lgt[r * HG + h1] - mn), live);
                }
                l_run = l_run * c + sum;
            }
            m_run = mn;
        }
        workgroupBarrier();
        if (cv < r4v) {
            let c0 = corr_q[2u * hq];
            let c1 = corr_q[2u * hq + 1u];
            a0 *= c0.x;
            a1 *= c0.y;
            a2 *= c0.z;
            a3 *= c0.w;
            a4 *= c1.x;
            a5 *= c1.y;
            a6 *= c1.z;
            a7 *= c1.w;
            for (var r = 0u; r < BR; r++) {
                let x = rows_f[r * ROW_V + cv];
                let p0 = pb[r * 4u + 2u * hq];
                let p1 = pb[r * 4u + 2u * hq + 1u];
                a0 += p0.x * x;
                a1 += p0.y * x;
                a2 += p0.z * x;
                a3 += p0.w * x;
                a4 += p1.x * x;
                a5 += p1.y * x;
                a6 += p1.z * x;
                a7 += p1.w * x;
            }
        }
        workgroupBarrier();
        slot = 1u - slot;
    }
    if (lid < HG) {
        head_ml[lid] = vec2<f32>(m_run, l_run);
    }
    workgroupBarrier();
    let hb = h0 + 8u * hq;
    put_partial(t, hb, split, cv, r4v, a0, head_ml[8u * hq]);
    put_partial(t, hb + 1u, split, cv, r4v, a1, head_ml[8u * hq + 1u]);
    put_partial(t, hb + 2u, split, cv, r4v, a2, head_ml[8u * hq + 2u]);
    put_partial(t, hb + 3u, split, cv, r4v, a3, head_ml[8u * hq + 3u]);
    put_partial(t, hb + 4u, split, cv, r4v, a4, head_ml[8u * hq + 4u]);
    put_partial(t, hb + 5u, split, cv, r4v, a5, head_ml[8u * hq + 5u]);
    put_partial(t, hb + 6u, split, cv, r4v, a6, head_ml[8u * hq + 6u]);
    put_partial(t, hb + 7u, split, cv, r4v, a7, head_ml[8u * hq + 7u]);
}

@group(0) @binding(22) var<storage, read> gate: array<f32>;
@group(0) @binding(23) var<storage, read_write> o: array<f32>;
@group(0) @binding(24) var<storage, read_write> lse: array<f32>;

// mla_merge_out: grid (H * ceil(Dv / OUT_ROWS), T). The workgroup of (head h, OUT_ROWS rows of
// W_UV,h) merges the splits itself (weights exp(m_s - max) in workgroup memory, obar from 256
// threads with eight partial loads in flight each), then 256 / OUT_ROWS threads per W_UV row
// read it with 16-byte loads, eight in flight, and meet in workgroup memory; gate and lse.
override OUT_ROWS: u32 = 32u;
const MAX_SPLITS: u32 = 128u;

var<workgroup> split_m: array<f32, MAX_SPLITS>;
var<workgroup> split_l: array<f32, MAX_SPLITS>;
var<workgroup> split_w: array<f32, MAX_SPLITS>;
var<workgroup> obar: array<vec4<f32>, 256>; // [split parity][column vec4], then obar in 0..128
var<workgroup> out_red: array<f32, WG>;

// Split s's partial vec4 cv weighted by its merge weight (zero past the last split).
fn merge_term(base: u32, s: u32, cv: u32, psv: u32) -> vec4<f32> {
    let sc = min(s, p.splits - 1u);
    return select(0.0, split_w[sc], s < p.splits) * part4[base + sc * psv + cv];
}

// out_term with the W_UV unit already loaded.
fn pre_term(w: vec4<u32>, u: u32, units: u32) -> f32 {
    let uc = min(u, units - 1u);
    return select(0.0, unit_dot(w, obar[2u * uc], obar[2u * uc + 1u]), u < units);
}

fn out_term(row: u32, u: u32, units: u32) -> f32 {
    return pre_term(wkv_unit(row, min(u, units - 1u)), u, units);
}

@compute @workgroup_size(256)
fn mla_merge_out(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let n_vc = (p.v_dim + OUT_ROWS - 1u) / OUT_ROWS;
    let h = wg.x / n_vc;
    let vc = wg.x % n_vc;
    let t = wg.y;
    let ninf = bitcast<f32>(0xff800000u);
    let r4v = (p.latent + 3u) / 4u;
    let psv = r4v + 1u;
    let base = (t * p.n_heads + h) * p.splits * psv;
    // This thread's first 8 W_UV units, loaded before the merge (they do not depend on it).
    let tpr = WG / OUT_ROWS;
    let j = lid % tpr;
    let v = vc * OUT_ROWS + lid / tpr;
    let units = (p.latent + 7u) / 8u;
    let row = h * (p.nope + p.v_dim) + p.nope + min(v, p.v_dim - 1u);
    let w0 = wkv_unit(row, min(j, units - 1u));
    let w1 = wkv_unit(row, min(j + tpr, units - 1u));
    let w2 = wkv_unit(row, min(j + 2u * tpr, units - 1u));
    let w3 = wkv_unit(row, min(j + 3u * tpr, units - 1u));
    let w4 = wkv_unit(row, min(j + 4u * tpr, units - 1u));
    let w5 = wkv_unit(row, min(j + 5u * tpr, units - 1u));
    let w6 = wkv_unit(row, min(j + 6u * tpr, units - 1u));
    let w7 = wkv_unit(row, min(j + 7u * tpr, units - 1u));
    for (var s = lid; s < p.splits; s += WG) {
        let ml = part4[base + s * psv + r4v];
        split_m[s] = ml.x;
        split_l[s] = ml.y;
    }
    workgroupBarrier();
    var mx = ninf;
    for (var s = 0u; s < p.splits; s++) {
        mx = max(mx, split_m[s]);
    }
    for (var s = lid; s < p.splits; s += WG) {
        split_w[s] = select(0.0, exp(split_m[s] - mx), split_m[s] > ninf);
    }
    workgroupBarrier();
    var total = 0.0;
    for (var s = 0u; s < p.splits; s++) {
        total += split_w[s] * split_l[s];
    }
    let cv = lid % 128u;
    let parity = lid / 128u;
    var acc = vec4<f32>(0.0);
    if (cv < r4v) {
        for (var s = parity; s < p.splits; s += 16u) {
            acc += ((merge_term(base, s, cv, psv) + merge_term(base, s + 2u, cv, psv))
                + (merge_term(base, s + 4u, cv, psv) + merge_term(base, s + 6u, cv, psv)))
                + ((merge_term(base, s + 8u, cv, psv) + merge_term(base, s + 10u, cv, psv))
                + (merge_term(base, s + 12u, cv, psv) + merge_term(base, s + 14u, cv, psv)));
        }
    }
    obar[lid] = acc;
    workgroupBarrier();
    if (lid < 128u) {
        let inv = select(0.0, 1.0 / total, total > 0.0);
        let v = (obar[lid] + obar[lid + 128u]) * inv;
        // Columns past R (k_pe, or unwritten padding) must not reach W_UV.
        let col = vec4<u32>(4u * lid) + vec4<u32>(0u, 1u, 2u, 3u);
        obar[lid] = select(vec4<f32>(0.0), v, col < vec4<u32>(p.latent));
    }
    workgroupBarrier();
    var d = 0.0;
    if (v < p.v_dim) {
        d = ((pre_term(w0, j, units) + pre_term(w1, j + tpr, units)) + (pre_term(w2, j + 2u * tpr, units) + pre_term(w3, j + 3u * tpr, units)))
            + ((pre_term(w4, j + 4u * tpr, units) + pre_term(w5, j + 5u * tpr, units)) + (pre_term(w6, j + 6u * tpr, units) + pre_term(w7, j + 7u * tpr, units)));
        for (var u = j + 8u * tpr; u < units; u += 8u * tpr) {
            d += ((out_term(row, u, units) + out_term(row, u + tpr, units))
                + (out_term(row, u + 2u * tpr, units) + out_term(row, u + 3u * tpr, units)))
                + ((out_term(row, u + 4u * tpr, units) + out_term(row, u + 5u * tpr, units))
                + (out_term(row, u + 6u * tpr, units) + out_term(row, u + 7u * tpr, units)));
        }
    }
    out_red[lid] = d;
    workgroupBarrier();
    let vo = vc * OUT_ROWS + lid;
    if (lid < OUT_ROWS && vo < p.v_dim) {
        var s = 0.0;
        for (var k = 0u; k < tpr; k++) {
            s += out_red[lid * tpr + k];
        }
        let oi = (t * p.n_heads + h) * p.v_dim + vo;
        if (p.has_gate != 0u) {
            s *= 1.0 / (1.0 + exp(-gate[oi]));
        }
        o[oi] = s;
    }
    if (vc == 0u && lid == 0u) {
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
