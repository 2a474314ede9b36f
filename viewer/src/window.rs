//! The live window. winit wants the event loop on the main thread: call [`run_window`] there
//! and generate on another thread that feeds the channel. The window polls the channel at
//! most `max_fps` times a second, redraws only when something changed, and never makes the
//! producer wait. It opens its own wgpu device: the engine's instance has no display handle
//! and its adapter was not chosen for a surface, so sharing it is not worth the coupling;
//! frames arrive as small CPU messages (the engine reads selections back for the sink anyway).

use std::sync::Arc;
use std::sync::mpsc::{Receiver, Sender, TryRecvError};
use std::time::{Duration, Instant};

use winit::application::ApplicationHandler;
use winit::dpi::PhysicalSize;
use winit::event::{ElementState, MouseScrollDelta, WindowEvent};
use winit::event_loop::{ActiveEventLoop, ControlFlow, EventLoop};
use winit::keyboard::{Key, NamedKey};
use winit::window::{Window, WindowId};

use crate::frame::{Control, ViewerMsg};
use crate::heatmap::{Heatmap, ViewState};
use crate::keys::{self, Action};
use crate::layout::Layout;
use crate::render::{Renderer, open_device};
use crate::{TokenText, ViewerError};

#[derive(Clone)]
pub struct ViewerOptions {
    pub title: String,
    pub size: (u32, u32),
    /// Close the window once the producer sent Done (or went away) and the last frame drew.
    pub exit_when_done: bool,
    /// Text of prompt tokens (generated tokens carry their text in the frame).
    pub token_text: Option<TokenText>,
    /// Tokens kept for layer focus.
    pub history: usize,
    /// Tokens the frequency strip counts over.
    pub freq_window: usize,
    pub max_fps: u32,
    pub view: ViewState,
    /// Allow the event loop off the main thread (tests: the test harness runs tests on
    /// worker threads; X11 and Wayland allow it, macOS does not).
    pub any_thread: bool,
}

impl Default for ViewerOptions {
    fn default() -> Self {
        ViewerOptions {
            title: crate::WINDOW_TITLE.into(),
            size: (1280, 760),
            exit_when_done: false,
            token_text: None,
            history: 512,
            freq_window: 64,
            max_fps: 60,
            view: ViewState::default(),
            any_thread: false,
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CloseReason {
    /// exit_when_done and the producer finished.
    Done,
    /// The user closed the window or pressed Q/Esc.
    User,
}

#[derive(Clone, Debug)]
pub struct WindowSummary {
    pub frames_received: usize,
    pub frames_drawn: usize,
    pub closed: CloseReason,
    /// Adapter the window drew with.
    pub adapter: String,
    /// Bytes written to the GPU for all frames drawn.
    pub upload_bytes: u64,
}

struct Gfx {
    window: Arc<Window>,
    surface: wgpu::Surface<'static>,
    config: wgpu::SurfaceConfiguration,
    renderer: Renderer,
    layout: Option<Layout>,
}

struct App {
    rx: Receiver<ViewerMsg>,
    control: Option<Sender<Control>>,
    opts: ViewerOptions,
    instance: wgpu::Instance,
    gfx: Option<Gfx>,
    hm: Heatmap,
    view: ViewState,
    dirty: bool,
    last_draw: Option<Instant>,
    drawn_after_done: bool,
    received: usize,
    drawn: usize,
    closed: Option<CloseReason>,
    adapter: String,
    error: Option<ViewerError>,
}

/// Opens the window and runs until the user closes it (or, with `exit_when_done`, until the
/// producer is done). Frames come from `rx`; keys send [`Control`] on `control`.
pub fn run_window(rx: Receiver<ViewerMsg>, control: Option<Sender<Control>>, opts: ViewerOptions) -> Result<WindowSummary, ViewerError> {
    #[allow(unused_mut)]
    let mut builder = EventLoop::builder();
    #[cfg(all(unix, not(target_os = "macos"), not(target_os = "android")))]
    if opts.any_thread {
        use winit::platform::x11::EventLoopBuilderExtX11;
        builder.with_any_thread(true);
    }
    #[cfg(target_os = "windows")]
    if opts.any_thread {
        use winit::platform::windows::EventLoopBuilderExtWindows;
        builder.with_any_thread(true);
    }
    let event_loop = builder.build().map_err(|e| ViewerError::EventLoop(e.to_string()))?;
    let instance = wgpu::Instance::new(wgpu::InstanceDescriptor::new_with_display_handle_from_env(Box::new(event_loop.owned_display_handle())));
    let mut app = App {
        rx,
        control,
        hm: Heatmap::new(opts.history, opts.freq_window),
        view: opts.view.clone(),
        opts,
        instance,
        gfx: None,
        dirty: true,
        last_draw: None,
        drawn_after_done: false,
        received: 0,
        drawn: 0,
        closed: None,
        adapter: String::new(),
        error: None,
    };
    event_loop.run_app(&mut app).map_err(|e| ViewerError::EventLoop(e.to_string()))?;
    if let Some(e) = app.error {
        return Err(e);
    }
    let upload_bytes = app.gfx.as_ref().map_or(0, |g| g.renderer.stats.bytes);
    Ok(WindowSummary { frames_received: app.received, frames_drawn: app.drawn, closed: app.closed.unwrap_or(CloseReason::User), adapter: app.adapter, upload_bytes })
}

impl App {
    fn fail(&mut self, el: &ActiveEventLoop, e: ViewerError) {
        self.error.get_or_insert(e);
        el.exit();
    }

    fn send(&self, c: Control) {
        if let Some(tx) = &self.control {
            // A producer that already finished does not listen any more: nothing to do.
            let _ = tx.send(c);
        }
    }

    fn init(&mut self, el: &ActiveEventLoop) -> Result<(), ViewerError> {
        let attrs = Window::default_attributes()
            .with_title(self.opts.title.clone())
            .with_inner_size(PhysicalSize::new(self.opts.size.0.max(64), self.opts.size.1.max(64)));
        let window = Arc::new(el.create_window(attrs).map_err(|e| ViewerError::EventLoop(e.to_string()))?);
        let surface = self.instance.create_surface(window.clone()).map_err(|e| ViewerError::Surface(e.to_string()))?;
        let adapter = pollster::block_on(self.instance.request_adapter(&wgpu::RequestAdapterOptions {
            power_preference: wgpu::PowerPreference::HighPerformance,
            compatible_surface: Some(&surface),
            ..Default::default()
        }))
        .map_err(|e| ViewerError::NoAdapter(e.to_string()))?;
        let info = adapter.get_info();
        self.adapter = format!("{} ({:?})", info.name, info.backend);
        let (device, queue) = open_device(&adapter)?;
        let caps = surface.get_capabilities(&adapter);
        // A plain (non-sRGB) format keeps the shader's byte colours exact; sRGB also works.
        let format = caps
            .formats
            .iter()
            .copied()
            .find(|f| matches!(f, wgpu::TextureFormat::Bgra8Unorm | wgpu::TextureFormat::Rgba8Unorm))
            .or_else(|| caps.formats.first().copied())
            .ok_or_else(|| ViewerError::Surface(format!("the surface offers no format on {}", self.adapter)))?;
        let size = window.inner_size();
        let mut config = surface
            .get_default_config(&adapter, size.width.max(1), size.height.max(1))
            .ok_or_else(|| ViewerError::Surface(format!("the surface is not supported by {}", self.adapter)))?;
        config.format = format;
        config.present_mode = wgpu::PresentMode::AutoVsync;
        surface.configure(&device, &config);
        let renderer = Renderer::new(device, queue, format)?;
        log::info!("viewer: {} format {format:?}", self.adapter);
        self.gfx = Some(Gfx { window, surface, config, renderer, layout: None });
        Ok(())
    }

    fn drain(&mut self) {
        loop {
            match self.rx.try_recv() {
                Ok(ViewerMsg::Frame(f)) => {
                    self.hm.push(f);
                    self.received += 1;
                    self.dirty = true;
                }
                Ok(ViewerMsg::Figures(f)) => {
                    self.hm.set_figures(f);
                    self.dirty = true;
                }
                Ok(ViewerMsg::Done) | Err(TryRecvError::Disconnected) => {
                    if !self.hm.done {
                        self.hm.done = true;
                        self.dirty = true;
                    }
                    break;
                }
                Err(TryRecvError::Empty) => break,
            }
        }
    }

    fn draw(&mut self) -> Result<(), ViewerError> {
        let Some(g) = self.gfx.as_mut() else { return Ok(()) };
        let frame = match g.surface.get_current_texture() {
            wgpu::CurrentSurfaceTexture::Success(t) | wgpu::CurrentSurfaceTexture::Suboptimal(t) => t,
            wgpu::CurrentSurfaceTexture::Outdated | wgpu::CurrentSurfaceTexture::Lost => {
                g.surface.configure(&g.renderer.device, &g.config);
                self.dirty = true;
                return Ok(());
            }
            wgpu::CurrentSurfaceTexture::Timeout | wgpu::CurrentSurfaceTexture::Occluded => {
                self.dirty = true;
                return Ok(());
            }
            other => return Err(ViewerError::Surface(format!("{other:?}"))),
        };
        let text = self.opts.token_text.clone();
        let lay = g.renderer.prepare(&self.hm, &self.view, g.config.width, g.config.height, text.as_ref())?;
        let tv = frame.texture.create_view(&Default::default());
        let mut enc = g.renderer.device.create_command_encoder(&Default::default());
        g.renderer.draw(&mut enc, &tv, &self.view)?;
        g.renderer.queue.submit([enc.finish()]);
        g.renderer.queue.present(frame);
        g.layout = Some(lay);
        self.drawn += 1;
        self.dirty = false;
        self.last_draw = Some(Instant::now());
        if self.hm.done {
            self.drawn_after_done = true;
        }
        Ok(())
    }

    fn act(&mut self, el: &ActiveEventLoop, a: Action) {
        let at = self.hover_position().map(|p| p as f64 + 0.5);
        if let Some(c) = keys::apply(&mut self.view, &self.hm, a, at) {
            self.send(c);
            if c == Control::Stop {
                self.closed = Some(CloseReason::User);
                el.exit();
            }
        }
        self.dirty = true;
    }

    fn hover_position(&self) -> Option<usize> {
        let (x, _) = self.view.hover?;
        self.gfx.as_ref()?.layout.as_ref()?.position_at(x)
    }
}

fn action(key: &Key) -> Option<Action> {
    Some(match key {
        Key::Named(NamedKey::Space) => Action::TogglePause,
        Key::Named(NamedKey::Tab) => Action::SwitchView,
        Key::Named(NamedKey::ArrowUp) => Action::PrevLayer,
        Key::Named(NamedKey::ArrowDown) => Action::NextLayer,
        Key::Named(NamedKey::ArrowLeft) => Action::PanLeft,
        Key::Named(NamedKey::ArrowRight) => Action::PanRight,
        Key::Named(NamedKey::PageUp) => Action::ScrollBack,
        Key::Named(NamedKey::PageDown) => Action::ScrollForward,
        Key::Named(NamedKey::End) => Action::Follow,
        Key::Named(NamedKey::Home) => Action::ResetZoom,
        Key::Named(NamedKey::Escape) => Action::Quit,
        Key::Named(NamedKey::F1) => Action::Help,
        Key::Character(s) => match s.as_str() {
            "n" | "N" | "." => Action::Step,
            "c" | "C" => Action::Colour,
            "v" | "V" => Action::SwitchView,
            "f" | "F" => Action::Figures,
            "h" | "H" | "?" => Action::Help,
            "q" | "Q" => Action::Quit,
            "+" | "=" => Action::ZoomIn,
            "-" | "_" => Action::ZoomOut,
            "0" => Action::ResetZoom,
            _ => return None,
        },
        _ => return None,
    })
}

impl ApplicationHandler for App {
    fn resumed(&mut self, el: &ActiveEventLoop) {
        if self.gfx.is_none()
            && let Err(e) = self.init(el)
        {
            self.fail(el, e);
        }
    }

    fn window_event(&mut self, el: &ActiveEventLoop, _id: WindowId, event: WindowEvent) {
        match event {
            WindowEvent::CloseRequested => {
                self.send(Control::Stop);
                self.closed = Some(CloseReason::User);
                el.exit();
            }
            WindowEvent::Resized(size) => {
                if let Some(g) = self.gfx.as_mut() {
                    g.config.width = size.width.max(1);
                    g.config.height = size.height.max(1);
                    g.surface.configure(&g.renderer.device, &g.config);
                }
                self.dirty = true;
            }
            WindowEvent::RedrawRequested => {
                if let Err(e) = self.draw() {
                    self.fail(el, e);
                }
            }
            WindowEvent::CursorMoved { position, .. } => {
                self.view.hover = Some((position.x as f32, position.y as f32));
                self.dirty = true;
            }
            WindowEvent::CursorLeft { .. } => {
                self.view.hover = None;
                self.dirty = true;
            }
            WindowEvent::MouseWheel { delta, .. } => {
                let y = match delta {
                    MouseScrollDelta::LineDelta(_, y) => y as f64,
                    MouseScrollDelta::PixelDelta(p) => p.y / 40.0,
                };
                if y != 0.0 {
                    let at = self.hover_position().map(|p| p as f64 + 0.5);
                    let (x0, x1) = self.view.x_range(self.hm.context());
                    self.view.zoom_by(0.8f64.powf(y), at.unwrap_or((x0 + x1) / 2.0), self.hm.context());
                    self.dirty = true;
                }
            }
            WindowEvent::KeyboardInput { event, .. } => {
                if event.state == ElementState::Pressed
                    && let Some(a) = action(&event.logical_key)
                {
                    self.act(el, a);
                }
            }
            _ => {}
        }
    }

    fn about_to_wait(&mut self, el: &ActiveEventLoop) {
        self.drain();
        let interval = Duration::from_secs_f64(1.0 / self.opts.max_fps.clamp(1, 240) as f64);
        let now = Instant::now();
        if self.opts.exit_when_done && self.hm.done && self.drawn_after_done {
            self.closed = Some(CloseReason::Done);
            el.exit();
            return;
        }
        if self.dirty
            && self.last_draw.is_none_or(|t| now.duration_since(t) >= interval)
            && let Some(g) = &self.gfx
        {
            g.window.request_redraw();
        }
        // Poll the channel at the frame rate (Xvfb does not throttle presentation).
        el.set_control_flow(ControlFlow::WaitUntil(now + interval));
    }
}
