// Included by linear.wgsl and linear_any.wgsl: the SIMT (plain WGSL) batched linear layer.
// A workgroup of 256 computes a tile of BN = 128 rows x BM = 128 tokens; thread (tx, ty) owns
// rows tx*4..+3 and 64+tx*4..+3 and tokens ty*4..+3 and 64+ty*4..+3: 16 vec4 accumulators held
// in named variables (a dynamically indexed array would live in local memory). K advances in
// steps of BK = 16 through two workgroup buffers: the next step's slab is fetched into
// registers while the current one is multiplied, then stored to the other buffer (one barrier
// per step). Thread n = lid % 128, h = lid / 128 fetches 8 consecutive k (h*8..) of W row n
// and of token n. Rows and tokens past the edge are clamped to the last valid one (their
// results are never stored), so only k past cols needs zeros: the includer's fetch_w/fetch_x
// return 0 there. 32 KiB of workgroup memory.
// The includer defines: fetch_w(row, k) -> Slab, fetch_x(token, k) -> Slab, bindings p, y.

const BN: u32 = 128u;
const BM: u32 = 128u;
const BK: u32 = 16u;
const STAGE: u32 = 512u; // vec4s per buffer: BK x 32 vec4 (128 values)

// 8 consecutive k of one row or token.
struct Slab {
    a: vec4<f32>,
    b: vec4<f32>,
}

// k-major staged tiles: [buffer][k][128 / 4] vec4, rows (ws) and tokens (xs) along the vec4s.
var<workgroup> ws: array<vec4<f32>, 1024>;
var<workgroup> xs: array<vec4<f32>, 1024>;

fn stage(buf: u32, n: u32, h: u32, fw: Slab, fx: Slab) {
    let at = buf * STAGE + h * 8u * 32u + n / 4u;
    let c = n % 4u;
    ws[at][c] = fw.a.x;
    ws[at + 32u][c] = fw.a.y;
    ws[at + 64u][c] = fw.a.z;
    ws[at + 96u][c] = fw.a.w;
    ws[at + 128u][c] = fw.b.x;
    ws[at + 160u][c] = fw.b.y;
    ws[at + 192u][c] = fw.b.z;
    ws[at + 224u][c] = fw.b.w;
    xs[at][c] = fx.a.x;
    xs[at + 32u][c] = fx.a.y;
    xs[at + 64u][c] = fx.a.z;
    xs[at + 96u][c] = fx.a.w;
    xs[at + 128u][c] = fx.b.x;
    xs[at + 160u][c] = fx.b.y;
    xs[at + 192u][c] = fx.b.z;
    xs[at + 224u][c] = fx.b.w;
}

// Rows r..r+3 of token t, each within bounds.
fn store4(t: u32, r: u32, v: vec4<f32>) {
    if (t >= p.tokens) {
        return;
    }
    let base = t * p.y_stride + p.row_offset + r;
    if (r + 3u < p.rows) {
        store_y(base, v.x);
        store_y(base + 1u, v.y);
        store_y(base + 2u, v.z);
        store_y(base + 3u, v.w);
        return;
    }
    for (var i = 0u; r + i < p.rows && i < 4u; i++) {
        store_y(base + i, v[i]);
    }
}

@compute @workgroup_size(256)
fn linear_simt(@builtin(workgroup_id) wg: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let r0 = wg.x * BN;
    let t0 = wg.y * BM;
    let tx = lid % 16u;
    let ty = lid / 16u;
    let n = lid % 128u;
    let h = lid / 128u;
    let wrow = min(r0 + n, p.rows - 1u);
    let xtok = min(t0 + n, p.tokens - 1u);
    let steps = (p.cols + BK - 1u) / BK;
    stage(0u, n, h, fetch_w(wrow, h * 8u), fetch_x(xtok, h * 8u));
    workgroupBarrier();
    var c0 = vec4<f32>();
    var c1 = vec4<f32>();
    var c2 = vec4<f32>();
    var c3 = vec4<f32>();
    var c4 = vec4<f32>();
    var c5 = vec4<f32>();
    var c6 = vec4<f32>();
    var c7 = vec4<f32>();
    var c8 = vec4<f32>();
    var c9 = vec4<f32>();
    var c10 = vec4<f32>();
    var c11 = vec4<f32>();
    var c12 = vec4<f32>();
    var c13 = vec4<f32>();
    var c14 = vec4<f32>();
    var c15 = vec4<f32>();
    for (var s = 0u; s < steps; s++) {
        let buf = s & 1u;
        let more = s + 1u < steps;
        var fw = Slab();
        var fx = Slab();
        if (more) {
            let k = (s + 1u) * BK + h * 8u;
            fw = fetch_w(wrow, k);
            fx = fetch_x(xtok, k);
        }
        for (var k = 0u; k < BK; k++) {
            let o = buf * STAGE + k * 32u;
            let a0 = ws[o + tx];
            let a1 = ws[o + 16u + tx];
            let b0 = xs[o + ty];
            let b1 = xs[o + 16u + ty];
            c0 += a0 * b0.x;
            c1 += a1 * b0.x;
            c2 += a0 * b0.y;
            c3 += a1 * b0.y;
            c4 += a0 * b0.z;
            c5 += a1 * b0.z;
            c6 += a0 * b0.w;
            c7 += a1 * b0.w;
            c8 += a0 * b1.x;
            c9 += a1 * b1.x;
            c10 += a0 * b1.y;
            c11 += a1 * b1.y;
            c12 += a0 * b1.z;
            c13 += a1 * b1.z;
            c14 += a0 * b1.w;
            c15 += a1 * b1.w;
        }
        if (more) {
            stage(1u - buf, n, h, fw, fx);
        }
        workgroupBarrier();
    }
    store4(t0 + ty * 4u + 0u, r0 + tx * 4u, c0);
    store4(t0 + ty * 4u + 0u, r0 + 64u + tx * 4u, c1);
    store4(t0 + ty * 4u + 1u, r0 + tx * 4u, c2);
    store4(t0 + ty * 4u + 1u, r0 + 64u + tx * 4u, c3);
    store4(t0 + ty * 4u + 2u, r0 + tx * 4u, c4);
    store4(t0 + ty * 4u + 2u, r0 + 64u + tx * 4u, c5);
    store4(t0 + ty * 4u + 3u, r0 + tx * 4u, c6);
    store4(t0 + ty * 4u + 3u, r0 + 64u + tx * 4u, c7);
    store4(t0 + 64u + ty * 4u + 0u, r0 + tx * 4u, c8);
    store4(t0 + 64u + ty * 4u + 0u, r0 + 64u + tx * 4u, c9);
    store4(t0 + 64u + ty * 4u + 1u, r0 + tx * 4u, c10);
    store4(t0 + 64u + ty * 4u + 1u, r0 + 64u + tx * 4u, c11);
    store4(t0 + 64u + ty * 4u + 2u, r0 + tx * 4u, c12);
    store4(t0 + 64u + ty * 4u + 2u, r0 + 64u + tx * 4u, c13);
    store4(t0 + 64u + ty * 4u + 3u, r0 + tx * 4u, c14);
    store4(t0 + 64u + ty * 4u + 3u, r0 + 64u + tx * 4u, c15);
}
