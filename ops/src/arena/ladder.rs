//! The ladders: held-out success against one knob (staleness bound, mini-batches per batch,
//! learning-rate factor), one line per method, the control being every ladder's origin (AGR-4).
//! This is the comparison SAO and SORL make claims about: which method keeps its success as the
//! samples get staler.
//!
//! Invariant: ALD-1: a ladder point is the held-out success of a method's finished seeds at one
//! rung (or at the control), drawn as the mean with a band from the lowest to the highest seed;
//! its Δ against the baseline is the paired comparison at that same rung (AST-3). A rung without
//! a finished seed shows a dash and draws no point; a method that skips an axis has no line.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::grid::{Axis, Grid, Setting};
use super::plots::spread;
use super::stats::{compare_seeds, mean_ci};
use super::table::{held_out, with_ci, Finished};

/// One point of a method's ladder.
pub struct Point {
    /// The knob's value (the control's own value at the control).
    pub x: f64,
    /// The control or the rung.
    pub setting: Setting,
    /// Held-out success of each finished seed (a collapsed seed has none).
    pub by_seed: BTreeMap<u64, f64>,
}

/// The settings on `axis`: the control, then the axis's rungs by value.
fn settings_on(grid: &Grid, axis: Axis) -> Vec<Setting> {
    std::iter::once(Setting::Control)
        .chain(
            grid.settings
                .iter()
                .copied()
                .filter(|s| s.rung().map(|r| r.0) == Some(axis)),
        )
        .collect()
}

/// `method`'s ladder on `env` along `axis`, by x; empty when it skips the axis.
pub fn points(grid: &Grid, done: &Finished, method: &str, env: &str, axis: Axis) -> Vec<Point> {
    let mut out: Vec<Point> = Vec::new();
    for setting in settings_on(grid, axis) {
        let Some(first) = grid
            .cells
            .iter()
            .find(|c| c.method == method && c.env == env && c.setting == setting)
        else {
            continue;
        };
        out.push(Point {
            x: first.knobs.on(axis),
            setting,
            by_seed: held_out(grid, done, method, env, setting),
        });
    }
    if out.len() < 2 {
        return Vec::new(); // the control alone is no ladder
    }
    out.sort_by(|a, b| a.x.total_cmp(&b.x));
    out
}

/// One line per method for the ladder plot: `(x, mean, lowest, highest)` over seeds.
pub fn lines(grid: &Grid, done: &Finished, env: &str, axis: Axis) -> Vec<(String, Vec<[f64; 4]>)> {
    grid.methods
        .iter()
        .filter(|m| m.envs.iter().any(|e| e == env))
        .filter_map(|m| {
            let pts: Vec<[f64; 4]> = points(grid, done, m.name(), env, axis)
                .iter()
                .filter(|p| !p.by_seed.is_empty())
                .map(|p| {
                    let [mean, lo, hi] = spread(p.by_seed.values().copied());
                    [p.x, mean, lo, hi]
                })
                .collect();
            (!pts.is_empty()).then(|| (m.name().to_string(), pts))
        })
        .collect()
}

/// A verdict's first word (`same`, `better`, `worse`), for the ladder's narrow columns.
fn short(word: &str) -> &str {
    word.split(' ').next().unwrap_or(word)
}

/// A column's head: the rung's value, or the control with its own value on the axis (that of
/// the env's first control cell).
fn column_name(grid: &Grid, env: &str, axis: Axis, s: Setting) -> String {
    let control = grid
        .cells
        .iter()
        .find(|c| c.env == env && c.setting == Setting::Control)
        .map(|c| c.knobs.on(axis));
    match (s.rung(), control) {
        (Some((_, v)), _) => format!("{v}"),
        (None, _) if axis == Axis::Staleness => "control (sync)".into(),
        (None, Some(x)) => format!("control ({x})"),
        (None, None) => "control".into(),
    }
}

/// The ladder section of `env` in table.md: per axis, held-out success by rung and each
/// method's paired Δ against its baseline (ALD-1); empty without rungs.
pub fn markdown(grid: &Grid, done: &Finished, env: &str) -> String {
    let mut md = String::new();
    let methods: Vec<&str> = grid
        .methods
        .iter()
        .filter(|m| m.envs.iter().any(|e| e == env))
        .map(|m| m.name())
        .collect();
    for axis in grid.ladder_axes() {
        let cols = settings_on(grid, axis);
        let head: Vec<String> = cols
            .iter()
            .map(|s| column_name(grid, env, axis, *s))
            .collect();
        let _ = writeln!(
            md,
            "## {env}: held-out success against the {}\n\n| method | {} |\n|---|{}",
            axis.label(),
            head.join(" | "),
            "---|".repeat(cols.len())
        );
        let ladder = |m: &str| -> BTreeMap<Setting, BTreeMap<u64, f64>> {
            points(grid, done, m, env, axis)
                .into_iter()
                .map(|p| (p.setting, p.by_seed))
                .collect()
        };
        for m in &methods {
            let l = ladder(m);
            let row: Vec<String> = cols
                .iter()
                .map(|s| match l.get(s) {
                    Some(v) if !v.is_empty() => {
                        with_ci(mean_ci(&v.values().copied().collect::<Vec<_>>()))
                    }
                    _ => "—".into(),
                })
                .collect();
            let _ = writeln!(md, "| {m} | {} |", row.join(" | "));
        }
        let pairs: Vec<(&str, &str)> = methods
            .iter()
            .filter_map(|m| grid.baseline_of(m).map(|b| (*m, b)))
            .collect();
        if !pairs.is_empty() {
            let _ = writeln!(
                md,
                "\n| Δ against the baseline | {} |\n|---|{}",
                head.join(" | "),
                "---|".repeat(cols.len())
            );
            for (m, b) in pairs {
                let (lm, lb) = (ladder(m), ladder(b));
                let row: Vec<String> = cols
                    .iter()
                    .map(|s| match (lm.get(s), lb.get(s)) {
                        (Some(x), Some(y)) => compare_seeds(x, y).map_or("—".into(), |c| {
                            format!(
                                "{:+.3} ± {:.3} {}",
                                c.delta,
                                c.half,
                                short(c.verdict.word())
                            )
                        }),
                        _ => "—".into(),
                    })
                    .collect();
                let _ = writeln!(md, "| {m} − {b} | {} |", row.join(" | "));
            }
        }
        let _ = writeln!(md, "\n![ladder](plots/{env}.ladder.{}.png)\n", axis.key());
    }
    md
}

#[cfg(test)]
mod tests {
    use super::super::grid;
    use super::super::stats::CellStats;
    use super::*;

    const GRID: &str = r#"
[arena]
seeds = [1, 2, 3]
steps = 4
[ladder]
staleness = [2, 8]
[envs.calc]
env = { name = "calc" }
[[methods]]
preset = "grpo"
envs = ["calc"]
[[methods]]
preset = "sao"
envs = ["calc"]
baseline = "grpo"
"#;

    /// ALD-1: points by knob value with the control at 0, the paired Δ per rung, dashes where
    /// nothing finished.
    #[test]
    fn ald1_ladder_points_table_and_paired_deltas() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("g.toml");
        std::fs::write(&path, GRID).expect("write");
        let g = grid::load(&path, None).expect("grid");
        // grpo loses 0.1 per staleness rung on every seed; sao loses nothing; sao's stale8
        // did not finish.
        let mut done = Finished::new();
        for c in &g.cells {
            let rung = match c.setting.name().as_str() {
                "control" => 0.0,
                "stale2" => 1.0,
                _ => 2.0,
            };
            if c.method == "sao" && rung == 2.0 {
                continue;
            }
            let base = 0.5 + 0.1 * c.seed as f64;
            let after = if c.method == "grpo" {
                base - 0.1 * rung
            } else {
                base
            };
            done.insert(
                c.name.clone(),
                CellStats {
                    after,
                    ..CellStats::default()
                },
            );
        }
        let pts = points(&g, &done, "grpo", "calc", Axis::Staleness);
        let xs: Vec<f64> = pts.iter().map(|p| p.x).collect();
        assert_eq!(xs, [0.0, 2.0, 8.0]);
        assert_eq!(pts[2].by_seed.len(), 3);
        let md = markdown(&g, &done, "calc");
        assert!(md.contains("| method | control (sync) | 2 | 8 |"), "{md}");
        assert!(md.contains("| grpo | 0.700 ± "), "{md}");
        assert!(
            md.contains("| sao | 0.700 ± 0.248 | 0.700 ± 0.248 | — |"),
            "{md}"
        );
        // Paired: the per-seed differences are exactly 0.1, so the interval is 0 wide.
        assert!(
            md.contains("| sao − grpo | +0.000 ± 0.000 same | +0.100 ± 0.000 better | — |"),
            "{md}"
        );
        let lines = lines(&g, &done, "calc", Axis::Staleness);
        assert_eq!(lines.len(), 2);
        assert_eq!(lines[1].1.len(), 2, "sao's unfinished rung draws no point");
    }
}
