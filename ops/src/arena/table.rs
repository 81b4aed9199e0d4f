//! `table.md`, `table.csv` (one row per method, env and setting) and `cells.csv` (one row per
//! cell) from the finished cells' stats.
//!
//! Invariant: AT-1: a row aggregates only finished cells and says how many of the grid's
//! seeds that is (`2/3`); a method with no finished cell is listed with dashes, never left out.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use super::grid::{Grid, MethodEntry, Setting};
use super::stats::{compare_seeds, mean_ci, CellStats, Comparison};

/// Finished cells' stats by cell name.
pub type Finished = BTreeMap<String, CellStats>;

/// The finished seeds of one method, env and setting.
pub fn seeds_of<'a>(
    grid: &Grid,
    done: &'a Finished,
    method: &str,
    env: &str,
    setting: Setting,
) -> Vec<&'a CellStats> {
    grid.cells
        .iter()
        .filter(|c| c.method == method && c.env == env && c.setting == setting)
        .filter_map(|c| done.get(&c.name))
        .collect()
}

/// The finite held-out successes of `seeds` (a collapsed seed has none).
fn finite_after(seeds: &[&CellStats]) -> Vec<f64> {
    seeds
        .iter()
        .map(|s| s.after)
        .filter(|x| x.is_finite())
        .collect()
}

/// The finite held-out successes of a method, env and setting, by seed (AST-3 pairs them).
pub(super) fn held_out(
    grid: &Grid,
    done: &Finished,
    method: &str,
    env: &str,
    setting: Setting,
) -> BTreeMap<u64, f64> {
    grid.cells
        .iter()
        .filter(|c| c.method == method && c.env == env && c.setting == setting)
        .filter_map(|c| done.get(&c.name).map(|s| (c.seed, s.after)))
        .filter(|(_, x)| x.is_finite())
        .collect()
}

/// A method against its baseline in one env and setting (AST-3).
fn against(
    grid: &Grid,
    done: &Finished,
    (method, baseline): (&str, &str),
    env: &str,
    setting: Setting,
) -> Option<Comparison> {
    let after = |name| held_out(grid, done, name, env, setting);
    compare_seeds(&after(method), &after(baseline))
}

fn fmt(x: f64, digits: usize) -> String {
    if x.is_finite() {
        format!("{x:.digits$}")
    } else {
        "—".into()
    }
}

pub(super) fn with_ci((m, h): (f64, f64)) -> String {
    match (m.is_finite(), h.is_finite()) {
        (true, true) => format!("{m:.3} ± {h:.3}"),
        (true, false) => format!("{m:.3}"),
        _ => "—".into(),
    }
}

/// One row's numbers.
struct Row {
    n: usize,
    collapsed: usize,
    after: (f64, f64),
    before: f64,
    best: f64,
    reached: usize,
    mean_steps: f64,
    rewinds: u64,
    nonfinite: u64,
    spikes: u64,
    kl: f64,
    wall: f64,
}

fn mean(xs: impl Iterator<Item = f64>) -> f64 {
    let v: Vec<f64> = xs.filter(|x| x.is_finite()).collect();
    match v.len() {
        0 => f64::NAN,
        n => v.iter().sum::<f64>() / n as f64,
    }
}

fn row(seeds: &[&CellStats]) -> Row {
    let after = finite_after(seeds);
    let reached: Vec<u64> = seeds.iter().filter_map(|s| s.steps_to_threshold).collect();
    Row {
        n: seeds.len(),
        collapsed: seeds.iter().filter(|s| s.collapsed).count(),
        after: mean_ci(&after),
        before: mean(seeds.iter().map(|s| s.before)),
        best: mean(seeds.iter().map(|s| s.best)),
        reached: reached.len(),
        mean_steps: mean(reached.iter().map(|&s| s as f64)),
        rewinds: seeds.iter().map(|s| s.rewinds).sum(),
        nonfinite: seeds.iter().map(|s| s.nonfinite).sum(),
        spikes: seeds.iter().map(|s| s.spikes).sum(),
        kl: mean(seeds.iter().map(|s| s.kl_ref)),
        wall: mean(seeds.iter().map(|s| s.wall_s)),
    }
}

/// `table.md` (AT-1). `command` is the line that reproduces it.
pub fn markdown(grid: &Grid, done: &Finished, command: &str) -> String {
    let a = &grid.arena;
    let mut md = format!("# Arena `{}`\n\n", grid.name);
    let _ = writeln!(md, "Reproduce: `{command}`\n");
    let _ = writeln!(
        md,
        "{} of {} cells finished; {} steps per cell; seeds {:?}. Held-out success: greedy pass@1 on the env's held-out tasks after RL (± = 95% t-interval over seeds). Best and steps-to-{}: moving mean of training success over {} steps. Collapses: guard rewinds / non-finite skipped steps / grad-norm spikes over {}× the median of the previous {} steps. KL: mean k3 KL to the SFT reference per step. Wall: seconds per seed. A collapsed seed (the collapse guard spent its rewinds and ended the run) counts in seeds and collapses but has no held-out success.\n",
        done.len(),
        grid.cells.len(),
        a.steps,
        a.seeds,
        a.threshold,
        a.smooth,
        a.spike_ratio,
        a.spike_window
    );
    let ns = a.seeds.len();
    for env in &grid.envs {
        md.push_str(&super::ladder::markdown(grid, done, env));
        for &setting in &grid.settings {
            let methods: Vec<&str> = grid
                .methods
                .iter()
                .filter(|m| m.envs.contains(env) && grid.runs(m.name(), setting))
                .map(|m| m.name())
                .collect();
            let _ = writeln!(md, "## {env}, {}\n", setting.name());
            let _ = writeln!(md, "| method | seeds | held-out success | before RL | best | reached {} (mean step) | collapses rw/nf/spike | KL to ref | wall s |", a.threshold);
            md.push_str("|---|---|---|---|---|---|---|---|---|\n");
            for m in &methods {
                let r = row(&seeds_of(grid, done, m, env, setting));
                let _ = writeln!(
                    md,
                    "| {m} | {}/{ns}{} | {} | {} | {} | {}/{} ({}) | {}/{}/{} | {} | {} |",
                    r.n,
                    match r.collapsed {
                        0 => String::new(),
                        c => format!(" ({c} collapsed)"),
                    },
                    with_ci(r.after),
                    fmt(r.before, 3),
                    fmt(r.best, 3),
                    r.reached,
                    r.n,
                    fmt(r.mean_steps, 1),
                    r.rewinds,
                    r.nonfinite,
                    r.spikes,
                    fmt(r.kl, 4),
                    fmt(r.wall, 0)
                );
            }
            let pairs: Vec<(&str, &str)> = methods
                .iter()
                .filter_map(|m| grid.baseline_of(m).map(|b| (*m, b)))
                .collect();
            if !pairs.is_empty() {
                md.push_str("\n| method | baseline | Δ held-out success (95% CI) | test | verdict |\n|---|---|---|---|---|\n");
                for (m, b) in pairs {
                    let (cell, test, verdict) = match against(grid, done, (m, b), env, setting) {
                        Some(c) => (
                            format!("{:+.3} ± {:.3}", c.delta, c.half),
                            c.test.name(),
                            c.verdict.word().to_string(),
                        ),
                        None => (
                            "—".into(),
                            "—".into(),
                            "— (needs 2 seeds on each side)".into(),
                        ),
                    };
                    let _ = writeln!(md, "| {m} | {b} | {cell} | {test} | {verdict} |");
                }
            }
            let _ = writeln!(
                md,
                "\n![success](plots/{env}.{}.success.png) ![grad norm](plots/{env}.{}.grad_norm.png)\n",
                setting.name(),
                setting.name()
            );
        }
    }
    md
}

fn csv_num(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        String::new()
    }
}

/// `table.csv`: one row per method, env and setting (AT-1).
pub fn csv(grid: &Grid, done: &Finished) -> String {
    let mut out = String::from("env,setting,method,baseline,seeds_finished,seeds_collapsed,seeds,heldout_success_mean,heldout_success_ci95,before_rl_mean,best_success_mean,seeds_reaching_threshold,steps_to_threshold_mean,rewinds,nonfinite_steps,grad_norm_spikes,kl_ref_mean,wall_s_mean,delta_vs_baseline,delta_ci95,verdict,test\n");
    for env in &grid.envs {
        for &setting in &grid.settings {
            let runs = |m: &&MethodEntry| m.envs.contains(env) && grid.runs(m.name(), setting);
            for m in grid.methods.iter().filter(runs) {
                let seeds = seeds_of(grid, done, m.name(), env, setting);
                let r = row(&seeds);
                let cmp = m
                    .baseline
                    .as_deref()
                    .and_then(|b| against(grid, done, (m.name(), b), env, setting));
                let _ = writeln!(
                    out,
                    "{env},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                    setting.name(),
                    m.name(),
                    m.baseline.as_deref().unwrap_or(""),
                    r.n,
                    r.collapsed,
                    grid.arena.seeds.len(),
                    csv_num(r.after.0),
                    csv_num(r.after.1),
                    csv_num(r.before),
                    csv_num(r.best),
                    r.reached,
                    csv_num(r.mean_steps),
                    r.rewinds,
                    r.nonfinite,
                    r.spikes,
                    csv_num(r.kl),
                    csv_num(r.wall),
                    cmp.map_or(String::new(), |c| csv_num(c.delta)),
                    cmp.map_or(String::new(), |c| csv_num(c.half)),
                    cmp.map_or("", |c| c.verdict.word()),
                    cmp.map_or(String::new(), |c| c.test.name()),
                );
            }
        }
    }
    out
}

/// `cells.csv`: one row per finished cell.
pub fn cells_csv(grid: &Grid, done: &Finished) -> String {
    let mut out = String::from("cell,method,env,setting,seed,collapsed,before_rl,heldout_success,best_success,steps_to_threshold,collapse_events,rewinds,nonfinite_steps,grad_norm_spikes,kl_ref_mean,wall_s,staleness,minibatches,lr_factor\n");
    for c in &grid.cells {
        let Some(s) = done.get(&c.name) else { continue };
        let _ = writeln!(
            out,
            "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
            c.name,
            c.method,
            c.env,
            c.setting.name(),
            c.seed,
            s.collapsed,
            csv_num(s.before),
            csv_num(s.after),
            csv_num(s.best),
            s.steps_to_threshold
                .map_or(String::new(), |x| x.to_string()),
            s.collapses(),
            s.rewinds,
            s.nonfinite,
            s.spikes,
            csv_num(s.kl_ref),
            csv_num(s.wall_s),
            c.knobs.staleness,
            c.knobs.minibatches,
            c.knobs.lr_factor
        );
    }
    out
}
