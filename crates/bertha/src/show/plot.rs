//! Scatter plots of 2-D points coloured by label, as PNG or SVG, with
//! `plotters`. Text is drawn with the DejaVu Sans compiled into the crate
//! (plotters' pure-Rust `ab_glyph` renderer), so no system font library
//! or font file is needed at run time.

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::{CoordTranslate, Shift};
use plotters::prelude::*;

use crate::error::{Error, Result};

/// DejaVu Sans 2.37 (Bitstream Vera license, `assets/fonts/LICENSE-DejaVu.txt`).
static DEJAVU_SANS: &[u8] = include_bytes!("../../assets/fonts/DejaVuSans.ttf");

/// The font family every text of a plot uses.
pub(crate) const FONT: &str = "sans-serif";

/// The legend box of every chart: upper right, on translucent white.
pub(crate) fn draw_legend<'a, DB, CT>(
    chart: &mut ChartContext<'a, DB, CT>,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    DB: DrawingBackend + 'a,
    CT: CoordTranslate,
{
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperRight)
        .background_style(WHITE.mix(0.9))
        .border_style(RGBColor(150, 150, 150))
        .label_font((FONT, 14))
        .draw()
}

pub(crate) fn register_fonts() -> Result<()> {
    static DONE: OnceLock<bool> = OnceLock::new();
    let ok = *DONE.get_or_init(|| {
        plotters::style::register_font(FONT, FontStyle::Normal, DEJAVU_SANS).is_ok()
    });
    if ok {
        Ok(())
    } else {
        Err(Error::Input(
            "the built-in DejaVu Sans font could not be loaded".into(),
        ))
    }
}

/// What an output file name asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ImageFormat {
    Png,
    Svg,
}

impl ImageFormat {
    /// From the extension: `.png` or `.svg` (any case).
    pub fn from_path(path: &Path) -> Result<Self> {
        match path
            .extension()
            .and_then(|e| e.to_str())
            .map(str::to_ascii_lowercase)
            .as_deref()
        {
            Some("png") => Ok(Self::Png),
            Some("svg") => Ok(Self::Svg),
            _ => Err(Error::Input(format!(
                "{}: the picture's file name must end in .png or .svg",
                path.display()
            ))),
        }
    }
}

/// One map to draw.
#[derive(Debug, Clone)]
pub struct MapPlot<'a> {
    pub title: &'a str,
    /// A second, smaller line under the title (e.g. the cluster figures).
    pub subtitle: Option<&'a str>,
    pub axes: [&'a str; 2],
    pub points: &'a [[f64; 2]],
    /// Each point's index into `label_names`.
    pub labels: &'a [usize],
    pub label_names: &'a [String],
    /// Draw a legend (off for unlabelled inputs).
    pub legend: bool,
    /// Picture size in pixels (SVG: user units).
    pub size: (u32, u32),
}

/// Colours of the labels: matplotlib's `tab10`, then plotters' Palette99.
pub fn label_color(i: usize) -> RGBColor {
    const TAB10: [(u8, u8, u8); 10] = [
        (0x1f, 0x77, 0xb4),
        (0xff, 0x7f, 0x0e),
        (0x2c, 0xa0, 0x2c),
        (0xd6, 0x27, 0x28),
        (0x94, 0x67, 0xbd),
        (0x8c, 0x56, 0x4b),
        (0xe3, 0x77, 0xc2),
        (0x7f, 0x7f, 0x7f),
        (0xbc, 0xbd, 0x22),
        (0x17, 0xbe, 0xcf),
    ];
    match TAB10.get(i) {
        Some(&(r, g, b)) => RGBColor(r, g, b),
        None => {
            let c = Palette99::pick(i - TAB10.len()).to_rgba();
            RGBColor(c.0, c.1, c.2)
        }
    }
}

impl MapPlot<'_> {
    fn check(&self) -> Result<()> {
        if self.points.is_empty() {
            return Err(Error::Input("nothing to draw: no points".into()));
        }
        if self.labels.len() != self.points.len() {
            return Err(Error::Input(format!(
                "{} points but {} labels",
                self.points.len(),
                self.labels.len()
            )));
        }
        if let Some(&bad) = self.labels.iter().find(|&&l| l >= self.label_names.len()) {
            return Err(Error::Input(format!(
                "label index {bad} but only {} label names",
                self.label_names.len()
            )));
        }
        if self.points.iter().flatten().any(|v| !v.is_finite()) {
            return Err(Error::Input("a point is not finite".into()));
        }
        if self.size.0 < 200 || self.size.1 < 200 {
            return Err(Error::Input(format!(
                "picture size {}x{} is too small (at least 200x200)",
                self.size.0, self.size.1
            )));
        }
        Ok(())
    }

    /// Axis ranges with 5% padding (a unit range around a single value).
    fn ranges(&self) -> (std::ops::Range<f64>, std::ops::Range<f64>) {
        let range = |axis: usize| {
            let (lo, hi) = self
                .points
                .iter()
                .map(|p| p[axis])
                .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                    (lo.min(v), hi.max(v))
                });
            let pad = if hi > lo { 0.05 * (hi - lo) } else { 0.5 };
            (lo - pad)..(hi + pad)
        };
        (range(0), range(1))
    }

    /// Draws to `path`, PNG or SVG by its extension, through a temporary
    /// file renamed into place.
    pub fn save(&self, path: &Path) -> Result<()> {
        let format = ImageFormat::from_path(path)?;
        self.check()?;
        register_fonts()?;
        let drawing_error = |e: String| Error::Input(format!("drawing {}: {e}", path.display()));
        match format {
            ImageFormat::Svg => {
                let svg = self.to_svg().map_err(drawing_error)?;
                super::coords::write_atomically(path, svg.as_bytes())
            }
            ImageFormat::Png => {
                let tmp = super::coords::temp_beside(path, ".embed-map", ".png")?;
                {
                    let root = BitMapBackend::new(tmp.path(), self.size).into_drawing_area();
                    self.draw(&root).map_err(|e| drawing_error(e.to_string()))?;
                }
                super::coords::persist(tmp, path)
            }
        }
    }

    /// The SVG text of the plot.
    pub fn to_svg(&self) -> std::result::Result<String, String> {
        self.check().map_err(|e| e.to_string())?;
        register_fonts().map_err(|e| e.to_string())?;
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, self.size).into_drawing_area();
            self.draw(&root).map_err(|e| e.to_string())?;
        }
        Ok(svg)
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
    ) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        root.fill(&WHITE)?;
        let area = root.margin(10, 0, 0, 0).titled(self.title, (FONT, 24))?;
        let area = match self.subtitle {
            Some(s) => area.titled(s, (FONT, 16).into_font().color(&RGBColor(70, 70, 70)))?,
            None => area,
        };
        let (xr, yr) = self.ranges();
        let mut chart = ChartBuilder::on(&area)
            .margin(16)
            .margin_top(4)
            .x_label_area_size(48)
            .y_label_area_size(64)
            .build_cartesian_2d(xr, yr)?;
        chart
            .configure_mesh()
            .x_desc(self.axes[0])
            .y_desc(self.axes[1])
            .label_style((FONT, 13))
            .axis_desc_style((FONT, 15))
            .bold_line_style(RGBColor(225, 225, 225))
            .light_line_style(RGBColor(243, 243, 243))
            .draw()?;
        let mut counts = vec![0usize; self.label_names.len()];
        self.labels.iter().for_each(|&l| counts[l] += 1);
        if self.legend {
            // Empty series carry the legend entries; the points are drawn
            // in input order below so that no label hides another.
            for (g, name) in self.label_names.iter().enumerate() {
                let color = label_color(g);
                chart
                    .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())?
                    .label(format!("{name} (n={})", counts[g]))
                    .legend(move |(x, y)| {
                        Rectangle::new([(x, y - 5), (x + 10, y + 5)], color.filled())
                    });
            }
        }
        chart.draw_series(
            self.points
                .iter()
                .zip(self.labels)
                .map(|(p, &l)| Circle::new((p[0], p[1]), 3, label_color(l).mix(0.75).filled())),
        )?;
        if self.legend {
            draw_legend(&mut chart)?;
        }
        root.present()?;
        Ok(())
    }
}
