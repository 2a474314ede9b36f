// Subgroup MXFP4 decode expert kernels (same slot layout, params and results as moe.wgsl;
// see its header, except that stage 1's h is written group-transposed for stage 2): each
// subgroup owns a few weight rows, lanes over the rows' 32-weight groups, row totals by
// subgroupAdd (no barrier, no shared-memory tree). A separate file because a module that uses
// subgroup operations needs the SUBGROUP feature as a whole; adapters without it keep
// moe.wgsl. Preconditions (host-checked): as moe.wgsl; MXFP4 experts; top_k * RPW2 <= 2048
// (stage 2); n_in <= 4 * MAX_XT when stage 1 stages z.
//
// E2M1 decode: shifting a nibble's 3 magnitude bits to f16 bits 9-11 and its sign to bit 15
// gives an f16 equal to the E2M1 value times 2^-14 (e = 0 lands on the f16 subnormal 2^-15,
// exactly 0.5 * 2^-14), so one shift-and-mask pair decodes two weights (one per 16-bit half)
// and unpack2x16float widens them; the 2^14 goes into the group scale. Word nibbles n0..n7
// come out as pairs (n0,n4) (n1,n5) (n2,n6) (n3,n7), so activations are read in that order.
// (Arithmetic decode to f32 cost ~15 integer ops per weight and ran at 614 GB/s on the H200;
// this runs at 1.1 TB/s.)

#include "lib/experts.wgsl"

@group(0) @binding(7) var<storage, read> pool_w: array<u32>;

// The group's E8M0 scale times 2^14 (exact: E8M0 0..240 stays a normal f32).
fn scale14(base4: u32, byte: u32) -> f32 {
    let b = base4 * 16u + byte;
    let s = (pool_w[b >> 2u] >> (8u * (b & 3u))) & 0xffu;
    return select(bitcast<f32>((s + 14u) << 23u), e8m0(s) * 16384.0, s > 240u);
}

// Activations of one group in pair order: xa[j] = (x0, x4, x1, x5), xb[j] = (x2, x6, x3, x7)
// of word j.
struct Xg {
    a: array<vec4<f32>, 4>,
    b: array<vec4<f32>, 4>,
}

// The group from its eight vec4 slots (floats 0-3, 4-7, ..., 28-31).
fn xg_of(l0: vec4<f32>, h0: vec4<f32>, l1: vec4<f32>, h1: vec4<f32>, l2: vec4<f32>, h2: vec4<f32>, l3: vec4<f32>, h3: vec4<f32>) -> Xg {
    return Xg(
        array<vec4<f32>, 4>(vec4<f32>(l0.x, h0.x, l0.y, h0.y), vec4<f32>(l1.x, h1.x, l1.y, h1.y), vec4<f32>(l2.x, h2.x, l2.y, h2.y), vec4<f32>(l3.x, h3.x, l3.y, h3.y)),
        array<vec4<f32>, 4>(vec4<f32>(l0.z, h0.z, l0.w, h0.w), vec4<f32>(l1.z, h1.z, l1.w, h1.w), vec4<f32>(l2.z, h2.z, l2.w, h2.w), vec4<f32>(l3.z, h3.z, l3.w, h3.w)),
    );
}

// Group activations stored contiguously from vec4 index xo (the natural layout of z).
fn load_xg(xo: u32) -> Xg {
    return xg_of(x[xo], x[xo + 1u], x[xo + 2u], x[xo + 3u], x[xo + 4u], x[xo + 5u], x[xo + 6u], x[xo + 7u]);
}

// The word's 8 E2M1 nibbles as f16 pairs (value 2^-14 times E2M1: the code's 3 bits land on
// the f16 exponent's low bits and the top mantissa bit, E2M1's e = 0 on f16's subnormals),
// nibbles (0, 4), (1, 5), (2, 6), (3, 7).
fn word_pairs(w: u32) -> vec4<u32> {
    let m = 0x0e000e00u;
    let s = 0x80008000u;
    return vec4<u32>(((w << 9u) & m) | ((w << 12u) & s), ((w << 5u) & m) | ((w << 8u) & s), ((w << 1u) & m) | ((w << 4u) & s),
        ((w >> 3u) & m) | (w & s));
}

// acc plus the word's 8 products, one fma each (two dots per word and their sums cost ~1.5
// float instructions per weight on the H200, this 1).
fn word_acc(acc: f32, w: u32, a: vec4<f32>, b: vec4<f32>) -> f32 {
    let p = word_pairs(w);
    let u0 = unpack2x16float(p.x);
    let u1 = unpack2x16float(p.y);
    let u2 = unpack2x16float(p.z);
    let u3 = unpack2x16float(p.w);
    var r = fma(u0.x, a.x, acc);
    r = fma(u0.y, a.y, r);
    r = fma(u1.x, a.z, r);
    r = fma(u1.y, a.w, r);
    r = fma(u2.x, b.x, r);
    r = fma(u2.y, b.y, r);
    r = fma(u3.x, b.z, r);
    return fma(u3.y, b.w, r);
}

// One MXFP4 group (4 words) times its activations, before the scale, as one chain of 32
// fmas: stage 1 of sgt 107.5 -> 99.6 us on the H200 (16 experts of 3584 x 3072) against two
// dots per word; stage 2 gained only once its items shrank to 4 rows (60 registers).
fn group_fma(q: vec4<u32>, xg: Xg) -> f32 {
    return word_acc(word_acc(word_acc(word_acc(0.0, q.x, xg.a[0], xg.b[0]), q.y, xg.a[1], xg.b[1]), q.z, xg.a[2], xg.b[2]), q.w, xg.a[3], xg.b[3]);
}

// Each lane owns one 32-weight group per row, so read in their natural layout the group's 32
// activations are 128 contiguous bytes per lane and a warp-wide 16-byte load of them touches
// 32 different cache lines: kernels reading them that way (the former sg2) spent most of
// their time there (both stages ~115-130 us on the H200 whatever their weight bytes). Here
// activations are read group-transposed, vec4 slot s (floats 4s..4s+3 of a group) of group g
// at s * G + g, so lanes on consecutive groups read consecutive 16 bytes: stage 1 stages z
// that way in workgroup memory (STAGE_Z; wider z is read in place, scattered), writes h that
// way to global memory, and stage 2 reads it as such.

// Stage 1 stages up to MAX_XT vec4 of z (n_in <= 4 * MAX_XT, host-checked). Keep it small:
// 32 KB per workgroup made stage 1 36 % slower on the H200 than 16 KB (the larger shared
// carve-out leaves less L1 for loads in flight).
const MAX_XT: u32 = 1024u;
var<workgroup> zt: array<vec4<f32>, MAX_XT>;
override STAGE_Z: bool = true;
// Rows per workgroup: in stage 1 a multiple of 8 (whole team passes), in stage 2 of 4 (items).
override RPW2: u32 = 32u;
// Stage 2 partial sums [expert j][row of the workgroup]; top_k * RPW2 <= 2048.
var<workgroup> down_part: array<f32, 2048>;
// Workgroup sizes of stage 1 (>= 64: zz below holds MAX_XT / 64 vec4) and stage 2 (>= RPW2).
override WG1: u32 = 256u;
override WG2: u32 = 256u;

// Group g's activations from the staged z (G groups per vector).
fn zt_group(g: u32, n_groups: u32) -> Xg {
    return xg_of(zt[g], zt[n_groups + g], zt[2u * n_groups + g], zt[3u * n_groups + g], zt[4u * n_groups + g], zt[5u * n_groups + g], zt[6u * n_groups + g], zt[7u * n_groups + g]);
}

// Group g's activations from a transposed vector of `x` starting at vec4 index b.
fn xt_group(b: u32, g: u32, n_groups: u32) -> Xg {
    return xg_of(x[b + g], x[b + n_groups + g], x[b + 2u * n_groups + g], x[b + 3u * n_groups + g], x[b + 4u * n_groups + g], x[b + 5u * n_groups + g], x[b + 6u * n_groups + g], x[b + 7u * n_groups + g]);
}

// Where element r of a transposed vector of G groups sits (in floats).
fn transposed_index(r: u32, n_groups: u32) -> u32 {
    return ((((r & 31u) >> 2u) * n_groups + (r >> 5u)) << 2u) | (r & 3u);
}

// Lanes per row in stage 1: the whole subgroup, or half of it when the row's groups fill
// halves better (K3.1's 112 groups: 32 lanes idle an eighth of their steps, 16 none).
fn lanes_per_row(groups: u32, sgs: u32) -> u32 {
    let half = sgs / 2u;
    let waste_whole = (groups + sgs - 1u) / sgs * sgs - groups;
    let waste_half = (groups + half - 1u) / half * half - groups;
    return select(sgs, half, half >= 4u && waste_half < waste_whole);
}

// Sum over the lpr lanes of a team (aligned runs of lpr lanes, lpr a power of two).
fn team_sum(v: f32, lpr: u32) -> f32 {
    var s = v;
    for (var o = lpr / 2u; o > 0u; o /= 2u) {
        s += subgroupShuffleXor(s, o);
    }
    return s;
}

// Stage 1: grid (ceil(n_mid / RPW2), tokens * top_k); h[pair] = act(w1 z, w3 z), transposed.
// Each team of lanes (the subgroup or half of it, lanes_per_row) covers 4 rows of w1 and of w3
// per pass with one activation group per lane step (named registers: arrays indexed in loops
// made the NVIDIA compile fragile).
@compute @workgroup_size(WG1)
fn expert_up_sgt(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sgs: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
) {
    let pair = wg.y;
    if (pair >= p.tokens * p.top_k) {
        return;
    }
    let groups = p.n_in / 32u;
    let xb = (pair / p.top_k) * (p.n_in / 4u);
    if (STAGE_Z) {
        // Every load issued before the first store (a strided load-store loop waited for each
        // load in turn: ~1.5 us of the H200's 109 us).
        var zz: array<vec4<f32>, MAX_XT / 64u>; // MAX_XT / WG1 of it used
        for (var j = 0u; j < (MAX_XT + WG1 - 1u) / WG1; j++) {
            let i = lid + j * WG1;
            if (i < p.n_in / 4u) {
                zz[j] = x[xb + i];
            }
        }
        for (var j = 0u; j < (MAX_XT + WG1 - 1u) / WG1; j++) {
            let i = lid + j * WG1;
            if (i < p.n_in / 4u) {
                zt[(i & 7u) * groups + (i >> 3u)] = zz[j];
            }
        }
    }
    workgroupBarrier();
    let base = slot_base(idx[pair]);
    let mid_groups = p.n_mid / 32u;
    let lpr = lanes_per_row(groups, sgs);
    let team = lane / lpr;
    let tl = lane % lpr;
    let pass_rows = 4u * (sgs / lpr);
    for (var p0 = sg * pass_rows; p0 < RPW2; p0 += nsg * pass_rows) {
        if (wg.x * RPW2 + p0 >= p.n_mid) {
            break;
        }
        let row0 = wg.x * RPW2 + p0 + team * 4u;
        let ro0 = min(row0 + 0u, p.n_mid - 1u) * groups;
        var ga0 = 0.0;
        var ua0 = 0.0;
        let ro1 = min(row0 + 1u, p.n_mid - 1u) * groups;
        var ga1 = 0.0;
        var ua1 = 0.0;
        let ro2 = min(row0 + 2u, p.n_mid - 1u) * groups;
        var ga2 = 0.0;
        var ua2 = 0.0;
        let ro3 = min(row0 + 3u, p.n_mid - 1u) * groups;
        var ga3 = 0.0;
        var ua3 = 0.0;
        for (var g = tl; g < groups; g += lpr) {
            let q1_0 = pool[base + p.off_w1 + ro0 + g];
            let q3_0 = pool[base + p.off_w3 + ro0 + g];
            let q1_1 = pool[base + p.off_w1 + ro1 + g];
            let q3_1 = pool[base + p.off_w3 + ro1 + g];
            let q1_2 = pool[base + p.off_w1 + ro2 + g];
            let q3_2 = pool[base + p.off_w3 + ro2 + g];
            let q1_3 = pool[base + p.off_w1 + ro3 + g];
            let q3_3 = pool[base + p.off_w3 + ro3 + g];
            var xg: Xg;
            if (STAGE_Z) {
                xg = zt_group(g, groups);
            } else {
                xg = load_xg(xb + g * 8u);
            }
            ga0 += scale14(base, p.off_s1 + ro0 + g) * group_fma(q1_0, xg);
            ua0 += scale14(base, p.off_s3 + ro0 + g) * group_fma(q3_0, xg);
            ga1 += scale14(base, p.off_s1 + ro1 + g) * group_fma(q1_1, xg);
            ua1 += scale14(base, p.off_s3 + ro1 + g) * group_fma(q3_1, xg);
            ga2 += scale14(base, p.off_s1 + ro2 + g) * group_fma(q1_2, xg);
            ua2 += scale14(base, p.off_s3 + ro2 + g) * group_fma(q3_2, xg);
            ga3 += scale14(base, p.off_s1 + ro3 + g) * group_fma(q1_3, xg);
            ua3 += scale14(base, p.off_s3 + ro3 + g) * group_fma(q3_3, xg);
        }
        let h0 = glu(team_sum(ga0, lpr), team_sum(ua0, lpr));
        let h1 = glu(team_sum(ga1, lpr), team_sum(ua1, lpr));
        let h2 = glu(team_sum(ga2, lpr), team_sum(ua2, lpr));
        let h3 = glu(team_sum(ga3, lpr), team_sum(ua3, lpr));
        if (tl == 0u) {
            let o = pair * p.n_mid;
            if (row0 + 0u < p.n_mid) {
                out[o + transposed_index(row0 + 0u, mid_groups)] = h0;
            }
            if (row0 + 1u < p.n_mid) {
                out[o + transposed_index(row0 + 1u, mid_groups)] = h1;
            }
            if (row0 + 2u < p.n_mid) {
                out[o + transposed_index(row0 + 2u, mid_groups)] = h2;
            }
            if (row0 + 3u < p.n_mid) {
                out[o + transposed_index(row0 + 3u, mid_groups)] = h3;
            }
        }
    }
}

// Stage 2 as expert_down_sg2 (experts spread over subgroups, fixed-order combine), 4 rows per
// work item with fma chains (8 rows with dots: 59.0 us on the H200 for 16 experts of 3584 x
// 3072; 4 with chains 57.0, and 52.3 with one item per subgroup in workgroups of 512), h
// (bound as x) read transposed. Grid (ceil(n_in / RPW2), tokens); RPW2 is a multiple of 4 and
// top_k * RPW2 <= 2048 (host-checked).
@compute @workgroup_size(WG2)
fn expert_down_sgt(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_invocation_id) lane: u32,
    @builtin(subgroup_size) sgs: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(num_subgroups) nsg: u32,
) {
    let t = wg.y;
    if (t >= p.tokens) {
        return;
    }
    let groups = p.n_mid / 32u;
    let blocks = RPW2 / 4u;
    for (var item = sg; item < p.top_k * blocks; item += nsg) {
        let j = item / blocks;
        let r0 = (item % blocks) * 4u;
        let row0 = wg.x * RPW2 + r0;
        let pair = t * p.top_k + j;
        let base = slot_base(idx[pair]);
        let xb = pair * (p.n_mid / 4u);
        let ro0 = min(row0 + 0u, p.n_in - 1u) * groups;
        var a0 = 0.0;
        let ro1 = min(row0 + 1u, p.n_in - 1u) * groups;
        var a1 = 0.0;
        let ro2 = min(row0 + 2u, p.n_in - 1u) * groups;
        var a2 = 0.0;
        let ro3 = min(row0 + 3u, p.n_in - 1u) * groups;
        var a3 = 0.0;
        for (var g = lane; g < groups; g += sgs) {
            let q0 = pool[base + p.off_w2 + ro0 + g];
            let q1 = pool[base + p.off_w2 + ro1 + g];
            let q2 = pool[base + p.off_w2 + ro2 + g];
            let q3 = pool[base + p.off_w2 + ro3 + g];
            let xg = xt_group(xb, g, groups);
            a0 += scale14(base, p.off_s2 + ro0 + g) * group_fma(q0, xg);
            a1 += scale14(base, p.off_s2 + ro1 + g) * group_fma(q1, xg);
            a2 += scale14(base, p.off_s2 + ro2 + g) * group_fma(q2, xg);
            a3 += scale14(base, p.off_s2 + ro3 + g) * group_fma(q3, xg);
        }
        let t0 = subgroupAdd(a0);
        let t1 = subgroupAdd(a1);
        let t2 = subgroupAdd(a2);
        let t3 = subgroupAdd(a3);
        if (lane == 0u) {
            down_part[j * RPW2 + r0 + 0u] = t0;
            down_part[j * RPW2 + r0 + 1u] = t1;
            down_part[j * RPW2 + r0 + 2u] = t2;
            down_part[j * RPW2 + r0 + 3u] = t3;
        }
    }
    workgroupBarrier();
    let row = wg.x * RPW2 + lid;
    if (lid < RPW2 && row < p.n_in) {
        var y = 0.0;
        for (var j = 0u; j < p.top_k; j++) {
            y += wts[t * p.top_k + j] * down_part[j * RPW2 + lid];
        }
        store_out(t * p.n_in + row, y);
    }
}
