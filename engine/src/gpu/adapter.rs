//! Adapter enumeration and choice: discrete GPUs first, overridable by name or index.

use super::GpuError;

/// The environment variable that overrides the adapter choice (same syntax as `--adapter`).
pub const ADAPTER_ENV: &str = "K31_ADAPTER";

/// What `k31 devices` prints for one adapter.
#[derive(Clone, Debug, serde::Serialize)]
pub struct AdapterSummary {
    pub index: usize,
    pub name: String,
    pub backend: String,
    pub device_type: String,
    pub driver: String,
    pub driver_info: String,
    pub max_storage_buffer_binding_size: u64,
    pub max_buffer_size: u64,
    pub max_compute_workgroup_storage_size: u32,
    pub max_compute_invocations_per_workgroup: u32,
    pub subgroup_size: (u32, u32),
    /// The optional features k31 uses that this adapter has.
    pub features: Vec<&'static str>,
}

/// Optional features k31 takes when offered, with the name shown to users.
pub const USEFUL_FEATURES: &[(wgpu::Features, &str)] = &[
    (wgpu::Features::SHADER_F16, "SHADER_F16"),
    (wgpu::Features::SUBGROUP, "SUBGROUP"),
    (wgpu::Features::TIMESTAMP_QUERY, "TIMESTAMP_QUERY"),
    (wgpu::Features::TIMESTAMP_QUERY_INSIDE_ENCODERS, "TIMESTAMP_QUERY_INSIDE_ENCODERS"),
    (wgpu::Features::SHADER_INT64, "SHADER_INT64"),
    (wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX, "COOPERATIVE_MATRIX"),
];

pub(super) fn instance() -> wgpu::Instance {
    // Reads WGPU_BACKEND etc., so CI can forbid a silent fall back to GL.
    wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env())
}

pub(super) fn all_adapters(instance: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    pollster::block_on(instance.enumerate_adapters(wgpu::Backends::all()))
}

/// Lower is better: real GPUs before software ones, native APIs before GL.
fn rank(info: &wgpu::AdapterInfo) -> (u8, u8) {
    let ty = match info.device_type {
        wgpu::DeviceType::DiscreteGpu => 0,
        wgpu::DeviceType::IntegratedGpu => 1,
        wgpu::DeviceType::VirtualGpu => 2,
        wgpu::DeviceType::Other => 3,
        wgpu::DeviceType::Cpu => 4,
    };
    let backend = match info.backend {
        wgpu::Backend::Vulkan | wgpu::Backend::Metal | wgpu::Backend::Dx12 => 0,
        _ => 1,
    };
    (ty, backend)
}

pub fn summarize(index: usize, a: &wgpu::Adapter) -> AdapterSummary {
    let info = a.get_info();
    let limits = a.limits();
    let f = a.features();
    AdapterSummary {
        index,
        name: info.name.clone(),
        backend: format!("{:?}", info.backend),
        device_type: format!("{:?}", info.device_type),
        driver: info.driver.clone(),
        driver_info: info.driver_info.clone(),
        max_storage_buffer_binding_size: limits.max_storage_buffer_binding_size,
        max_buffer_size: limits.max_buffer_size,
        max_compute_workgroup_storage_size: limits.max_compute_workgroup_storage_size,
        max_compute_invocations_per_workgroup: limits.max_compute_invocations_per_workgroup,
        subgroup_size: (info.subgroup_min_size, info.subgroup_max_size),
        features: USEFUL_FEATURES.iter().filter(|(x, _)| f.contains(*x)).map(|(_, n)| *n).collect(),
    }
}

/// Adapters in the order k31 prefers them (index 0 is the default choice).
pub fn ranked(instance: &wgpu::Instance) -> Vec<wgpu::Adapter> {
    let mut v = all_adapters(instance);
    // Stable sort keeps the driver's order among equals.
    v.sort_by_key(|a| rank(&a.get_info()));
    v
}

/// Picks an adapter: `selector` (or `K31_ADAPTER`) is an index into the ranked list or a
/// case-insensitive part of the adapter name; otherwise the best-ranked adapter.
pub fn choose(instance: &wgpu::Instance, selector: Option<&str>) -> Result<wgpu::Adapter, GpuError> {
    let env = std::env::var(ADAPTER_ENV).ok().filter(|s| !s.trim().is_empty());
    let selector = selector.map(str::to_string).or(env);
    let mut adapters = ranked(instance);
    if adapters.is_empty() {
        return Err(GpuError::NoAdapter);
    }
    let Some(sel) = selector else { return Ok(adapters.swap_remove(0)) };
    let sel = sel.trim();
    let names = || adapters.iter().enumerate().map(|(i, a)| format!("{i}: {}", a.get_info().name)).collect::<Vec<_>>();
    if let Ok(i) = sel.parse::<usize>() {
        if i < adapters.len() {
            return Ok(adapters.swap_remove(i));
        }
        return Err(GpuError::AdapterNotFound { selector: sel.into(), available: names().join("; ") });
    }
    let low = sel.to_lowercase();
    match adapters.iter().position(|a| a.get_info().name.to_lowercase().contains(&low)) {
        Some(i) => Ok(adapters.swap_remove(i)),
        None => Err(GpuError::AdapterNotFound { selector: sel.into(), available: names().join("; ") }),
    }
}

/// Whether the adapter lists 16x16x16 cooperative matrices with f16 A/B and an f32
/// accumulator, the one configuration k31's tensor-core kernels use. `K31_NO_COOPMAT=1`
/// turns them off (to compare against the SIMT kernels on the same GPU).
pub fn has_coopmat_f16_16(adapter: &wgpu::Adapter) -> bool {
    use wgpu::CooperativeScalarType as T;
    if std::env::var("K31_NO_COOPMAT").is_ok_and(|v| v == "1") {
        return false;
    }
    adapter.features().contains(wgpu::Features::EXPERIMENTAL_COOPERATIVE_MATRIX)
        && adapter
            .cooperative_matrix_properties()
            .iter()
            .any(|p| p.m_size == 16 && p.n_size == 16 && p.k_size == 16 && p.ab_type == T::F16 && p.cr_type == T::F32)
}
