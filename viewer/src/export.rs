//! Headless export: the same renderer draws offscreen and the frames go to PNG files. No
//! display is needed. [`spawn_png_export`] runs on its own thread so a `--selection-png-every`
//! render never stalls generation.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender};
use std::thread::JoinHandle;

use crate::frame::ViewerMsg;
use crate::heatmap::{Heatmap, ViewState};
use crate::render::Renderer;
use crate::{TokenText, ViewerError};

/// Writes [height, width, 4] RGBA bytes as an 8-bit RGBA PNG.
pub fn write_png(path: &Path, width: u32, height: u32, rgba: &[u8]) -> Result<(), ViewerError> {
    if rgba.len() != (width * height * 4) as usize {
        return Err(ViewerError::Png(format!("{} bytes for a {width}x{height} RGBA image", rgba.len())));
    }
    let file = File::create(path).map_err(|e| ViewerError::Io(path.to_path_buf(), e))?;
    let mut enc = png::Encoder::new(BufWriter::new(file), width, height);
    enc.set_color(png::ColorType::Rgba);
    enc.set_depth(png::BitDepth::Eight);
    let mut w = enc.write_header().map_err(|e| ViewerError::Png(format!("{}: {e}", path.display())))?;
    w.write_image_data(rgba).map_err(|e| ViewerError::Png(format!("{}: {e}", path.display())))?;
    w.finish().map_err(|e| ViewerError::Png(format!("{}: {e}", path.display())))
}

/// Renders the heatmap offscreen and writes it to `path`.
pub fn render_png(r: &mut Renderer, hm: &Heatmap, view: &ViewState, size: (u32, u32), text: Option<&TokenText>, path: &Path) -> Result<(), ViewerError> {
    let rgba = r.render_rgba(hm, view, size.0, size.1, text)?;
    write_png(path, size.0.max(1), size.1.max(1), &rgba)
}

/// `out.png`, token 12 -> `out-000012.png`.
pub fn numbered(path: &Path, token: usize) -> PathBuf {
    let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "selection".into());
    let ext = path.extension().map(|e| e.to_string_lossy().into_owned()).unwrap_or_else(|| "png".into());
    path.with_file_name(format!("{stem}-{token:06}.{ext}"))
}

#[derive(Clone)]
pub struct PngExportOptions {
    /// The final heatmap goes here when generation ends.
    pub path: PathBuf,
    /// Also write `numbered(path, tokens)` every this many tokens.
    pub every: Option<usize>,
    pub size: (u32, u32),
    pub view: ViewState,
    pub history: usize,
    pub freq_window: usize,
    pub token_text: Option<TokenText>,
}

impl PngExportOptions {
    pub fn new(path: impl Into<PathBuf>) -> Self {
        PngExportOptions { path: path.into(), every: None, size: (1280, 720), view: ViewState::default(), history: 512, freq_window: 64, token_text: None }
    }
}

/// What an export wrote.
#[derive(Clone, Debug, Default)]
pub struct ExportSummary {
    pub frames: usize,
    pub files: Vec<PathBuf>,
}

/// Consumes messages until Done (or the sender goes away) and writes the PNGs.
pub fn export_pngs(rx: Receiver<ViewerMsg>, opts: PngExportOptions, renderer: Option<Renderer>) -> Result<ExportSummary, ViewerError> {
    let mut r = match renderer {
        Some(r) => r,
        None => Renderer::headless()?,
    };
    let mut hm = Heatmap::new(opts.history, opts.freq_window);
    let mut out = ExportSummary::default();
    let text = opts.token_text.as_ref();
    for msg in rx {
        match msg {
            ViewerMsg::Frame(f) => {
                hm.push(f);
                out.frames += 1;
                if opts.every.is_some_and(|n| n > 0 && hm.tokens().is_multiple_of(n)) {
                    let p = numbered(&opts.path, hm.tokens());
                    render_png(&mut r, &hm, &opts.view, opts.size, text, &p)?;
                    out.files.push(p);
                }
            }
            ViewerMsg::Figures(f) => hm.set_figures(f),
            ViewerMsg::Done => break,
        }
    }
    hm.done = true;
    render_png(&mut r, &hm, &opts.view, opts.size, text, &opts.path)?;
    out.files.push(opts.path.clone());
    Ok(out)
}

/// Starts [`export_pngs`] on its own thread; feed the sender (e.g. `FrameSink::add`).
pub fn spawn_png_export(opts: PngExportOptions) -> (Sender<ViewerMsg>, JoinHandle<Result<ExportSummary, ViewerError>>) {
    let (tx, rx) = std::sync::mpsc::channel();
    let h = std::thread::Builder::new().name("k31-png-export".into()).spawn(move || export_pngs(rx, opts, None));
    match h {
        Ok(h) => (tx, h),
        // Spawning only fails when the OS is out of threads: report it through the handle.
        Err(e) => (tx, std::thread::spawn(move || Err(ViewerError::Device(format!("could not start the export thread: {e}"))))),
    }
}

/// Reads an 8-bit RGB or RGBA PNG back as (width, height, RGBA bytes) (tests, tools).
pub fn read_png(path: &Path) -> Result<(u32, u32, Vec<u8>), ViewerError> {
    let file = File::open(path).map_err(|e| ViewerError::Io(path.to_path_buf(), e))?;
    let bad = |e: String| ViewerError::Png(format!("{}: {e}", path.display()));
    let mut reader = png::Decoder::new(std::io::BufReader::new(file)).read_info().map_err(|e| bad(e.to_string()))?;
    let size = reader.output_buffer_size().ok_or_else(|| bad("image too large".into()))?;
    let mut buf = vec![0; size];
    let info = reader.next_frame(&mut buf).map_err(|e| bad(e.to_string()))?;
    let px = &buf[..info.buffer_size()];
    let rgba = match (info.color_type, info.bit_depth) {
        (png::ColorType::Rgba, png::BitDepth::Eight) => px.to_vec(),
        (png::ColorType::Rgb, png::BitDepth::Eight) => px.chunks(3).flat_map(|c| [c[0], c[1], c[2], 255]).collect(),
        (c, d) => return Err(bad(format!("unsupported PNG {c:?} {d:?}"))),
    };
    Ok((info.width, info.height, rgba))
}
