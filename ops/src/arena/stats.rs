//! What the table says about a cell and about a method's seeds.
//!
//! Invariants:
//! - AST-1: a cell's numbers come from its metrics log alone (`report::parse_log`), along the
//!   history that survived (`report::head_series`); held-out success is the `after_rl` pass@1
//!   (greedy, `rollout.eval_tasks` held-out tasks), before RL the `before_rl` one.
//! - AST-2: best success and steps to threshold read the moving mean (window `arena.smooth`) of
//!   the training rollouts' success; a collapse event is a guard rewind, a non-finite step the
//!   learner skipped, or a step whose gradient norm exceeds `arena.spike_ratio` × the median of
//!   the previous `arena.spike_window` steps (with at least 5 of them).
//! - AST-3: intervals are two-sided 95% Student-t intervals over seeds. A method against its
//!   baseline is a paired comparison when at least two seeds finished on both sides: the cells
//!   of one seed share their SFT start, so the interval is the paired t-interval of the
//!   per-seed differences (n − 1 degrees of freedom), over the seeds both sides finished.
//!   Otherwise it is Welch's unpaired interval over every finished seed; with fewer than two
//!   seeds on a side there is no interval and no verdict. The verdict is `better` / `worse`
//!   when the difference's interval excludes 0, else `same`, and it names its test.

use statrs::distribution::{ContinuousCDF, StudentsT};

use crate::report::{head_series, RunLog};

use super::grid::ArenaSection;

/// One finished cell.
#[derive(Debug, Clone, Default)]
pub struct CellStats {
    /// Held-out pass@1 before RL (after the SFT warm start).
    pub before: f64,
    /// Held-out pass@1 after RL.
    pub after: f64,
    /// Highest moving mean of training success.
    pub best: f64,
    /// First step whose moving mean of training success reached the threshold.
    pub steps_to_threshold: Option<u64>,
    /// Guard rewinds.
    pub rewinds: u64,
    /// Non-finite steps skipped.
    pub nonfinite: u64,
    /// Gradient-norm spikes.
    pub spikes: u64,
    /// Mean KL to the reference over steps (NaN when the log has none).
    pub kl_ref: f64,
    /// Training wall time, seconds.
    pub wall_s: f64,
    /// The collapse guard gave up (its rewinds spent): the run ended before `arena.steps`, with
    /// no held-out evaluation after RL.
    pub collapsed: bool,
    /// Moving mean of training success by step.
    pub success: Vec<(u64, f64)>,
    /// Gradient norm by step.
    pub grad_norm: Vec<(u64, f64)>,
}

impl CellStats {
    /// Collapse events of every kind (AST-2).
    pub fn collapses(&self) -> u64 {
        self.rewinds + self.nonfinite + self.spikes
    }
}

fn moving_mean(points: &[(u64, f64)], window: usize) -> Vec<(u64, f64)> {
    (0..points.len())
        .map(|i| {
            let tail = &points[(i + 1).saturating_sub(window)..=i];
            let mean = tail.iter().map(|p| p.1).sum::<f64>() / tail.len() as f64;
            (points[i].0, mean)
        })
        .collect()
}

fn median(xs: &mut [f64]) -> f64 {
    xs.sort_by(f64::total_cmp);
    let n = xs.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => xs[n / 2],
        _ => (xs[n / 2 - 1] + xs[n / 2]) / 2.0,
    }
}

/// Gradient-norm spikes (AST-2).
pub fn spikes(grad_norm: &[(u64, f64)], ratio: f64, window: usize) -> u64 {
    let mut n = 0;
    for i in 5..grad_norm.len() {
        let mut prev: Vec<f64> = grad_norm[i.saturating_sub(window)..i]
            .iter()
            .map(|p| p.1)
            .collect();
        if grad_norm[i].1 > ratio * median(&mut prev) {
            n += 1;
        }
    }
    n
}

/// A cell's numbers from its parsed log (AST-1, AST-2).
pub fn cell_stats(log: &RunLog, arena: &ArenaSection) -> CellStats {
    let eval = |phase: &str| {
        log.evals
            .iter()
            .rev()
            .find(|e| e.phase == phase)
            .map_or(f64::NAN, |e| e.pass_at_1)
    };
    let success = moving_mean(&head_series(log, "success"), arena.smooth);
    let grad_norm = head_series(log, "grad_norm");
    let kl = head_series(log, "kl_ref");
    CellStats {
        before: eval("before_rl"),
        after: eval("after_rl"),
        best: success.iter().map(|p| p.1).fold(f64::NAN, f64::max),
        steps_to_threshold: success.iter().find(|p| p.1 >= arena.threshold).map(|p| p.0),
        rewinds: log.rewinds.len() as u64,
        nonfinite: log.skips,
        spikes: spikes(&grad_norm, arena.spike_ratio, arena.spike_window),
        kl_ref: match kl.len() {
            0 => f64::NAN,
            n => kl.iter().map(|p| p.1).sum::<f64>() / n as f64,
        },
        wall_s: log.wall_seconds,
        collapsed: false,
        success,
        grad_norm,
    }
}

/// Mean and 95% half-width of a sample (AST-3); the half-width is NaN below two values.
pub fn mean_ci(xs: &[f64]) -> (f64, f64) {
    let n = xs.len();
    if n == 0 {
        return (f64::NAN, f64::NAN);
    }
    let mean = xs.iter().sum::<f64>() / n as f64;
    if n < 2 {
        return (mean, f64::NAN);
    }
    let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1) as f64;
    (mean, t975((n - 1) as f64) * (var / n as f64).sqrt())
}

fn t975(df: f64) -> f64 {
    StudentsT::new(0.0, 1.0, df).map_or(f64::NAN, |t| t.inverse_cdf(0.975))
}

/// A method against its baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The difference's interval lies above 0.
    Better,
    /// It contains 0.
    Same,
    /// It lies below 0.
    Worse,
}

impl Verdict {
    /// Its word in the table.
    pub fn word(self) -> &'static str {
        match self {
            Verdict::Better => "better",
            Verdict::Same => "same within the interval",
            Verdict::Worse => "worse",
        }
    }
}

/// Which test a comparison used (AST-3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Test {
    /// Paired t over this many seeds finished on both sides.
    Paired(usize),
    /// Welch's unpaired t.
    Welch,
}

impl Test {
    /// Its name in the table.
    pub fn name(self) -> String {
        match self {
            Test::Paired(n) => format!("paired t, {n} seeds"),
            Test::Welch => "Welch t (unpaired)".into(),
        }
    }
}

/// A method against its baseline: the difference of held-out success, its 95% half-width, the
/// verdict and the test (AST-3).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Comparison {
    /// Mean difference, method − baseline.
    pub delta: f64,
    /// 95% half-width.
    pub half: f64,
    /// What the interval says.
    pub verdict: Verdict,
    /// How it was computed.
    pub test: Test,
}

/// `a − b` over seeds (values by seed; AST-3): paired when two or more seeds are on both
/// sides, else Welch's; `None` without two seeds on each side.
pub fn compare_seeds(
    a: &std::collections::BTreeMap<u64, f64>,
    b: &std::collections::BTreeMap<u64, f64>,
) -> Option<Comparison> {
    let diffs: Vec<f64> = a
        .iter()
        .filter_map(|(seed, x)| b.get(seed).map(|y| x - y))
        .collect();
    if diffs.len() >= 2 {
        let (delta, half) = mean_ci(&diffs);
        let half = if half.is_nan() { 0.0 } else { half };
        return Some(Comparison {
            delta,
            half,
            verdict: verdict(delta, half),
            test: Test::Paired(diffs.len()),
        });
    }
    let values = |m: &std::collections::BTreeMap<u64, f64>| m.values().copied().collect::<Vec<_>>();
    compare(&values(a), &values(b)).map(|(delta, half, verdict)| Comparison {
        delta,
        half,
        verdict,
        test: Test::Welch,
    })
}

fn verdict(d: f64, half: f64) -> Verdict {
    if d - half > 0.0 {
        Verdict::Better
    } else if d + half < 0.0 {
        Verdict::Worse
    } else {
        Verdict::Same
    }
}

/// Difference of means `a − b`, its Welch 95% half-width, and the verdict (AST-3); `None` with
/// fewer than two seeds on either side.
pub fn compare(a: &[f64], b: &[f64]) -> Option<(f64, f64, Verdict)> {
    if a.len() < 2 || b.len() < 2 {
        return None;
    }
    let stats = |xs: &[f64]| {
        let n = xs.len() as f64;
        let m = xs.iter().sum::<f64>() / n;
        let v = xs.iter().map(|x| (x - m).powi(2)).sum::<f64>() / (n - 1.0);
        (m, v / n, n)
    };
    let ((ma, sa, na), (mb, sb, nb)) = (stats(a), stats(b));
    let d = ma - mb;
    let se2 = sa + sb;
    let half = if se2 == 0.0 {
        0.0
    } else {
        let df = se2 * se2 / (sa * sa / (na - 1.0) + sb * sb / (nb - 1.0));
        t975(df) * se2.sqrt()
    };
    Some((d, half, verdict(d, half)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::parse_log;
    use std::collections::BTreeMap;

    fn arena() -> ArenaSection {
        toml::from_str("seeds = [1]\nsteps = 4\nsmooth = 2\nthreshold = 0.5\nspike_window = 10")
            .expect("arena")
    }

    #[test]
    fn as3_intervals_match_the_t_table() {
        // t(0.975, 2) = 4.302653; sd of [1, 2, 3] = 1.
        let (m, h) = mean_ci(&[1.0, 2.0, 3.0]);
        assert_eq!(m, 2.0);
        assert!((h - 4.302653 / 3f64.sqrt()).abs() < 1e-5, "{h}");
        assert!(mean_ci(&[0.4]).1.is_nan());
        // Welch: equal variances and sizes give df = 4, t = 2.776445.
        let (d, h, v) = compare(&[5.0, 6.0, 7.0], &[1.0, 2.0, 3.0]).expect("two sides");
        assert_eq!(d, 4.0);
        assert!((h - 2.776445 * (2.0f64 / 3.0).sqrt()).abs() < 1e-5, "{h}");
        assert_eq!(v, Verdict::Better);
        // d = 2 < half-width 2.267: the interval holds 0.
        assert_eq!(
            compare(&[3.0, 4.0, 5.0], &[1.0, 2.0, 3.0]).map(|c| c.2),
            Some(Verdict::Same)
        );
        assert_eq!(
            compare(&[1.0, 2.0, 3.0], &[3.0, 1.0, 2.0]).map(|c| c.2),
            Some(Verdict::Same)
        );
        assert_eq!(
            compare(&[0.0, 0.0], &[1.0, 1.0]).map(|c| c.2),
            Some(Verdict::Worse)
        );
        assert!(compare(&[1.0], &[1.0, 2.0]).is_none());
    }

    /// AST-3: seeds finished on both sides are paired; the paired interval is far narrower
    /// than Welch's when the seeds differ a lot but the method moves each one alike.
    #[test]
    fn as3_paired_seeds_give_the_paired_interval_and_name_it() {
        let by_seed = |xs: &[(u64, f64)]| xs.iter().copied().collect::<BTreeMap<u64, f64>>();
        let base = by_seed(&[(1, 0.1), (2, 0.5), (3, 0.9)]);
        let method = by_seed(&[(1, 0.2), (2, 0.62), (3, 0.98)]);
        // Differences 0.1, 0.12, 0.08: mean 0.1, sd 0.02, t(0.975, 2) = 4.302653.
        let c = compare_seeds(&method, &base).expect("paired");
        assert_eq!(c.test, Test::Paired(3));
        assert!((c.delta - 0.1).abs() < 1e-12);
        assert!(
            (c.half - 4.302653 * 0.02 / 3f64.sqrt()).abs() < 1e-5,
            "{}",
            c.half
        );
        assert_eq!(c.verdict, Verdict::Better);
        let welch = compare(&[0.2, 0.62, 0.98], &[0.1, 0.5, 0.9]).expect("welch");
        assert_eq!(
            welch.2,
            Verdict::Same,
            "unpaired, the spread between seeds hides it"
        );
        // One seed in common: Welch over every finished seed.
        let other = by_seed(&[(3, 0.95), (4, 0.4), (5, 0.7)]);
        let c = compare_seeds(&other, &base).expect("welch");
        assert_eq!(c.test, Test::Welch);
        assert!(compare_seeds(&by_seed(&[(1, 0.5)]), &base).is_none());
        assert_eq!(Test::Paired(3).name(), "paired t, 3 seeds");
    }

    #[test]
    fn as2_spikes_need_a_history_and_a_ratio() {
        let mut g: Vec<(u64, f64)> = (0..12).map(|i| (i, 1.0 + 0.01 * i as f64)).collect();
        assert_eq!(spikes(&g, 5.0, 10), 0);
        g[3].1 = 100.0; // before 5 steps of history: not judged
        g[8].1 = 6.0;
        g[10].1 = 4.0;
        assert_eq!(spikes(&g, 5.0, 10), 1);
    }

    #[test]
    fn as1_a_rewound_log_reads_along_the_surviving_history() {
        let log = parse_log(
            r#"{"event":"eval","phase":"before_rl","version":0,"success":0.25,"elapsed_s":1.0}
{"event":"step","step":1,"success":0.2,"metrics":{"grad_norm":1.0,"kl_ref":0.0},"branch":"main","elapsed_s":2.0}
{"event":"step","step":2,"success":0.4,"metrics":{"grad_norm":1.0,"kl_ref":0.2},"branch":"main","elapsed_s":3.0}
{"event":"step","step":3,"success":0.0,"metrics":{"grad_norm":9.0,"kl_ref":0.4},"branch":"main","elapsed_s":4.0}
{"event":"rewind","from_step":3,"to_step":2,"branch":"rewind-1","reason":"spike","elapsed_s":4.5}
{"event":"step","step":3,"success":0.8,"metrics":{"grad_norm":1.0,"kl_ref":0.2},"branch":"rewind-1","elapsed_s":1.5}
{"event":"step","step":4,"success":0.6,"metrics":{"grad_norm":1.0,"kl_ref":0.2},"branch":"rewind-1","elapsed_s":2.5}
{"event":"eval","phase":"after_rl","version":4,"success":0.75,"elapsed_s":3.0}
"#,
        );
        let s = cell_stats(&log, &arena());
        assert_eq!((s.before, s.after), (0.25, 0.75));
        // The rewind branch's step 3 replaces main's; moving mean over 2 steps.
        let want = [(1, 0.2), (2, 0.3), (3, 0.6), (4, 0.7)];
        for ((s1, v1), (s2, v2)) in s.success.iter().zip(want) {
            assert!(*s1 == s2 && (v1 - v2).abs() < 1e-12, "{:?}", s.success);
        }
        assert_eq!(s.steps_to_threshold, Some(3));
        assert!((s.best - 0.7).abs() < 1e-12);
        assert_eq!((s.rewinds, s.nonfinite, s.collapses()), (1, 0, 1));
        assert!((s.kl_ref - 0.15).abs() < 1e-12, "{}", s.kl_ref);
        assert!(
            (s.wall_s - 7.5).abs() < 1e-12,
            "two lives: 4.5 + 3.0, got {}",
            s.wall_s
        );
    }
}
