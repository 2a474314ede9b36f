//! The batched linear layer (prefill, T >= 2) against an f64 CPU reference at awkward shapes:
//! bf16 and f32 weights, accumulate on and off, weights split into row chunks (row_offset and
//! y_stride), activations of large magnitude. Lavapipe has no cooperative matrices, so CI runs
//! the SIMT kernels; benches/linear.rs checks the coop kernel the same way on the H200.

mod support;

use k31_engine::gpu::{Gpu, GpuTensor};
use k31_engine::layout::DType;
use k31_engine::ops::linear::{self, LinearVariant};

/// Relative L2 error the SIMT kernels must meet (they measure 1e-7 to 2e-6: f32 accumulation).
const TOL: f64 = 1e-5;
/// The coop kernel's bound (H200: ~2.4e-9 * cols, see linear::COOP_MAX_COLS).
const COOP_TOL: f64 = 1e-4;

fn bf16_round(v: &[f32]) -> Vec<f32> {
    v.iter().map(|&x| half::bf16::from_f32(x).to_f32()).collect()
}

/// W [rows, cols] in `dtype` (values rounded to it), split into chunks of at most `chunk_rows`.
fn upload(gpu: &Gpu, dtype: DType, rows: usize, cols: usize, w: &[f32], chunk_rows: usize) -> GpuTensor {
    let bytes: Vec<u8> = match dtype {
        DType::BF16 => w.iter().flat_map(|&x| half::bf16::from_f32(x).to_le_bytes()).collect(),
        _ => w.iter().flat_map(|&x| x.to_le_bytes()).collect(),
    };
    let row_bytes = cols * dtype.size();
    // Chunks of whole 4-byte words (GpuTensor rounds the row count to keep that).
    let max = (chunk_rows * row_bytes).max(4) as u64;
    GpuTensor::upload(gpu, "w", dtype, &[rows, cols], &bytes, Some(max)).expect("upload")
}

/// y0 + W x in f64.
fn reference(w: &[f32], x: &[f32], y0: &[f32], rows: usize, cols: usize, tokens: usize) -> Vec<f32> {
    let mut y = y0.to_vec();
    for t in 0..tokens {
        for r in 0..rows {
            let s: f64 = (0..cols).map(|c| w[r * cols + c] as f64 * x[t * cols + c] as f64).sum();
            y[t * rows + r] = (y0[t * rows + r] as f64 + s) as f32;
        }
    }
    y
}

/// Runs one case; returns the relative L2 error.
#[allow(clippy::too_many_arguments)]
fn case(gpu: &Gpu, variant: LinearVariant, dtype: DType, rows: usize, cols: usize, tokens: usize, chunk_rows: usize, accumulate: bool, x_scale: f32, seed: u64) -> f64 {
    let mut w = support::random_vec(seed, rows * cols);
    if dtype == DType::BF16 {
        w = bf16_round(&w);
    }
    // Per-token magnitudes spread over decades (and x_scale on top): the coop path's scale is per token.
    let x: Vec<f32> = support::random_vec(seed + 1, tokens * cols)
        .iter()
        .enumerate()
        .map(|(i, &v)| v * x_scale * 10f32.powi((i / cols) as i32 % 5 - 2))
        .collect();
    let y0 = if accumulate { support::random_vec(seed + 2, tokens * rows) } else { vec![f32::NAN; tokens * rows] };
    let wt = upload(gpu, dtype, rows, cols, &w, chunk_rows);
    let xb = gpu.storage_from("x", &x);
    let yb = gpu.storage_from("y", &y0);
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    linear::linear_variant(gpu, &mut enc, &wt, tokens, &xb, &yb, accumulate, variant, None).expect("linear");
    gpu.queue.submit([enc.finish()]);
    let got: Vec<f32> = gpu.read(&yb, tokens * rows).unwrap();
    let zeros = vec![0.0; tokens * rows];
    let want = reference(&w, &x, if accumulate { &y0 } else { &zeros }, rows, cols, tokens);
    let err = support::nmse(&got, &want).sqrt();
    eprintln!(
        "{variant:?} {} rows {rows} cols {cols} tokens {tokens} chunks {} acc {accumulate} x*{x_scale:e}: rel L2 {err:.2e}",
        dtype.name(),
        wt.chunks.len()
    );
    err
}

/// (rows, cols, tokens, rows per chunk): cols 1, 17, 100 (scalar loads for bf16; f32 rows are
/// 16-byte aligned with a half-filled last slab), 136 (aligned, K tail of 8), 7168; tokens 2,
/// 3, 17, 64, 100, 130 (two token tiles); rows past one 128-row tile and in several chunks.
const SHAPES: &[(usize, usize, usize, usize)] = &[
    (5, 1, 2, 5),
    (33, 17, 3, 33),
    (130, 100, 17, 48),
    (129, 136, 64, 129),
    (40, 64, 130, 16),
    (70, 7168, 100, 70),
    (200, 24, 2, 64),
];

#[test]
fn simt_matches_f64_reference_at_awkward_shapes() {
    let Some(gpu) = support::gpu() else { return };
    let mut worst: f64 = 0.0;
    for (i, &(rows, cols, tokens, chunk)) in SHAPES.iter().enumerate() {
        for dtype in [DType::BF16, DType::F32] {
            for accumulate in [false, true] {
                let err = case(&gpu, LinearVariant::Simt, dtype, rows, cols, tokens, chunk, accumulate, 1.0, 100 + i as u64);
                assert!(err <= TOL, "SIMT {} {rows}x{cols} T={tokens} acc={accumulate}: rel L2 {err:.2e}", dtype.name());
                worst = worst.max(err);
            }
        }
    }
    eprintln!("worst SIMT rel L2 {worst:.2e}");
}

#[test]
fn large_activations_stay_exact() {
    let Some(gpu) = support::gpu() else { return };
    // |x| up to 1e7: past f16's range, which the coop path must scale away; SIMT is f32 throughout.
    for (rows, cols, tokens) in [(64, 256, 5), (130, 100, 3)] {
        let err = case(&gpu, LinearVariant::Auto, DType::BF16, rows, cols, tokens, rows, true, 1e5, 7);
        assert!(err <= TOL, "{rows}x{cols} T={tokens}: rel L2 {err:.2e}");
    }
}

#[test]
fn default_and_naive_kernels_match_reference() {
    let Some(gpu) = support::gpu() else { return };
    for &(rows, cols, tokens, chunk) in &SHAPES[..4] {
        for variant in [LinearVariant::Auto, LinearVariant::Naive] {
            let err = case(&gpu, variant, DType::BF16, rows, cols, tokens, chunk, true, 1.0, 3);
            assert!(err <= TOL, "{variant:?} {rows}x{cols} T={tokens}: rel L2 {err:.2e}");
        }
    }
    // The public entry point: T >= 2 runs the batched kernels, accumulating into y.
    let (rows, cols, tokens) = (48, 40, 4);
    let w = bf16_round(&support::random_vec(9, rows * cols));
    let x = support::random_vec(10, tokens * cols);
    let y0 = support::random_vec(11, tokens * rows);
    let wt = upload(&gpu, DType::BF16, rows, cols, &w, rows);
    let (xb, yb) = (gpu.storage_from("x", &x), gpu.storage_from("y", &y0));
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    linear::linear_into(&gpu, &mut enc, &wt, tokens, &xb, &yb, true, None).unwrap();
    gpu.queue.submit([enc.finish()]);
    let got: Vec<f32> = gpu.read(&yb, tokens * rows).unwrap();
    let err = support::nmse(&got, &reference(&w, &x, &y0, rows, cols, tokens)).sqrt();
    assert!(err <= TOL, "linear_into: rel L2 {err:.2e}");
}

#[test]
fn coop_is_refused_or_exact() {
    let Some(gpu) = support::gpu() else { return };
    let wt = upload(&gpu, DType::BF16, 8, 16, &vec![0.5; 128], 8);
    if !linear::coop_available(&gpu, &wt) {
        // Lavapipe: the variant is refused with a reason rather than run.
        let (xb, yb) = (gpu.storage("x", 4 * 16 * 4), gpu.storage("y", 4 * 8 * 4));
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        let r = linear::linear_variant(&gpu, &mut enc, &wt, 4, &xb, &yb, false, LinearVariant::Coop, None);
        assert!(r.is_err(), "coop must be refused where the adapter lacks it");
        return;
    }
    for (i, &(rows, cols, tokens, chunk)) in SHAPES.iter().enumerate().filter(|(_, s)| s.1 % 8 == 0) {
        for x_scale in [1.0, 1e5] {
            let err = case(&gpu, LinearVariant::Coop, DType::BF16, rows, cols, tokens, chunk, true, x_scale, 50 + i as u64);
            assert!(err <= COOP_TOL, "coop {rows}x{cols} T={tokens}: rel L2 {err:.2e}");
        }
    }
}
