// Tiles of the grouped (prefill) expert kernels, shared by moe_grouped.wgsl (SIMT) and
// moe_coop.wgsl (cooperative matrices); needs lib/experts.wgsl and an override UP (stage 1).
//
// moe_group lists the pairs routed to expert e in list[e * tokens ..][count[e]]; moe_tiles
// cuts each list into tiles of BM pairs: tiles[0] = number of tiles, then (expert, first
// list index) per tile. A workgroup computes one tile x BR "B rows" (weight rows) in steps of
// KS along K: stage 1 stacks 64 rows of w1 over the same 64 rows of w3 (both halves of the
// GLU of 64 outputs), stage 2 takes 128 rows of w2.
@group(0) @binding(7) var<storage, read> list: array<u32>;
@group(0) @binding(8) var<storage, read> count: array<u32>;
@group(0) @binding(9) var<storage, read_write> tiles: array<u32>;

const BM: u32 = 64u;  // routed pairs per tile
const BR: u32 = 128u; // B rows per workgroup
const KS: u32 = 32u;  // K per step: one MXFP4 group

var<workgroup> tile_head: vec4<u32>;
var<workgroup> tile_pairs: array<u32, BM>;

// (expert, first list index, pairs in this tile, 1) of tile `tile`, or w = 0 past the last
// tile (uniform); tile_pairs gets the tile's pairs (0 past its end).
fn load_tile(tile: u32, lid: u32) -> vec4<u32> {
    if (lid == 0u) {
        var h = vec4<u32>(0u);
        if (tile < tiles[0]) {
            let e = tiles[1u + 2u * tile];
            let n0 = tiles[2u + 2u * tile];
            h = vec4<u32>(e, n0, min(count[e] - n0, BM), 1u);
        }
        tile_head = h;
    }
    let head = workgroupUniformLoad(&tile_head);
    if (head.w != 0u && lid < BM) {
        tile_pairs[lid] = select(0u, list[head.x * p.tokens + head.y + lid], lid < head.z);
    }
    workgroupBarrier();
    return head;
}

// Weight rows (B rows) of the matrix in this stage: n_mid in stage 1, n_in in stage 2.
fn b_rows() -> u32 {
    return select(p.n_in, p.n_mid, UP);
}

// K of this stage: the activation width.
fn k_width() -> u32 {
    return select(p.n_mid, p.n_in, UP);
}

// First weight row of workgroup column `wx`: 64 (stage 1, w1 and w3) or 128 (stage 2).
fn row_base(wx: u32) -> u32 {
    return wx * select(BR, BR / 2u, UP);
}

// Weight row of B row b (r0 = row_base), and whether it is from w3 (stage 1, upper half).
fn b_row(b: u32, r0: u32) -> u32 {
    return select(r0 + b, r0 + b % (BR / 2u), UP);
}

// Packed-weight offset (16-byte units) and scale offset (bytes) of B row b's matrix.
fn b_offsets(b: u32) -> vec2<u32> {
    if (!UP) {
        return vec2<u32>(p.off_w2, p.off_s2);
    }
    return select(vec2<u32>(p.off_w1, p.off_s1), vec2<u32>(p.off_w3, p.off_s3), b >= BR / 2u);
}

// Activation row of a routed pair: its token's z (stage 1) or the pair's h (stage 2).
fn x_row(pair: u32) -> u32 {
    return select(pair, pair / p.top_k, UP);
}
