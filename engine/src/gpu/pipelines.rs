//! Compute pipelines built from the WGSL files in `shaders/` (embedded at compile time),
//! one per named kernel variant, created once and cached.

use super::{Gpu, GpuError};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// One kernel variant: a shader file, an entry point and the override constants that
/// specialise it. `name` labels the pipeline, its errors and its profiler row.
#[derive(Clone, Copy, Debug)]
pub struct Kernel {
    pub name: &'static str,
    pub shader: &'static str,
    pub entry: &'static str,
    pub constants: &'static [(&'static str, f64)],
    /// Device features the variant needs (checked before building it).
    pub needs_subgroups: bool,
    pub needs_f16: bool,
    /// Needs 16x16x16 f16 -> f32 cooperative matrices (`Capabilities::coopmat`).
    pub needs_coopmat: bool,
    /// Built without wgpu's runtime bounds checks: only for kernels whose every index is
    /// host-checked and covered by tests at awkward shapes (the checks cost ALU in the
    /// bandwidth-bound decode kernels).
    pub unchecked: bool,
    /// Profiler label when variants of one op should report together (default: `name`).
    pub profile_as: Option<&'static str>,
}

impl Kernel {
    pub const fn new(name: &'static str, shader: &'static str, entry: &'static str) -> Kernel {
        Kernel { name, shader, entry, constants: &[], needs_subgroups: false, needs_f16: false, needs_coopmat: false, unchecked: false, profile_as: None }
    }
    pub const fn with_constants(mut self, constants: &'static [(&'static str, f64)]) -> Kernel {
        self.constants = constants;
        self
    }
    /// The value of override constant `name` this variant sets, if it sets it.
    pub fn constant(&self, name: &str) -> Option<f64> {
        self.constants.iter().find(|(n, _)| *n == name).map(|&(_, v)| v)
    }
    pub const fn subgroups(mut self) -> Kernel {
        self.needs_subgroups = true;
        self
    }
    pub const fn f16(mut self) -> Kernel {
        self.needs_f16 = true;
        self
    }
    pub const fn profile_as(mut self, label: &'static str) -> Kernel {
        self.profile_as = Some(label);
        self
    }
    /// The label its passes get in a profile.
    pub fn profile_label(&self) -> &'static str {
        match self.profile_as {
            Some(l) => l,
            None => self.name,
        }
    }
    pub const fn unchecked(mut self) -> Kernel {
        self.unchecked = true;
        self
    }
    pub const fn coopmat(mut self) -> Kernel {
        self.needs_coopmat = true;
        self.needs_f16 = true;
        self
    }
}

/// Workgroup memory `entry` of `module` uses: its workgroup-space globals, summed (naga does
/// not check this against a device limit, and neither does wgpu; drivers may hang or fail).
/// Pass a module with override constants applied where array sizes depend on them.
pub fn workgroup_bytes(module: &naga::Module, info: &naga::valid::ModuleInfo, entry: &str) -> Option<u32> {
    let index = module.entry_points.iter().position(|e| e.name == entry)?;
    let uses = info.get_entry_point(index);
    Some(
        module
            .global_variables
            .iter()
            .filter(|(h, v)| v.space == naga::AddressSpace::WorkGroup && !uses[*h].is_empty())
            .map(|(_, v)| module.types[v.ty].inner.size(module.to_ctx()))
            .sum(),
    )
}

/// `entry` of the WGSL `src` as the engine builds it: the override `constants` applied, the
/// module reduced to that entry point, and every storage buffer the entry point never writes
/// declared read-only. Why: NVIDIA's Vulkan compiler turns each load from a `read_write` buffer
/// into a coherent `LDG.E.STRONG.SM`, which it neither merges into wider loads nor sends down
/// the read-only path (tools/nvidia_sass.py shows it), and a module such as kda_chunk.wgsl
/// declares a buffer `read_write` for the kernel that writes it and for those that only read it.
pub fn specialise(src: &str, entry: &str, constants: &[(&str, f64)]) -> Result<naga::Module, String> {
    let (module, info) = parse(src)?;
    specialise_parsed(&module, &info, entry, constants)
}

/// A WGSL module parsed and validated (every capability: the device's own validation comes
/// when wgpu builds it).
fn parse(src: &str) -> Result<(naga::Module, naga::valid::ModuleInfo), String> {
    use naga::valid::{Capabilities, ValidationFlags, Validator};
    let module = naga::front::wgsl::parse_str(src).map_err(|e| e.emit_to_string(src))?;
    let info = Validator::new(ValidationFlags::all(), Capabilities::all()).validate(&module).map_err(|e| e.emit_to_string(src))?;
    Ok((module, info))
}

/// [`specialise`] on a module already parsed (each shader is parsed once for all its kernels).
fn specialise_parsed(
    module: &naga::Module,
    info: &naga::valid::ModuleInfo,
    entry: &str,
    constants: &[(&str, f64)],
) -> Result<naga::Module, String> {
    use naga::valid::GlobalUse;
    let values: naga::back::PipelineConstants = constants.iter().map(|(c, v)| (c.to_string(), *v)).collect();
    let (module, info) =
        naga::back::pipeline_constants::process_overrides(module, info, Some((naga::ShaderStage::Compute, entry)), &values)
            .map_err(|e| format!("overrides: {e}"))?;
    let index = module.entry_points.iter().position(|e| e.name == entry).ok_or_else(|| format!("no entry point {entry}"))?;
    let uses = info.get_entry_point(index);
    let mut module = module.into_owned();
    for (h, var) in module.global_variables.iter_mut() {
        if let naga::AddressSpace::Storage { access } = &mut var.space
            && access.contains(naga::StorageAccess::STORE)
            && !uses[h].intersects(GlobalUse::WRITE | GlobalUse::ATOMIC)
        {
            *access = naga::StorageAccess::LOAD;
        }
    }
    Ok(module)
}

#[derive(Default)]
pub struct PipelineCache {
    built: Mutex<HashMap<&'static str, Arc<wgpu::ComputePipeline>>>,
    /// Each shader parsed and validated once, for its workgroup sizes and every kernel built
    /// from it.
    parsed: Mutex<HashMap<&'static str, Arc<(naga::Module, naga::valid::ModuleInfo)>>>,
    /// Refuse kernels over the workgroup limit on lavapipe too (see [`PipelineCache::get`]).
    strict: AtomicBool,
    /// Host time spent building pipelines, in nanoseconds, summed over threads (a process's
    /// first prompt pays it unless `prewarm` built them beside the weight upload).
    build_nanos: AtomicU64,
}

/// Lavapipe reports 32 KiB of workgroup memory but runs kernels that use more, so the tests
/// can run the larger variants there (the GL driver on the same llvmpipe enforces it).
fn runs_past_workgroup_limit(gpu: &Gpu) -> bool {
    gpu.info.backend == wgpu::Backend::Vulkan && gpu.info.name.contains("llvmpipe")
}

/// Whether `k` needs a device feature the adapter lacks.
pub fn lacks_feature(gpu: &Gpu, k: &Kernel) -> bool {
    (k.needs_subgroups && !gpu.caps.subgroups) || (k.needs_f16 && !gpu.caps.f16) || (k.needs_coopmat && !gpu.caps.coopmat)
}

impl PipelineCache {
    /// Whether `k`'s workgroup memory is within the adapter's limit, so an op can choose a
    /// variant the adapter runs.
    pub fn fits(&self, gpu: &Gpu, k: &Kernel) -> Result<bool, GpuError> {
        Ok(self.workgroup_bytes(k)? <= gpu.caps.max_workgroup_storage)
    }

    /// Whether the kernel named `name` has been built on this device (tests: which variant an
    /// op chose).
    pub fn is_built(&self, name: &str) -> bool {
        self.built.lock().unwrap_or_else(|p| p.into_inner()).contains_key(name)
    }

    /// Host seconds spent building pipelines so far in this process.
    pub fn build_seconds(&self) -> f64 {
        self.build_nanos.load(Ordering::Relaxed) as f64 * 1e-9
    }

    /// Makes [`PipelineCache::get`] refuse kernels over the adapter's workgroup limit even on
    /// lavapipe (tests of the guard; kernels already built stay cached).
    pub fn enforce_workgroup_limit(&self, on: bool) {
        self.strict.store(on, Ordering::Relaxed);
    }

    /// `k`'s shader parsed and validated, once per shader.
    fn parsed(&self, k: &Kernel) -> Result<Arc<(naga::Module, naga::valid::ModuleInfo)>, GpuError> {
        if let Some(p) = self.parsed.lock().unwrap_or_else(|p| p.into_inner()).get(k.shader) {
            return Ok(p.clone());
        }
        // Parsed without the lock held, so that threads prewarming other shaders do not wait.
        let fail = |reason: String| GpuError::Pipeline { shader: k.shader.into(), entry: k.entry.into(), reason };
        let src = crate::shaders::source(k.shader).ok_or_else(|| fail("no such shader file".into()))?;
        let parsed = Arc::new(parse(src).map_err(fail)?);
        let mut known = self.parsed.lock().unwrap_or_else(|p| p.into_inner());
        Ok(known.entry(k.shader).or_insert(parsed).clone())
    }

    /// Workgroup memory of `k` in bytes (our kernels size their workgroup arrays with plain
    /// constants, so the shader as written is measured).
    pub fn workgroup_bytes(&self, k: &Kernel) -> Result<u32, GpuError> {
        let parsed = self.parsed(k)?;
        workgroup_bytes(&parsed.0, &parsed.1, k.entry)
            .ok_or_else(|| GpuError::Pipeline { shader: k.shader.into(), entry: k.entry.into(), reason: "no such entry point".into() })
    }

    /// Whether `k` can be built here: the features it needs, and workgroup memory within the
    /// adapter's limit.
    pub fn runs_here(&self, gpu: &Gpu, k: &Kernel) -> bool {
        !lacks_feature(gpu, k) && self.fits(gpu, k).unwrap_or(false)
    }

    /// Builds every kernel of `kernels` that runs here on up to `threads` threads, so that the
    /// first prompt of a process does not compile its kernels one after the other (the driver
    /// took ~4.5 s for the k31-slice's first prompt on an H200). Meant to run beside the weight
    /// upload. A kernel that fails to build is not cached, so the op that asks for it later
    /// gets the error. Returns how many were built.
    pub fn prewarm(&self, gpu: &Gpu, kernels: &[Kernel], threads: usize) -> usize {
        let todo: Vec<&Kernel> = kernels.iter().filter(|k| self.runs_here(gpu, k)).collect();
        let next = AtomicUsize::new(0);
        let built = AtomicUsize::new(0);
        std::thread::scope(|scope| {
            for _ in 0..threads.clamp(1, todo.len().max(1)) {
                scope.spawn(|| {
                    while let Some(k) = todo.get(next.fetch_add(1, Ordering::Relaxed)) {
                        if self.get(gpu, k).is_ok() {
                            built.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                });
            }
        });
        built.into_inner()
    }

    /// The pipeline of `k`, built on first use. A kernel whose workgroup memory exceeds the
    /// adapter's `max_compute_workgroup_storage_size` is an error here (drivers would fail or
    /// hang on it later), except on lavapipe (see `runs_past_workgroup_limit`).
    pub fn get(&self, gpu: &Gpu, k: &Kernel) -> Result<Arc<wgpu::ComputePipeline>, GpuError> {
        if let Some(p) = self.built.lock().unwrap_or_else(|p| p.into_inner()).get(k.name) {
            return Ok(p.clone());
        }
        let fail = |reason: String| GpuError::Pipeline { shader: k.shader.into(), entry: k.entry.into(), reason };
        if lacks_feature(gpu, k) {
            return Err(fail(format!("kernel {} needs a feature this adapter lacks", k.name)));
        }
        let limit = gpu.caps.max_workgroup_storage;
        let bytes = self.workgroup_bytes(k)?;
        if bytes > limit && (self.strict.load(Ordering::Relaxed) || !runs_past_workgroup_limit(gpu)) {
            // Not `Pipeline` (its text reads as a missing entry point).
            return Err(GpuError::Shape(format!(
                "kernel {} ({}.wgsl, {}) uses {bytes} bytes of workgroup memory; this adapter allows {limit} \
                 (max_compute_workgroup_storage_size): use a variant that fits",
                k.name, k.shader, k.entry
            )));
        }
        let started = std::time::Instant::now();
        // Overrides are applied here, so the pipeline gets no constants.
        let parsed = self.parsed(k)?;
        let specialised = specialise_parsed(&parsed.0, &parsed.1, k.entry, k.constants).map_err(fail)?;
        let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let source = wgpu::ShaderSource::Naga(std::borrow::Cow::Owned(specialised));
        let desc = wgpu::ShaderModuleDescriptor { label: Some(k.shader), source };
        let module = if k.unchecked {
            // SAFETY: `unchecked` kernels index only within host-validated extents (see the field).
            unsafe { gpu.device.create_shader_module_trusted(desc, wgpu::ShaderRuntimeChecks::unchecked()) }
        } else {
            gpu.device.create_shader_module(desc)
        };
        let pipeline = gpu.device.create_compute_pipeline(&wgpu::ComputePipelineDescriptor {
            label: Some(k.name),
            layout: None,
            module: &module,
            entry_point: Some(k.entry),
            compilation_options: wgpu::PipelineCompilationOptions::default(),
            cache: None,
        });
        let error = pollster::block_on(scope.pop());
        self.build_nanos.fetch_add(started.elapsed().as_nanos() as u64, Ordering::Relaxed);
        if let Some(err) = error {
            return Err(fail(err.to_string()));
        }
        // Built without the lock held (threads build in parallel); a kernel two threads built
        // at once keeps the first one stored.
        let mut built = self.built.lock().unwrap_or_else(|p| p.into_inner());
        Ok(built.entry(k.name).or_insert_with(|| Arc::new(pipeline)).clone())
    }
}
