//! Line charts of training curves (loss per step), as PNG or SVG.

use std::path::Path;

use plotters::prelude::*;

use super::plot::{draw_legend, label_color, register_fonts, ImageFormat, FONT};
use crate::error::{Error, Result};

/// The trailing mean of the last `window` points at every point: per-step
/// losses jump with each batch, and the trend is what a reader looks for.
pub fn moving_average(points: &[(f64, f64)], window: usize) -> Vec<(f64, f64)> {
    let window = window.max(1);
    let mut sum = 0.0;
    points
        .iter()
        .enumerate()
        .map(|(i, &(x, y))| {
            sum += y;
            if i >= window {
                sum -= points[i - window].1;
            }
            (x, sum / (i + 1).min(window) as f64)
        })
        .collect()
}

/// A smoothing window for `n` per-step points: about 40 windows per run.
pub fn smoothing_window(n: usize) -> usize {
    (n / 40).max(1)
}

/// A training-loss chart: the per-step loss, its trailing mean (see
/// [`smoothing_window`]) and the held-out loss.
pub fn plot_loss(
    path: &Path,
    title: &str,
    train_name: &str,
    train: Vec<(f64, f64)>,
    held_out_name: &str,
    held_out: Vec<(f64, f64)>,
) -> Result<()> {
    let window = smoothing_window(train.len());
    let smooth = moving_average(&train, window);
    let smooth_name = format!("{train_name}, mean of {window} steps");
    plot_curves(
        path,
        title,
        "step",
        &[
            (train_name, train),
            (smooth_name.as_str(), smooth),
            (held_out_name, held_out),
        ],
    )
}

/// Draws each named series of (x, y) points; empty series are skipped.
/// The picture is written beside `path` and renamed into place.
pub fn plot_curves(
    path: &Path,
    title: &str,
    x_desc: &str,
    series: &[(&str, Vec<(f64, f64)>)],
) -> Result<()> {
    let format = ImageFormat::from_path(path)?;
    register_fonts()?;
    let drawing_error = |e: String| Error::Input(format!("drawing {}: {e}", path.display()));
    let suffix = match format {
        ImageFormat::Png => ".png",
        ImageFormat::Svg => ".svg",
    };
    let tmp = super::coords::temp_beside(path, ".curve", suffix)?;
    let size = (900, 560);
    match format {
        ImageFormat::Png => {
            let root = BitMapBackend::new(tmp.path(), size).into_drawing_area();
            draw(&root, title, x_desc, series).map_err(|e| drawing_error(e.to_string()))?;
        }
        ImageFormat::Svg => {
            let root = SVGBackend::new(tmp.path(), size).into_drawing_area();
            draw(&root, title, x_desc, series).map_err(|e| drawing_error(e.to_string()))?;
        }
    }
    super::coords::persist(tmp, path)
}

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    x_desc: &str,
    series: &[(&str, Vec<(f64, f64)>)],
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    root.fill(&WHITE)?;
    let points = series
        .iter()
        .flat_map(|(_, s)| s.iter())
        .filter(|(x, y)| x.is_finite() && y.is_finite());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in points {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    if x1 - x0 < 1e-9 {
        x1 = x0 + 1.0;
    }
    let pad = ((y1 - y0) * 0.05).max(1e-3);
    let mut chart = ChartBuilder::on(root)
        .caption(title, (FONT, 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, (y0 - pad)..(y1 + pad))?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 15))
        .bold_line_style(RGBColor(225, 225, 225))
        .light_line_style(RGBColor(243, 243, 243))
        .draw()?;
    for (i, (name, pts)) in series
        .iter()
        .enumerate()
        .filter(|(_, (_, p))| !p.is_empty())
    {
        let color = label_color(i);
        let pts: Vec<(f64, f64)> = pts
            .iter()
            .copied()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .collect();
        chart
            .draw_series(LineSeries::new(pts.clone(), color.stroke_width(2)))?
            .label(*name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
        if pts.len() <= 50 {
            chart.draw_series(pts.iter().map(|&p| Circle::new(p, 3, color.filled())))?;
        }
    }
    draw_legend(&mut chart)?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moving_average_is_the_trailing_mean() {
        let pts: Vec<(f64, f64)> = [4.0, 2.0, 6.0, 0.0, 8.0]
            .iter()
            .enumerate()
            .map(|(i, &y)| (i as f64, y))
            .collect();
        let got: Vec<f64> = moving_average(&pts, 2).iter().map(|p| p.1).collect();
        assert_eq!(got, vec![4.0, 3.0, 4.0, 3.0, 4.0]);
        let xs: Vec<f64> = moving_average(&pts, 3).iter().map(|p| p.0).collect();
        assert_eq!(xs, vec![0.0, 1.0, 2.0, 3.0, 4.0]);
        assert_eq!(moving_average(&pts, 1), pts);
        assert_eq!(smoothing_window(10), 1);
        assert_eq!(smoothing_window(2105), 52);
    }
}
