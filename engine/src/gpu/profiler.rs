//! GPU timestamp profiler: each labelled op runs in its own compute pass whose begin and
//! end timestamps are written to a query set; `collect` attributes the time to labels.
//! Span mode (`Profiler::spans`) stamps no pass: the recorder marks scope boundaries
//! (`Profiler::enter`, `Profiler::end_span`) with empty passes whose end-of-pass stamp is
//! written once all earlier work is done, so a scope's time is the span between its marks,
//! without the few microseconds every stamped pass adds. On adapters without TIMESTAMP_QUERY it records nothing and says so.

use super::{Gpu, GpuError};
use std::collections::BTreeMap;

/// Accumulated GPU time of one label.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct OpTime {
    pub label: String,
    pub count: u64,
    pub total_ns: f64,
}

pub struct Profiler {
    queries: Option<(wgpu::QuerySet, wgpu::Buffer)>,
    capacity: u32,
    pending: Vec<String>,
    period_ns: f64,
    totals: BTreeMap<String, OpTime>,
    /// Prefix of the labels recorded now (e.g. the layer), joined to the kernel name by '/'.
    scope: Option<String>,
    /// Passes that found the query set full (their time is not attributed).
    pub dropped: u64,
    /// Span mode: stamps only at marked scope boundaries (see the module doc).
    spans: bool,
}

impl Profiler {
    /// A profiler that can time up to `capacity` passes between two `collect` calls
    /// (at most 2048: a query set holds 4096 timestamps).
    pub fn new(gpu: &Gpu, capacity: u32) -> Profiler {
        let capacity = capacity.clamp(1, 2048);
        let queries = gpu.caps.timestamps.then(|| {
            let set = gpu.device.create_query_set(&wgpu::QuerySetDescriptor {
                label: Some("k31 profiler"),
                ty: wgpu::QueryType::Timestamp,
                count: capacity * 2,
            });
            let resolve = gpu.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some("k31 profiler resolve"),
                size: capacity as u64 * 16,
                usage: wgpu::BufferUsages::QUERY_RESOLVE | wgpu::BufferUsages::COPY_SRC,
                mapped_at_creation: false,
            });
            (set, resolve)
        });
        Profiler {
            queries,
            capacity,
            pending: Vec::new(),
            period_ns: gpu.queue.get_timestamp_period() as f64,
            totals: BTreeMap::new(),
            scope: None,
            dropped: 0,
            spans: false,
        }
    }

    pub fn enabled(&self) -> bool {
        self.queries.is_some()
    }

    /// A span-mode profiler (see the module doc): up to 2 * `capacity` marks between two
    /// `collect` calls; the recording must end with [`Profiler::end_span`].
    pub fn spans(gpu: &Gpu, capacity: u32) -> Profiler {
        Profiler { spans: true, ..Profiler::new(gpu, capacity) }
    }

    /// Attributes the next passes to `scope`; in span mode also marks the boundary in `enc`.
    pub fn enter(&mut self, gpu: &Gpu, enc: &mut wgpu::CommandEncoder, scope: Option<String>) {
        if self.spans {
            self.mark(gpu, enc, scope.clone().unwrap_or_default());
        }
        self.scope = scope;
    }

    /// Span mode: marks the end of the last span (nothing otherwise).
    pub fn end_span(&mut self, gpu: &Gpu, enc: &mut wgpu::CommandEncoder) {
        if self.spans {
            self.mark(gpu, enc, String::new());
        }
    }

    /// An empty pass whose end-of-pass stamp closes the open span and starts `label`'s
    /// (empty: none).
    fn mark(&mut self, gpu: &Gpu, enc: &mut wgpu::CommandEncoder, label: String) {
        let Some((set, _)) = self.queries.as_ref() else { return };
        let i = self.pending.len() as u32;
        if i >= 2 * self.capacity {
            self.dropped += 1;
            return;
        }
        self.pending.push(label);
        gpu.mark_timestamp(enc, set, i);
    }

    /// Timestamp writes for the next pass, attributed to `label`.
    pub fn pass(&mut self, label: &str) -> Option<wgpu::ComputePassTimestampWrites<'_>> {
        let (set, i) = self.stamps(label)?;
        Some(wgpu::ComputePassTimestampWrites { query_set: set, beginning_of_pass_write_index: Some(i), end_of_pass_write_index: Some(i + 1) })
    }

    /// The query set and the first of two query indices for one op attributed to `label`
    /// (its start and end stamps), or None in span mode, without timestamps or when full.
    pub fn stamps(&mut self, label: &str) -> Option<(&wgpu::QuerySet, u32)> {
        if self.spans {
            return None;
        }
        let (set, _) = self.queries.as_ref()?;
        let i = self.pending.len() as u32;
        if i >= self.capacity {
            self.dropped += 1;
            return None;
        }
        self.pending.push(match &self.scope {
            Some(s) => format!("{s}/{label}"),
            None => label.to_string(),
        });
        Some((set, 2 * i))
    }

    pub fn is_spans(&self) -> bool {
        self.spans
    }

    /// Reads back the timestamps of all passes submitted since the last call (waits for
    /// the GPU) and adds them to the per-label totals.
    pub fn collect(&mut self, gpu: &Gpu) -> Result<(), GpuError> {
        let Some((set, resolve)) = &self.queries else { return Ok(()) };
        let n = self.pending.len() as u32;
        if n == 0 {
            return Ok(());
        }
        let stamps = if self.spans { n } else { 2 * n };
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        enc.resolve_query_set(set, 0..stamps, resolve, 0);
        gpu.submit([enc.finish()]);
        let raw: Vec<u64> = gpu.read(resolve, stamps as usize)?;
        if self.spans {
            // Span i runs from stamp i to stamp i + 1; the end marker (empty label) starts none.
            let labels: Vec<String> = self.pending.drain(..).collect();
            for (i, label) in labels.iter().enumerate().take(labels.len().saturating_sub(1)) {
                if label.is_empty() {
                    continue;
                }
                let ns = raw[i + 1].saturating_sub(raw[i]) as f64 * self.period_ns;
                let e = self.totals.entry(label.clone()).or_insert_with(|| OpTime { label: label.clone(), ..Default::default() });
                e.count += 1;
                e.total_ns += ns;
            }
            return Ok(());
        }
        for (i, label) in self.pending.drain(..).enumerate() {
            let (a, b) = (raw[2 * i], raw[2 * i + 1]);
            let ns = b.saturating_sub(a) as f64 * self.period_ns;
            let e = self.totals.entry(label.clone()).or_insert_with(|| OpTime { label, ..Default::default() });
            e.count += 1;
            e.total_ns += ns;
        }
        Ok(())
    }

    /// Attributes the next passes to `scope` (None: kernel names alone).
    pub fn set_scope(&mut self, scope: Option<String>) {
        self.scope = scope;
    }

    /// Totals regrouped by `key(label)` (e.g. dropping the scope to get op families),
    /// largest first.
    pub fn report_by(&self, key: impl Fn(&str) -> String) -> Vec<OpTime> {
        let mut m: BTreeMap<String, OpTime> = BTreeMap::new();
        for t in self.totals.values() {
            let k = key(&t.label);
            let e = m.entry(k.clone()).or_insert_with(|| OpTime { label: k, ..Default::default() });
            e.count += t.count;
            e.total_ns += t.total_ns;
        }
        let mut v: Vec<OpTime> = m.into_values().collect();
        v.sort_by(|a, b| b.total_ns.total_cmp(&a.total_ns));
        v
    }

    /// Totals per label, largest first.
    pub fn report(&self) -> Vec<OpTime> {
        let mut v: Vec<OpTime> = self.totals.values().cloned().collect();
        v.sort_by(|a, b| b.total_ns.total_cmp(&a.total_ns));
        v
    }

    pub fn reset(&mut self) {
        self.totals.clear();
        self.pending.clear();
        self.dropped = 0;
    }
}
