//! CPU reference of RMSNorm (spec 2.1), f64.

/// out [rows, n] = x * rsqrt(mean(x^2) + eps) * w.
pub fn rms_norm(x: &[f32], rows: usize, n: usize, w: &[f32], eps: f32) -> Vec<f32> {
    let mut out = Vec::with_capacity(rows * n);
    for r in 0..rows {
        let row = &x[r * n..(r + 1) * n];
        let ms: f64 = row.iter().map(|&v| v as f64 * v as f64).sum::<f64>() / n as f64;
        let inv = 1.0 / (ms + eps as f64).sqrt();
        out.extend(row.iter().zip(w).map(|(&v, &g)| (v as f64 * inv * g as f64) as f32));
    }
    out
}
