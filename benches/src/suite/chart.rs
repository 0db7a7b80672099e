//! The PNG of `sluice-bench suite --png`: a bar chart of rows/s per system, on a log scale.

use std::path::Path;
use std::sync::OnceLock;

use plotters::coord::ranged1d::SegmentValue;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use plotters::style::{FontStyle, register_font};

use crate::error::{BenchError, Result};

/// The font the chart's text is drawn with.
pub const FONT_PATH: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
/// The chart's size in pixels.
pub const CHART_SIZE: (u32, u32) = (1200, 600);
/// The family name the font is registered under.
const FAMILY: &str = "sans-serif";

/// Loads [`FONT_PATH`] once per process and registers it with plotters.
fn load_font() -> Result<()> {
    static LOADED: OnceLock<std::result::Result<(), String>> = OnceLock::new();
    LOADED
        .get_or_init(|| {
            let bytes = std::fs::read(FONT_PATH).map_err(|error| {
                format!(
                    "the chart's font {FONT_PATH}: {error}; install the Debian package fonts-dejavu-core \
                     (apt-get install fonts-dejavu-core)"
                )
            })?;
            // plotters keeps registered fonts for the life of the process, so it takes them as
            // 'static; the font is read once, by the OnceLock.
            let bytes: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            register_font(FAMILY, FontStyle::Normal, bytes)
                .map_err(|_| format!("the chart's font {FONT_PATH} is not a font plotters can read; reinstall fonts-dejavu-core"))
        })
        .clone()
        .map_err(|reason| BenchError::Chart { reason })
}

/// Draws one bar per `(name, rows/s)` to a PNG at `path`.
///
/// # Errors
///
/// Returns [`BenchError::Chart`] when the font is missing, a figure is not positive, or the file
/// cannot be written.
pub fn draw_rows_per_s(path: &Path, title: &str, bars: &[(String, f64)]) -> Result<()> {
    if let Some((name, value)) = bars
        .iter()
        .find(|(_, value)| !(value.is_finite() && *value > 0.0))
    {
        return Err(BenchError::Chart {
            reason: format!("{name} has {value} rows/s, which a log scale cannot show"),
        });
    }
    if bars.is_empty() {
        return Err(BenchError::Chart {
            reason: "no system to draw".to_owned(),
        });
    }
    load_font()?;
    let failed = |error: &dyn std::fmt::Display| BenchError::Chart {
        reason: format!("drawing {}: {error}", path.display()),
    };
    let lowest = bars
        .iter()
        .map(|(_, value)| *value)
        .fold(f64::MAX, f64::min);
    let highest = bars.iter().map(|(_, value)| *value).fold(0.0, f64::max);
    let floor = 10f64.powf(lowest.log10().floor());
    let ceiling = 10f64.powf(highest.log10().ceil()).max(floor * 10.0);
    let root = BitMapBackend::new(path, CHART_SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(|error| failed(&error))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, (FAMILY, 22))
        .margin(20)
        .x_label_area_size(60)
        .y_label_area_size(90)
        .build_cartesian_2d(
            // An integer range holds its end: the last bar is the segment of `len - 1`.
            (0..bars.len().saturating_sub(1)).into_segmented(),
            (floor..ceiling).log_scale(),
        )
        .map_err(|error| failed(&error))?;
    let label = |value: &SegmentValue<usize>| match value {
        SegmentValue::CenterOf(index) | SegmentValue::Exact(index) => bars
            .get(*index)
            .map(|(name, _)| name.clone())
            .unwrap_or_default(),
        SegmentValue::Last => String::new(),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(bars.len())
        .x_label_formatter(&label)
        .y_desc("rows/s (log scale)")
        .y_label_formatter(&|value| format!("{value:.0e}"))
        .label_style((FAMILY, 14))
        .draw()
        .map_err(|error| failed(&error))?;
    chart
        .draw_series(bars.iter().enumerate().map(|(index, (_, value))| {
            let mut bar = Rectangle::new(
                [
                    (SegmentValue::Exact(index), floor),
                    (SegmentValue::Exact(index + 1), *value),
                ],
                BLUE.mix(0.6).filled(),
            );
            bar.set_margin(0, 0, 12, 12);
            bar
        }))
        .map_err(|error| failed(&error))?;
    chart
        .draw_series(bars.iter().enumerate().map(|(index, (_, value))| {
            Text::new(
                format!("{:.3} M", value / 1e6),
                (SegmentValue::CenterOf(index), *value),
                TextStyle::from((FAMILY, 14).into_font()).pos(Pos::new(HPos::Center, VPos::Bottom)),
            )
        }))
        .map_err(|error| failed(&error))?;
    root.present().map_err(|error| failed(&error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_is_a_png_of_the_chart_size() {
        let directory = tempfile::tempdir().expect("tempdir");
        let path = directory.path().join("chart.png");
        let bars = vec![("sluice".to_owned(), 2.5e6), ("pyarrow".to_owned(), 9e6)];
        draw_rows_per_s(&path, "rows/s", &bars).expect("drawn");
        let bytes = std::fs::read(&path).expect("read");
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        let width = u32::from_be_bytes(bytes[16..20].try_into().expect("4 bytes"));
        let height = u32::from_be_bytes(bytes[20..24].try_into().expect("4 bytes"));
        assert_eq!((width, height), CHART_SIZE);
    }

    #[test]
    fn a_figure_a_log_scale_cannot_show_is_refused() {
        let directory = tempfile::tempdir().expect("tempdir");
        let error = draw_rows_per_s(
            &directory.path().join("chart.png"),
            "rows/s",
            &[("ray_data".to_owned(), 0.0)],
        )
        .expect_err("zero rows/s");
        assert!(error.to_string().contains("ray_data"), "{error}");
    }
}
