//! A grid file (`recipes/arena/*.toml`) and the cells it expands to.
//!
//! A cell is one `keel train` run: a method (a preset with its config) on an env, in a setting,
//! with one seed. The settings are `control`; `stress` when the grid has a `[stress]` table (a
//! mixed stress); and the rungs of `[ladder]`, each moving one knob away from the control:
//! `stale<k>` (async, `run.staleness_bound = k`), `mb<m>` (`learner.minibatches = m`) and
//! `lr<f>x` (learning rates times f; a `.` in f is written `p`). A cell's config is the built-in
//! defaults, then `[base]`, then the env's table, then the method's `config`, then (stress only)
//! `[stress]` and the method's own `stress` fragment, then the rung's knob, with the learning
//! rates times `arena.stress_lr_factor` (stress) or the rung's factor, then what the arena owns:
//! `run.name` (the cell's name with `_` for `.`), `run.seed`, `run.steps`, `learner.algo` (the
//! method's preset), `model.path` when `keel arena --model DIR` names one, and
//! `learner.reference_kl = true` (so every method reports its KL to the SFT reference).
//!
//! Invariants:
//! - AGR-1: a grid that names an unknown env, a baseline that is not run on every env of its
//!   method, a duplicate name or seed, or a fragment that sets a key the arena owns is refused
//!   before anything runs, naming the entry.
//! - AGR-2: every cell's config is validated as `keel train` validates it (`TrainConfig`); the
//!   error names the cell. The cell's config text is a pure function of the grid file (and
//!   `--model`).
//! - AGR-3: cell names are `<method>.<env>.<setting>.s<seed>` with method and env names of
//!   `[A-Za-z0-9_-]`, so a cell name is a safe folder name and never collides with the grid's
//!   own `cells/` and `plots/` folders.
//! - AGR-4: a ladder rung is the control with one knob moved, so the control is every ladder's
//!   origin (staleness 0: sync); a rung of staleness 0, 0 mini-batches or factor 1 (or <= 0, or
//!   with more than 3 decimals), a rung given twice, and a method that skips an axis the grid
//!   has no rungs on are refused.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{bail, Context, Result};
use keel_actors::TrainConfig;
use serde::Deserialize;
use toml::{Table, Value};

/// `[arena]`: what every cell shares and how the table reads the runs.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ArenaSection {
    /// The grid's folder name under `runs/arena/` (default: the file's stem).
    pub name: Option<String>,
    /// One cell per seed (`run.seed`) for each method, env and setting.
    pub seeds: Vec<u64>,
    /// `run.steps` of every cell.
    pub steps: u64,
    /// Training success (moving mean) that "steps to threshold" waits for.
    #[serde(default = "default_threshold")]
    pub threshold: f64,
    /// Window of the moving mean of training success (best success, threshold), in steps.
    #[serde(default = "default_smooth")]
    pub smooth: usize,
    /// A step's gradient norm over this many times the median of the previous
    /// `spike_window` steps is a collapse event.
    #[serde(default = "default_spike_ratio")]
    pub spike_ratio: f64,
    /// See `spike_ratio`.
    #[serde(default = "default_spike_window")]
    pub spike_window: usize,
    /// The stress setting's learning rates are the control's times this.
    #[serde(default = "default_lr_factor")]
    pub stress_lr_factor: f64,
}

fn default_threshold() -> f64 {
    0.5
}
fn default_smooth() -> usize {
    5
}
fn default_spike_ratio() -> f64 {
    5.0
}
fn default_spike_window() -> usize {
    20
}
fn default_lr_factor() -> f64 {
    1.0
}

/// `[ladder]`: rungs that each move one knob of the control (AGR-4); one cell per rung, method,
/// env and seed.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LadderSection {
    /// Async runs with `run.staleness_bound` = each value (the control, sync, is 0).
    #[serde(default)]
    pub staleness: Vec<u64>,
    /// `learner.minibatches` = each value.
    #[serde(default)]
    pub minibatches: Vec<u64>,
    /// The learning rates times each value (at most 3 decimals).
    #[serde(default)]
    pub lr_factor: Vec<f64>,
}

impl LadderSection {
    /// Whether it lists rungs on `axis`.
    pub fn has(&self, axis: Axis) -> bool {
        match axis {
            Axis::Staleness => !self.staleness.is_empty(),
            Axis::Minibatches => !self.minibatches.is_empty(),
            Axis::LrFactor => !self.lr_factor.is_empty(),
        }
    }
}

/// The knob a ladder moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Axis {
    /// `run.staleness_bound` (async).
    Staleness,
    /// `learner.minibatches`.
    Minibatches,
    /// The learning rates' factor.
    LrFactor,
}

impl Axis {
    /// Every axis, in table order.
    pub const ALL: [Axis; 3] = [Axis::Staleness, Axis::Minibatches, Axis::LrFactor];

    /// Its key in `[ladder]` and in file names.
    pub fn key(self) -> &'static str {
        match self {
            Axis::Staleness => "staleness",
            Axis::Minibatches => "minibatches",
            Axis::LrFactor => "lr_factor",
        }
    }

    /// What its values are, for tables and plots.
    pub fn label(self) -> &'static str {
        match self {
            Axis::Staleness => "staleness bound",
            Axis::Minibatches => "mini-batches per batch",
            Axis::LrFactor => "learning-rate factor",
        }
    }
}

/// One `[[methods]]` entry.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MethodEntry {
    /// Its name in the table (default: the preset).
    pub name: Option<String>,
    /// `learner.algo`.
    pub preset: String,
    /// The `[envs]` it runs on.
    pub envs: Vec<String>,
    /// The method it is compared with (run on each of its envs).
    pub baseline: Option<String>,
    /// A config fragment of its own (e.g. `{ learner = { epochs = 2 } }`).
    #[serde(default)]
    pub config: Table,
    /// Laid over `[stress]` in its stress cells (e.g. RTPO, which cannot run async, keeps
    /// `run.mode = "sync"` there).
    #[serde(default)]
    pub stress: Table,
    /// Ladder axes it does not run (e.g. RTPO, which cannot run async: `["staleness"]`).
    #[serde(default)]
    pub ladder_skip: Vec<Axis>,
}

impl MethodEntry {
    /// The name in the table.
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or(&self.preset)
    }
}

/// The grid file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GridFile {
    /// `[arena]`.
    pub arena: ArenaSection,
    /// Config fragment of every cell.
    #[serde(default)]
    pub base: Table,
    /// Config fragment of the stress setting; without it no stress cells run.
    pub stress: Option<Table>,
    /// The ladder's rungs; empty by default.
    #[serde(default)]
    pub ladder: LadderSection,
    /// Config fragment per env name.
    pub envs: BTreeMap<String, Table>,
    /// The methods.
    pub methods: Vec<MethodEntry>,
}

/// A cell's setting: the control, the mixed stress, or one ladder rung.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Setting {
    /// The grid without `[stress]` or a rung.
    Control,
    /// With `[stress]`.
    Stress,
    /// The control with one knob at a value (`LrFactor` in thousandths).
    Rung(Axis, u64),
}

impl Setting {
    /// Its name in cell names and tables (`control`, `stress`, `stale4`, `mb8`, `lr0p5x`).
    pub fn name(self) -> String {
        match self {
            Setting::Control => "control".into(),
            Setting::Stress => "stress".into(),
            Setting::Rung(Axis::Staleness, k) => format!("stale{k}"),
            Setting::Rung(Axis::Minibatches, m) => format!("mb{m}"),
            Setting::Rung(Axis::LrFactor, t) => {
                format!("lr{}x", (t as f64 / 1000.0).to_string().replace('.', "p"))
            }
        }
    }

    /// The rung's axis and value (the factor as a number), if it is one.
    pub fn rung(self) -> Option<(Axis, f64)> {
        match self {
            Setting::Rung(Axis::LrFactor, t) => Some((Axis::LrFactor, t as f64 / 1000.0)),
            Setting::Rung(axis, v) => Some((axis, v as f64)),
            _ => None,
        }
    }
}

/// Where a cell sits on each ladder axis (the control is every axis's origin, AGR-4).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Knobs {
    /// `run.staleness_bound` when async, else 0.
    pub staleness: f64,
    /// `learner.minibatches`.
    pub minibatches: f64,
    /// The learning rates over the control's.
    pub lr_factor: f64,
}

impl Knobs {
    /// The value on `axis`.
    pub fn on(&self, axis: Axis) -> f64 {
        match axis {
            Axis::Staleness => self.staleness,
            Axis::Minibatches => self.minibatches,
            Axis::LrFactor => self.lr_factor,
        }
    }
}

/// One run of the grid.
#[derive(Debug, Clone)]
pub struct Cell {
    /// `<method>.<env>.<setting>.s<seed>` (AGR-3).
    pub name: String,
    /// The method's name.
    pub method: String,
    /// The env's name.
    pub env: String,
    /// Control, stress or a ladder rung.
    pub setting: Setting,
    /// `run.seed`.
    pub seed: u64,
    /// Where it sits on the ladder axes.
    pub knobs: Knobs,
    /// The config `keel train` gets, as TOML text (AGR-2).
    pub config_text: String,
}

/// A grid ready to run.
#[derive(Debug, Clone)]
pub struct Grid {
    /// The folder name.
    pub name: String,
    /// `[arena]`.
    pub arena: ArenaSection,
    /// Methods in file order.
    pub methods: Vec<MethodEntry>,
    /// Env names in file order of first use.
    pub envs: Vec<String>,
    /// Settings run: control, stress, then the rungs by axis and value.
    pub settings: Vec<Setting>,
    /// Every cell.
    pub cells: Vec<Cell>,
}

impl Grid {
    /// The axes the grid has rungs on.
    pub fn ladder_axes(&self) -> Vec<Axis> {
        Axis::ALL
            .into_iter()
            .filter(|a| {
                self.settings
                    .iter()
                    .any(|s| s.rung().map(|r| r.0) == Some(*a))
            })
            .collect()
    }

    /// Whether `method` has cells in `setting` (a method may skip a ladder axis).
    pub fn runs(&self, method: &str, setting: Setting) -> bool {
        self.cells
            .iter()
            .any(|c| c.method == method && c.setting == setting)
    }

    /// The baseline of `method`, if it has one.
    pub fn baseline_of(&self, method: &str) -> Option<&str> {
        self.methods
            .iter()
            .find(|m| m.name() == method)
            .and_then(|m| m.baseline.as_deref())
    }
}

/// Keys the arena sets in every cell (AGR-1).
const OWNED: &[(&str, &str)] = &[
    ("run", "name"),
    ("run", "seed"),
    ("run", "steps"),
    ("learner", "algo"),
];

fn valid_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 64
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// `dst` with `src` laid over it: tables merge key by key, anything else is replaced.
pub fn overlay(dst: &mut Table, src: &Table) {
    for (k, v) in src {
        match (dst.get_mut(k), v) {
            (Some(Value::Table(d)), Value::Table(s)) => overlay(d, s),
            _ => {
                dst.insert(k.clone(), v.clone());
            }
        }
    }
}

fn set(table: &mut Table, section: &str, key: &str, value: Value) {
    let entry = table
        .entry(section.to_string())
        .or_insert_with(|| Value::Table(Table::new()));
    if let Value::Table(t) = entry {
        t.insert(key.to_string(), value);
    }
}

fn owned_key_in(fragment: &Table) -> Option<String> {
    OWNED.iter().find_map(|(section, key)| {
        fragment
            .get(*section)
            .and_then(Value::as_table)
            .filter(|t| t.contains_key(*key))
            .map(|_| format!("{section}.{key}"))
    })
}

/// Reads and expands a grid file (AGR-1..4); `model` is `keel arena --model`.
pub fn load(path: &Path, model: Option<&Path>) -> Result<Grid> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read grid {}", path.display()))?;
    let file: GridFile =
        toml::from_str(&text).with_context(|| format!("in grid {}", path.display()))?;
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("grid")
        .to_string();
    let model = model.map(|m| m.to_string_lossy().into_owned());
    expand(file, &stem, model.as_deref()).with_context(|| format!("in grid {}", path.display()))
}

/// The ladder's rungs, checked (AGR-4).
fn rungs(ladder: &LadderSection) -> Result<Vec<Setting>> {
    let mut out = Vec::new();
    for &k in &ladder.staleness {
        if k == 0 {
            bail!("ladder.staleness: 0 is the control (sync); list only bounds >= 1");
        }
        out.push(Setting::Rung(Axis::Staleness, k));
    }
    for &m in &ladder.minibatches {
        if m == 0 {
            bail!("ladder.minibatches: values must be at least 1");
        }
        out.push(Setting::Rung(Axis::Minibatches, m));
    }
    for &f in &ladder.lr_factor {
        let t = (f * 1000.0).round();
        if !(f.is_finite() && f > 0.0) || (t - f * 1000.0).abs() > 1e-6 || t == 1000.0 {
            bail!(
                "ladder.lr_factor: {f} is not a factor > 0, other than 1, with at most 3 decimals"
            );
        }
        out.push(Setting::Rung(Axis::LrFactor, t as u64));
    }
    let n = out.len();
    out.sort();
    out.dedup();
    if out.len() != n {
        bail!("[ladder] lists a rung twice");
    }
    Ok(out)
}

fn check_arena(a: &ArenaSection) -> Result<()> {
    if a.seeds.is_empty() {
        bail!("arena.seeds must name at least one seed");
    }
    if a.seeds.iter().collect::<BTreeSet<_>>().len() != a.seeds.len() {
        bail!("arena.seeds has a seed twice: {:?}", a.seeds);
    }
    if a.steps == 0 {
        bail!("arena.steps must be at least 1");
    }
    if !(0.0..=1.0).contains(&a.threshold) {
        bail!("arena.threshold must be in [0, 1], got {}", a.threshold);
    }
    if a.smooth == 0 || a.spike_window < 3 {
        bail!("arena.smooth must be at least 1 and arena.spike_window at least 3");
    }
    if !(a.spike_ratio.is_finite() && a.spike_ratio > 1.0) {
        bail!("arena.spike_ratio must be > 1, got {}", a.spike_ratio);
    }
    if !(a.stress_lr_factor.is_finite() && a.stress_lr_factor > 0.0) {
        bail!(
            "arena.stress_lr_factor must be > 0, got {}",
            a.stress_lr_factor
        );
    }
    Ok(())
}

fn check_methods(file: &GridFile) -> Result<()> {
    let mut names = BTreeSet::new();
    for m in &file.methods {
        let name = m.name();
        if !valid_label(name) {
            bail!("method name {name:?}: use 1-64 of [A-Za-z0-9_-]");
        }
        if !names.insert(name) {
            bail!("two methods are named {name:?}; give one a `name`");
        }
        if m.envs.is_empty() {
            bail!("method {name:?} runs on no env (envs = [...])");
        }
        for env in &m.envs {
            if !file.envs.contains_key(env) {
                bail!("method {name:?} names env {env:?}, which has no [envs.{env}] table");
            }
        }
        if let Some(key) = owned_key_in(&m.config).or_else(|| owned_key_in(&m.stress)) {
            bail!("method {name:?} sets {key}, which the arena sets (preset, arena.seeds, arena.steps)");
        }
        for axis in &m.ladder_skip {
            if !file.ladder.has(*axis) {
                bail!(
                    "method {name:?} skips ladder axis {:?}, which [ladder] does not list",
                    axis.key()
                );
            }
        }
    }
    for m in &file.methods {
        let Some(b) = &m.baseline else { continue };
        let Some(base) = file.methods.iter().find(|x| x.name() == b) else {
            bail!(
                "method {:?} has baseline {b:?}, which is no method of the grid",
                m.name()
            );
        };
        if let Some(env) = m.envs.iter().find(|e| !base.envs.contains(e)) {
            bail!(
                "method {:?} runs on {env:?} but its baseline {b:?} does not",
                m.name()
            );
        }
    }
    Ok(())
}

fn expand(file: GridFile, stem: &str, model: Option<&str>) -> Result<Grid> {
    check_arena(&file.arena)?;
    let name = file.arena.name.clone().unwrap_or_else(|| stem.to_string());
    if !valid_label(&name) {
        bail!("the grid's name {name:?}: use 1-64 of [A-Za-z0-9_-] (arena.name)");
    }
    for env in file.envs.keys() {
        if !valid_label(env) {
            bail!("env name {env:?}: use 1-64 of [A-Za-z0-9_-]");
        }
    }
    check_methods(&file)?;
    let fragments = [("[base]", &file.base)]
        .into_iter()
        .chain(file.stress.iter().map(|s| ("[stress]", s)))
        .chain(file.envs.iter().map(|(k, t)| (k.as_str(), t)));
    for (what, fragment) in fragments {
        if let Some(key) = owned_key_in(fragment) {
            bail!("{what} sets {key}, which the arena sets (preset, arena.seeds, arena.steps)");
        }
    }
    let settings: Vec<Setting> = std::iter::once(Setting::Control)
        .chain(file.stress.as_ref().map(|_| Setting::Stress))
        .chain(rungs(&file.ladder)?)
        .collect();
    let mut envs: Vec<String> = Vec::new();
    let mut cells = Vec::new();
    for m in &file.methods {
        for env in &m.envs {
            if !envs.contains(env) {
                envs.push(env.clone());
            }
            let skipped = |s: &Setting| s.rung().is_some_and(|(a, _)| m.ladder_skip.contains(&a));
            for &setting in settings.iter().filter(|s| !skipped(s)) {
                for &seed in &file.arena.seeds {
                    cells.push(cell(&file, m, env, setting, seed, model)?);
                }
            }
        }
    }
    Ok(Grid {
        name,
        arena: file.arena,
        methods: file.methods,
        envs,
        settings,
        cells,
    })
}

fn cell(
    file: &GridFile,
    m: &MethodEntry,
    env: &str,
    setting: Setting,
    seed: u64,
    model: Option<&str>,
) -> Result<Cell> {
    let name = format!("{}.{env}.{}.s{seed}", m.name(), setting.name());
    let mut t = Table::new();
    set(&mut t, "learner", "reference_kl", Value::Boolean(true));
    overlay(&mut t, &file.base);
    if let Some(e) = file.envs.get(env) {
        overlay(&mut t, e);
    }
    overlay(&mut t, &m.config);
    let lr_factor = match (setting, &file.stress) {
        (Setting::Stress, Some(s)) => {
            overlay(&mut t, s);
            overlay(&mut t, &m.stress);
            file.arena.stress_lr_factor
        }
        (Setting::Rung(axis, v), _) => {
            let v = i64::try_from(v).context("a ladder value is too large")?;
            match axis {
                Axis::Staleness => {
                    set(&mut t, "run", "mode", Value::String("async".into()));
                    set(&mut t, "run", "staleness_bound", Value::Integer(v));
                    1.0
                }
                Axis::Minibatches => {
                    set(&mut t, "learner", "minibatches", Value::Integer(v));
                    1.0
                }
                Axis::LrFactor => v as f64 / 1000.0,
            }
        }
        _ => 1.0,
    };
    // run.name allows no '.': the cell's name with '_' (a label of its metrics and trackers).
    set(&mut t, "run", "name", Value::String(name.replace('.', "_")));
    set(&mut t, "run", "seed", Value::Integer(i64::try_from(seed)?));
    let steps = i64::try_from(file.arena.steps).context("arena.steps is too large")?;
    set(&mut t, "run", "steps", Value::Integer(steps));
    set(&mut t, "learner", "algo", Value::String(m.preset.clone()));
    if let Some(path) = model {
        set(&mut t, "model", "path", Value::String(path.to_string()));
    }
    let parse = |t: &Table| {
        let text = toml::to_string(t).context("cannot render the cell's config")?;
        let cfg = TrainConfig::from_toml(&text).with_context(|| format!("cell {name}"))?;
        Ok::<_, anyhow::Error>((text, cfg))
    };
    let (mut text, mut cfg) = parse(&t)?;
    if lr_factor != 1.0 {
        scale_lrs(&mut t, cfg.learner.lr, lr_factor);
        (text, cfg) = parse(&t)?;
    }
    let knobs = Knobs {
        staleness: cfg.staleness_bound() as f64,
        minibatches: cfg.learner.minibatches as f64,
        lr_factor,
    };
    Ok(Cell {
        name,
        method: m.name().to_string(),
        env: env.to_string(),
        setting,
        seed,
        knobs,
        config_text: text,
    })
}

/// The learner's and every agent model's learning rate times `k` (`lr` is the learner's).
fn scale_lrs(t: &mut Table, lr: f64, k: f64) {
    set(t, "learner", "lr", Value::Float(lr * k));
    if let Some(Value::Array(models)) = t.get_mut("agent_models") {
        for am in models.iter_mut().filter_map(Value::as_table_mut) {
            if let Some(lr) = am.get("lr").and_then(Value::as_float) {
                am.insert("lr".into(), Value::Float(lr * k));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRID: &str = r#"
[arena]
seeds = [1, 2]
steps = 4
stress_lr_factor = 3.0

[base]
run = { threads = 1 }

[stress]
run = { mode = "async", staleness_bound = 4 }

[envs.calc]
env = { name = "calc", difficulty = 1 }

[[methods]]
preset = "grpo"
envs = ["calc"]

[[methods]]
preset = "so_grpo"
envs = ["calc"]
baseline = "grpo"
config = { learner = { epochs = 2 } }
"#;

    fn grid(text: &str) -> Result<Grid> {
        expand(toml::from_str(text)?, "g", None)
    }

    #[test]
    fn ag2_cells_layer_base_env_method_stress_and_the_arena_keys() {
        let g = grid(GRID).expect("grid");
        assert_eq!(g.cells.len(), 2 * 2 * 2);
        assert_eq!(g.name, "g");
        let c = g
            .cells
            .iter()
            .find(|c| c.name == "so_grpo.calc.stress.s2")
            .expect("cell");
        let cfg = TrainConfig::from_toml(&c.config_text).expect("valid");
        assert_eq!(cfg.run.seed, 2);
        assert_eq!(cfg.run.steps, 4);
        assert_eq!(cfg.run.threads, 1);
        assert_eq!(cfg.learner.epochs, 2);
        assert!(cfg.learner.reference_kl);
        assert_eq!(cfg.learner.algo.name(), "so_grpo");
        assert_eq!(cfg.staleness_bound(), 4);
        let control = g
            .cells
            .iter()
            .find(|c| c.name == "so_grpo.calc.control.s2")
            .expect("control");
        let base = TrainConfig::from_toml(&control.config_text).expect("valid");
        assert_eq!(cfg.learner.lr, base.learner.lr * 3.0);
        assert_eq!(
            base.staleness_bound(),
            0,
            "the control is the default sync mode"
        );
        assert_eq!(g.baseline_of("so_grpo"), Some("grpo"));
    }

    #[test]
    fn ag1_bad_grids_are_refused_naming_the_entry() {
        let cases = [
            (
                GRID.replace("baseline = \"grpo\"", "baseline = \"ppo\""),
                "no method",
            ),
            (
                GRID.replace("envs = [\"calc\"]\nbaseline", "envs = [\"shop\"]\nbaseline"),
                "[envs.shop]",
            ),
            (
                GRID.replace("run = { threads = 1 }", "run = { seed = 3 }"),
                "run.seed",
            ),
            (GRID.replace("seeds = [1, 2]", "seeds = [1, 1]"), "twice"),
            (
                GRID.replace("preset = \"so_grpo\"", "preset = \"grpo\""),
                "two methods",
            ),
            (
                GRID.replace("epochs = 2", "epochs = 0"),
                "cell so_grpo.calc.control.s1",
            ),
            (
                GRID.replace(
                    "[[methods]]\npreset = \"grpo\"",
                    "[[methods]]\nname = \"a.b\"\npreset = \"grpo\"",
                ),
                "a.b",
            ),
        ];
        for (text, want) in cases {
            let err = format!("{:#}", grid(&text).expect_err(want));
            assert!(err.contains(want), "{want}: {err}");
        }
    }

    /// AGR-4: each rung moves one knob of the control; a method can skip an axis.
    #[test]
    fn agr4_ladder_rungs_move_one_knob_and_methods_may_skip_an_axis() {
        let text =
            format!("{GRID}\n[ladder]\nstaleness = [1, 8]\nminibatches = [4]\nlr_factor = [0.5]\n")
                .replace(
                    "config = { learner = { epochs = 2 } }",
                    "config = { learner = { epochs = 2 } }\nladder_skip = [\"staleness\"]",
                );
        let g = expand(toml::from_str(&text).expect("toml"), "g", Some("/m")).expect("grid");
        let names: Vec<String> = g.settings.iter().map(|s| s.name()).collect();
        assert_eq!(
            names,
            ["control", "stress", "stale1", "stale8", "mb4", "lr0p5x"]
        );
        assert_eq!(
            g.ladder_axes(),
            [Axis::Staleness, Axis::Minibatches, Axis::LrFactor]
        );
        // grpo: 6 settings; so_grpo skips the 2 staleness rungs; 2 seeds each.
        assert_eq!(g.cells.len(), (6 + 4) * 2);
        assert!(!g.runs("so_grpo", Setting::Rung(Axis::Staleness, 1)));
        let find = |name: &str| {
            let c = g.cells.iter().find(|c| c.name == name).expect(name);
            (
                c.knobs,
                TrainConfig::from_toml(&c.config_text).expect("valid"),
            )
        };
        let (k0, control) = find("grpo.calc.control.s1");
        assert_eq!((k0.staleness, k0.lr_factor), (0.0, 1.0));
        assert_eq!(
            control.model.path, "/m",
            "--model is every cell's model.path"
        );
        let (k, cfg) = find("grpo.calc.stale8.s1");
        assert_eq!((k.staleness, cfg.staleness_bound()), (8.0, 8));
        assert_eq!(cfg.learner.lr, control.learner.lr);
        let (k, cfg) = find("so_grpo.calc.mb4.s2");
        assert_eq!((k.minibatches, cfg.learner.minibatches), (4.0, 4));
        assert_eq!(cfg.learner.epochs, 2, "the method's own keys stay");
        assert_eq!(cfg.staleness_bound(), 0, "only the one knob moves");
        let (k, cfg) = find("grpo.calc.lr0p5x.s1");
        assert_eq!(k.lr_factor, 0.5);
        assert_eq!(cfg.learner.lr, control.learner.lr * 0.5);
        for (ladder, want) in [
            ("staleness = [0]", "0 is the control"),
            ("staleness = [2, 2]", "twice"),
            ("staleness = [2]\nminibatches = [0]", "at least 1"),
            ("staleness = [2]\nlr_factor = [1.0]", "other than 1"),
            ("staleness = [2]\nlr_factor = [0.0005]", "3 decimals"),
            ("lr_factor = [2.0]", "skips ladder axis \"staleness\""),
        ] {
            let text = format!("{GRID}\n[ladder]\n{ladder}\n").replace(
                "config = { learner = { epochs = 2 } }",
                "config = { learner = { epochs = 2 } }\nladder_skip = [\"staleness\"]",
            );
            let err = format!("{:#}", grid(&text).expect_err(want));
            assert!(err.contains(want), "{ladder}: {err}");
        }
    }

    #[test]
    fn overlay_merges_tables_and_replaces_values() {
        let mut a: Table = toml::from_str("x = { y = 1, z = 2 }\nw = [1]").expect("a");
        let b: Table = toml::from_str("x = { y = 5 }\nw = [2, 3]").expect("b");
        overlay(&mut a, &b);
        assert_eq!(a["x"]["y"].as_integer(), Some(5));
        assert_eq!(a["x"]["z"].as_integer(), Some(2));
        assert_eq!(a["w"].as_array().map(Vec::len), Some(2));
    }
}
