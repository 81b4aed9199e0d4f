//! `keel report RUN`: PNG and SVG plots of a run's training curves (one line per branch) and a
//! markdown summary, from the run's metrics log (`keel_actors::jsonl::read_log`).
//!
//! Invariants:
//! - RP-1: the report reads only the metrics log (the serialised `TrainEvent`s); it never needs
//!   the checkpoints, so it works on a run that is still going or has crashed.
//! - RP-2: text (titles, axis labels, legends) is drawn only with a font found at run time
//!   (`KEEL_REPORT_FONT`, then common system paths; `scripts/setup.sh` installs DejaVu); without
//!   one the plots are drawn without text and the summary says so. A headless machine never fails
//!   for lack of fonts.
//! - RP-3: a step of one branch is one point; steps are plotted in log order, so a rewound branch
//!   starts at its rewind step.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use keel_actors::events::{LoggedEvent, MethodDetail, TrainEvent};
use plotters::coord::Shift;
use plotters::prelude::*;

/// The curves of the report: (file stem, title, how to read the value from a `step` event).
pub const CURVES: &[(&str, &str)] = &[
    ("success", "rollout success rate"),
    ("reward", "mean reward"),
    ("grad_norm", "gradient norm (pre-clip)"),
    ("kl", "approx KL (behaviour -> current)"),
    ("clip_frac", "PPO clip fraction"),
    ("entropy", "token entropy"),
    ("staleness", "max policy-version lag"),
    ("kl_ref", "KL to the reference (k3)"),
];

/// Points of one curve, by branch: `(step, value)` in log order.
pub type Curve = BTreeMap<String, Vec<(u64, f64)>>;

/// One held-out evaluation (EV-5).
#[derive(Debug, Clone, PartialEq)]
pub struct EvalRow {
    /// `before_rl` or `after_rl`.
    pub phase: String,
    /// The policy version evaluated.
    pub version: u64,
    /// pass@1: one greedy episode per task.
    pub pass_at_1: f64,
    /// avg@k: the mean success of k sampled episodes per task.
    pub avg_at_k: Option<f64>,
    /// k.
    pub samples: u64,
}

/// Everything the report shows.
#[derive(Debug, Default)]
pub struct RunLog {
    /// Curves by stem (see `CURVES`).
    pub curves: BTreeMap<String, Curve>,
    /// Branches in the order their first step was logged (a rewind's branch after the one it
    /// left).
    pub branches: Vec<String>,
    /// Wall-clock seconds of the logged history: the sum over trainer lives of each life's
    /// last `elapsed_s` (JL-3).
    pub wall_seconds: f64,
    /// Held-out evaluations, in log order.
    pub evals: Vec<EvalRow>,
    /// Rewinds: `(from_step, to_step, branch, reason)`.
    pub rewinds: Vec<(u64, u64, String, String)>,
    /// Non-finite skips.
    pub skips: u64,
    /// Checkpoints committed.
    pub checkpoints: u64,
    /// Dropped batches.
    pub dropped: u64,
    /// Lines that were not JSON events.
    pub bad_lines: u64,
    /// What the method runtimes did (from `method` events).
    pub methods: MethodTotals,
    /// Stored rollout batches (from `rollout` events).
    pub rollouts: RolloutTotals,
}

/// Totals of the `rollout` events.
#[derive(Debug, Default, PartialEq)]
pub struct RolloutTotals {
    /// Batches stored.
    pub batches: u64,
    /// Episodes in them.
    pub episodes: u64,
    /// Episodes that failed in their env while they were sampled (never trained).
    pub failed_episodes: u64,
    /// Seconds spent sampling them (summed over generators).
    pub sample_seconds: f64,
    /// Sampler decode steps.
    pub decode_steps: u64,
    /// Of those, steps with at least 90% of the slots busy.
    pub busy_decode_steps: u64,
}

/// Totals of the `method` events: dynamic sampling, RTPO, PATS, ARMOR.
#[derive(Debug, Default, PartialEq)]
pub struct MethodTotals {
    /// Generations that re-rolled groups, and the rollout passes they took.
    pub rerolled_batches: u64,
    /// Rollout passes of those generations.
    pub reroll_passes: u64,
    /// Groups still uniform after the last pass, summed.
    pub uniform_groups_left: u64,
    /// RTPO depths trained.
    pub rtpo_depths: u64,
    /// RTPO trees completed.
    pub rtpo_trees: u64,
    /// PATS reviews, and the last bank version seen.
    pub pats_reviews: u64,
    /// Last PATS bank version.
    pub pats_version: u64,
    /// Training prompt tokens of PATS generations, and of those the scaffold's.
    pub prompt_tokens: u64,
    /// Scaffold tokens among `prompt_tokens`.
    pub scaffold_tokens: u64,
    /// ARMOR reference resets (their steps).
    pub reference_resets: Vec<u64>,
}

/// Parses the metrics log as JSONL text (RP-1, RP-3): every line read as a `TrainEvent`
/// (EVT-1); a line that is not JSON is counted as bad, one of an unknown event is skipped.
pub fn parse_log(text: &str) -> RunLog {
    let mut log = RunLog::default();
    let mut life_elapsed = 0.0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Ok(read) = LoggedEvent::parse(line) else {
            log.bad_lines += 1;
            continue;
        };
        if let Some(t) = read.elapsed_s {
            // A life's clock starts at 0: a smaller value than the last one is a new life.
            if t < life_elapsed {
                log.wall_seconds += life_elapsed;
            }
            life_elapsed = t;
        }
        if let Some(ev) = &read.event {
            note_event(&mut log, ev);
        }
    }
    log.wall_seconds += life_elapsed;
    log
}

/// Adds one event to the report's totals and curves.
fn note_event(log: &mut RunLog, ev: &TrainEvent) {
    match ev {
        TrainEvent::Step { .. } => note_step(log, ev),
        TrainEvent::Eval {
            phase,
            version,
            success,
            avg_at_k,
            samples,
            ..
        } => log.evals.push(EvalRow {
            phase: or_unknown(phase),
            version: *version,
            pass_at_1: *success,
            avg_at_k: *avg_at_k,
            samples: *samples as u64,
        }),
        TrainEvent::Rewind {
            from_step,
            to_step,
            branch,
            reason,
            ..
        } => log
            .rewinds
            .push((*from_step, *to_step, or_unknown(branch), or_unknown(reason))),
        TrainEvent::Method { method, detail, .. } => note_method(&mut log.methods, method, detail),
        TrainEvent::Rollout {
            episodes,
            failed_episodes,
            sample_seconds,
            decode_steps,
            busy_decode_steps,
            ..
        } => {
            let r = &mut log.rollouts;
            r.batches += 1;
            r.episodes += *episodes as u64;
            r.failed_episodes += *failed_episodes as u64;
            r.sample_seconds += finite_or_zero(*sample_seconds);
            r.decode_steps += decode_steps;
            r.busy_decode_steps += busy_decode_steps;
        }
        TrainEvent::Skipped { .. } => log.skips += 1,
        TrainEvent::Checkpoint { .. } => log.checkpoints += 1,
        TrainEvent::Dropped { .. } => log.dropped += 1,
        // Stored batches a resume could not reuse: the run's printed total counts them.
        TrainEvent::Resumed {
            dropped_batches, ..
        } => log.dropped += *dropped_batches as u64,
        TrainEvent::SftDone { .. } => {}
    }
}

/// `text`, or `?` when the log did not say (EVT-2 reads a missing text as empty).
fn or_unknown(text: &str) -> String {
    if text.is_empty() { "?" } else { text }.to_string()
}

fn finite_or_zero(x: f64) -> f64 {
    if x.is_nan() {
        0.0
    } else {
        x
    }
}

/// The curves' points of a step event, on its branch (`main` when the log does not say).
fn note_step(log: &mut RunLog, ev: &TrainEvent) {
    let TrainEvent::Step {
        step,
        metrics: m,
        success,
        reward,
        max_lag,
        branch,
        ..
    } = ev
    else {
        return;
    };
    let branch = if branch.is_empty() { "main" } else { branch };
    let reward = if reward.is_nan() {
        m.mean_reward
    } else {
        *reward
    };
    let values = [
        ("success", *success),
        ("reward", reward),
        ("grad_norm", m.grad_norm),
        ("kl", m.approx_kl),
        ("clip_frac", m.clip_frac),
        ("entropy", m.entropy),
        ("staleness", *max_lag as f64),
        ("kl_ref", m.kl_ref),
    ];
    if !log.branches.iter().any(|b| b == branch) {
        log.branches.push(branch.to_string());
    }
    for (stem, x) in values.into_iter().filter(|(_, x)| x.is_finite()) {
        log.curves
            .entry(stem.to_string())
            .or_default()
            .entry(branch.to_string())
            .or_default()
            .push((*step, x));
    }
}

/// One curve along the history that survived: the branches' points in branch order, a later
/// branch's step replacing an earlier one's (a rewind retrains the steps it went back over).
pub fn head_series(log: &RunLog, stem: &str) -> Vec<(u64, f64)> {
    let mut by_step = BTreeMap::new();
    if let Some(curve) = log.curves.get(stem) {
        for branch in &log.branches {
            for &(step, v) in curve.get(branch).into_iter().flatten() {
                by_step.insert(step, v);
            }
        }
    }
    by_step.into_iter().collect()
}

/// Registers a system font for plot text (RP-2); true when one was found.
pub fn load_font() -> bool {
    let mut candidates: Vec<PathBuf> = std::env::var_os("KEEL_REPORT_FONT")
        .map(PathBuf::from)
        .into_iter()
        .collect();
    candidates.extend(
        [
            "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/TTF/DejaVuSans.ttf",
            "/usr/share/fonts/dejavu/DejaVuSans.ttf",
            "/usr/share/fonts/truetype/liberation/LiberationSans-Regular.ttf",
            "/usr/share/fonts/liberation-sans/LiberationSans-Regular.ttf",
        ]
        .map(PathBuf::from),
    );
    for path in candidates {
        if let Ok(bytes) = std::fs::read(&path) {
            let leaked: &'static [u8] = Box::leak(bytes.into_boxed_slice());
            if plotters::style::register_font("sans-serif", FontStyle::Normal, leaked).is_ok() {
                return true;
            }
        }
    }
    false
}

/// Line colours of every plot keel draws.
pub const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(255, 127, 14),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

fn draw<DB: DrawingBackend>(
    root: &DrawingArea<DB, Shift>,
    title: &str,
    curve: &Curve,
    text: bool,
) -> Result<()>
where
    DB::ErrorType: 'static,
{
    root.fill(&WHITE).map_err(|e| anyhow::anyhow!("{e}"))?;
    let points = curve.values().flatten();
    let (mut x0, mut x1, mut y0, mut y1) = (u64::MAX, 0u64, f64::INFINITY, f64::NEG_INFINITY);
    for &(x, y) in points {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0, 1, 0.0, 1.0);
    }
    if x1 == x0 {
        x1 = x0 + 1;
    }
    let pad = ((y1 - y0) * 0.05).max(1e-9);
    let (y0, y1) = (y0 - pad, y1 + pad);
    let mut builder = ChartBuilder::on(root);
    builder.margin(12);
    if text {
        builder
            .caption(title, ("sans-serif", 20))
            .x_label_area_size(30)
            .y_label_area_size(50);
    }
    let mut chart = builder
        .build_cartesian_2d(x0..x1, y0..y1)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    let mut mesh = chart.configure_mesh();
    if text {
        mesh.x_desc("step");
    }
    // Without text there are no label areas, so plotters draws the grid but no tick labels.
    mesh.draw().map_err(|e| anyhow::anyhow!("{e}"))?;
    for (i, (branch, pts)) in curve.iter().enumerate() {
        let color = PALETTE[i % PALETTE.len()];
        let series = chart
            .draw_series(LineSeries::new(pts.iter().copied(), color.stroke_width(2)))
            .map_err(|e| anyhow::anyhow!("{e}"))?;
        if text {
            series.label(branch.clone()).legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
            });
        }
    }
    if text && !curve.is_empty() {
        chart
            .configure_series_labels()
            .background_style(WHITE.mix(0.8))
            .border_style(BLACK)
            .draw()
            .map_err(|e| anyhow::anyhow!("{e}"))?;
    }
    root.present().map_err(|e| anyhow::anyhow!("{e}"))?;
    Ok(())
}

/// Writes `<stem>.png` and `<stem>.svg` of one curve into `dir`.
pub fn plot_curve(dir: &Path, stem: &str, title: &str, curve: &Curve, text: bool) -> Result<()> {
    let png = dir.join(format!("{stem}.png"));
    draw(
        &BitMapBackend::new(&png, (900, 500)).into_drawing_area(),
        title,
        curve,
        text,
    )
    .with_context(|| format!("cannot draw {}", png.display()))?;
    let svg = dir.join(format!("{stem}.svg"));
    draw(
        &SVGBackend::new(&svg, (900, 500)).into_drawing_area(),
        title,
        curve,
        text,
    )
    .with_context(|| format!("cannot draw {}", svg.display()))?;
    Ok(())
}

fn last_mean(pts: &[(u64, f64)], n: usize) -> f64 {
    let tail = &pts[pts.len().saturating_sub(n)..];
    tail.iter().map(|p| p.1).sum::<f64>() / tail.len().max(1) as f64
}

/// Adds one method event (`method`, its record `d`, EVT-3) to the totals.
fn note_method(m: &mut MethodTotals, method: &str, d: &MethodDetail) {
    match method {
        "generate" => {
            if let Some(tries) = d.tries.filter(|&t| t > 1) {
                m.rerolled_batches += 1;
                m.reroll_passes += tries;
            }
            m.uniform_groups_left += d.uniform_groups.unwrap_or(0);
            m.prompt_tokens += d.prompt_tokens.unwrap_or(0);
            m.scaffold_tokens += d.scaffold_tokens.unwrap_or(0);
        }
        "rtpo" => {
            m.rtpo_depths += 1;
            if d.depth.zip(d.depths).is_some_and(|(k, n)| k + 1 == n) {
                m.rtpo_trees += 1;
            }
        }
        "pats" => {
            m.pats_reviews += 1;
            m.pats_version = m.pats_version.max(d.version.unwrap_or(0));
        }
        "armor" => m.reference_resets.extend(d.reference_reset_at),
        _ => {}
    }
}

/// The "Rollouts" section of the summary (empty when no rollout event was logged).
fn rollouts_markdown(r: &RolloutTotals) -> String {
    if r.batches == 0 {
        return String::new();
    }
    let utilization = if r.decode_steps > 0 {
        format!(
            "{:.3} ({} of {} decode steps had at least 90% of the sampler's slots busy)",
            r.busy_decode_steps as f64 / r.decode_steps as f64,
            r.busy_decode_steps,
            r.decode_steps
        )
    } else {
        "- (no decode step)".into()
    };
    let failed = match r.failed_episodes {
        0 => String::new(),
        n => format!("{n} more episodes failed in their env and were not trained.\n\n"),
    };
    format!(
        "## Rollouts\n\n| batches stored | episodes | mean sampling seconds per batch | sampler utilisation |\n| --- | --- | --- | --- |\n| {} | {} | {:.2} | {} |\n\n{failed}",
        r.batches,
        r.episodes,
        r.sample_seconds / r.batches as f64,
        utilization
    )
}

/// The "Methods" section of the summary (empty when no method event was logged).
fn methods_markdown(m: &MethodTotals) -> String {
    let mut rows = Vec::new();
    if m.rerolled_batches > 0 || m.uniform_groups_left > 0 {
        rows.push(format!(
            "| dynamic sampling | {} batches re-rolled uniform groups ({} rollout passes); {} groups still uniform after the last pass |",
            m.rerolled_batches, m.reroll_passes, m.uniform_groups_left
        ));
    }
    if m.rtpo_depths > 0 {
        rows.push(format!(
            "| RTPO | {} depths trained, {} reverse trees completed |",
            m.rtpo_depths, m.rtpo_trees
        ));
    }
    if m.pats_reviews > 0 || m.scaffold_tokens > 0 {
        let share = m.scaffold_tokens as f64 / (m.prompt_tokens.max(1)) as f64;
        rows.push(format!(
            "| PATS | {} reviews, bank version {}; the scaffold was {} of {} training prompt tokens ({:.1}%), evaluation prompts carry none: {:.1}% fewer prompt tokens at deployment |",
            m.pats_reviews, m.pats_version, m.scaffold_tokens, m.prompt_tokens, 100.0 * share, 100.0 * share
        ));
    }
    if !m.reference_resets.is_empty() {
        rows.push(format!(
            "| ARMOR | reference reset at steps {:?} |",
            m.reference_resets
        ));
    }
    if rows.is_empty() {
        return String::new();
    }
    format!(
        "## Methods\n\n| method | what its runtime did |\n| --- | --- |\n{}\n\n",
        rows.join("\n")
    )
}

/// The markdown summary.
pub fn summary_markdown(run_root: &str, log: &RunLog, text: bool) -> String {
    let mut md = format!("# keel run report\n\nRun root: `{run_root}`\n\n");
    let branches: Vec<&String> = log
        .curves
        .get("success")
        .map(|c| c.keys().collect())
        .unwrap_or_default();
    md.push_str(&format!(
        "Branches: {}. Checkpoints: {}. Non-finite steps skipped: {}. Batches dropped: {}. Rewinds: {}.\n\n",
        if branches.is_empty() { "none".to_string() } else { branches.iter().map(|b| format!("`{b}`")).collect::<Vec<_>>().join(", ") },
        log.checkpoints,
        log.skips,
        log.dropped,
        log.rewinds.len()
    ));
    if !log.evals.is_empty() {
        md.push_str(
            "## Held-out evaluation\n\n| phase | policy version | pass@1 (greedy) | avg@k (sampled) |\n| --- | --- | --- | --- |\n",
        );
        for e in &log.evals {
            let sampled = e
                .avg_at_k
                .map_or("-".to_string(), |a| format!("{a:.3} (k = {})", e.samples));
            md.push_str(&format!(
                "| {} | {} | {:.3} | {sampled} |\n",
                e.phase, e.version, e.pass_at_1
            ));
        }
        md.push('\n');
    }
    md.push_str(&rollouts_markdown(&log.rollouts));
    md.push_str(&methods_markdown(&log.methods));
    if !log.rewinds.is_empty() {
        md.push_str("## Collapse guard rewinds\n\n| at step | back to step | new branch | reason |\n| --- | --- | --- | --- |\n");
        for (from, to, branch, reason) in &log.rewinds {
            md.push_str(&format!("| {from} | {to} | `{branch}` | {reason} |\n"));
        }
        md.push('\n');
    }
    md.push_str("## Last 10 steps per branch (mean)\n\n| branch | steps | ");
    md.push_str(
        &CURVES
            .iter()
            .map(|(s, _)| *s)
            .collect::<Vec<_>>()
            .join(" | "),
    );
    md.push_str(" |\n| --- | --- |");
    md.push_str(&" --- |".repeat(CURVES.len()));
    md.push('\n');
    for b in &branches {
        let steps = log
            .curves
            .get("success")
            .and_then(|c| c.get(*b))
            .map_or(0, Vec::len);
        md.push_str(&format!("| `{b}` | {steps} |"));
        for (stem, _) in CURVES {
            match log.curves.get(*stem).and_then(|c| c.get(*b)) {
                Some(pts) if !pts.is_empty() => {
                    md.push_str(&format!(" {:.4} |", last_mean(pts, 10)))
                }
                _ => md.push_str(" - |"),
            }
        }
        md.push('\n');
    }
    md.push_str("\n## Curves\n\n");
    for (stem, title) in CURVES {
        md.push_str(&format!(
            "### {title}\n\n![{title}]({stem}.png) ([svg]({stem}.svg))\n\n"
        ));
    }
    if !text {
        md.push_str("_No font was found, so the plots carry no titles, labels or legends; install `fonts-dejavu-core` or set KEEL_REPORT_FONT._\n");
    }
    if log.bad_lines > 0 {
        md.push_str(&format!(
            "\n_{} lines of the metrics log were not JSON and were ignored._\n",
            log.bad_lines
        ));
    }
    md
}

/// Writes every plot and `summary.md` into `out`, ticking `progress` once per file group.
pub fn write_report(
    run_root: &str,
    log: &RunLog,
    out: &Path,
    text: bool,
    progress: &indicatif::ProgressBar,
) -> Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("cannot create {}", out.display()))?;
    let empty = Curve::new();
    for (stem, title) in CURVES {
        progress.set_message(stem.to_string());
        plot_curve(
            out,
            stem,
            title,
            log.curves.get(*stem).unwrap_or(&empty),
            text,
        )?;
        progress.inc(1);
    }
    let md = out.join("summary.md");
    std::fs::write(&md, summary_markdown(run_root, log, text))
        .with_context(|| format!("cannot write {}", md.display()))?;
    progress.inc(1);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOG: &str = r#"{"event":"eval","phase":"before_rl","version":0,"success":0.25,"episodes":16}
{"event":"step","step":1,"total":4,"batch_seq":0,"metrics":{"grad_norm":0.5,"approx_kl":0.001,"clip_frac":0.0,"entropy":1.2,"mean_reward":0.3},"success":0.3,"invalid_rate":0.0,"max_lag":0,"branch":"main","reward":0.3}
{"event":"step","step":2,"total":4,"batch_seq":1,"metrics":{"grad_norm":0.6,"approx_kl":0.002,"clip_frac":0.1,"entropy":1.1,"mean_reward":0.4},"success":0.4,"invalid_rate":0.0,"max_lag":1,"branch":"main","reward":0.4}
{"event":"skipped","step":2,"batch_seq":2,"what":"loss"}
{"event":"rewind","from_step":2,"to_step":1,"to_checkpoint":"x","branch":"rewind-1","kind":"nonfinite","reason":"3 consecutive steps with a non-finite loss","lr":0.0005}
{"event":"step","step":2,"total":4,"batch_seq":3,"metrics":{"grad_norm":0.4,"approx_kl":0.001,"clip_frac":0.0,"entropy":1.0,"mean_reward":0.5},"success":0.5,"invalid_rate":0.0,"max_lag":0,"branch":"rewind-1","reward":0.5}
not json
"#;

    #[test]
    fn rp3_steps_are_split_by_branch() {
        let log = parse_log(LOG);
        let success = &log.curves["success"];
        assert_eq!(success["main"], vec![(1, 0.3), (2, 0.4)]);
        assert_eq!(success["rewind-1"], vec![(2, 0.5)]);
        assert_eq!(log.curves["staleness"]["main"], vec![(1, 0.0), (2, 1.0)]);
        assert_eq!(
            (log.skips, log.rewinds.len(), log.bad_lines, log.evals.len()),
            (1, 1, 1, 1)
        );
    }

    #[test]
    fn rollout_events_give_the_sampler_utilisation() {
        let text = r#"{"event":"rollout","batch_seq":0,"policy_version":0,"episodes":128,"sample_seconds":2.0,"decode_steps":40,"busy_decode_steps":10}
{"event":"rollout","batch_seq":1,"policy_version":1,"episodes":126,"sample_seconds":4.0,"decode_steps":60,"busy_decode_steps":15}
"#;
        let log = parse_log(text);
        assert_eq!(log.rollouts.batches, 2);
        assert_eq!(log.rollouts.episodes, 254);
        let md = summary_markdown("runs/x", &log, true);
        assert!(
            md.contains("| 2 | 254 | 3.00 | 0.250 (25 of 100 decode steps"),
            "{md}"
        );
    }

    #[test]
    fn method_events_are_totalled_in_the_summary() {
        let text = r#"{"event":"method","method":"generate","step":0,"detail":{"batch_seq":0,"tries":3,"uniform_groups":2,"prompt_tokens":400,"scaffold_tokens":100}}
{"event":"method","method":"generate","step":1,"detail":{"batch_seq":1,"prompt_tokens":300,"scaffold_tokens":50}}
{"event":"method","method":"rtpo","step":1,"detail":{"depth":0,"depths":2,"first_task":0,"batch_seq":2}}
{"event":"method","method":"rtpo","step":2,"detail":{"depth":1,"depths":2,"first_task":0,"batch_seq":3}}
{"event":"method","method":"pats","step":1,"detail":{"version":4}}
{"event":"method","method":"armor","step":3,"detail":{"reference_reset_at":3}}
"#;
        let log = parse_log(text);
        let m = &log.methods;
        assert_eq!(
            (m.rerolled_batches, m.reroll_passes, m.uniform_groups_left),
            (1, 3, 2)
        );
        assert_eq!(
            (m.rtpo_depths, m.rtpo_trees, m.pats_reviews, m.pats_version),
            (2, 1, 1, 4)
        );
        assert_eq!((m.prompt_tokens, m.scaffold_tokens), (700, 150));
        assert_eq!(m.reference_resets, vec![3]);
        let md = summary_markdown("runs/x", &log, true);
        assert!(
            md.contains("150 of 700 training prompt tokens (21.4%)"),
            "{md}"
        );
        assert!(
            md.contains("2 depths trained, 1 reverse trees completed"),
            "{md}"
        );
        assert!(!summary_markdown("runs/x", &parse_log(LOG), true).contains("## Methods"));
    }

    #[test]
    fn rp2_report_is_written_with_and_without_fonts() {
        let log = parse_log(LOG);
        let dir = tempfile::tempdir().expect("tempdir");
        let bar = indicatif::ProgressBar::hidden();
        write_report("runs/x", &log, dir.path(), false, &bar).expect("report without text");
        for (stem, _) in CURVES {
            let png = std::fs::metadata(dir.path().join(format!("{stem}.png"))).expect("png");
            assert!(png.len() > 100, "{stem}.png is {} bytes", png.len());
            let svg = std::fs::read_to_string(dir.path().join(format!("{stem}.svg"))).expect("svg");
            assert!(svg.starts_with("<svg"), "{stem}.svg");
        }
        let md = std::fs::read_to_string(dir.path().join("summary.md")).expect("summary");
        assert!(
            md.contains("`rewind-1`") && md.contains("non-finite loss"),
            "{md}"
        );
        if load_font() {
            let dir = tempfile::tempdir().expect("tempdir");
            write_report("runs/x", &log, dir.path(), true, &bar).expect("report with text");
            let svg = std::fs::read_to_string(dir.path().join("success.svg")).expect("svg");
            assert!(
                svg.contains("rollout success rate") && svg.contains("rewind-1"),
                "text drawn"
            );
        }
    }
}
