//! Labelled heatmaps (attention maps) as PNG or SVG, with `plotters` and
//! the font of the maps (DejaVu Sans compiled into the crate).

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use super::plot::{register_fonts, FONT};
use super::ImageFormat;
use crate::error::{Error, Result};

/// A matrix with a label for each row and column, drawn as coloured
/// cells (white → dark blue, 0 → the largest value) with a colour bar.
#[derive(Debug, Clone)]
pub struct Heatmap<'a> {
    pub title: String,
    /// Under the title, e.g. what rows and columns are.
    pub subtitle: String,
    pub row_labels: &'a [String],
    pub col_labels: &'a [String],
    /// `values[row][col]`, finite and ≥ 0.
    pub values: &'a [Vec<f32>],
}

const LABEL_PX: u32 = 13;
const CHAR_PX: u32 = 8;

fn colour(t: f64) -> RGBColor {
    // White to matplotlib's Blues end (8, 48, 107), through (66, 146, 198).
    let t = t.clamp(0.0, 1.0);
    let lerp = |a: f64, b: f64, s: f64| (a + (b - a) * s).round() as u8;
    let (a, b, s) = if t < 0.6 {
        ((255.0, 255.0, 255.0), (66.0, 146.0, 198.0), t / 0.6)
    } else {
        ((66.0, 146.0, 198.0), (8.0, 48.0, 107.0), (t - 0.6) / 0.4)
    };
    RGBColor(lerp(a.0, b.0, s), lerp(a.1, b.1, s), lerp(a.2, b.2, s))
}

fn chars(labels: &[String]) -> u32 {
    labels.iter().map(|l| l.chars().count()).max().unwrap_or(1) as u32
}

struct Layout {
    cell: u32,
    left: u32,
    top: u32,
    size: (u32, u32),
}

impl Heatmap<'_> {
    fn check(&self) -> Result<f32> {
        let rows = self.values.len();
        if rows == 0 || rows != self.row_labels.len() {
            return Err(Error::Input(format!(
                "heatmap: {rows} rows of values for {} row labels",
                self.row_labels.len()
            )));
        }
        let mut max = 0f32;
        for (r, row) in self.values.iter().enumerate() {
            if row.len() != self.col_labels.len() || row.is_empty() {
                return Err(Error::Input(format!(
                    "heatmap: row {r} has {} values for {} column labels",
                    row.len(),
                    self.col_labels.len()
                )));
            }
            for &v in row {
                if !v.is_finite() || v < 0.0 {
                    return Err(Error::Input(format!(
                        "heatmap: row {r} has the value {v}; values must be finite and ≥ 0"
                    )));
                }
                max = max.max(v);
            }
        }
        Ok(if max > 0.0 { max } else { 1.0 })
    }

    fn layout(&self) -> Layout {
        let n = self.values.len().max(self.col_labels.len()) as u32;
        let cell = if n <= 20 { 30 } else { (640 / n).max(10) };
        let left = chars(self.row_labels) * CHAR_PX + 20;
        let top = 78;
        let bottom = chars(self.col_labels) * CHAR_PX + 24;
        let grid_w = cell * self.col_labels.len() as u32;
        let grid_h = cell * self.values.len() as u32;
        let title_w = (self
            .title
            .chars()
            .count()
            .max(self.subtitle.chars().count()) as u32)
            * 10;
        let width = (left + grid_w + 110).max(title_w + 40);
        Layout {
            cell,
            left,
            top,
            size: (width, top + grid_h + bottom),
        }
    }

    /// Draws to `path`, PNG or SVG by its extension, through a temporary
    /// file renamed into place.
    pub fn save(&self, path: &Path) -> Result<()> {
        let format = ImageFormat::from_path(path)?;
        match format {
            ImageFormat::Svg => {
                let svg = self.to_svg()?;
                super::coords::write_atomically(path, svg.as_bytes())
            }
            ImageFormat::Png => {
                let vmax = self.check()?;
                register_fonts()?;
                let layout = self.layout();
                let tmp = super::coords::temp_beside(path, ".attention", ".png")?;
                {
                    let root = BitMapBackend::new(tmp.path(), layout.size).into_drawing_area();
                    self.draw(&root, &layout, vmax)
                        .and_then(|_| root.present())
                        .map_err(|e| Error::Input(format!("drawing {}: {e}", path.display())))?;
                }
                super::coords::persist(tmp, path)
            }
        }
    }

    /// The SVG text of the heatmap.
    pub fn to_svg(&self) -> Result<String> {
        let vmax = self.check()?;
        register_fonts()?;
        let layout = self.layout();
        let mut svg = String::new();
        {
            let root = SVGBackend::with_string(&mut svg, layout.size).into_drawing_area();
            self.draw(&root, &layout, vmax)
                .and_then(|_| root.present())
                .map_err(|e| Error::Input(format!("drawing the heatmap: {e}")))?;
        }
        Ok(svg)
    }

    fn draw<DB: DrawingBackend>(
        &self,
        root: &DrawingArea<DB, Shift>,
        l: &Layout,
        vmax: f32,
    ) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
        root.fill(&WHITE)?;
        let title = (FONT, 20).into_font().color(&BLACK);
        let sub = (FONT, 14).into_font().color(&RGBColor(80, 80, 80));
        root.draw(&Text::new(self.title.clone(), (12, 10), title))?;
        root.draw(&Text::new(self.subtitle.clone(), (12, 38), sub))?;
        let c = l.cell as i32;
        let (x0, y0) = (l.left as i32, l.top as i32);
        for (r, row) in self.values.iter().enumerate() {
            for (k, &v) in row.iter().enumerate() {
                let (x, y) = (x0 + k as i32 * c, y0 + r as i32 * c);
                root.draw(&Rectangle::new(
                    [(x, y), (x + c, y + c)],
                    colour((v / vmax) as f64).filled(),
                ))?;
            }
        }
        let grid_w = c * self.col_labels.len() as i32;
        let grid_h = c * self.values.len() as i32;
        root.draw(&Rectangle::new(
            [(x0, y0), (x0 + grid_w, y0 + grid_h)],
            RGBColor(120, 120, 120).stroke_width(1),
        ))?;
        let label = (FONT, LABEL_PX).into_font().color(&BLACK);
        let right = label.clone().pos(Pos::new(HPos::Right, VPos::Center));
        for (r, name) in self.row_labels.iter().enumerate() {
            root.draw(&Text::new(
                name.clone(),
                (x0 - 6, y0 + r as i32 * c + c / 2),
                right.clone(),
            ))?;
        }
        let down = label
            .transform(FontTransform::Rotate90)
            .pos(Pos::new(HPos::Left, VPos::Center));
        for (k, name) in self.col_labels.iter().enumerate() {
            root.draw(&Text::new(
                name.clone(),
                (x0 + k as i32 * c + c / 2, y0 + grid_h + 6),
                down.clone(),
            ))?;
        }
        // The colour bar: 0 at the bottom, the largest value at the top.
        let bx = x0 + grid_w + 24;
        let steps = 64;
        for s in 0..steps {
            let t = 1.0 - (s as f64 + 0.5) / steps as f64;
            let ya = y0 + grid_h * s / steps;
            let yb = y0 + grid_h * (s + 1) / steps;
            root.draw(&Rectangle::new(
                [(bx, ya), (bx + 16, yb)],
                colour(t).filled(),
            ))?;
        }
        root.draw(&Rectangle::new(
            [(bx, y0), (bx + 16, y0 + grid_h)],
            RGBColor(120, 120, 120).stroke_width(1),
        ))?;
        let tick = (FONT, 12)
            .into_font()
            .color(&BLACK)
            .pos(Pos::new(HPos::Left, VPos::Center));
        for (frac, value) in [(0.0, vmax), (0.5, vmax / 2.0), (1.0, 0.0)] {
            let y = y0 + (grid_h as f64 * frac) as i32;
            root.draw(&PathElement::new(
                vec![(bx + 16, y), (bx + 20, y)],
                BLACK.stroke_width(1),
            ))?;
            root.draw(&Text::new(
                format!("{value:.2}"),
                (bx + 23, y),
                tick.clone(),
            ))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bad_matrices_are_errors() {
        let labels = vec!["a".to_string(), "b".to_string()];
        let short = vec![vec![0.5f32]];
        let h = Heatmap {
            title: "t".into(),
            subtitle: String::new(),
            row_labels: &labels[..1],
            col_labels: &labels,
            values: &short,
        };
        assert!(h.to_svg().unwrap_err().to_string().contains("row 0"));
        let nan = vec![vec![0.5f32, f32::NAN]];
        let h = Heatmap { values: &nan, ..h };
        assert!(h.to_svg().unwrap_err().to_string().contains("finite"));
    }

    #[test]
    fn colours_run_from_white_to_dark_blue() {
        assert_eq!(colour(0.0), RGBColor(255, 255, 255));
        assert_eq!(colour(1.0), RGBColor(8, 48, 107));
    }
}
