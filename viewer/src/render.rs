//! The render pipeline shared by the window and the PNG export: small per-token uploads
//! (the newest token's row per layer, one history row for layer focus, the frequency strip,
//! the changed band of the text overlay), one full-screen draw.

use crate::ViewerError;
use crate::TokenText;
use crate::heatmap::{ColourMode, Heatmap, ViewMode, ViewState, fill_row};
use crate::layout::Layout;
use crate::overlay::{self, Canvas};

#[repr(C)]
#[derive(Clone, Copy, Debug, bytemuck::Pod, bytemuck::Zeroable)]
struct Params {
    heat: [f32; 4],
    strip: [f32; 4],
    x0: f32,
    x1: f32,
    rows: u32,
    row_base: u32,
    row_mod: u32,
    cap: u32,
    srgb: u32,
    row_gap: u32,
}

/// GPU copies of the heatmap, sized for `cap` positions.
struct Data {
    cap: usize,
    layers: usize,
    ring: usize,
    /// [layers, cap] value bytes of the newest token.
    cur: wgpu::Buffer,
    /// [ring, cap] value bytes of the focused layer, slot = token % ring.
    hist: wgpu::Buffer,
    /// [cap] value bytes.
    strip: wgpu::Buffer,
    /// [layers] u32 query position per row.
    pos_cur: wgpu::Buffer,
    /// [ring] u32.
    pos_hist: wgpu::Buffer,
}

struct Overlay {
    tex: wgpu::Texture,
    view: wgpu::TextureView,
    canvas: Canvas,
    prev: Vec<u8>,
}

#[derive(Default)]
struct Uploaded {
    valid: bool,
    version: u64,
    colour: Option<ColourMode>,
    focus: Option<usize>,
    hist_until: usize,
    strip_mode: Option<ViewMode>,
}

/// Counts of what went to the GPU (for tests and the overhead report).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct UploadStats {
    pub bytes: u64,
    pub writes: u64,
}

pub struct Renderer {
    pub device: wgpu::Device,
    pub queue: wgpu::Queue,
    format: wgpu::TextureFormat,
    pipeline: wgpu::RenderPipeline,
    bgl: wgpu::BindGroupLayout,
    params: wgpu::Buffer,
    data: Option<Data>,
    overlay: Option<Overlay>,
    up: Uploaded,
    max_binding: u64,
    pub stats: UploadStats,
}

fn round4(n: usize) -> usize {
    n.div_ceil(4) * 4
}

impl Renderer {
    /// A renderer on its own device with no surface (PNG export; no display needed).
    pub fn headless() -> Result<Renderer, ViewerError> {
        let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_without_display_handle_from_env());
        let adapter = pollster::block_on(instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            ..Default::default()
        }))
        .map_err(|e| ViewerError::NoAdapter(e.to_string()))?;
        let (device, queue) = open_device(&adapter)?;
        Renderer::new(device, queue, wgpu::TextureFormat::Rgba8Unorm)
    }

    /// A renderer drawing into targets of `format` on an existing device (the window's, or
    /// the engine's for export).
    pub fn new(device: wgpu::Device, queue: wgpu::Queue, format: wgpu::TextureFormat) -> Result<Renderer, ViewerError> {
        let module = device.create_shader_module(wgpu::ShaderModuleDescriptor {
            label: Some("viewer"),
            source: wgpu::ShaderSource::Wgsl(SHADER.into()),
        });
        let storage = |binding| wgpu::BindGroupLayoutEntry {
            binding,
            visibility: wgpu::ShaderStages::FRAGMENT,
            ty: wgpu::BindingType::Buffer { ty: wgpu::BufferBindingType::Storage { read_only: true }, has_dynamic_offset: false, min_binding_size: None },
            count: None,
        };
        let bgl = device.create_bind_group_layout(&wgpu::BindGroupLayoutDescriptor {
            label: Some("viewer"),
            entries: &[
                wgpu::BindGroupLayoutEntry {
                    binding: 0,
                    visibility: wgpu::ShaderStages::FRAGMENT,
                    ty: wgpu::BindingType::Buffer { ty: wgpu::BufferBindingType::Uniform, has_dynamic_offset: false, min_binding_size: None },
                    count: None,
                },
                storage(1),
                storage(2),
                storage(3),
                wgpu::BindGroupLayoutEntry {
                    binding: 4,
                    visibility: wgpu::ShaderStages::FRAGMENT,
                    ty: wgpu::BindingType::Texture {
                        sample_type: wgpu::TextureSampleType::Float { filterable: false },
                        view_dimension: wgpu::TextureViewDimension::D2,
                        multisampled: false,
                    },
                    count: None,
                },
            ],
        });
        let pl = device.create_pipeline_layout(&wgpu::PipelineLayoutDescriptor {
            label: Some("viewer"),
            bind_group_layouts: &[Some(&bgl)],
            immediate_size: 0,
        });
        let pipeline = device.create_render_pipeline(&wgpu::RenderPipelineDescriptor {
            label: Some("viewer"),
            layout: Some(&pl),
            vertex: wgpu::VertexState { module: &module, entry_point: Some("vs"), compilation_options: Default::default(), buffers: &[] },
            primitive: wgpu::PrimitiveState::default(),
            depth_stencil: None,
            multisample: wgpu::MultisampleState::default(),
            fragment: Some(wgpu::FragmentState {
                module: &module,
                entry_point: Some("fs"),
                compilation_options: Default::default(),
                targets: &[Some(wgpu::ColorTargetState { format, blend: None, write_mask: wgpu::ColorWrites::ALL })],
            }),
            multiview_mask: None,
            cache: None,
        });
        let params = device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("viewer params"),
            size: std::mem::size_of::<Params>() as u64,
            usage: wgpu::BufferUsages::UNIFORM | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let limits = device.limits();
        let max_binding = limits.max_storage_buffer_binding_size.min(limits.max_buffer_size);
        Ok(Renderer { device, queue, format, pipeline, bgl, params, data: None, overlay: None, up: Uploaded::default(), max_binding, stats: UploadStats::default() })
    }

    pub fn format(&self) -> wgpu::TextureFormat {
        self.format
    }

    fn write(&mut self, buf: &wgpu::Buffer, offset: usize, bytes: &[u8]) {
        self.queue.write_buffer(buf, offset as u64, bytes);
        self.stats.bytes += bytes.len() as u64;
        self.stats.writes += 1;
    }

    fn ensure_data(&mut self, hm: &Heatmap) -> Result<(), ViewerError> {
        let need = hm.context().max(1).next_power_of_two().max(1024);
        let layers = hm.layers().len().max(1);
        if let Some(d) = &self.data
            && d.cap >= need
            && d.layers == layers
        {
            return Ok(());
        }
        // The history ring is the biggest buffer: keep it inside one binding.
        let ring = hm.history_cap();
        let hist_bytes = (ring * need) as u64;
        if hist_bytes > self.max_binding || (layers * need) as u64 > self.max_binding {
            return Err(ViewerError::TooLarge(format!(
                "{ring} history tokens x {need} positions = {hist_bytes} bytes exceeds the adapter's {} byte binding limit; use a shorter history",
                self.max_binding
            )));
        }
        let mk = |label, size: usize| {
            self.device.create_buffer(&wgpu::BufferDescriptor {
                label: Some(label),
                size: round4(size.max(4)) as u64,
                usage: wgpu::BufferUsages::STORAGE | wgpu::BufferUsages::COPY_DST,
                mapped_at_creation: false,
            })
        };
        self.data = Some(Data {
            cap: need,
            layers,
            ring,
            cur: mk("viewer cur", layers * need),
            hist: mk("viewer hist", ring * need),
            strip: mk("viewer strip", need),
            pos_cur: mk("viewer pos cur", layers * 4),
            pos_hist: mk("viewer pos hist", ring * 4),
        });
        self.up = Uploaded::default();
        Ok(())
    }

    fn upload(&mut self, hm: &Heatmap, view: &ViewState) -> Result<(), ViewerError> {
        self.ensure_data(hm)?;
        let Some(d) = self.data.take() else { return Ok(()) };
        let ctx = round4(hm.context().max(1)).min(d.cap);
        let mut row = vec![0u8; ctx];
        let fresh = !self.up.valid || self.up.colour != Some(view.colour);
        let newest = hm.newest().cloned();
        if fresh || self.up.version != hm.version() {
            // Newest token, one row per layer.
            for r in 0..hm.layers().len() {
                fill_row(&mut row, newest.as_deref().and_then(|f| hm.selection(f, r)), view.colour);
                self.write(&d.cur, r * d.cap, &row);
            }
            let p = newest.as_ref().map_or(0, |f| f.position as u32);
            self.write(&d.pos_cur, 0, bytemuck::cast_slice(&vec![p; d.layers]));
        }
        if let ViewMode::Focus(l) = view.mode {
            let (h0, h1) = hm.history_range();
            let from = if fresh || self.up.focus != Some(l) { h0 } else { self.up.hist_until.max(h0) };
            // One row per new token (all rows after a focus or colour change).
            for t in from.max(h1.saturating_sub(d.ring))..h1 {
                let Some(f) = hm.frame(t).cloned() else { continue };
                let slot = t % d.ring;
                fill_row(&mut row, hm.selection(&f, l), view.colour);
                self.write(&d.hist, slot * d.cap, &row);
                self.write(&d.pos_hist, slot * 4, bytemuck::bytes_of(&(f.position as u32)));
            }
            self.up.focus = Some(l);
            self.up.hist_until = h1;
        } else {
            self.up.focus = None;
        }
        if fresh || self.up.version != hm.version() || self.up.strip_mode != Some(view.mode) {
            hm.strip(view.mode, &mut row);
            self.write(&d.strip, 0, &row);
        }
        self.up.valid = true;
        self.up.version = hm.version();
        self.up.colour = Some(view.colour);
        self.up.strip_mode = Some(view.mode);
        self.data = Some(d);
        Ok(())
    }

    fn upload_overlay(&mut self, lay: &Layout, hm: &Heatmap, view: &ViewState, text: Option<&TokenText>) {
        let (w, h) = (lay.width, lay.height);
        if self.overlay.as_ref().is_none_or(|o| o.canvas.width != w || o.canvas.height != h) {
            let tex = self.device.create_texture(&wgpu::TextureDescriptor {
                label: Some("viewer overlay"),
                size: wgpu::Extent3d { width: w, height: h, depth_or_array_layers: 1 },
                mip_level_count: 1,
                sample_count: 1,
                dimension: wgpu::TextureDimension::D2,
                format: wgpu::TextureFormat::Rgba8Unorm,
                usage: wgpu::TextureUsages::TEXTURE_BINDING | wgpu::TextureUsages::COPY_DST,
                view_formats: &[],
            });
            let view = tex.create_view(&Default::default());
            // prev differs everywhere, so the first frame uploads the whole canvas.
            self.overlay = Some(Overlay { tex, view, canvas: Canvas::new(w, h), prev: vec![1; (w * h * 4) as usize] });
        }
        let Some(mut o) = self.overlay.take() else { return };
        overlay::draw(&mut o.canvas, lay, hm, view, text);
        // Upload only what changed: per band of 16 rows, the span of changed columns
        // (usually the title, the hover line, and moving row labels in layer focus).
        let (wu, hu) = (w as usize, h as usize);
        let mut sub = Vec::new();
        for y0 in (0..hu).step_by(16) {
            let y1 = (y0 + 16).min(hu);
            let (mut x0, mut x1) = (wu, 0);
            for y in y0..y1 {
                let a = &o.canvas.px[y * wu * 4..(y + 1) * wu * 4];
                let b = &o.prev[y * wu * 4..(y + 1) * wu * 4];
                if a == b {
                    continue;
                }
                if let Some(f) = (0..wu).find(|&x| a[x * 4..x * 4 + 4] != b[x * 4..x * 4 + 4]) {
                    x0 = x0.min(f);
                }
                if let Some(l) = (0..wu).rev().find(|&x| a[x * 4..x * 4 + 4] != b[x * 4..x * 4 + 4]) {
                    x1 = x1.max(l + 1);
                }
            }
            if x1 <= x0 {
                continue;
            }
            sub.clear();
            for y in y0..y1 {
                sub.extend_from_slice(&o.canvas.px[(y * wu + x0) * 4..(y * wu + x1) * 4]);
            }
            self.queue.write_texture(
                wgpu::TexelCopyTextureInfo { texture: &o.tex, mip_level: 0, origin: wgpu::Origin3d { x: x0 as u32, y: y0 as u32, z: 0 }, aspect: wgpu::TextureAspect::All },
                &sub,
                wgpu::TexelCopyBufferLayout { offset: 0, bytes_per_row: Some(((x1 - x0) * 4) as u32), rows_per_image: None },
                wgpu::Extent3d { width: (x1 - x0) as u32, height: (y1 - y0) as u32, depth_or_array_layers: 1 },
            );
            self.stats.bytes += sub.len() as u64;
            self.stats.writes += 1;
        }
        o.prev.copy_from_slice(&o.canvas.px);
        self.overlay = Some(o);
    }

    /// Uploads what changed for a `width` x `height` frame and returns its layout.
    pub fn prepare(&mut self, hm: &Heatmap, view: &ViewState, width: u32, height: u32, text: Option<&TokenText>) -> Result<Layout, ViewerError> {
        let (width, height) = (width.max(1), height.max(1));
        let lay = Layout::new(width, height, hm, view);
        self.upload(hm, view)?;
        self.upload_overlay(&lay, hm, view, text);
        let d = self.data.as_ref().ok_or_else(|| ViewerError::Device("no data buffers".into()))?;
        let (row_base, row_mod) = match view.mode {
            ViewMode::Layers => (0, d.layers as u32),
            ViewMode::Focus(_) => ((lay.first_token % d.ring) as u32, d.ring as u32),
        };
        let r = |r: crate::layout::Rect| [r.x as f32, r.y as f32, r.w as f32, r.h as f32];
        let p = Params {
            heat: r(lay.heat),
            strip: r(lay.strip),
            x0: lay.x0 as f32,
            x1: lay.x1 as f32,
            rows: lay.rows as u32,
            row_base,
            row_mod,
            cap: d.cap as u32,
            srgb: self.format.is_srgb() as u32,
            row_gap: (view.mode == ViewMode::Layers && lay.row_gap()) as u32,
        };
        self.queue.write_buffer(&self.params, 0, bytemuck::bytes_of(&p));
        Ok(lay)
    }

    /// Records the draw of the prepared frame into `target`.
    pub fn draw(&self, enc: &mut wgpu::CommandEncoder, target: &wgpu::TextureView, view: &ViewState) -> Result<(), ViewerError> {
        let (Some(d), Some(o)) = (&self.data, &self.overlay) else {
            return Err(ViewerError::Device("draw before prepare".into()));
        };
        let (grid, pos) = match view.mode {
            ViewMode::Layers => (&d.cur, &d.pos_cur),
            ViewMode::Focus(_) => (&d.hist, &d.pos_hist),
        };
        let bg = self.device.create_bind_group(&wgpu::BindGroupDescriptor {
            label: Some("viewer"),
            layout: &self.bgl,
            entries: &[
                wgpu::BindGroupEntry { binding: 0, resource: self.params.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 1, resource: grid.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 2, resource: d.strip.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 3, resource: pos.as_entire_binding() },
                wgpu::BindGroupEntry { binding: 4, resource: wgpu::BindingResource::TextureView(&o.view) },
            ],
        });
        let mut pass = enc.begin_render_pass(&wgpu::RenderPassDescriptor {
            label: Some("viewer"),
            color_attachments: &[Some(wgpu::RenderPassColorAttachment {
                view: target,
                depth_slice: None,
                resolve_target: None,
                ops: wgpu::Operations { load: wgpu::LoadOp::Clear(wgpu::Color::BLACK), store: wgpu::StoreOp::Store },
            })],
            depth_stencil_attachment: None,
            timestamp_writes: None,
            occlusion_query_set: None,
            multiview_mask: None,
        });
        pass.set_pipeline(&self.pipeline);
        pass.set_bind_group(0, &bg, &[]);
        pass.draw(0..3, 0..1);
        Ok(())
    }

    /// Renders one frame offscreen and returns [height, width, 4] RGBA bytes (sRGB values).
    pub fn render_rgba(&mut self, hm: &Heatmap, view: &ViewState, width: u32, height: u32, text: Option<&TokenText>) -> Result<Vec<u8>, ViewerError> {
        if self.format != wgpu::TextureFormat::Rgba8Unorm {
            return Err(ViewerError::Device(format!("offscreen rendering needs an Rgba8Unorm renderer, this one draws {:?}", self.format)));
        }
        let (width, height) = (width.max(1), height.max(1));
        self.prepare(hm, view, width, height, text)?;
        let tex = self.device.create_texture(&wgpu::TextureDescriptor {
            label: Some("viewer offscreen"),
            size: wgpu::Extent3d { width, height, depth_or_array_layers: 1 },
            mip_level_count: 1,
            sample_count: 1,
            dimension: wgpu::TextureDimension::D2,
            format: self.format,
            usage: wgpu::TextureUsages::RENDER_ATTACHMENT | wgpu::TextureUsages::COPY_SRC,
            view_formats: &[],
        });
        let tv = tex.create_view(&Default::default());
        let padded = (width * 4).div_ceil(wgpu::COPY_BYTES_PER_ROW_ALIGNMENT) * wgpu::COPY_BYTES_PER_ROW_ALIGNMENT;
        let staging = self.device.create_buffer(&wgpu::BufferDescriptor {
            label: Some("viewer readback"),
            size: padded as u64 * height as u64,
            usage: wgpu::BufferUsages::MAP_READ | wgpu::BufferUsages::COPY_DST,
            mapped_at_creation: false,
        });
        let mut enc = self.device.create_command_encoder(&Default::default());
        self.draw(&mut enc, &tv, view)?;
        enc.copy_texture_to_buffer(
            wgpu::TexelCopyTextureInfo { texture: &tex, mip_level: 0, origin: wgpu::Origin3d::ZERO, aspect: wgpu::TextureAspect::All },
            wgpu::TexelCopyBufferInfo { buffer: &staging, layout: wgpu::TexelCopyBufferLayout { offset: 0, bytes_per_row: Some(padded), rows_per_image: None } },
            wgpu::Extent3d { width, height, depth_or_array_layers: 1 },
        );
        self.queue.submit([enc.finish()]);
        let (tx, rx) = std::sync::mpsc::channel();
        staging.slice(..).map_async(wgpu::MapMode::Read, move |r| {
            let _ = tx.send(r);
        });
        self.device.poll(wgpu::PollType::wait_indefinitely()).map_err(|e| ViewerError::Readback(e.to_string()))?;
        rx.recv().map_err(|e| ViewerError::Readback(e.to_string()))?.map_err(|e| ViewerError::Readback(e.to_string()))?;
        let mapped = staging.slice(..).get_mapped_range().map_err(|e| ViewerError::Readback(e.to_string()))?;
        let mut out = Vec::with_capacity((width * height * 4) as usize);
        for y in 0..height as usize {
            out.extend_from_slice(&mapped[y * padded as usize..y * padded as usize + width as usize * 4]);
        }
        Ok(out)
    }
}

/// A device with the adapter's own limits (large storage bindings for long contexts).
pub(crate) fn open_device(adapter: &wgpu::Adapter) -> Result<(wgpu::Device, wgpu::Queue), ViewerError> {
    pollster::block_on(adapter.request_device(&wgpu::DeviceDescriptor {
        label: Some("k31 viewer"),
        required_limits: adapter.limits(),
        ..Default::default()
    }))
    .map_err(|e| ViewerError::Device(e.to_string()))
}

pub const SHADER: &str = include_str!("viewer.wgsl");
