//! The GPU runtime: adapter choice, device, tensors split across bindings, the pipeline
//! cache and the timestamp profiler. Nothing model-specific lives here.

pub mod adapter;
mod frame;
pub mod pipelines;
pub mod profiler;
pub mod tensor;

pub use adapter::{AdapterSummary, ADAPTER_ENV};
pub use pipelines::{Kernel, PipelineCache};
pub use profiler::{OpTime, Profiler};
pub use tensor::{GpuTensor, TensorChunk};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(
        "no usable GPU adapter was found (Vulkan, Metal, DX12 or GL). Install your GPU vendor's driver \
         (Vulkan on Linux/Windows, Metal on macOS, DX12 on Windows); on a Linux machine without a GPU \
         install Mesa's software Vulkan: `apt-get install mesa-vulkan-drivers libvulkan1`. If WGPU_BACKEND \
         is set, check that it names a backend this machine has."
    )]
    NoAdapter,
    #[error("no adapter matches `{selector}` (from --adapter or K31_ADAPTER); available: {available}")]
    AdapterNotFound { selector: String, available: String },
    #[error("the adapter `{adapter}` refused a device: {source}")]
    RequestDevice { adapter: String, source: wgpu::RequestDeviceError },
    #[error("GPU readback failed: {0}")]
    Readback(String),
    #[error("{what} needs {needed} bytes in one buffer but the adapter allows {limit}")]
    TooLarge { what: String, needed: u64, limit: u64 },
    #[error("shader `{shader}` has no entry point `{entry}` or failed to build: {reason}")]
    Pipeline { shader: String, entry: String, reason: String },
    #[error("{0}")]
    Shape(String),
}

/// Device capabilities the kernels choose variants by.
#[derive(Clone, Debug)]
pub struct Capabilities {
    pub f16: bool,
    pub subgroups: bool,
    /// `subgroupBarrier()` (Vulkan has it wherever it has subgroups).
    pub subgroup_barrier: bool,
    pub timestamps: bool,
    /// Timestamps between the dispatches of one compute pass (per-op times while dispatches
    /// share passes).
    pub timestamps_in_passes: bool,
    /// 16x16x16 cooperative matrices with f16 inputs and f32 accumulators (tensor cores);
    /// kernels that use them have a SIMT twin for adapters without.
    pub coopmat: bool,
    pub subgroup_min: u32,
    pub subgroup_max: u32,
    /// Largest byte range one storage binding may cover.
    pub max_binding: u64,
    pub max_buffer: u64,
    pub max_workgroups_per_dim: u32,
    pub max_workgroup_storage: u32,
    pub max_invocations: u32,
    pub storage_offset_alignment: u32,
    /// Storage buffers one kernel may bind.
    pub max_storage_buffers: u32,
}

/// An opened device with everything kernels need to run.
pub struct Gpu {
    pub adapter: wgpu::Adapter,
    pub info: wgpu::AdapterInfo,
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    pub caps: Capabilities,
    pub pipelines: PipelineCache,
    /// Process-unique id (keys this device's per-thread frames).
    id: u64,
}

/// See [`Gpu::batch_passes`].
pub struct PassBatch<'a> {
    gpu: &'a Gpu,
}

impl Drop for PassBatch<'_> {
    fn drop(&mut self) {
        self.gpu.end_pass();
        frame::with(self.gpu.id, |f| f.batching -= 1);
    }
}

/// See [`Gpu::scratch_scope`].
pub struct ScratchScope<'a> {
    gpu: &'a Gpu,
    mark: usize,
}

impl Drop for ScratchScope<'_> {
    fn drop(&mut self) {
        frame::with(self.gpu.id, |f| f.end_scope(self.mark));
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        frame::forget(self.id);
    }
}

/// Lists every adapter in preference order.
pub fn list_adapters() -> Vec<AdapterSummary> {
    let instance = adapter::instance();
    adapter::ranked(&instance).iter().enumerate().map(|(i, a)| adapter::summarize(i, a)).collect()
}

impl Gpu {
    /// Opens the adapter chosen by `selector` (index or name part), `K31_ADAPTER`, or the
    /// best one, with its real limits and the optional features that help.
    pub fn open(selector: Option<&str>) -> Result<Arc<Gpu>, GpuError> {
        let instance = adapter::instance();
        let adapter = adapter::choose(&instance, selector)?;
        let info = adapter.get_info();
        let want = wgpu::Features::SHADER_F16
            | wgpu::Features::SUBGROUP
            | wgpu::Features::SUBGROUP_BARRIER
            | wgpu::Features::TIMESTAMP_QUERY
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS
            | wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES;
        let mut features = adapter.features() & want;
        let coopmat = features.contains(wgpu::Features::SHADER_F16) && adapter::has_coopmat_f16_16(&adapter);
        if coopmat {
            features |= wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX;
        }
        let limits = adapter.limits();
        let (device, queue) = pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
            label: Some("k31"),
            required_features: features,
            required_limits: limits.clone(),
            // Only the cooperative-matrix extension is experimental; naga checks the shaders
            // that use it and the adapter listed the exact configuration they use.
            experimental_features: if coopmat {
                unsafe { wgpu::ExperimentalFeatures::enabled() }
            } else {
                wgpu::ExperimentalFeatures::disabled()
            },
            ..Default::default()
        }))
        .map_err(|source| GpuError::RequestDevice { adapter: info.name.clone(), source })?;
        let caps = Capabilities {
            f16: features.contains(wgpu::Features::SHADER_F16),
            subgroups: features.contains(wgpu::Features::SUBGROUP),
            subgroup_barrier: features.contains(wgpu::Features::SUBGROUP | wgpu::Features::SUBGROUP_BARRIER),
            timestamps: features.contains(wgpu::Features::TIMESTAMP_QUERY),
            timestamps_in_passes: features.contains(wgpu::Features::TIMESTAMP_QUERY_INSIDE_PASSES),
            coopmat,
            subgroup_min: info.subgroup_min_size,
            subgroup_max: info.subgroup_max_size,
            max_binding: limits.max_storage_buffer_binding_size.min(limits.max_buffer_size),
            max_buffer: limits.max_buffer_size,
            max_workgroups_per_dim: limits.max_compute_workgroups_per_dimension,
            max_workgroup_storage: limits.max_compute_workgroup_storage_size,
            max_invocations: limits.max_compute_invocations_per_workgroup,
            storage_offset_alignment: limits.min_storage_buffer_offset_alignment,
            max_storage_buffers: limits.max_storage_buffers_per_shader_stage,
        };
        let pipelines = PipelineCache::default();
        static NEXT_ID: AtomicU64 = AtomicU64::new(1);
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Ok(Arc::new(Gpu { adapter, info, device, queue, caps, pipelines, id }))
    }

    /// One line naming the adapter, for logs and test output.
    pub fn describe(&self) -> String {
        format!("{} ({:?}, {:?}, driver {})", self.info.name, self.info.backend, self.info.device_type, self.info.driver_info)
    }

    /// A storage buffer holding `data`, usable as kernel input or output.
    pub fn storage_from<T: bytemuck::Pod>(&self, label: &str, data: &[T]) -> wgpu::Buffer {
        use wgpu::util::DeviceExt;
        let bytes: &[u8] = bytemuck::cast_slice(data);
        // wgpu rejects zero-sized bindings; keep one word so empty inputs still bind.
        let padded;
        let contents = if !bytes.len().is_multiple_of(4) || bytes.is_empty() {
            let mut v = bytes.to_vec();
            v.resize(bytes.len().div_ceil(4).max(1) * 4, 0);
            padded = v;
            &padded[..]
        } else {
            bytes
        };
        self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
        })
    }

    /// An uninitialised (zeroed) storage buffer of `bytes` bytes.
    pub fn storage(&self, label: &str, bytes: u64) -> wgpu::Buffer {
        self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some(label),
            size: bytes.div_ceil(4).max(1) * 4,
            usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_SRC | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        })
    }

    /// Starts a forward pass: uniform slots, scratch buffers and bind groups of the last
    /// forward become reusable (see `frame`). Call only when everything recorded before has
    /// been submitted.
    pub fn begin_frame(&self) {
        frame::with(self.id, |f| f.begin());
    }

    /// Scratch storage of `bytes` for the current forward: contents undefined (a recycled
    /// buffer holds the last forward's data; debug builds fill it with NaN so a kernel that
    /// reads before writing fails the tests). Use `storage` where zeros are needed.
    pub fn scratch(&self, label: &str, bytes: u64) -> wgpu::Buffer {
        let (buf, fill) = frame::with(self.id, |f| f.scratch(&self.device, label, bytes));
        if fill && cfg!(debug_assertions) {
            self.queue.write_buffer(&buf, 0, &vec![0xff; buf.size() as usize]);
        }
        buf
    }

    /// Until the returned guard drops, scratch buffers handed out are the caller's; then they
    /// can be handed out again in this forward (wrap a layer's internal scratch in one).
    pub fn scratch_scope(&self) -> ScratchScope<'_> {
        ScratchScope { gpu: self, mark: frame::with(self.id, |f| f.begin_scope()) }
    }

    /// A uniform buffer holding one parameter struct.
    pub fn uniform<T: bytemuck::Pod>(&self, label: &str, params: &T) -> wgpu::Buffer {
        use wgpu::util::DeviceExt;
        self.device.create_buffer_init(&wgpu::util::BufferInitDescriptor {
            label: Some(label),
            contents: bytemuck::bytes_of(params),
            usage: wgpu::BufferUsages::UNIFORM,
        })
    }

    /// Copies `bytes` bytes of `buffer` (from `offset`) back to the host.
    pub fn read_bytes(&self, buffer: &wgpu::Buffer, offset: u64, bytes: u64) -> Result<Vec<u8>, GpuError> {
        let size = bytes.div_ceil(4) * 4;
        if size == 0 {
            return Ok(Vec::new());
        }
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("readback"),
            size,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self.device.create_command_encoder(&Default::default());
        enc.copy_buffer_to_buffer(buffer, offset, &staging, 0, size);
        self.submit([enc.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| GpuError::Readback(e.to_string()))?;
        rx.recv()
            .map_err(|e| GpuError::Readback(e.to_string()))?
            .map_err(|e| GpuError::Readback(e.to_string()))?;
        let view = staging.slice(..).get_mapped_range().map_err(|e| GpuError::Readback(e.to_string()))?;
        let mut out = view.to_vec();
        drop(view);
        staging.unmap();
        out.truncate(bytes as usize);
        Ok(out)
    }

    /// Reads `count` values of `T` from the start of `buffer`.
    pub fn read<T: bytemuck::Pod>(&self, buffer: &wgpu::Buffer, count: usize) -> Result<Vec<T>, GpuError> {
        let bytes = self.read_bytes(buffer, 0, (count * std::mem::size_of::<T>()) as u64)?;
        Ok(bytemuck::pod_collect_to_vec(&bytes))
    }

    /// Until the guard drops, the dispatches this thread records share one compute pass per
    /// encoder instead of a pass each: on an H200 a pass costs the GPU ~4.6 us by itself
    /// (benches/dispatch.rs: 6.7 us per dependent dispatch in its own pass, 2.1 us in one).
    /// The open pass locks its encoder, so anything else recorded into it meanwhile goes
    /// through [`Gpu::begin_pass`], [`Gpu::copy_buffer`] or [`Gpu::flush`], which end it first.
    /// Timestamped dispatches (a per-pass profiler without in-pass stamps) get a pass each.
    pub fn batch_passes(&self) -> PassBatch<'_> {
        frame::with(self.id, |f| f.batching += 1);
        PassBatch { gpu: self }
    }

    /// Ends this thread's shared compute pass, if one is open (see [`Gpu::batch_passes`]).
    fn end_pass(&self) {
        let open = frame::with(self.id, |f| f.open_pass.take());
        drop(open);
    }

    /// A compute pass of the caller's own on `enc` (ops that record several dispatches or
    /// profiler marks themselves), after ending the shared one.
    pub fn begin_pass<'e>(&self, enc: &'e mut wgpu::CommandEncoder, desc: &wgpu::ComputePassDescriptor<'_>) -> wgpu::ComputePass<'e> {
        self.end_pass();
        enc.begin_compute_pass(desc)
    }

    /// A timestamp written once all earlier work on `enc` is done: inside the shared compute
    /// pass where the adapter has in-pass timestamps and passes are batched (so the mark does
    /// not split the pass, which would cost the GPU a pass boundary the unprofiled stream does
    /// not have), else as the end stamp of an empty pass.
    pub fn mark_timestamp(&self, enc: &mut wgpu::CommandEncoder, set: &wgpu::QuerySet, index: u32) {
        if self.caps.timestamps_in_passes && mark_in_pass() && frame::with(self.id, |f| f.batching > 0) {
            self.in_shared_pass(enc, |pass| pass.write_timestamp(set, index));
            return;
        }
        let ts = wgpu::ComputePassTimestampWrites { query_set: set, beginning_of_pass_write_index: None, end_of_pass_write_index: Some(index) };
        drop(self.begin_pass(enc, &wgpu::ComputePassDescriptor { label: Some("span mark"), timestamp_writes: Some(ts) }));
    }

    /// Records into `enc`'s shared compute pass, opening it if this thread has none open for
    /// `enc` (one open for another encoder is ended first).
    fn in_shared_pass(&self, enc: &mut wgpu::CommandEncoder, record: impl FnOnce(&mut wgpu::ComputePass<'static>)) {
        let at = enc as *const wgpu::CommandEncoder as usize;
        let stale = frame::with(self.id, |f| f.open_pass.take_if(|(e, _)| *e != at));
        drop(stale);
        frame::with(self.id, |f| {
            let (_, pass) = f.open_pass.get_or_insert_with(|| {
                (at, enc.begin_compute_pass(&wgpu::ComputePassDescriptor { label: Some("k31 dispatches"), timestamp_writes: None }).forget_lifetime())
            });
            record(pass);
        });
    }

    /// `enc.copy_buffer_to_buffer`, after ending the shared compute pass.
    pub fn copy_buffer(&self, enc: &mut wgpu::CommandEncoder, src: &wgpu::Buffer, src_offset: u64, dst: &wgpu::Buffer, dst_offset: u64, bytes: u64) {
        self.end_pass();
        enc.copy_buffer_to_buffer(src, src_offset, dst, dst_offset, bytes);
    }

    /// Submits what `enc` holds and leaves a fresh encoder in its place (to hand recorded work
    /// to the GPU early, or before work recorded elsewhere that must follow it).
    pub fn flush(&self, enc: &mut wgpu::CommandEncoder) {
        self.end_pass();
        frame::with(self.id, |f| f.submissions += 1);
        let done = std::mem::replace(enc, self.device.create_command_encoder(&Default::default()));
        self.submit([done.finish()]);
    }

    /// `queue.submit`, after writing the uniform slots changed since the last submission (while
    /// batching they are written together, here): every engine submission goes through it.
    pub fn submit<I: IntoIterator<Item = wgpu::CommandBuffer>>(&self, cmds: I) {
        if let Some((arena, offset, bytes)) = frame::with(self.id, |f| f.take_dirty()) {
            self.queue.write_buffer(&arena, offset, &bytes);
        }
        self.queue.submit(cmds);
    }

    /// Waits until all submitted work has finished.
    pub fn wait(&self) -> Result<(), GpuError> {
        self.device.poll(wgpu::PollType::wait_indefinitely()).map(|_| ()).map_err(|e| GpuError::Readback(e.to_string()))
    }

    /// Records one labelled (and, with a profiler, timed) compute pass of `kernel` with
    /// `entries` bound at their binding numbers, over exactly `groups` workgroups.
    pub fn record(
        &self,
        enc: &mut wgpu::CommandEncoder,
        kernel: &Kernel,
        entries: &[(u32, &wgpu::Buffer)],
        groups: [u32; 3],
        profiler: Option<&mut Profiler>,
    ) -> Result<(), GpuError> {
        let pipeline = self.pipelines.get(self, kernel)?;
        let bind = self.bind_group(kernel, &pipeline, entries)?;
        self.pass(enc, kernel, &pipeline, &bind, groups, profiler)
    }

    /// [`Gpu::record`] with `uniform` at binding 0 and `buffers` at theirs, over `groups.0`
    /// workgroups (folded into 2-D past the per-dimension limit) or, when `groups.1 > 1`,
    /// an explicit `groups.0 x groups.1` grid.
    pub fn record_with_uniform(
        &self,
        enc: &mut wgpu::CommandEncoder,
        kernel: &Kernel,
        uniform: &wgpu::Buffer,
        buffers: &[(u32, &wgpu::Buffer)],
        groups: (u32, u32),
        profiler: Option<&mut Profiler>,
    ) -> Result<(), GpuError> {
        let mut entries = Vec::with_capacity(buffers.len() + 1);
        entries.push((0, uniform));
        entries.extend_from_slice(buffers);
        self.record(enc, kernel, &entries, self.grid_of(groups), profiler)
    }

    /// [`Gpu::record_with_uniform`] with a fresh uniform holding `params`.
    pub fn dispatch<P: bytemuck::Pod>(
        &self,
        enc: &mut wgpu::CommandEncoder,
        kernel: &Kernel,
        params: &P,
        buffers: &[(u32, &wgpu::Buffer)],
        groups: (u32, u32),
        profiler: Option<&mut Profiler>,
    ) -> Result<(), GpuError> {
        self.dispatch_grid(enc, kernel, params, buffers, self.grid_of(groups), profiler)
    }

    /// [`Gpu::dispatch`] over an explicit `[x, y, z]` grid: the uniform from this forward's
    /// arena and the bind group from its cache, so a static decode graph records cheaply.
    pub fn dispatch_grid<P: bytemuck::Pod>(
        &self,
        enc: &mut wgpu::CommandEncoder,
        kernel: &Kernel,
        params: &P,
        buffers: &[(u32, &wgpu::Buffer)],
        grid: [u32; 3],
        profiler: Option<&mut Profiler>,
    ) -> Result<(), GpuError> {
        self.check_bindings(kernel, buffers)?;
        let bytes = bytemuck::bytes_of(params);
        let slot = frame::with(self.id, |f| f.uniform_slot(&self.device, &self.queue, bytes));
        let Some((arena, offset, slot)) = slot else {
            let uniform = self.uniform(kernel.name, params);
            let mut entries = Vec::with_capacity(buffers.len() + 1);
            entries.push((0, &uniform));
            entries.extend_from_slice(buffers);
            return self.record(enc, kernel, &entries, grid, profiler);
        };
        let pipeline = self.pipelines.get(self, kernel)?;
        let key = frame::BindKey { kernel: kernel.name, uniform_slot: slot, buffers: buffers.iter().map(|(b, buf)| (*b, (*buf).clone())).collect() };
        let cached = frame::with(self.id, |f| f.bind_group(&key));
        let bind = match cached {
            Some(b) => b,
            None => {
                let mut e = vec![wgpu::BindGroupEntry {
                    binding: 0,
                    resource: wgpu::BindingResource::Buffer(wgpu::BufferBinding {
                        buffer: &arena,
                        offset,
                        size: std::num::NonZeroU64::new(bytes.len() as u64),
                    }),
                }];
                e.extend(buffers.iter().map(|(b, buf)| wgpu::BindGroupEntry { binding: *b, resource: buf.as_entire_binding() }));
                let b = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
                    label: Some(kernel.name),
                    layout: &pipeline.get_bind_group_layout(0),
                    entries: &e,
                });
                frame::with(self.id, |f| f.keep_bind_group(key, b.clone()));
                b
            }
        };
        self.pass(enc, kernel, &pipeline, &bind, grid, profiler)
    }

    /// A bind group of whole buffers for `kernel`'s group 0, after [`Gpu::check_bindings`]
    /// (wgpu panics on a binding past the adapter's limit).
    pub fn bind_group(&self, kernel: &Kernel, pipeline: &wgpu::ComputePipeline, entries: &[(u32, &wgpu::Buffer)]) -> Result<wgpu::BindGroup, GpuError> {
        self.check_bindings(kernel, entries)?;
        let e: Vec<wgpu::BindGroupEntry> =
            entries.iter().map(|(b, buf)| wgpu::BindGroupEntry { binding: *b, resource: buf.as_entire_binding() }).collect();
        Ok(self.device.create_bind_group(&wgpu::BindGroupDescriptor { label: Some(kernel.name), layout: &pipeline.get_bind_group_layout(0), entries: &e }))
    }

    /// A clear error where a whole-buffer binding exceeds what the adapter allows (wgpu would
    /// otherwise panic inside bind group creation).
    pub fn check_bindings(&self, kernel: &Kernel, buffers: &[(u32, &wgpu::Buffer)]) -> Result<(), GpuError> {
        match buffers.iter().find(|(_, b)| b.size() > self.caps.max_binding) {
            Some((b, buf)) => Err(GpuError::TooLarge { what: format!("{} binding {b}", kernel.name), needed: buf.size(), limit: self.caps.max_binding }),
            None => Ok(()),
        }
    }

    /// The dispatch grid for `groups` (see [`Gpu::record_with_uniform`]).
    fn grid_of(&self, groups: (u32, u32)) -> [u32; 3] {
        if groups.1 > 1 {
            [groups.0.max(1), groups.1, 1]
        } else {
            let (gx, gy) = self.grid(groups.0);
            [gx, gy, 1]
        }
    }

    fn pass(
        &self,
        enc: &mut wgpu::CommandEncoder,
        kernel: &Kernel,
        pipeline: &wgpu::ComputePipeline,
        bind: &wgpu::BindGroup,
        groups: [u32; 3],
        profiler: Option<&mut Profiler>,
    ) -> Result<(), GpuError> {
        let max = self.caps.max_workgroups_per_dim;
        if groups.iter().any(|&g| g > max) {
            return Err(GpuError::Shape(format!("{}: grid {groups:?} exceeds {max} workgroups per dimension", kernel.name)));
        }
        let mut profiler = profiler;
        // A per-pass profiler stamps inside the shared pass where the adapter can (the
        // stamps bracket each dispatch with its barrier: the op's share of the real stream),
        // else it gets a pass per dispatch.
        let stamps_inside = self.caps.timestamps_in_passes || profiler.as_ref().is_none_or(|p| p.is_spans());
        if stamps_inside && frame::with(self.id, |f| f.batching > 0) {
            let stamp = profiler.as_deref_mut().and_then(|p| p.stamps(kernel.profile_label()));
            self.in_shared_pass(enc, |pass| {
                if let Some((set, i)) = stamp {
                    pass.write_timestamp(set, i);
                }
                pass.set_pipeline(pipeline);
                pass.set_bind_group(0, bind, &[]);
                pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
                if let Some((set, i)) = stamp {
                    pass.write_timestamp(set, i + 1);
                }
            });
            return Ok(());
        }
        let timestamp_writes = profiler.and_then(|p| p.pass(kernel.profile_label()));
        let mut pass = self.begin_pass(enc, &wgpu::ComputePassDescriptor { label: Some(kernel.name), timestamp_writes });
        pass.set_pipeline(pipeline);
        pass.set_bind_group(0, bind, &[]);
        pass.dispatch_workgroups(groups[0], groups[1], groups[2]);
        Ok(())
    }

    /// Splits a 1-D workgroup count into a grid that respects the per-dimension limit.
    pub fn grid(&self, groups: u32) -> (u32, u32) {
        let max = self.caps.max_workgroups_per_dim.max(1);
        if groups <= max { (groups.max(1), 1) } else { (max, groups.div_ceil(max)) }
    }
}

/// Whether span marks go inside the shared pass where they can; `K31_MARK_IN_PASS=0` keeps
/// the empty-pass marks (experiments).
fn mark_in_pass() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    crate::ops::switch_on(&ON, "K31_MARK_IN_PASS")
}
