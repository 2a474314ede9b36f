// Sparse absorbed MLA attention (spec 5.4) on cooperative matrices (16x16x16 f16 -> f32): the
// partials of mla_attend_tiled (mla.wgsl, its SIMT twin; mla_merge_out merges either), for
// splits of at most 128 selected rows. Workgroup (split, 16 heads, query t):
//   S[16 heads, rows] = Q[16, R+E] C^T,   P = exp(S - m) per head,   O[16, R] = P C[:, 0..R]
// All of a split's logits exist before any p is formed, so the accumulators never need the
// online softmax's rescale (which a cooperative matrix cannot apply per row).
// Precision: q and p are split into hi + lo f16 parts (hi = the top 11 significant bits by
// masking, exact in f16; lo = x - hi, exact in f32 and then rounded: ~2^-22 relative; the
// driver folds the f32(f16(x)) form of lo to zero), two products each; cache rows are bf16,
// exact in f16 within its range. A q or row value beyond f16's range sends the workgroup to an
// f32 SIMT path (its logits and p.c recomputed from the bf16 rows).
// Roles (8 subgroups of 32; the host runs this only where the subgroup size is 32):
//   QK: subgroup w owns rows 16w..16w+15 (a hi and a lo accumulator chain); the rows are staged
//       as f16 in chunks of 64 dims with q's hi and lo chunks, the next chunk loaded meanwhile.
//   softmax: 16 lanes per head, 8 rows each, joined by shuffles.
//   PV: subgroup w owns latent column tiles w, w + 8, ... (R / 128 of them); rows staged 16 at a
//       time.
// Preconditions (host): H % 16 == 0, R % 128 == 0, R <= 512, (R+E) % 8 == 0, rows per split
// (ceil(n_sel / splits) rounded up to 16) <= 128; partials as in mla.wgsl.

enable f16;
enable wgpu_cooperative_matrix;

#include "lib/mla_cache.wgsl"

@group(0) @binding(5) var<storage, read_write> part: array<f32>;
@group(0) @binding(27) var<storage, read> qa4: array<vec4<f32>>;

const WG: u32 = 256u;
const HG: u32 = 16u;     // heads per workgroup
const RMAX: u32 = 128u;  // rows per workgroup: one 16-row tile per subgroup
const CS4: u32 = 18u;    // vec4<f16> stride of a staged row's 64-dim chunk (72 halves: conflict-free)
const QS4: u32 = 18u;    // the same for q's chunks
const PS4: u32 = 34u;    // vec4<f16> stride of a head's p (128 + 8 halves)
const SST: u32 = 132u;   // f32 stride of a head's logits
const F16_MAX: f32 = 65504.0;

var<workgroup> cst: array<vec4<f16>, 2304>; // QK: [row][CS4]; PV: [16 rows][(R + 8) / 4]
var<workgroup> qp: array<vec4<f16>, 1088>;  // QK: q hi, lo chunks [2][head][QS4]; PV: p hi, lo [2][head][PS4]
var<workgroup> sacc: array<f32, 4224>;       // logits' hi and lo parts [2][head][SST]; p (f32 path)
var<workgroup> row_pg: array<u32, RMAX>;     // page of each row (NONE: no row)
var<workgroup> row_bs: array<u32, RMAX>;     // its first 16-byte unit in the page
var<workgroup> head_ml: array<vec2<f32>, HG>;
var<workgroup> bad: vec4<u32>; // .x (16 bytes: every workgroup variable a multiple of 16, as linear_coop found the fragments need)

// 16-byte unit u of row r (zero for no row or past the row).
fn row_unit(r: u32, u: u32, units: u32) -> vec4<u32> {
    let pg = row_pg[r];
    var x = vec4<u32>(0u);
    if (pg != NONE && u < units) {
        x = page_unit(pg, row_bs[r] + u);
    }
    return x;
}

fn over_f16(x: vec4<f32>) -> bool {
    let a = abs(x);
    return !(max(max(a.x, a.y), max(a.z, a.w)) <= F16_MAX);
}

// The top 11 significant bits of x (exact in f16 within its range).
fn hi_part(x: vec4<f32>) -> vec4<f32> {
    return bitcast<vec4<f32>>(bitcast<vec4<u32>>(x) & vec4<u32>(0xffffe000u));
}

// A unit of eight bf16 as f16 at cst[at], cst[at + 1].
fn stage_unit(at: u32, x: vec4<u32>) {
    let a = first4(x);
    let b = last4(x);
    if (over_f16(a) || over_f16(b)) {
        bad.x = 1u;
    }
    cst[at] = vec4<f16>(a);
    cst[at + 1u] = vec4<f16>(b);
}

fn q4(t: u32, head: u32, v: u32, wv: u32) -> vec4<f32> {
    var x = vec4<f32>(0.0);
    if (v < wv) {
        x = qa4[(t * p.n_heads + head) * wv + v];
    }
    return x;
}

// Softmax input of head h, row r: the logit's two parts, -inf for no row.
fn logit(h: u32, r: u32, nr: u32) -> f32 {
    if (r < nr && row_pg[r] != NONE) {
        return sacc[h * SST + r] + sacc[(HG + h) * SST + r];
    }
    return bitcast<f32>(0xff800000u);
}

fn put_p(h: u32, r: u32, v: vec4<f32>) {
    sacc[h * SST + r] = v.x;
    sacc[h * SST + r + 1u] = v.y;
    sacc[h * SST + r + 2u] = v.z;
    sacc[h * SST + r + 3u] = v.w;
}

// Round j of the p.c store: subgroup w's tile (columns 16 (w + 8 j) ..) into sacc, then the
// workgroup writes the eight 16 x 16 tiles to the partials.
fn put_o_tiles(o: coop_mat16x16<f32, C>, j: u32, sg: u32, lid: u32, base0: u32, hstride: u32) {
    coopStoreT(o, &sacc[sg * 256u], 16u);
    workgroupBarrier();
    for (var i = 0u; i < 8u; i++) {
        part[base0 + (lid / 16u) * hstride + 16u * (i + 8u * j) + lid % 16u] = sacc[i * 256u + lid];
    }
    workgroupBarrier();
}

@compute @workgroup_size(256)
fn mla_attend_coop(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
) {
    let split = wg.x;
    let h0 = wg.y * HG;
    let t = wg.z;
    let width = p.latent + p.rope;
    let units = width / 8u;
    let wv = width / 4u;
    let ninf = bitcast<f32>(0xff800000u);
    let n_sel = n_selected(t);
    let per = ((n_sel + p.splits - 1u) / p.splits + 15u) / 16u * 16u;
    let r0 = min(n_sel, split * per);
    let r1 = min(n_sel, r0 + per);
    let nr = r1 - r0;
    let ntiles = (nr + 15u) / 16u;
    if (lid < RMAX) {
        let pos = selected_pos(t, r0 + lid, r1);
        if (pos == NONE) {
            row_pg[lid] = NONE;
            row_bs[lid] = 0u;
        } else {
            let at = locate(pos);
            row_pg[lid] = at.x;
            row_bs[lid] = at.y * units;
        }
    }
    if (lid == 0u) {
        bad.x = 0u;
    }
    workgroupBarrier();

    // QK over chunks of 64 dims (8 units): thread stages unit lid % 8 of rows lid / 8 + 32 i,
    // and q's vec4 lid % 16 of head lid / 16.
    let su = lid % 8u;
    let sr = lid / 8u;
    let qh = lid / 16u;
    let qv = lid % 16u;
    let n_chunks = (units + 7u) / 8u;
    var x0 = row_unit(sr, su, units);
    var x1 = row_unit(sr + 32u, su, units);
    var x2 = row_unit(sr + 64u, su, units);
    var x3 = row_unit(sr + 96u, su, units);
    var xq = q4(t, h0 + qh, qv, wv);
    var s_hi = coop_mat16x16<f32, C>();
    var s_lo = coop_mat16x16<f32, C>();
    for (var c = 0u; c < n_chunks; c++) {
        stage_unit(sr * CS4 + 2u * su, x0);
        stage_unit((sr + 32u) * CS4 + 2u * su, x1);
        stage_unit((sr + 64u) * CS4 + 2u * su, x2);
        stage_unit((sr + 96u) * CS4 + 2u * su, x3);
        if (over_f16(xq)) {
            bad.x = 1u;
        }
        let qhi = hi_part(xq);
        qp[qh * QS4 + qv] = vec4<f16>(qhi);
        qp[(HG + qh) * QS4 + qv] = vec4<f16>(xq - qhi);
        workgroupBarrier();
        if (c + 1u < n_chunks) {
            let u = 8u * (c + 1u) + su;
            x0 = row_unit(sr, u, units);
            x1 = row_unit(sr + 32u, u, units);
            x2 = row_unit(sr + 64u, u, units);
            x3 = row_unit(sr + 96u, u, units);
            xq = q4(t, h0 + qh, 16u * (c + 1u) + qv, wv);
        }
        // Every subgroup multiplies (rows past the split are zeros): a branch on the subgroup
        // would not be uniform control flow, which cooperative-matrix operations need.
        for (var kk = 0u; kk < 4u; kk++) {
            let b = coopLoad<coop_mat16x16<f16, B>>(&cst[sg * 16u * CS4 + kk * 4u], CS4);
            let ah = coopLoadT<coop_mat16x16<f16, A>>(&qp[kk * 4u], QS4);
            let al = coopLoadT<coop_mat16x16<f16, A>>(&qp[HG * QS4 + kk * 4u], QS4);
            s_hi = coopMultiplyAdd(ah, b, s_hi);
            s_lo = coopMultiplyAdd(al, b, s_lo);
        }
        workgroupBarrier();
    }
    // The first 16 rows' latent part for PV, loaded under the softmax: thread unit lid % 64 of
    // rows lid / 64 + 4 i.
    let lu = p.latent / 8u;
    let vu = lid % 64u;
    let vr = lid / 64u;
    var v0 = row_unit(vr, vu, lu);
    var v1 = row_unit(vr + 4u, vu, lu);
    var v2 = row_unit(vr + 8u, vu, lu);
    var v3 = row_unit(vr + 12u, vu, lu);
    coopStoreT(s_hi, &sacc[sg * 16u], SST);
    coopStoreT(s_lo, &sacc[HG * SST + sg * 16u], SST);
    workgroupBarrier();
    let exact = workgroupUniformLoad(&bad).x != 0u;
    if (exact) {
        // f32 logits from the bf16 rows: thread (head lid / 16) rows lid % 16 + 16 j.
        for (var j = 0u; j < 8u; j++) {
            let r = lid % 16u + 16u * j;
            let pg = row_pg[r];
            if (r < nr && pg != NONE) {
                let qb = (t * p.n_heads + h0 + qh) * wv;
                var d = 0.0;
                for (var u = 0u; u < units; u++) {
                    let x = page_unit(pg, row_bs[r] + u);
                    d += dot(first4(x), qa4[qb + 2u * u]) + dot(last4(x), qa4[qb + 2u * u + 1u]);
                }
                sacc[qh * SST + r] = d;
                sacc[(HG + qh) * SST + r] = 0.0;
            }
        }
        workgroupBarrier();
    }

    // Softmax: thread (head qh, g = lid % 16) owns rows 4g..4g+3 and 64+4g..64+4g+3.
    let g = lid % 16u;
    let ra = 4u * g;
    let rb = 64u + 4u * g;
    let sa = vec4<f32>(logit(qh, ra, nr), logit(qh, ra + 1u, nr), logit(qh, ra + 2u, nr), logit(qh, ra + 3u, nr));
    let sb = vec4<f32>(logit(qh, rb, nr), logit(qh, rb + 1u, nr), logit(qh, rb + 2u, nr), logit(qh, rb + 3u, nr));
    var m = max(max(max(sa.x, sa.y), max(sa.z, sa.w)), max(max(sb.x, sb.y), max(sb.z, sb.w)));
    m = max(m, subgroupShuffleXor(m, 1u));
    m = max(m, subgroupShuffleXor(m, 2u));
    m = max(m, subgroupShuffleXor(m, 4u));
    m = max(m, subgroupShuffleXor(m, 8u));
    let live = m > ninf;
    let pa = select(vec4<f32>(0.0), exp(sa - m), live);
    let pb = select(vec4<f32>(0.0), exp(sb - m), live);
    var l = (pa.x + pa.y) + (pa.z + pa.w) + ((pb.x + pb.y) + (pb.z + pb.w));
    l += subgroupShuffleXor(l, 1u);
    l += subgroupShuffleXor(l, 2u);
    l += subgroupShuffleXor(l, 4u);
    l += subgroupShuffleXor(l, 8u);
    let ha = hi_part(pa);
    let hb = hi_part(pb);
    qp[qh * PS4 + g] = vec4<f16>(ha);
    qp[qh * PS4 + 16u + g] = vec4<f16>(hb);
    qp[(HG + qh) * PS4 + g] = vec4<f16>(pa - ha);
    qp[(HG + qh) * PS4 + 16u + g] = vec4<f16>(pb - hb);
    if (exact) {
        put_p(qh, ra, pa);
        put_p(qh, rb, pb);
    }
    if (g == 0u) {
        head_ml[qh] = vec2<f32>(m, l);
    }
    workgroupBarrier();

    let r4v = p.latent / 4u;
    let psv = 4u * (r4v + 1u);
    let hstride = p.splits * psv;
    let base0 = ((t * p.n_heads + h0) * p.splits + split) * psv;
    if (lid < HG) {
        let ml = head_ml[lid];
        let at = base0 + lid * hstride + 4u * r4v;
        part[at] = ml.x;
        part[at + 1u] = ml.y;
        part[at + 2u] = 0.0;
        part[at + 3u] = 0.0;
    }
    if (exact) {
        // f32 p.c: thread owns latent columns 2 lid, 2 lid + 1 of all 16 heads.
        var acc: array<vec2<f32>, HG>;
        for (var r = 0u; r < nr; r++) {
            let pg = row_pg[r];
            if (pg != NONE && 2u * lid < p.latent) {
                let x = page_word(pg, 4u * row_bs[r] + lid);
                let v = vec2<f32>(lo(x), hi(x));
                for (var h = 0u; h < HG; h++) {
                    acc[h] += sacc[h * SST + r] * v;
                }
            }
        }
        if (2u * lid < p.latent) {
            for (var h = 0u; h < HG; h++) {
                part[base0 + h * hstride + 2u * lid] = acc[h].x;
                part[base0 + h * hstride + 2u * lid + 1u] = acc[h].y;
            }
        }
        return;
    }

    // PV over chunks of 16 rows.
    let vs4 = (p.latent + 8u) / 4u;
    let tiles_per_sg = p.latent / 128u; // column tiles per subgroup (uniform: R % 128 == 0)
    var o0 = coop_mat16x16<f32, C>();
    var o1 = coop_mat16x16<f32, C>();
    var o2 = coop_mat16x16<f32, C>();
    var o3 = coop_mat16x16<f32, C>();
    for (var rc = 0u; rc < ntiles; rc++) {
        if (vu < lu) {
            cst[vr * vs4 + 2u * vu] = vec4<f16>(first4(v0));
            cst[vr * vs4 + 2u * vu + 1u] = vec4<f16>(last4(v0));
            cst[(vr + 4u) * vs4 + 2u * vu] = vec4<f16>(first4(v1));
            cst[(vr + 4u) * vs4 + 2u * vu + 1u] = vec4<f16>(last4(v1));
            cst[(vr + 8u) * vs4 + 2u * vu] = vec4<f16>(first4(v2));
            cst[(vr + 8u) * vs4 + 2u * vu + 1u] = vec4<f16>(last4(v2));
            cst[(vr + 12u) * vs4 + 2u * vu] = vec4<f16>(first4(v3));
            cst[(vr + 12u) * vs4 + 2u * vu + 1u] = vec4<f16>(last4(v3));
        }
        workgroupBarrier();
        if (rc + 1u < ntiles) {
            let rn = 16u * (rc + 1u) + vr;
            v0 = row_unit(rn, vu, lu);
            v1 = row_unit(rn + 4u, vu, lu);
            v2 = row_unit(rn + 8u, vu, lu);
            v3 = row_unit(rn + 12u, vu, lu);
        }
        let ah = coopLoadT<coop_mat16x16<f16, A>>(&qp[rc * 4u], PS4);
        let al = coopLoadT<coop_mat16x16<f16, A>>(&qp[HG * PS4 + rc * 4u], PS4);
        if (0u < tiles_per_sg) {
            let b = coopLoadT<coop_mat16x16<f16, B>>(&cst[sg * 4u], vs4);
            o0 = coopMultiplyAdd(ah, b, o0);
            o0 = coopMultiplyAdd(al, b, o0);
        }
        if (1u < tiles_per_sg) {
            let b = coopLoadT<coop_mat16x16<f16, B>>(&cst[(sg + 8u) * 4u], vs4);
            o1 = coopMultiplyAdd(ah, b, o1);
            o1 = coopMultiplyAdd(al, b, o1);
        }
        if (2u < tiles_per_sg) {
            let b = coopLoadT<coop_mat16x16<f16, B>>(&cst[(sg + 16u) * 4u], vs4);
            o2 = coopMultiplyAdd(ah, b, o2);
            o2 = coopMultiplyAdd(al, b, o2);
        }
        if (3u < tiles_per_sg) {
            let b = coopLoadT<coop_mat16x16<f16, B>>(&cst[(sg + 24u) * 4u], vs4);
            o3 = coopMultiplyAdd(ah, b, o3);
            o3 = coopMultiplyAdd(al, b, o3);
        }
        workgroupBarrier();
    }
    // Through workgroup memory, a column tile of every subgroup per round (naga 30's SPIR-V
    // writer panics on a cooperative store into a runtime-sized storage array).
    if (0u < tiles_per_sg) {
        put_o_tiles(o0, 0u, sg, lid, base0, hstride);
    }
    if (1u < tiles_per_sg) {
        put_o_tiles(o1, 1u, sg, lid, base0, hstride);
    }
    if (2u < tiles_per_sg) {
        put_o_tiles(o2, 2u, sg, lid, base0, hstride);
    }
    if (3u < tiles_per_sg) {
        put_o_tiles(o3, 3u, sg, lid, base0, hstride);
    }
}
