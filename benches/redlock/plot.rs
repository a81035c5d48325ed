//! The latency distributions as an SVG: one panel per scenario, one cumulative
//! distribution per contender (latency on a log scale, percentile up the side).

use std::path::Path;

use plotters::prelude::*;

use crate::error::{BenchError, Context, CHECK_OUT_DIR};
use crate::report::Results;
use crate::stats::Summary;

const SIZE: (u32, u32) = (1400, 1000);

/// One panel: a title and the distributions it compares.
struct Panel {
    title: String,
    series: Vec<Curve>,
}

/// One contender's distribution: its label, its colour, `[quantile, µs]` points.
struct Curve {
    label: String,
    color: RGBColor,
    cdf: Vec<[f64; 2]>,
}

/// A fixed colour per contender, the same in every panel.
fn color(subject: &str) -> RGBColor {
    match subject {
        "floor" => RGBColor(0, 0, 0),
        "floor-quorum" => RGBColor(150, 150, 150),
        "ours" => RGBColor(31, 119, 180),
        "ours-polling" => RGBColor(44, 160, 44),
        "ours-defaults" => RGBColor(148, 103, 189),
        "ours-control" => RGBColor(158, 202, 225),
        "ours-fair" => RGBColor(140, 86, 75),
        "rslock" => RGBColor(214, 39, 40),
        _ => RGBColor(255, 127, 14),
    }
}

pub fn draw(results: &Results, path: &Path) -> Result<(), BenchError> {
    let panels = panels(results);
    let step = format!("drawing {}", path.display());
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).during(&step, CHECK_OUT_DIR)?;
    let (title_area, body) = root.split_vertically(40);
    title_area
        .titled(
            &format!(
                "redlock bench ({} run), {} on {}, {} cores",
                results.mode,
                results.machine.date,
                results.machine.cpu_model,
                results.machine.cores
            ),
            ("sans-serif", 20),
        )
        .during(&step, CHECK_OUT_DIR)?;
    let areas = body.split_evenly((2, 2));
    for (area, panel) in areas.iter().zip(&panels) {
        draw_panel(area, panel).during(&step, CHECK_OUT_DIR)?;
    }
    root.present().during(&step, CHECK_OUT_DIR)
}

fn panels(results: &Results) -> Vec<Panel> {
    let mut panels = Vec::new();
    for (scenario, title) in [
        ("P1", "P1 healthy, N=5: lock+unlock cycle"),
        ("P2", "P2 one node hung (SIGSTOP), N=5"),
        ("P3", "P3 one node +50 ms (proxy), N=5"),
    ] {
        let series = results
            .latency
            .iter()
            .filter(|c| c.scenario == scenario && c.nodes == 5)
            .filter_map(|c| curve(c.subject, c.label, &c.summary))
            .collect();
        panels.push(Panel {
            title: title.into(),
            series,
        });
    }
    if let Some(h) = &results.handoff {
        panels.push(Panel {
            title: format!("P4 hand-off, {} workers on one key", h.workers[0]),
            series: h
                .cases
                .iter()
                .filter(|c| c.workers == h.workers[0])
                .filter_map(|c| curve(c.subject, c.label, &c.handoff))
                .collect(),
        });
    }
    panels
}

fn curve(subject: &str, label: &str, summary: &Summary) -> Option<Curve> {
    (!summary.cdf.is_empty()).then(|| Curve {
        label: label.to_string(),
        color: color(subject),
        cdf: summary.cdf.clone(),
    })
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &Panel,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    // Latency in ms; the range covers every curve, widened a little on both sides.
    let all = panel
        .series
        .iter()
        .flat_map(|c| c.cdf.iter().map(|p| p[1] / 1000.0));
    let (lo, hi) = all.fold((f64::INFINITY, 0.0f64), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    let (lo, hi) = if lo.is_finite() && hi > 0.0 {
        (lo.max(0.001) / 1.5, hi * 1.5)
    } else {
        (0.01, 10.0)
    };
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(50)
        .build_cartesian_2d((lo..hi).log_scale(), 0.0f64..100.0)?;
    chart
        .configure_mesh()
        .x_desc("latency, ms (log scale)")
        .y_desc("percentile")
        .x_label_formatter(&|ms| format!("{ms}"))
        .y_label_formatter(&|p| format!("{p:.0}"))
        .draw()?;
    for curve in &panel.series {
        let color = curve.color;
        chart
            .draw_series(LineSeries::new(
                curve.cdf.iter().map(|p| (p[1] / 1000.0, p[0] * 100.0)),
                color.stroke_width(2),
            ))?
            .label(curve.label.as_str())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}
