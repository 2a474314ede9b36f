//! Compute pipelines built from the WGSL files in `shaders/` (embedded at compile time),
//! one per named kernel variant, created once and cached.

use super::{Gpu, GpuError};
use std::collections::HashMap;
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

#[derive(Default)]
pub struct PipelineCache {
    built: Mutex<HashMap<&'static str, Arc<wgpu::ComputePipeline>>>,
    workgroup: Mutex<HashMap<&'static str, u32>>,
}

impl PipelineCache {
    /// Whether `k`'s workgroup memory is within the adapter's limit, so an op can choose a
    /// variant the adapter runs (our kernels size their workgroup arrays with plain
    /// constants, so the shader as written is measured).
    pub fn fits(&self, gpu: &Gpu, k: &Kernel) -> Result<bool, GpuError> {
        let mut known = self.workgroup.lock().unwrap_or_else(|p| p.into_inner());
        let bytes = match known.get(k.name) {
            Some(&b) => b,
            None => {
                let fail = |reason: String| GpuError::Pipeline { shader: k.shader.into(), entry: k.entry.into(), reason };
                let src = crate::shaders::source(k.shader).ok_or_else(|| fail("no such shader file".into()))?;
                let module = naga::front::wgsl::parse_str(src).map_err(|e| fail(e.emit_to_string(src)))?;
                let info = naga::valid::Validator::new(naga::valid::ValidationFlags::empty(), naga::valid::Capabilities::all())
                    .validate(&module)
                    .map_err(|e| fail(e.emit_to_string(src)))?;
                let b = workgroup_bytes(&module, &info, k.entry).ok_or_else(|| fail("no such entry point".into()))?;
                known.insert(k.name, b);
                b
            }
        };
        Ok(bytes <= gpu.caps.max_workgroup_storage)
    }

    pub fn get(&self, gpu: &Gpu, k: &Kernel) -> Result<Arc<wgpu::ComputePipeline>, GpuError> {
        let mut built = self.built.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(p) = built.get(k.name) {
            return Ok(p.clone());
        }
        let fail = |reason: String| GpuError::Pipeline { shader: k.shader.into(), entry: k.entry.into(), reason };
        if (k.needs_subgroups && !gpu.caps.subgroups) || (k.needs_f16 && !gpu.caps.f16) || (k.needs_coopmat && !gpu.caps.coopmat) {
            return Err(fail(format!("kernel {} needs a feature this adapter lacks", k.name)));
        }
        let src = crate::shaders::source(k.shader).ok_or_else(|| fail("no such shader file".into()))?;
        let scope = gpu.device.push_error_scope(wgpu::ErrorFilter::Validation);
        let desc = wgpu::ShaderModuleDescriptor { label: Some(k.shader), source: wgpu::ShaderSource::Wgsl(src.into()) };
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
            compilation_options: wgpu::PipelineCompilationOptions { constants: k.constants, ..Default::default() },
            cache: None,
        });
        if let Some(err) = pollster::block_on(scope.pop()) {
            return Err(fail(err.to_string()));
        }
        let p = Arc::new(pipeline);
        built.insert(k.name, p.clone());
        Ok(p)
    }
}
