//! Shared pieces of the benchmark binaries in `benches/`: GPU timing of a recorded
//! workload with the timestamp profiler, and the copy-bandwidth ceiling measured in the
//! same run that every memory-bound figure is compared with.

use crate::gpu::{Gpu, GpuError, Profiler};
use crate::ops::copy::{copy, spin};

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
        gpu.submit([enc.finish()]);
    }
    gpu.wait()?;
    let mut samples = Vec::with_capacity(reps);
    let mut profiler = Profiler::new(gpu, 256);
    for _ in 0..reps {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        let start = std::time::Instant::now();
        if profiler.enabled() {
            record(&mut enc, Some(&mut profiler))?;
            gpu.submit([enc.finish()]);
            profiler.collect(gpu)?;
            let total: f64 = profiler.report().iter().map(|t| t.total_ns).sum();
            profiler.reset();
            samples.push(total * 1e-9);
        } else {
            record(&mut enc, None)?;
            gpu.submit([enc.finish()]);
            gpu.wait()?;
            samples.push(start.elapsed().as_secs_f64());
        }
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[samples.len() / 2])
}

/// Two GPU timestamps (query indices 0 and 1) and their readback: the GPU time between a
/// pass's stamp and a later one's, for benchmarks that time a span rather than every pass.
pub struct Stamps {
    set: wgpu::QuerySet,
    resolve: wgpu::Buffer,
    period_ns: f64,
}

impl Stamps {
    /// None where the adapter has no timestamp queries.
    pub fn new(gpu: &Gpu) -> Option<Stamps> {
        gpu.caps.timestamps.then(|| Stamps {
            set: gpu.device.create_query_set(&wgpu::QuerySetDescriptor { label: Some("span stamps"), ty: wgpu::QueryType::Timestamp, count: 2 }),
            resolve: gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("span stamps resolve"),
                size: 16,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            }),
            period_ns: gpu.queue.get_timestamp_period() as f64,
        })
    }

    /// Timestamp writes for a pass: stamp 0 and/or stamp 1 at its beginning / end.
    pub fn writes(&self, beginning: Option<u32>, end: Option<u32>) -> wgpu::ComputePassTimestampWrites<'_> {
        wgpu::ComputePassTimestampWrites { query_set: &self.set, beginning_of_pass_write_index: beginning, end_of_pass_write_index: end }
    }

    /// Records the copy of both stamps for [`Stamps::seconds`] (after the passes that write them).
    pub fn resolve(&self, enc: &mut wgpu::CommandEncoder) {
        enc.resolve_query_set(&self.set, 0..2, &self.resolve, 0);
    }

    /// Seconds from stamp 0 to stamp 1 (after the resolving submission has finished).
    pub fn seconds(&self, gpu: &Gpu) -> Result<f64, GpuError> {
        let raw: Vec<u64> = gpu.read(&self.resolve, 2)?;
        Ok(raw[1].saturating_sub(raw[0]) as f64 * self.period_ns * 1e-9)
    }
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
    let t = median_span(gpu, warmup, reps, |enc, stamps| {
        if let Some(st) = stamps {
            drop(enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("span start"), timestamp_writes: Some(st.writes(None, Some(0))) }));
        }
        for i in 0..inner {
            record(enc, i)?;
        }
        if let Some(st) = stamps {
            drop(enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("span end"), timestamp_writes: Some(st.writes(Some(1), None)) }));
        }
        Ok(())
    })?;
    Ok(t / inner as f64)
}

/// Median over `reps` submissions (after `warmup`) of the time between the two stamps that
/// `record` places with the [`Stamps`] it is given (each submission is one fresh encoder of
/// `record`'s work); the submission's wall-clock time where timestamps are unavailable.
pub fn median_span(
    gpu: &Gpu,
    warmup: usize,
    reps: usize,
    mut record: impl FnMut(&mut wgpu::CommandEncoder, Option<&Stamps>) -> Result<(), GpuError>,
) -> Result<f64, GpuError> {
    let stamps = Stamps::new(gpu);
    let mut samples = Vec::with_capacity(reps);
    for rep in 0..warmup + reps.max(1) {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        let start = std::time::Instant::now();
        record(&mut enc, stamps.as_ref())?;
        if let Some(st) = &stamps {
            st.resolve(&mut enc);
        }
        gpu.submit([enc.finish()]);
        gpu.wait()?;
        let wall = start.elapsed().as_secs_f64();
        let t = match &stamps {
            Some(st) => st.seconds(gpu)?,
            None => wall,
        };
        if rep >= warmup {
            samples.push(t);
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
    gpu.submit([enc.finish()]);
    for _ in 0..reps {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        record(&mut enc, Some(&mut profiler))?;
        gpu.submit([enc.finish()]);
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

/// Keeps the GPU busy until its shader clock is back at full speed, then returns the
/// milliseconds that took. A GPU left idle for a second or more (the host generating a
/// 512K-1M cache, an f64 reference, recording 8192 dispatches) drops its clock (the H200 from
/// 1980 to 345-1245 MHz, sampled with nvidia-smi, sixteenth session) and short timed kernels
/// do not lift it: the fifteenth session's 512K / 1M figures swung 1.5-4x within one process,
/// and a 7.7 ms KDA prefill timed at 24.5 ms right after its reference ran on the host.
/// Batches of an issue-bound fma spin (~2 ms each at full clock, wall clock) run until three
/// in a row are within 3 % of the fastest batch this process has seen, after at least
/// `min_ms` (at least a second on the first call, which sets that best); at most `max_ms`.
/// A stable but slow spin is not enough: a GPU at a low clock runs it stably too.
pub fn warm_gpu(gpu: &Gpu, min_ms: u64, max_ms: u64) -> Result<f64, GpuError> {
    use std::sync::atomic::{AtomicU64, Ordering};
    static BEST_NS: AtomicU64 = AtomicU64::new(u64::MAX);
    let sink = gpu.storage("spin sink", 256 * 4);
    let (groups, iters) = if gpu.info.device_type == wgpu::DeviceType::Cpu { (8, 64) } else { (4096, 16384) };
    let first = BEST_NS.load(Ordering::Relaxed) == u64::MAX;
    let min_ms = if first { min_ms.max(1000) } else { min_ms };
    let start = std::time::Instant::now();
    let mut near_best = 0;
    loop {
        let t0 = std::time::Instant::now();
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        spin(gpu, &mut enc, &sink, groups, iters)?;
        gpu.submit([enc.finish()]);
        gpu.wait()?;
        let t = t0.elapsed().as_nanos() as u64;
        let best = BEST_NS.fetch_min(t, Ordering::Relaxed).min(t);
        near_best = if t * 100 <= best * 103 { near_best + 1 } else { 0 };
        let ms = start.elapsed().as_secs_f64() * 1e3;
        if (ms >= min_ms as f64 && near_best >= 3) || ms >= max_ms as f64 {
            return Ok(ms);
        }
    }
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
