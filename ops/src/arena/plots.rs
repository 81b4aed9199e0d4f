//! The arena's figures: per env and setting, training success (moving mean) vs step and
//! log10 gradient norm vs step; per env and ladder axis, held-out success vs the knob (ALD-1).
//! One line per method (mean over its finished seeds) with a band from the lowest to the
//! highest seed. PNG and SVG, text as `keel report` draws it (RP-2).

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::{Context, Result};
use plotters::coord::Shift;
use plotters::prelude::*;

use super::grid::Grid;
use super::ladder;
use super::table::{seeds_of, Finished};
use crate::report::PALETTE;

/// One method's line: `[x, mean, low, high]` over seeds.
type Band = Vec<[f64; 4]>;

/// `[mean, lowest, highest]` of some values (NaN mean when there are none).
pub fn spread(values: impl IntoIterator<Item = f64>) -> [f64; 3] {
    let (mut sum, mut n, mut lo, mut hi) = (0.0, 0usize, f64::INFINITY, f64::NEG_INFINITY);
    for v in values {
        (sum, n, lo, hi) = (sum + v, n + 1, lo.min(v), hi.max(v));
    }
    [sum / n as f64, lo, hi]
}

fn band(series: &[&[(u64, f64)]]) -> Band {
    let mut by_step: BTreeMap<u64, Vec<f64>> = BTreeMap::new();
    for s in series {
        for &(step, v) in *s {
            if v.is_finite() {
                by_step.entry(step).or_default().push(v);
            }
        }
    }
    by_step
        .into_iter()
        .map(|(step, v)| {
            let [mean, lo, hi] = spread(v);
            [step as f64, mean, lo, hi]
        })
        .collect()
}

/// What one figure shows.
struct Figure<'a> {
    title: &'a str,
    x_desc: &'a str,
    lines: &'a [(String, Band)],
    /// Mark each point and show the whole [0, 1] (a ladder: a few success rates).
    markers: bool,
}

fn draw<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, fig: &Figure, text: bool) -> Result<()>
where
    DB::ErrorType: 'static,
{
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| anyhow::anyhow!("{e}");
    root.fill(&WHITE).map_err(e)?;
    let lines = fig.lines;
    let pts = lines.iter().flat_map(|(_, b)| b.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::INFINITY,
        f64::NEG_INFINITY,
    );
    for &[x, _, lo, hi] in pts {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(lo), y1.max(hi));
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    if fig.markers {
        // A ladder shows a success rate: the whole [0, 1], so two ladders compare by eye.
        (y0, y1) = (y0.min(0.0), y1.max(1.0));
    }
    x1 = x1.max(x0 + 1.0);
    let pad = ((y1 - y0) * 0.05).max(1e-9);
    let mut builder = ChartBuilder::on(root);
    builder.margin(12);
    if text {
        builder
            .caption(fig.title, ("sans-serif", 20))
            .x_label_area_size(30)
            .y_label_area_size(50);
    }
    let mut chart = builder
        .build_cartesian_2d(x0..x1, (y0 - pad)..(y1 + pad))
        .map_err(e)?;
    let mut mesh = chart.configure_mesh();
    mesh.x_label_formatter(&|x| format!("{x}"));
    if text {
        mesh.x_desc(fig.x_desc);
    }
    mesh.draw().map_err(e)?;
    for (i, (name, b)) in lines.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let outline: Vec<(f64, f64)> = b
            .iter()
            .map(|p| (p[0], p[3]))
            .chain(b.iter().rev().map(|p| (p[0], p[2])))
            .collect();
        chart
            .draw_series(std::iter::once(Polygon::new(
                outline,
                color.mix(0.18).filled(),
            )))
            .map_err(e)?;
        if fig.markers {
            chart
                .draw_series(
                    b.iter()
                        .map(|p| Circle::new((p[0], p[1]), 4, color.filled())),
                )
                .map_err(e)?;
        }
        let series = chart
            .draw_series(LineSeries::new(
                b.iter().map(|p| (p[0], p[1])),
                color.stroke_width(2),
            ))
            .map_err(e)?;
        if text {
            series.label(name.clone()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
        }
    }
    if text && !lines.is_empty() {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(e)?;
    }
    root.present().map_err(e)?;
    Ok(())
}

fn write(dir: &Path, stem: &str, fig: &Figure, text: bool) -> Result<()> {
    let png = dir.join(format!("{stem}.png"));
    draw(
        &BitMapBackend::new(&png, (900, 500)).into_drawing_area(),
        fig,
        text,
    )
    .with_context(|| format!("cannot draw {}", png.display()))?;
    let svg = dir.join(format!("{stem}.svg"));
    draw(
        &SVGBackend::new(&svg, (900, 500)).into_drawing_area(),
        fig,
        text,
    )
    .with_context(|| format!("cannot draw {}", svg.display()))?;
    Ok(())
}

/// Writes `<env>.<setting>.success`, `<env>.<setting>.grad_norm` and `<env>.ladder.<axis>`
/// (PNG + SVG) into `dir`.
pub fn write_all(grid: &Grid, done: &Finished, dir: &Path, text: bool) -> Result<usize> {
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let mut figures = 0;
    for env in &grid.envs {
        for &setting in &grid.settings {
            let (mut success, mut grad) = (Vec::new(), Vec::new());
            for m in grid.methods.iter().filter(|m| m.envs.contains(env)) {
                let seeds = seeds_of(grid, done, m.name(), env, setting);
                if seeds.is_empty() {
                    continue;
                }
                let s: Vec<&[(u64, f64)]> = seeds.iter().map(|c| c.success.as_slice()).collect();
                success.push((m.name().to_string(), band(&s)));
                let logs: Vec<Vec<(u64, f64)>> = seeds
                    .iter()
                    .map(|c| {
                        c.grad_norm
                            .iter()
                            .map(|&(k, g)| (k, g.max(1e-12).log10()))
                            .collect()
                    })
                    .collect();
                let g: Vec<&[(u64, f64)]> = logs.iter().map(Vec::as_slice).collect();
                grad.push((m.name().to_string(), band(&g)));
            }
            let key = format!("{env}.{}", setting.name());
            let title = format!("{env} ({}): training success, moving mean", setting.name());
            let fig = Figure {
                title: &title,
                x_desc: "step",
                lines: &success,
                markers: false,
            };
            write(dir, &format!("{key}.success"), &fig, text)?;
            let title = format!("{env} ({}): log10 gradient norm", setting.name());
            let fig = Figure {
                title: &title,
                lines: &grad,
                ..fig
            };
            write(dir, &format!("{key}.grad_norm"), &fig, text)?;
            figures += 2;
        }
        for axis in grid.ladder_axes() {
            let lines = ladder::lines(grid, done, env, axis);
            let title = format!("{env}: held-out success against the {}", axis.label());
            let fig = Figure {
                title: &title,
                x_desc: axis.label(),
                lines: &lines,
                markers: true,
            };
            write(dir, &format!("{env}.ladder.{}", axis.key()), &fig, text)?;
            figures += 1;
        }
    }
    Ok(figures)
}
