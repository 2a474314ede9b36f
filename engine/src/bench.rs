//! Shared pieces of the benchmark binaries in `benches/`: GPU timing of a recorded
//! workload with the timestamp profiler, and the copy-bandwidth ceiling measured in the
//! same run that every memory-bound figure is compared with.

use crate::gpu::{Gpu, GpuError, Profiler};
use crate::ops::copy::copy;

/// Median GPU time in seconds of `label`'s passes over `reps` submissions after `warmup`,
/// where `record` records one repetition into the encoder (timing its passes through the
/// profiler it is given). Falls back to wall-clock time when timestamps are unavailable.
pub fn time_gpu(
    gpu: &Gpu,
    warmup: usize,
    reps: usize,
    mut record: impl FnMut(&mut wgpu::CommandEncoder, Option<&mut Profiler>) -> Result<(), GpuError>,
) -> Result<f64, GpuError> {
    for _ in 0..warmup {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        record(&mut enc, None)?;
        gpu.queue.submit([enc.finish()]);
    }
    gpu.wait()?;
    let mut samples = Vec::with_capacity(reps);
    let mut profiler = Profiler::new(gpu, 256);
    for _ in 0..reps {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        let start = std::time::Instant::now();
        if profiler.enabled() {
            record(&mut enc, Some(&mut profiler))?;
            gpu.queue.submit([enc.finish()]);
            profiler.collect(gpu)?;
            let total: f64 = profiler.report().iter().map(|t| t.total_ns).sum();
            profiler.reset();
            samples.push(total * 1e-9);
        } else {
            record(&mut enc, None)?;
            gpu.queue.submit([enc.finish()]);
            gpu.wait()?;
            samples.push(start.elapsed().as_secs_f64());
        }
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

/// Mean GPU time per kernel label over `reps` recordings (after one warm-up), largest first:
/// where a multi-dispatch op spends its time.
pub fn breakdown(
    gpu: &Gpu,
    reps: usize,
    mut record: impl FnMut(&mut wgpu::CommandEncoder, Option<&mut Profiler>) -> Result<(), GpuError>,
) -> Result<Vec<(String, f64)>, GpuError> {
    let mut profiler = Profiler::new(gpu, 1024);
    if !profiler.enabled() {
        return Ok(Vec::new());
    }
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    record(&mut enc, None)?;
    gpu.queue.submit([enc.finish()]);
    for _ in 0..reps {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        record(&mut enc, Some(&mut profiler))?;
        gpu.queue.submit([enc.finish()]);
        profiler.collect(gpu)?;
    }
    Ok(profiler.report().into_iter().map(|t| (t.label, t.total_ns * 1e-9 / reps as f64)).collect())
}

/// Device copy bandwidth in bytes/s (read + write counted), over a buffer of `bytes`.
pub fn copy_bandwidth(gpu: &Gpu, bytes: u64) -> Result<f64, GpuError> {
    let bytes = (bytes.min(gpu.caps.max_binding) / 16) * 16;
    let src = gpu.storage("copy src", bytes);
    let dst = gpu.storage("copy dst", bytes);
    let t = time_gpu(gpu, 3, 20, |enc, prof| copy(gpu, enc, &src, &dst, bytes, prof))?;
    Ok(2.0 * bytes as f64 / t)
}

/// One result row, printed as text and collected as JSON.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    pub name: String,
    pub time_us: f64,
    /// Achieved rate in the unit of `ceiling` (GB/s or TFLOP/s).
    pub rate: f64,
    pub ceiling: f64,
    pub unit: &'static str,
}

impl Row {
    pub fn print(&self) {
        println!(
            "{:<48} {:>10.2} us  {:>9.1} {}  ({:>5.1} % of {:.1})",
            self.name,
            self.time_us,
            self.rate,
            self.unit,
            100.0 * self.rate / self.ceiling,
            self.ceiling
        );
    }
}
