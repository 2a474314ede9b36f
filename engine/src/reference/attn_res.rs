//! CPU reference of the Block AttnRes aggregation (spec 3.1) for one token, f64.

/// (out [d], alpha [n]) from sources v_0..v_{n-1} (each [d]), gamma [d], proj [d].
pub fn attn_res(sources: &[&[f32]], gamma: &[f32], proj: &[f32], eps: f32) -> (Vec<f32>, Vec<f32>) {
    let d = gamma.len();
    let s: Vec<f64> = sources
        .iter()
        .map(|v| {
            let ms: f64 = v.iter().map(|&a| a as f64 * a as f64).sum::<f64>() / d as f64;
            let dot: f64 = v.iter().zip(gamma).zip(proj).map(|((&a, &g), &p)| a as f64 * g as f64 * p as f64).sum();
            dot / (ms + eps as f64).sqrt()
        })
        .collect();
    let m = s.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = s.iter().map(|&v| (v - m).exp()).collect();
    let sum: f64 = e.iter().sum();
    let alpha: Vec<f64> = e.iter().map(|&v| v / sum).collect();
    let out = (0..d).map(|i| sources.iter().zip(&alpha).map(|(v, &a)| a * v[i] as f64).sum::<f64>() as f32).collect();
    (out, alpha.iter().map(|&a| a as f32).collect())
}
