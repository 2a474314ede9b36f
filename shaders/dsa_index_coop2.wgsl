// Lightning indexer scores (spec 5.3) on cooperative matrices, streaming form, K3.1 shape only
// (32 heads x 128; the host checks): the same contract as index_scores in indexer.wgsl,
//   I[t, s] = w_scale * sum_j w[t, j] * relu(q[t, j] . k[s])      for s <= q_pos0 + t, else -inf,
// with scores equal to the f32 kernel's up to f32 rounding (the selection must not move).
//
// Precision (why f16 tensor cores give f32-grade head dots here):
// - keys: bf16 has 8 significant bits, f16 has 11, so k * KEY_SCALE (a power of two) is exact in
//   f16 whenever |k| * KEY_SCALE <= 65504. Keys above that (|k| >= 64 at KEY_SCALE 1024) flag their
//   position, whose score is then recomputed in f32 from the bf16 key (`exact_score`). Below
//   the f16 normal range (|k| < 2^-24 after scaling) a value may flush to zero: an error of at most
//   2^-24 |q_d| per element, the size of f32 rounding of the dot itself.
// - q: each head's row is scaled by a power of two 2^e_h so its largest |q| lands in
//   [2^13, 2^14), then split q = hi + lo with hi = q truncated to 11 significant bits (exact in
//   f16) and lo = f16(q - hi): |q - hi - lo| <= 2^-21 |q| (plus 2^-24 of the row's largest |q|
//   where lo is subnormal). Both products go to
//   the f32 accumulator (products of f16 operands are exact), and 2^-e_h / KEY_SCALE is undone
//   before the ReLU (exact: powers of two).
//
// Layout: a workgroup is 2 subgroups of 32 (the host runs this only where subgroups are 32 wide);
// subgroup m owns heads 16m..16m+15 and keeps their 16 A fragments (8 dims steps, hi and lo) in
// registers for the whole kernel. Per step of TILE = 32 positions (grid-strided over the row):
// each thread loads 8 x 16 bytes of keys (coalesced), the next step's loads are issued before the
// current step's products, keys are converted to f16 into a double-buffered workgroup tile whose
// rows are 34 vec4<f16> apart (the 16 rows of a B fragment hit distinct banks), each subgroup
// multiplies [16 heads x 128] by [128 x 32 positions], stores its accumulators row-major and
// reduces its 16 heads per position (lane = position); the two halves are summed and written
// after the next step's first barrier (two barriers per step).

enable f16;
enable wgpu_cooperative_matrix;

struct IndexParams {
    n_queries: u32,
    row_stride: u32,
    q_pos0: u32,
    n_pos: u32,
    page0: u32,
    shift_max: u32,
    w_scale: f32,
    _pad: u32,
}

override QSPLIT: bool = true;
// Diagnostics for the bench (wrong scores): NOMMA skips the products (loads, staging and the
// epilogue only); FALLBACK = false drops the f32 recomputation of out-of-range keys.
override NOMMA: bool = false;
override FALLBACK: bool = true;
// ONE_PAGE: page 0 only, no page switch (the host uses it for single-page caches only).
override ONE_PAGE: bool = false;
// PER_LOAD_PAGE: every load through the per-load page switch (bench comparison of the fetch forms).
override PER_LOAD_PAGE: bool = false;
override KEY_SCALE: f32 = 1024.0;
const IH: u32 = 32u;
const ID: u32 = 128u;
const QV: u32 = 32u;     // vec4 per q row (ID / 4)
const CH: u32 = 16u;     // vec4<u32> (8 bf16) chunks per key row (ID / 8)
const TILE: u32 = 32u;   // positions per step
const WG: u32 = 64u;
const LOADS: u32 = 8u;   // TILE * CH / WG
const KS4: u32 = 34u;    // vec4<f16> between staged key rows (32 + 2)
const BUF: u32 = 1088u;  // TILE * KS4
const CST: u32 = 36u;    // f32 between head rows of a staged accumulator (32 positions + 4)

@group(0) @binding(0) var<uniform> p: IndexParams;
@group(0) @binding(1) var<storage, read> q: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read> w: array<f32>;
@group(0) @binding(3) var<storage, read_write> scores: array<f32>;
@group(0) @binding(4) var<storage, read> k0: array<vec4<u32>>;
@group(0) @binding(5) var<storage, read> k1: array<vec4<u32>>;
@group(0) @binding(6) var<storage, read> k2: array<vec4<u32>>;
@group(0) @binding(7) var<storage, read> k3: array<vec4<u32>>;
@group(0) @binding(8) var<storage, read> k4: array<vec4<u32>>;
@group(0) @binding(9) var<storage, read> k5: array<vec4<u32>>;
@group(0) @binding(10) var<storage, read> k6: array<vec4<u32>>;
@group(0) @binding(11) var<storage, read> k7: array<vec4<u32>>;
@group(0) @binding(12) var<storage, read> k8: array<vec4<u32>>;
@group(0) @binding(13) var<storage, read> k9: array<vec4<u32>>;
@group(0) @binding(14) var<storage, read> k10: array<vec4<u32>>;
@group(0) @binding(15) var<storage, read> k11: array<vec4<u32>>;
@group(0) @binding(16) var<storage, read> k12: array<vec4<u32>>;
@group(0) @binding(17) var<storage, read> k13: array<vec4<u32>>;
@group(0) @binding(18) var<storage, read> k14: array<vec4<u32>>;
@group(0) @binding(19) var<storage, read> k15: array<vec4<u32>>;

// Two key buffers of TILE rows; before the scan, q hi at [0, 1024) and lo at [1024, 2048)
// ([head][32 vec4]) for the A fragments.
var<workgroup> kt: array<vec4<f16>, 2176>;
var<workgroup> cs: array<f32, 1152>;  // [subgroup][16 heads][CST]
var<workgroup> part: array<f32, 128>; // [buffer][subgroup][position]
var<workgroup> bad: array<u32, 64>;   // [buffer][position]: key outside the exact f16 range
var<workgroup> ws: array<f32, 32>;    // w * w_scale
var<workgroup> hs: array<f32, 32>;    // 2^-e_h / KEY_SCALE: undoes the operand scales
var<workgroup> qmb: array<atomic<u32>, 32>; // per head: max |q| (f32 bits)
var<workgroup> qs: array<f32, 32>;    // 2^e_h: puts a head's largest |q| in [2^13, 2^14)

fn key_vec(page: u32, i: u32) -> vec4<u32> {
    switch page {
        case 0u: { return k0[i]; }
        case 1u: { return k1[i]; }
        case 2u: { return k2[i]; }
        case 3u: { return k3[i]; }
        case 4u: { return k4[i]; }
        case 5u: { return k5[i]; }
        case 6u: { return k6[i]; }
        case 7u: { return k7[i]; }
        case 8u: { return k8[i]; }
        case 9u: { return k9[i]; }
        case 10u: { return k10[i]; }
        case 11u: { return k11[i]; }
        case 12u: { return k12[i]; }
        case 13u: { return k13[i]; }
        case 14u: { return k14[i]; }
        default: { return k15[i]; }
    }
}

// Page geometry: page i holds page0 << min(i, shift_max) rows; returns (page, row in page).
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

fn bf_lo(x: u32) -> f32 {
    return bitcast<f32>(x << 16u);
}

fn bf_hi(x: u32) -> f32 {
    return bitcast<f32>(x & 0xffff0000u);
}

// One 16-byte load per j of the step at tile: chunk lid % 16 of row j * 4 + lid / 16 (zero past
// n_pos; nothing at all for a step wholly past the query's last position).
fn fetch(tile: u32, lid: u32, last: u32) -> array<vec4<u32>, LOADS> {
    var kv: array<vec4<u32>, LOADS>;
    let s0 = tile * TILE;
    if (s0 >= p.n_pos || s0 > last) {
        return kv;
    }
    if (ONE_PAGE) {
        for (var j = 0u; j < LOADS; j++) {
            let e = j * WG + lid;
            if (s0 + e / CH < p.n_pos) {
                kv[j] = k0[s0 * CH + e];
            }
        }
        return kv;
    }
    let at = locate(s0);
    let rows = p.page0 << min(at.x, p.shift_max);
    if (!PER_LOAD_PAGE && at.y + TILE <= rows && s0 + TILE <= p.n_pos) {
        // The whole step in one page (always so when page0 % TILE == 0): one uniform switch.
        let base = at.y * CH + lid;
        switch at.x {
            case 0u: { for (var j = 0u; j < LOADS; j++) { kv[j] = k0[base + j * WG]; } }
            case 1u: { for (var j = 0u; j < LOADS; j++) { kv[j] = k1[base + j * WG]; } }
            case 2u: { for (var j = 0u; j < LOADS; j++) { kv[j] = k2[base + j * WG]; } }
            case 3u: { for (var j = 0u; j < LOADS; j++) { kv[j] = k3[base + j * WG]; } }
            case 4u: { for (var j = 0u; j < LOADS; j++) { kv[j] = k4[base + j * WG]; } }
            case 5u: { for (var j = 0u; j < LOADS; j++) { kv[j] = k5[base + j * WG]; } }
            case 6u: { for (var j = 0u; j < LOADS; j++) { kv[j] = k6[base + j * WG]; } }
            case 7u: { for (var j = 0u; j < LOADS; j++) { kv[j] = k7[base + j * WG]; } }
            case 8u: { for (var j = 0u; j < LOADS; j++) { kv[j] = k8[base + j * WG]; } }
            case 9u: { for (var j = 0u; j < LOADS; j++) { kv[j] = k9[base + j * WG]; } }
            case 10u: { for (var j = 0u; j < LOADS; j++) { kv[j] = k10[base + j * WG]; } }
            case 11u: { for (var j = 0u; j < LOADS; j++) { kv[j] = k11[base + j * WG]; } }
            case 12u: { for (var j = 0u; j < LOADS; j++) { kv[j] = k12[base + j * WG]; } }
            case 13u: { for (var j = 0u; j < LOADS; j++) { kv[j] = k13[base + j * WG]; } }
            case 14u: { for (var j = 0u; j < LOADS; j++) { kv[j] = k14[base + j * WG]; } }
            default: { for (var j = 0u; j < LOADS; j++) { kv[j] = k15[base + j * WG]; } }
        }
    } else {
        for (var j = 0u; j < LOADS; j++) {
            let e = j * WG + lid;
            let pos = s0 + e / CH;
            if (pos < p.n_pos) {
                let a = locate(pos);
                kv[j] = key_vec(a.x, a.y * CH + e % CH);
            }
        }
    }
    return kv;
}

// Converts the loads to f16 (scaled by KEY_SCALE) into key buffer b, flagging rows out of range.
fn stage(kv: array<vec4<u32>, LOADS>, b: u32, lid: u32) {
    for (var j = 0u; j < LOADS; j++) {
        let e = j * WG + lid;
        let r = e / CH;
        let v = kv[j];
        let f0 = vec4<f32>(bf_lo(v.x), bf_hi(v.x), bf_lo(v.y), bf_hi(v.y));
        let f1 = vec4<f32>(bf_lo(v.z), bf_hi(v.z), bf_lo(v.w), bf_hi(v.w));
        let m4 = max(abs(f0), abs(f1));
        let m = max(max(m4.x, m4.y), max(m4.z, m4.w));
        if (!(m * KEY_SCALE <= 65504.0)) {
            bad[b * TILE + r] = 1u;
        }
        let at = b * BUF + r * KS4 + (e % CH) * 2u;
        kt[at] = vec4<f16>(f0 * KEY_SCALE);
        kt[at + 1u] = vec4<f16>(f1 * KEY_SCALE);
    }
}

// f32 score of one position straight from the bf16 key (the out-of-range fallback).
fn exact_score(t: u32, pos: u32) -> f32 {
    let at = locate(pos);
    var s = 0.0;
    for (var h = 0u; h < IH; h++) {
        var d = 0.0;
        for (var c = 0u; c < CH; c++) {
            let kw = key_vec(at.x, at.y * CH + c);
            let ka = vec4<f32>(bf_lo(kw.x), bf_hi(kw.x), bf_lo(kw.y), bf_hi(kw.y));
            let kb = vec4<f32>(bf_lo(kw.z), bf_hi(kw.z), bf_lo(kw.w), bf_hi(kw.w));
            let qi = t * (IH * QV) + h * QV + 2u * c;
            d += dot(q[qi], ka) + dot(q[qi + 1u], kb);
        }
        s += ws[h] * max(d, 0.0);
    }
    return s;
}

fn a_frag(at: u32) -> coop_mat16x16<f16, A> {
    return coopLoadT<coop_mat16x16<f16, A>>(&kt[at], QV);
}

// Dims 16 kk .. +15 of 16 positions: B is 16 dims x 16 keys, a key per column.
fn kstep(acc: coop_mat16x16<f32, C>, ah: coop_mat16x16<f16, A>, al: coop_mat16x16<f16, A>, at: u32) -> coop_mat16x16<f32, C> {
    let b = coopLoad<coop_mat16x16<f16, B>>(&kt[at], KS4);
    var r = coopMultiplyAdd(ah, b, acc);
    if (QSPLIT) {
        r = coopMultiplyAdd(al, b, r);
    }
    return r;
}

// Writes the step at s0 (buffer b): both subgroups' head halves summed, masked, or recomputed.
fn finish(t: u32, s0: u32, b: u32, lane: u32, last: u32) {
    let pos = s0 + lane;
    if (pos < p.n_pos) {
        var v = part[b * 64u + lane] + part[b * 64u + 32u + lane];
        if (pos > last) {
            v = bitcast<f32>(0xff800000u);
        } else if (FALLBACK && bad[b * TILE + lane] != 0u) {
            v = exact_score(t, pos);
        }
        scores[t * p.row_stride + pos] = v;
    }
    bad[b * TILE + lane] = 0u;
}

// Per head: w * w_scale, the power-of-two scale of q and its inverse (with KEY_SCALE's); then q
// scaled and split into kt ([0, 1024) hi, [1024, 2048) lo, [head][32 vec4]). Ends on a barrier.
fn prepare(t: u32, lid: u32) {
    if (lid < IH) {
        atomicStore(&qmb[lid], 0u);
    }
    bad[lid] = 0u;
    workgroupBarrier();
    // Coalesced; |x| as u32 orders like the float.
    for (var i = lid; i < IH * QV; i += WG) {
        let a = abs(q[t * (IH * QV) + i]);
        atomicMax(&qmb[i / QV], bitcast<u32>(max(max(a.x, a.y), max(a.z, a.w))));
    }
    workgroupBarrier();
    if (lid < IH) {
        let m = bitcast<f32>(atomicLoad(&qmb[lid]));
        var e = 0i;
        if (m > 0.0) {
            e = clamp(13i - (i32((bitcast<u32>(m) >> 23u) & 0xffu) - 127i), -100i, 100i);
        }
        ws[lid] = w[t * IH + lid] * p.w_scale;
        hs[lid] = ldexp(1.0, -e) / KEY_SCALE;
        qs[lid] = ldexp(1.0, e);
    }
    workgroupBarrier();
    for (var i = lid; i < IH * QV; i += WG) {
        // hi keeps the top 11 significant bits by masking (exact in f16; a compiler may not fold
        // it away as it may f32(f16(x)) == x), lo = x - hi is exact in f32 and rounds once to f16.
        let x = q[t * (IH * QV) + i] * qs[i / QV];
        let hi = bitcast<vec4<f32>>(bitcast<vec4<u32>>(x) & vec4<u32>(0xffffe000u));
        kt[i] = vec4<f16>(hi);
        kt[IH * QV + i] = vec4<f16>(x - hi);
    }
    workgroupBarrier();
}

@compute @workgroup_size(64)
fn index_scores_coop2(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let t = wg.y;
    let last = p.q_pos0 + t;
    let tiles = (p.n_pos + TILE - 1u) / TILE;
    var tile = wg.x;
    // The first step's keys are in flight while q is prepared.
    var kv = fetch(tile, lid, last);
    prepare(t, lid);
    let qa = sg * 16u * QV;
    let ah0 = a_frag(qa);
    let ah1 = a_frag(qa + 4u);
    let ah2 = a_frag(qa + 8u);
    let ah3 = a_frag(qa + 12u);
    let ah4 = a_frag(qa + 16u);
    let ah5 = a_frag(qa + 20u);
    let ah6 = a_frag(qa + 24u);
    let ah7 = a_frag(qa + 28u);
    let ql = IH * QV + qa;
    let al0 = a_frag(ql);
    let al1 = a_frag(ql + 4u);
    let al2 = a_frag(ql + 8u);
    let al3 = a_frag(ql + 12u);
    let al4 = a_frag(ql + 16u);
    let al5 = a_frag(ql + 20u);
    let al6 = a_frag(ql + 24u);
    let al7 = a_frag(ql + 28u);
    let h0 = sg * 16u;
    var b = 0u;
    var prev = 0xffffffffu;
    workgroupBarrier();
    while (tile < tiles) {
        let s0 = tile * TILE;
        stage(kv, b, lid);
        let next = tile + nwg.x;
        if (next < tiles) {
            kv = fetch(next, lid, last);
        }
        workgroupBarrier();
        if (prev != 0xffffffffu && sg == 0u) {
            finish(t, prev * TILE, b ^ 1u, lane, last);
        }
        if (s0 <= last && !NOMMA) {
            let kb = b * BUF;
            var c0 = coop_mat16x16<f32, C>();
            var c1 = coop_mat16x16<f32, C>();
            let r1 = kb + 16u * KS4;
            c0 = kstep(c0, ah0, al0, kb);
            c1 = kstep(c1, ah0, al0, r1);
            c0 = kstep(c0, ah1, al1, kb + 4u);
            c1 = kstep(c1, ah1, al1, r1 + 4u);
            c0 = kstep(c0, ah2, al2, kb + 8u);
            c1 = kstep(c1, ah2, al2, r1 + 8u);
            c0 = kstep(c0, ah3, al3, kb + 12u);
            c1 = kstep(c1, ah3, al3, r1 + 12u);
            c0 = kstep(c0, ah4, al4, kb + 16u);
            c1 = kstep(c1, ah4, al4, r1 + 16u);
            c0 = kstep(c0, ah5, al5, kb + 20u);
            c1 = kstep(c1, ah5, al5, r1 + 20u);
            c0 = kstep(c0, ah6, al6, kb + 24u);
            c1 = kstep(c1, ah6, al6, r1 + 24u);
            c0 = kstep(c0, ah7, al7, kb + 28u);
            c1 = kstep(c1, ah7, al7, r1 + 28u);
            let cb = sg * 16u * CST;
            coopStoreT(c0, &cs[cb], CST);
            coopStoreT(c1, &cs[cb + 16u], CST);
        }
        workgroupBarrier();
        if (s0 <= last) {
            // lane = position: this subgroup's 16 heads, ReLU after undoing the scales.
            let cb = sg * 16u * CST + lane;
            var sum = 0.0;
            for (var j = 0u; j < 16u; j++) {
                sum += ws[h0 + j] * max(cs[cb + j * CST] * hs[h0 + j], 0.0);
            }
            part[b * 64u + sg * 32u + lane] = sum;
        }
        prev = tile;
        tile = next;
        b ^= 1u;
    }
    workgroupBarrier();
    if (sg == 0u && prev != 0xffffffffu) {
        finish(t, prev * TILE, b ^ 1u, lane, last);
    }
}

// Variant with all 32 heads per subgroup: each B fragment (16 keys x 16 dims) feeds four products
// (two head tiles, hi and lo) instead of two, at 32 A fragments (128 registers) per thread. Each
// subgroup owns 16 positions of the 32-position step and writes their scores itself (no
// cross-subgroup sum).
var<workgroup> cs3: array<f32, 1280>; // [subgroup][32 heads][CS3]
const CS3: u32 = 20u; // f32 between head rows (16 positions + 4)

// Subgroup-uniform addresses (derived from subgroup_id) go through functions: naga's uniformity
// analysis does not follow subgroup_id, the hardware only needs it uniform per subgroup.
fn b_frag(at: u32) -> coop_mat16x16<f16, B> {
    return coopLoad<coop_mat16x16<f16, B>>(&kt[at], KS4);
}

fn mma2(c: coop_mat16x16<f32, C>, ah: coop_mat16x16<f16, A>, al: coop_mat16x16<f16, A>, b: coop_mat16x16<f16, B>) -> coop_mat16x16<f32, C> {
    var r = coopMultiplyAdd(ah, b, c);
    if (QSPLIT) {
        r = coopMultiplyAdd(al, b, r);
    }
    return r;
}

fn store3(c: coop_mat16x16<f32, C>, at: u32) {
    coopStoreT(c, &cs3[at], CS3);
}

@compute @workgroup_size(64)
fn index_scores_coop3(
    @builtin(workgroup_id) wg: vec3<u32>,
    @builtin(num_workgroups) nwg: vec3<u32>,
    @builtin(local_invocation_index) lid: u32,
    @builtin(subgroup_id) sg: u32,
    @builtin(subgroup_invocation_id) lane: u32,
) {
    let t = wg.y;
    let last = p.q_pos0 + t;
    let tiles = (p.n_pos + TILE - 1u) / TILE;
    var tile = wg.x;
    var kv = fetch(tile, lid, last);
    prepare(t, lid);
    let ah00 = a_frag(0u + 0u * QV + 0u);
    let ah01 = a_frag(0u + 0u * QV + 4u);
    let ah02 = a_frag(0u + 0u * QV + 8u);
    let ah03 = a_frag(0u + 0u * QV + 12u);
    let ah04 = a_frag(0u + 0u * QV + 16u);
    let ah05 = a_frag(0u + 0u * QV + 20u);
    let ah06 = a_frag(0u + 0u * QV + 24u);
    let ah07 = a_frag(0u + 0u * QV + 28u);
    let al00 = a_frag(IH * QV + 0u * QV + 0u);
    let al01 = a_frag(IH * QV + 0u * QV + 4u);
    let al02 = a_frag(IH * QV + 0u * QV + 8u);
    let al03 = a_frag(IH * QV + 0u * QV + 12u);
    let al04 = a_frag(IH * QV + 0u * QV + 16u);
    let al05 = a_frag(IH * QV + 0u * QV + 20u);
    let al06 = a_frag(IH * QV + 0u * QV + 24u);
    let al07 = a_frag(IH * QV + 0u * QV + 28u);
    let ah10 = a_frag(0u + 16u * QV + 0u);
    let ah11 = a_frag(0u + 16u * QV + 4u);
    let ah12 = a_frag(0u + 16u * QV + 8u);
    let ah13 = a_frag(0u + 16u * QV + 12u);
    let ah14 = a_frag(0u + 16u * QV + 16u);
    let ah15 = a_frag(0u + 16u * QV + 20u);
    let ah16 = a_frag(0u + 16u * QV + 24u);
    let ah17 = a_frag(0u + 16u * QV + 28u);
    let al10 = a_frag(IH * QV + 16u * QV + 0u);
    let al11 = a_frag(IH * QV + 16u * QV + 4u);
    let al12 = a_frag(IH * QV + 16u * QV + 8u);
    let al13 = a_frag(IH * QV + 16u * QV + 12u);
    let al14 = a_frag(IH * QV + 16u * QV + 16u);
    let al15 = a_frag(IH * QV + 16u * QV + 20u);
    let al16 = a_frag(IH * QV + 16u * QV + 24u);
    let al17 = a_frag(IH * QV + 16u * QV + 28u);
    workgroupBarrier();
    var b = 0u;
    while (tile < tiles) {
        let s0 = tile * TILE;
        stage(kv, b, lid);
        let next = tile + nwg.x;
        if (next < tiles) {
            kv = fetch(next, lid, last);
        }
        workgroupBarrier();
        let cb = sg * 32u * CS3;
        if (s0 <= last && !NOMMA) {
            let kb = b * BUF + sg * 16u * KS4;
            var c0 = coop_mat16x16<f32, C>();
            var c1 = coop_mat16x16<f32, C>();
            {
                let bk = b_frag(kb + 0u);
                c0 = mma2(c0, ah00, al00, bk);
                c1 = mma2(c1, ah10, al10, bk);
            }
            {
                let bk = b_frag(kb + 4u);
                c0 = mma2(c0, ah01, al01, bk);
                c1 = mma2(c1, ah11, al11, bk);
            }
            {
                let bk = b_frag(kb + 8u);
                c0 = mma2(c0, ah02, al02, bk);
                c1 = mma2(c1, ah12, al12, bk);
            }
            {
                let bk = b_frag(kb + 12u);
                c0 = mma2(c0, ah03, al03, bk);
                c1 = mma2(c1, ah13, al13, bk);
            }
            {
                let bk = b_frag(kb + 16u);
                c0 = mma2(c0, ah04, al04, bk);
                c1 = mma2(c1, ah14, al14, bk);
            }
            {
                let bk = b_frag(kb + 20u);
                c0 = mma2(c0, ah05, al05, bk);
                c1 = mma2(c1, ah15, al15, bk);
            }
            {
                let bk = b_frag(kb + 24u);
                c0 = mma2(c0, ah06, al06, bk);
                c1 = mma2(c1, ah16, al16, bk);
            }
            {
                let bk = b_frag(kb + 28u);
                c0 = mma2(c0, ah07, al07, bk);
                c1 = mma2(c1, ah17, al17, bk);
            }
            store3(c0, cb);
            store3(c1, cb + 16u * CS3);
        }
        workgroupBarrier();
        // Lane = (position l % 16, heads 16 (l / 16) ..): ReLU after undoing the scales, halves
        // summed across the subgroup.
        let pl = lane % 16u;
        let hb = (lane / 16u) * 16u;
        var sum = 0.0;
        for (var j = 0u; j < 16u; j++) {
            sum += ws[hb + j] * max(cs3[cb + (hb + j) * CS3 + pl] * hs[hb + j], 0.0);
        }
        sum += subgroupShuffleXor(sum, 16u);
        let r = sg * 16u + pl;
        let pos = s0 + r;
        if (lane < 16u) {
            if (pos < p.n_pos) {
                var v = sum;
                if (pos > last) {
                    v = bitcast<f32>(0xff800000u);
                } else if (FALLBACK && bad[b * TILE + r] != 0u) {
                    v = exact_score(t, pos);
                }
                scores[t * p.row_stride + pos] = v;
            }
            bad[b * TILE + r] = 0u;
        }
        tile = next;
        b ^= 1u;
    }
}
