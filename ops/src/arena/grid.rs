//! A grid file (`recipes/arena/*.toml`) and the cells it expands to.
//!
//! A cell is one `keel train` run: a method (a preset with its config) on an env, in a setting
//! (`control`, or `stress` when the grid has a `[stress]` table), with one seed. Its config is
//! the built-in defaults, then `[base]`, then the env's table, then the method's `config`, then
//! (stress only) `[stress]` and the method's own `stress` fragment, with the learning rates times `arena.stress_lr_factor`, then what
//! the arena owns: `run.name` (the cell's name with `_` for `.`), `run.seed`, `run.steps`, `learner.algo` (the method's preset) and
//! `learner.reference_kl = true` (so every method reports its KL to the SFT reference).
//!
//! Invariants:
//! - AGR-1: a grid that names an unknown env, a baseline that is not run on every env of its
//!   method, a duplicate name or seed, or a fragment that sets a key the arena owns is refused
//!   before anything runs, naming the entry.
//! - AGR-2: every cell's config is validated as `keel train` validates it (`TrainConfig`); the
//!   error names the cell. The cell's config text is a pure function of the grid file.
//! - AGR-3: cell names are `<method>.<env>.<setting>.s<seed>` with method and env names of
//!   `[A-Za-z0-9_-]`, so a cell name is a safe folder name and never collides with the grid's
//!   own `cells/` and `plots/` folders.

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
    /// Config fragment of the stress setting; without it only the control runs.
    pub stress: Option<Table>,
    /// Config fragment per env name.
    pub envs: BTreeMap<String, Table>,
    /// The methods.
    pub methods: Vec<MethodEntry>,
}

/// `control` or `stress`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Setting {
    /// The grid without `[stress]`.
    Control,
    /// With `[stress]`.
    Stress,
}

impl Setting {
    /// Its name in cell names and tables.
    pub fn name(self) -> &'static str {
        match self {
            Setting::Control => "control",
            Setting::Stress => "stress",
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
    /// Control or stress.
    pub setting: Setting,
    /// `run.seed`.
    pub seed: u64,
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
    /// Settings run.
    pub settings: Vec<Setting>,
    /// Every cell.
    pub cells: Vec<Cell>,
}

impl Grid {
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

/// Reads and expands a grid file (AGR-1..3).
pub fn load(path: &Path) -> Result<Grid> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read grid {}", path.display()))?;
    let file: GridFile =
        toml::from_str(&text).with_context(|| format!("in grid {}", path.display()))?;
    let stem = path
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("grid")
        .to_string();
    expand(file, &stem).with_context(|| format!("in grid {}", path.display()))
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

fn expand(file: GridFile, stem: &str) -> Result<Grid> {
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
        .collect();
    let mut envs: Vec<String> = Vec::new();
    let mut cells = Vec::new();
    for m in &file.methods {
        for env in &m.envs {
            if !envs.contains(env) {
                envs.push(env.clone());
            }
            for &setting in &settings {
                for &seed in &file.arena.seeds {
                    cells.push(cell(&file, m, env, setting, seed)?);
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

fn cell(file: &GridFile, m: &MethodEntry, env: &str, setting: Setting, seed: u64) -> Result<Cell> {
    let name = format!("{}.{env}.{}.s{seed}", m.name(), setting.name());
    let mut t = Table::new();
    set(&mut t, "learner", "reference_kl", Value::Boolean(true));
    overlay(&mut t, &file.base);
    if let Some(e) = file.envs.get(env) {
        overlay(&mut t, e);
    }
    overlay(&mut t, &m.config);
    let stress = match (setting, &file.stress) {
        (Setting::Stress, Some(s)) => {
            overlay(&mut t, s);
            overlay(&mut t, &m.stress);
            true
        }
        _ => false,
    };
    // run.name allows no '.': the cell's name with '_' (a label of its metrics and trackers).
    set(&mut t, "run", "name", Value::String(name.replace('.', "_")));
    set(&mut t, "run", "seed", Value::Integer(i64::try_from(seed)?));
    let steps = i64::try_from(file.arena.steps).context("arena.steps is too large")?;
    set(&mut t, "run", "steps", Value::Integer(steps));
    set(&mut t, "learner", "algo", Value::String(m.preset.clone()));
    let parse = |t: &Table| {
        let text = toml::to_string(t).context("cannot render the cell's config")?;
        let cfg = TrainConfig::from_toml(&text).with_context(|| format!("cell {name}"))?;
        Ok::<_, anyhow::Error>((text, cfg))
    };
    let (mut text, cfg) = parse(&t)?;
    if stress && file.arena.stress_lr_factor != 1.0 {
        let k = file.arena.stress_lr_factor;
        set(&mut t, "learner", "lr", Value::Float(cfg.learner.lr * k));
        if let Some(Value::Array(models)) = t.get_mut("agent_models") {
            for am in models.iter_mut().filter_map(Value::as_table_mut) {
                if let Some(lr) = am.get("lr").and_then(Value::as_float) {
                    am.insert("lr".into(), Value::Float(lr * k));
                }
            }
        }
        text = parse(&t)?.0;
    }
    Ok(Cell {
        name,
        method: m.name().to_string(),
        env: env.to_string(),
        setting,
        seed,
        config_text: text,
    })
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
        expand(toml::from_str(text)?, "g")
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
