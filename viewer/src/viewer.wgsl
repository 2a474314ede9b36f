// The selection viewer: one full-screen triangle; the fragment shader bins context positions
// into pixel columns (max over the bin), colours cells, marks the query position, draws the
// frequency strip, then lays the CPU-drawn text overlay on top. Colours repeat palette.rs.

struct Params {
    heat: vec4<f32>,   // heatmap rect x, y, w, h (px)
    strip: vec4<f32>,  // frequency strip rect
    x0: f32,           // visible positions [x0, x1)
    x1: f32,
    rows: u32,         // visible rows
    row_base: u32,     // buffer row of the first visible row = (row_base + r) % row_mod
    row_mod: u32,
    cap: u32,          // positions per buffer row (multiple of 4)
    srgb: u32,         // 1: the target is an sRGB format (write linear values)
    row_gap: u32,      // 1: leave a background line under each row
}

@group(0) @binding(0) var<uniform> p: Params;
@group(0) @binding(1) var<storage, read> grid: array<u32>;   // [row_mod, cap] value bytes
@group(0) @binding(2) var<storage, read> strip: array<u32>;  // [cap] value bytes
@group(0) @binding(3) var<storage, read> rowpos: array<u32>; // [row_mod] query position per row
@group(0) @binding(4) var overlay: texture_2d<f32>;

const BACKGROUND = vec3<f32>(12.0, 13.0, 18.0);
const UNSELECTED = vec3<f32>(32.0, 35.0, 46.0);
const FUTURE = vec3<f32>(18.0, 18.0, 22.0);
const MARK = vec3<f32>(0.0, 230.0, 255.0);
// Longest bin scanned in full; wider bins are sampled with a stride.
const MAX_SCAN: u32 = 1024u;

@vertex
fn vs(@builtin(vertex_index) i: u32) -> @builtin(position) vec4<f32> {
    let x = f32((i << 1u) & 2u) * 2.0 - 1.0;
    let y = f32(i & 2u) * 2.0 - 1.0;
    return vec4<f32>(x, y, 0.0, 1.0);
}

fn grid_byte(i: u32) -> u32 {
    return (grid[i >> 2u] >> ((i & 3u) * 8u)) & 255u;
}

fn strip_byte(i: u32) -> u32 {
    return (strip[i >> 2u] >> ((i & 3u) * 8u)) & 255u;
}

fn heat(b: u32) -> vec3<f32> {
    if b == 0u {
        return UNSELECTED;
    }
    var stops = array<vec3<f32>, 4>(
        vec3<f32>(70.0, 30.0, 120.0),
        vec3<f32>(190.0, 45.0, 90.0),
        vec3<f32>(245.0, 135.0, 35.0),
        vec3<f32>(252.0, 240.0, 100.0),
    );
    let u = f32(b - 1u) / 254.0 * 3.0;
    let i = min(u32(u), 2u);
    return round(mix(stops[i], stops[i + 1u], u - f32(i)));
}

fn strip_colour(b: u32) -> vec3<f32> {
    if b == 0u {
        return UNSELECTED;
    }
    return round(mix(vec3<f32>(30.0, 70.0, 70.0), vec3<f32>(110.0, 240.0, 200.0), f32(b - 1u) / 254.0));
}

fn marked(c: vec3<f32>) -> vec3<f32> {
    return round((c + MARK) * 0.5);
}

fn inside(q: vec2<f32>, r: vec4<f32>) -> bool {
    return q.x >= r.x && q.y >= r.y && q.x < r.x + r.z && q.y < r.y + r.w;
}

// Positions [lo, hi) shown in pixel column px of rect r.
fn bin(px: f32, r: vec4<f32>) -> vec2<u32> {
    let span = p.x1 - p.x0;
    let a = p.x0 + (px - r.x) / r.z * span;
    let b = p.x0 + (px + 1.0 - r.x) / r.z * span;
    let lo = u32(max(floor(a), 0.0));
    let hi = max(u32(max(ceil(b), 0.0)), lo + 1u);
    return vec2<u32>(lo, hi);
}

fn stride(lo: u32, hi: u32) -> u32 {
    return max(1u, (hi - lo + MAX_SCAN - 1u) / MAX_SCAN);
}

fn to_linear(c: vec3<f32>) -> vec3<f32> {
    let lo = c / 12.92;
    let hi = pow((c + 0.055) / 1.055, vec3<f32>(2.4));
    return select(hi, lo, c <= vec3<f32>(0.04045));
}

@fragment
fn fs(@builtin(position) frag: vec4<f32>) -> @location(0) vec4<f32> {
    let q = floor(frag.xy);
    var c = BACKGROUND;
    let newest = rowpos[(p.row_base + max(p.rows, 1u) - 1u) % max(p.row_mod, 1u)];
    if p.rows > 0u && inside(q, p.heat) {
        let h = p.heat;
        let row = min(u32((frag.y - h.y) * f32(p.rows) / h.w), p.rows - 1u);
        let slot = (p.row_base + row) % p.row_mod;
        let qpos = rowpos[slot];
        let bn = bin(q.x, h);
        if bn.x > qpos {
            c = FUTURE;
        } else {
            var m = 0u;
            let end = min(bn.y, p.cap);
            let st = stride(bn.x, end);
            for (var i = bn.x; i < end; i += st) {
                m = max(m, grid_byte(slot * p.cap + i));
            }
            c = heat(m);
            if qpos >= bn.x && qpos < bn.y {
                c = marked(c);
            }
        }
        if p.row_gap == 1u {
            let y1 = h.y + f32(row + 1u) * h.w / f32(p.rows);
            if y1 - q.y <= 1.0 {
                c = BACKGROUND;
            }
        }
    } else if p.rows > 0u && inside(q, p.strip) {
        let bn = bin(q.x, p.strip);
        if bn.x > newest {
            c = FUTURE;
        } else {
            var m = 0u;
            let end = min(bn.y, p.cap);
            let st = stride(bn.x, end);
            for (var i = bn.x; i < end; i += st) {
                m = max(m, strip_byte(i));
            }
            c = strip_colour(m);
            if newest >= bn.x && newest < bn.y {
                c = marked(c);
            }
        }
    }
    let o = textureLoad(overlay, vec2<i32>(q), 0);
    var rgb = mix(c / 255.0, o.rgb, o.a);
    if p.srgb == 1u {
        rgb = to_linear(rgb);
    }
    return vec4<f32>(rgb, 1.0);
}
