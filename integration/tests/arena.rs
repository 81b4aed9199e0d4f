//! `keel arena` on the shipped smoke grid: every cell runs as its own `keel train`, the table,
//! the staleness ladder and the plots are written, a grid killed half-way skips its finished cells and resumes the
//! interrupted one on a rerun (AR-1, AR-3, AA-2), and a grid whose cells changed is refused
//! (AR-2).

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use keel_integration::{keel_bin, wait_for};

fn smoke_grid() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../recipes/arena/smoke.toml")
}

const CELLS: [&str; 6] = [
    "grpo.calc.control.s1",
    "grpo.calc.stress.s1",
    "grpo.calc.stale2.s1",
    "so_grpo.calc.control.s1",
    "so_grpo.calc.stress.s1",
    "so_grpo.calc.stale2.s1",
];

fn arena(grid: &Path, out: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(keel_bin())
        .arg("arena")
        .arg(grid)
        .arg("--out")
        .arg(out)
        .args(extra)
        .env("KEEL_LOG", "warn")
        .output()
        .expect("run keel arena")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// Whether `checkpoints/` holds a committed checkpoint of `step` (ids are `<step:08>-<hash>`).
fn has_checkpoint_at_step(dir: &Path, step: u64) -> bool {
    let prefix = format!("{step:08}-");
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            e.file_name().to_string_lossy().starts_with(&prefix)
                && e.path().join("MANIFEST.json").is_file()
        })
    })
}

#[test]
fn a_grid_killed_half_way_resumes_and_writes_its_table_and_plots() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("smoke");
    let cells = out.join("cells");
    // One cell at a time; kill the arena once the first cell finished and the second has a
    // checkpoint past the SFT warm start.
    let mut first = Command::new(keel_bin())
        .arg("arena")
        .arg(smoke_grid())
        .arg("--out")
        .arg(&out)
        .args(["--jobs", "1"])
        .env("KEEL_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start keel arena");
    wait_for("the first cell", Duration::from_secs(300), || {
        cells.join(format!("{}.json", CELLS[0])).is_file()
    });
    let second_log = cells.join(format!("{}.log", CELLS[1]));
    let second_checkpoints = out.join(CELLS[1]).join("checkpoints");
    wait_for(
        "the second cell's first RL checkpoint",
        Duration::from_secs(300),
        || has_checkpoint_at_step(&second_checkpoints, 2),
    );
    first.kill().expect("SIGKILL the arena");
    first.wait().expect("reap");
    let finished_before = read(&cells.join(format!("{}.json", CELLS[0])));
    // AR-3: the orphaned cell was told to stop (PR_SET_PDEATHSIG) and checkpoints on its way out.
    wait_for("the orphaned cell to stop", Duration::from_secs(60), || {
        read(&second_log).contains("stopped on request")
            && cells.join(format!("{}.json.part", CELLS[1])).is_file()
    });
    assert!(!cells.join(format!("{}.json", CELLS[1])).exists());

    let rerun = arena(&smoke_grid(), &out, &["--jobs", "2"]);
    let stderr = String::from_utf8_lossy(&rerun.stderr);
    assert!(rerun.status.success(), "{stderr}");
    assert!(stderr.contains("1 finished before, 5 to run"), "{stderr}");
    assert_eq!(
        read(&cells.join(format!("{}.json", CELLS[0]))),
        finished_before,
        "a finished cell is not run again"
    );
    let outcome: serde_json::Value =
        serde_json::from_str(&read(&cells.join(format!("{}.json", CELLS[1])))).expect("json");
    assert_eq!(outcome["final_step"], 6);
    assert!(
        outcome["resumed_from"].is_string(),
        "the interrupted cell resumed its run root: {outcome}"
    );
    assert_eq!(
        read(&second_log).matches("run root:").count(),
        2,
        "two lives"
    );

    let table = read(&out.join("table.md"));
    assert!(table.contains("6 of 6 cells finished"), "{table}");
    assert!(
        table.contains("## calc, control")
            && table.contains("## calc, stress")
            && table.contains("## calc, stale2"),
        "{table}"
    );
    assert_eq!(table.matches("| so_grpo | grpo |").count(), 3, "{table}");
    // The staleness ladder: the control (sync) is its origin, then bound 2, for both methods,
    // and SO-GRPO's paired Δ at each point.
    assert!(
        table.contains("## calc: held-out success against the staleness bound")
            && table.contains("| method | control (sync) | 2 |")
            && table.contains("| so_grpo − grpo | "),
        "{table}"
    );
    let csv = read(&out.join("table.csv"));
    assert_eq!(csv.lines().count(), 1 + 6, "{csv}");
    let cells_csv = read(&out.join("cells.csv"));
    for c in CELLS {
        assert!(cells_csv.contains(&format!("\n{c},")), "{cells_csv}");
        let cfg = read(&cells.join(format!("{c}.toml")));
        assert!(cfg.contains("reference_kl = true"), "{cfg}");
    }
    assert!(
        cells_csv.contains(&format!("\n{},", CELLS[2])) && cells_csv.contains(",2,2,1\n"),
        "the stale2 cell sits at staleness 2 (2 mini-batches, lr factor 1): {cells_csv}"
    );
    for fig in [
        "calc.control.success",
        "calc.stress.grad_norm",
        "calc.ladder.staleness",
    ] {
        let png = std::fs::metadata(out.join("plots").join(format!("{fig}.png"))).expect("png");
        assert!(png.len() > 1000, "{fig}.png");
        assert!(read(&out.join("plots").join(format!("{fig}.svg"))).starts_with("<svg"));
    }
    // Every cell is an ordinary run root: keel ckpt list reads it.
    let list = Command::new(keel_bin())
        .args(["ckpt", "list", "--run-root"])
        .arg(out.join(CELLS[4]))
        .output()
        .expect("ckpt list");
    assert!(list.status.success());
    assert!(String::from_utf8_lossy(&list.stdout).contains("00000006"));
}

#[test]
fn changed_cells_are_refused_and_table_only_runs_nothing() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("g");
    let only = arena(&smoke_grid(), &out, &["--table-only"]);
    assert!(
        only.status.success(),
        "{}",
        String::from_utf8_lossy(&only.stderr)
    );
    let table = read(&out.join("table.md"));
    assert!(
        table.contains("0 of 6 cells finished") && table.contains("| grpo | 0/1 | — |"),
        "{table}"
    );
    assert!(!out.join(CELLS[0]).exists(), "--table-only trains nothing");

    // A cell config left by an earlier run of another version of the grid.
    std::fs::create_dir_all(out.join("cells")).expect("mkdir");
    std::fs::write(
        out.join("cells").join(format!("{}.toml", CELLS[3])),
        "[run]\nsteps = 99\n",
    )
    .expect("write");
    let refused = arena(&smoke_grid(), &out, &[]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(!refused.status.success());
    assert!(
        stderr.contains("changed the config of 1 cell") && stderr.contains(CELLS[3]),
        "{stderr}"
    );
    assert!(!out.join(CELLS[0]).exists(), "nothing ran");

    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        read(&smoke_grid()).replace("baseline = \"grpo\"", "baseline = \"gpro\""),
    )
    .expect("write");
    let refused = arena(&bad, &dir.path().join("bad"), &[]);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        !refused.status.success() && stderr.contains("\"gpro\""),
        "{stderr}"
    );
}
