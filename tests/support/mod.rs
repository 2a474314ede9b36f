//! Shared helpers of the integration tests.
#![allow(dead_code)]

pub mod golden;

use k31_engine::gpu::Gpu;
use std::sync::{Arc, OnceLock};

/// The test GPU, opened once per test binary. Without an adapter the GPU tests skip with
/// a message, unless `K31_REQUIRE_GPU=1` (set by CI) turns that into a failure.
pub fn gpu() -> Option<Arc<Gpu>> {
    static GPU: OnceLock<Option<Arc<Gpu>>> = OnceLock::new();
    GPU.get_or_init(|| match Gpu::open(None) {
        Ok(g) => {
            eprintln!("GPU tests run on: {}", g.describe());
            Some(g)
        }
        Err(e) => {
            if std::env::var("K31_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!("K31_REQUIRE_GPU=1 but no GPU could be opened: {e}");
            }
            eprintln!("skipping GPU test: {e}");
            None
        }
    })
    .clone()
}

/// Deterministic uniform values in [-1, 1).
pub fn random_vec(seed: u64, n: usize) -> Vec<f32> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..n).map(|_| rng.random::<f32>() * 2.0 - 1.0).collect()
}

/// Normalised mean squared error sum((a-b)^2) / sum(b^2), the test-backend-ops measure.
pub fn nmse(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len(), "length mismatch");
    let mut num = 0f64;
    let mut den = 0f64;
    for (&g, &w) in got.iter().zip(want) {
        assert!(g.is_finite(), "non-finite output {g}");
        num += (g as f64 - w as f64).powi(2);
        den += (w as f64).powi(2);
    }
    if den == 0.0 { num } else { num / den }
}

/// A fresh scratch directory under the target dir.
pub fn scratch(name: &str) -> std::path::PathBuf {
    let d = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).expect("creating a scratch directory");
    d
}
