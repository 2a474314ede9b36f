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

fn word_dot(w: u32, a: vec4<f32>, b: vec4<f32>) -> f32 {
    let p = word_pairs(w);
    return dot(vec4<f32>(unpack2x16float(p.x), unpack2x16float(p.y)), a) + dot(vec4<f32>(unpack2x16float(p.z), unpack2x16float(p.w)), b);
}

// One MXFP4 group (4 words) times its activations, before the scale.
fn group_dot2(q: vec4<u32>, xg: Xg) -> f32 {
    return word_dot(q.x, xg.a[0], xg.b[0]) + word_dot(q.y, xg.a[1], xg.b[1]) + word_dot(q.z, xg.a[2], xg.b[2]) + word_dot(q.w, xg.a[3], xg.b[3]);
}

// acc plus the word's 8 products, one fma each (word_dot's sums of dots cost ~1.5 float
// instructions per weight on the H200, this 1).
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

// group_dot2 as one chain of 32 fmas: stage 1 of sgt 107.5 -> 99.6 us on the H200 (16
// experts of 3584 x 3072); stage 2 went 58.4 -> 75.3 us with it, so it keeps group_dot2.
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
// Rows per workgroup (a multiple of 8: whole subgroup passes in stage 1, items in stage 2).
override RPW2: u32 = 32u;
// Stage 2 partial sums [expert j][row of the workgroup]; top_k * RPW2 <= 2048.
var<workgroup> down_part: array<f32, 2048>;

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

// Stage 1: grid (ceil(n_mid / RPW2), tokens * top_k); h[pair] = act(w1 z, w3 z), transposed.
// Each subgroup pass covers 4 rows of w1 and of w3 with one activation group per lane step
// (named registers: arrays indexed in loops made the NVIDIA compile fragile).
@compute @workgroup_size(256)
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
        var zz: array<vec4<f32>, MAX_XT / 256u>;
        for (var j = 0u; j < MAX_XT / 256u; j++) {
            let i = lid + j * 256u;
            if (i < p.n_in / 4u) {
                zz[j] = x[xb + i];
            }
        }
        for (var j = 0u; j < MAX_XT / 256u; j++) {
            let i = lid + j * 256u;
            if (i < p.n_in / 4u) {
                zt[(i & 7u) * groups + (i >> 3u)] = zz[j];
            }
        }
    }
    workgroupBarrier();
    let base = slot_base(idx[pair]);
    let mid_groups = p.n_mid / 32u;
    for (var r0 = sg * 4u; r0 < RPW2; r0 += nsg * 4u) {
        let row0 = wg.x * RPW2 + r0;
        if (row0 >= p.n_mid) {
            break;
        }
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
        for (var g = lane; g < groups; g += sgs) {
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
        let gs0 = subgroupAdd(ga0);
        let us0 = subgroupAdd(ua0);
        if (lane == 0u && row0 + 0u < p.n_mid) {
            out[pair * p.n_mid + transposed_index(row0 + 0u, mid_groups)] = glu(gs0, us0);
        }
        let gs1 = subgroupAdd(ga1);
        let us1 = subgroupAdd(ua1);
        if (lane == 0u && row0 + 1u < p.n_mid) {
            out[pair * p.n_mid + transposed_index(row0 + 1u, mid_groups)] = glu(gs1, us1);
        }
        let gs2 = subgroupAdd(ga2);
        let us2 = subgroupAdd(ua2);
        if (lane == 0u && row0 + 2u < p.n_mid) {
            out[pair * p.n_mid + transposed_index(row0 + 2u, mid_groups)] = glu(gs2, us2);
        }
        let gs3 = subgroupAdd(ga3);
        let us3 = subgroupAdd(ua3);
        if (lane == 0u && row0 + 3u < p.n_mid) {
            out[pair * p.n_mid + transposed_index(row0 + 3u, mid_groups)] = glu(gs3, us3);
        }
    }
}

// Stage 2 as expert_down_sg2 (experts spread over subgroups, fixed-order combine), 8 rows per
// work item, h (bound as x) read transposed. Grid (ceil(n_in / RPW2), tokens);
// RPW2 is a multiple of 8 and top_k * RPW2 <= 2048 (host-checked).
@compute @workgroup_size(256)
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
    let blocks = RPW2 / 8u;
    for (var item = sg; item < p.top_k * blocks; item += nsg) {
        let j = item / blocks;
        let r0 = (item % blocks) * 8u;
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
        let ro4 = min(row0 + 4u, p.n_in - 1u) * groups;
        var a4 = 0.0;
        let ro5 = min(row0 + 5u, p.n_in - 1u) * groups;
        var a5 = 0.0;
        let ro6 = min(row0 + 6u, p.n_in - 1u) * groups;
        var a6 = 0.0;
        let ro7 = min(row0 + 7u, p.n_in - 1u) * groups;
        var a7 = 0.0;
        for (var g = lane; g < groups; g += sgs) {
            let q0 = pool[base + p.off_w2 + ro0 + g];
            let q1 = pool[base + p.off_w2 + ro1 + g];
            let q2 = pool[base + p.off_w2 + ro2 + g];
            let q3 = pool[base + p.off_w2 + ro3 + g];
            let q4 = pool[base + p.off_w2 + ro4 + g];
            let q5 = pool[base + p.off_w2 + ro5 + g];
            let q6 = pool[base + p.off_w2 + ro6 + g];
            let q7 = pool[base + p.off_w2 + ro7 + g];
            let xg = xt_group(xb, g, groups);
            a0 += scale14(base, p.off_s2 + ro0 + g) * group_dot2(q0, xg);
            a1 += scale14(base, p.off_s2 + ro1 + g) * group_dot2(q1, xg);
            a2 += scale14(base, p.off_s2 + ro2 + g) * group_dot2(q2, xg);
            a3 += scale14(base, p.off_s2 + ro3 + g) * group_dot2(q3, xg);
            a4 += scale14(base, p.off_s2 + ro4 + g) * group_dot2(q4, xg);
            a5 += scale14(base, p.off_s2 + ro5 + g) * group_dot2(q5, xg);
            a6 += scale14(base, p.off_s2 + ro6 + g) * group_dot2(q6, xg);
            a7 += scale14(base, p.off_s2 + ro7 + g) * group_dot2(q7, xg);
        }
        let t0 = subgroupAdd(a0);
        let t1 = subgroupAdd(a1);
        let t2 = subgroupAdd(a2);
        let t3 = subgroupAdd(a3);
        let t4 = subgroupAdd(a4);
        let t5 = subgroupAdd(a5);
        let t6 = subgroupAdd(a6);
        let t7 = subgroupAdd(a7);
        if (lane == 0u) {
            down_part[j * RPW2 + r0 + 0u] = t0;
            down_part[j * RPW2 + r0 + 1u] = t1;
            down_part[j * RPW2 + r0 + 2u] = t2;
            down_part[j * RPW2 + r0 + 3u] = t3;
            down_part[j * RPW2 + r0 + 4u] = t4;
            down_part[j * RPW2 + r0 + 5u] = t5;
            down_part[j * RPW2 + r0 + 6u] = t6;
            down_part[j * RPW2 + r0 + 7u] = t7;
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
