// Device-to-device copy of `words4` vec4<f32> values: the bandwidth ceiling every
// memory-bound kernel is judged against (benches measure it in the same run).

struct CopyParams {
    words4: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> p: CopyParams;
@group(0) @binding(1) var<storage, read> src: array<vec4<f32>>;
@group(0) @binding(2) var<storage, read_write> dst: array<vec4<f32>>;

@compute @workgroup_size(256)
fn copy_vec4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let stride = nwg.x * 256u;
    for (var i = gid.x + gid.y * stride; i < p.words4; i += stride * nwg.y) {
        dst[i] = src[i];
    }
}

// Reads `words4` vec4 and writes nothing (the sink only if the xor of everything read hits a
// fixed 128-bit pattern, which keeps the loads): the ceiling of a kernel that must read those
// bytes once, timed the way it is (benches/moe.rs sets the GEMVs beside it).
@group(0) @binding(12) var<storage, read_write> read_sink: array<u32>;

@compute @workgroup_size(256)
fn read_vec4(@builtin(global_invocation_id) gid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {
    let stride = nwg.x * 256u;
    var acc = vec4<u32>(0u);
    for (var i = gid.x + gid.y * stride; i < p.words4; i += stride * nwg.y) {
        acc ^= bitcast<vec4<u32>>(src[i]);
    }
    if (all(acc == vec4<u32>(0x9e3779b9u, 0x7f4a7c15u, 0x85ebca6bu, 0xc2b2ae35u))) {
        read_sink[0] = acc.x;
    }
}

// Clock probe: `iters` rounds of four independent fma chains per thread, bound by the SMs'
// issue rate (not memory), so its time follows the shader clock. The store never happens
// (the chains cannot reach the sentinel) but keeps the chains alive.
struct SpinParams {
    iters: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> sp: SpinParams;
@group(0) @binding(1) var<storage, read_write> sink: array<f32>;

@compute @workgroup_size(256)
fn spin_fma(@builtin(global_invocation_id) gid: vec3<u32>) {
    var a = f32(gid.x & 255u) * 1e-3;
    var b = a + 0.25;
    var c = a + 0.5;
    var d = a + 0.75;
    for (var i = 0u; i < sp.iters; i++) {
        a = fma(a, 0.9999, 1e-4);
        b = fma(b, 0.9999, 1e-4);
        c = fma(c, 0.9999, 1e-4);
        d = fma(d, 0.9999, 1e-4);
    }
    if (a + b + c + d == -1.0) {
        sink[gid.x & 255u] = a;
    }
}

// A dispatch that only names buffers (read-only): wgpu moves them to the read state at the
// barrier in front of it, so later dispatches that read them get no barrier of their own and
// can run beside one another. Its one invocation does nothing (`never` is 0).
struct TouchParams {
    never: u32,
    _pad0: u32,
    _pad1: u32,
    _pad2: u32,
}

@group(0) @binding(0) var<uniform> tp: TouchParams;
@group(0) @binding(6) var<storage, read> touch0: array<u32>;
@group(0) @binding(7) var<storage, read> touch1: array<u32>;
@group(0) @binding(8) var<storage, read> touch2: array<u32>;
@group(0) @binding(9) var<storage, read> touch3: array<u32>;
@group(0) @binding(10) var<storage, read_write> touch_sink: array<u32>;

@compute @workgroup_size(1)
fn touch() {
    if (tp.never != 0u) {
        touch_sink[0] = touch0[0] + touch1[0] + touch2[0] + touch3[0];
    }
}

// Reads one word per page (`stride` words) of a buffer, so the GPU's address translations for
// it are warm before a kernel streams it: a GEMV whose first wave touches ~90 cold 2 MiB pages
// at once stalls ~5 us on them (docs/perf.md). The workgroup atomic (never read) keeps the
// loads.
struct PageTouchParams {
    words: u32,
    stride: u32,
    _pad0: u32,
    _pad1: u32,
}

@group(0) @binding(0) var<uniform> pt: PageTouchParams;
@group(0) @binding(11) var<storage, read> pages: array<u32>;
var<workgroup> pages_seen: atomic<u32>;

@compute @workgroup_size(64)
fn page_touch(@builtin(global_invocation_id) gid: vec3<u32>) {
    let at = gid.x * pt.stride;
    if (at < pt.words) {
        atomicOr(&pages_seen, pages[at]);
    }
}
