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

/// Median GPU time in seconds of ONE of `inner` back-to-back repetitions that `record(enc, i)`
/// records (no per-pass timestamps: an empty pass before and after carries the two), over
/// `reps` submissions after `warmup`: the steady-state cost of a kernel inside a model's
/// command stream, without the few microseconds a timestamped pass adds to each kernel.
/// Falls back to wall-clock time when timestamps are unavailable.
pub fn time_back_to_back(
    gpu: &Gpu,
    warmup: usize,
    reps: usize,
    inner: usize,
    mut record: impl FnMut(&mut wgpu::CommandEncoder, usize) -> Result<(), GpuError>,
) -> Result<f64, GpuError> {
    let inner = inner.max(1);
    let queries = gpu.caps.timestamps.then(|| {
        let set = gpu.device.create_query_set(&wgpu::QuerySetDescriptor { label: Some("back to back"), ty: wgpu::QueryType::Timestamp, count: 2 });
        let buf = gpu.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("back to back resolve"),
            size: 16,
            usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
            mapped_at_creation: false,
        });
        (set, buf)
    });
    let period = gpu.queue.get_timestamp_period() as f64;
    let mut samples = Vec::with_capacity(reps);
    for rep in 0..warmup + reps {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        let start = std::time::Instant::now();
        if let Some((set, _)) = &queries {
            let ts = wgpu::ComputePassTimestampWrites { query_set: set, beginning_of_pass_write_index: None, end_of_pass_write_index: Some(0) };
            drop(enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("span start"), timestamp_writes: Some(ts) }));
        }
        for i in 0..inner {
            record(&mut enc, i)?;
        }
        if let Some((set, buf)) = &queries {
            let ts = wgpu::ComputePassTimestampWrites { query_set: set, beginning_of_pass_write_index: Some(1), end_of_pass_write_index: None };
            drop(enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("span end"), timestamp_writes: Some(ts) }));
            enc.resolve_query_set(set, 0..2, buf, 0);
        }
        gpu.queue.submit([enc.finish()]);
        gpu.wait()?;
        let wall = start.elapsed().as_secs_f64();
        let t = match &queries {
            Some((_, buf)) => {
                let raw: Vec<u64> = gpu.read(buf, 2)?;
                raw[1].saturating_sub(raw[0]) as f64 * period * 1e-9
            }
            None => wall,
        };
        if rep >= warmup {
            samples.push(t / inner as f64);
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
