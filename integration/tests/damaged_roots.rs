//! `keel ckpt list / lineage / verify` on run roots whose head or manifests are damaged (issue 32
//! item 9, CL-1, SY-1, SY-2): every readable checkpoint is still shown, the damage is named, and
//! the checkpoint to resume from is given with the command that resumes from it.

use std::path::Path;
use std::process::Command;

use keel_integration::{keel_bin, run_train, MethodRun};

fn keel(args: &[&str], root: &Path) -> (bool, String) {
    let out = Command::new(keel_bin())
        .args(args)
        .arg("--run-root")
        .arg(root)
        .output()
        .expect("run keel");
    let text =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

/// A finished run's root (checkpoints at steps 0, 2, 4) copied afresh for each damage.
fn trained_root(dir: &Path) -> std::path::PathBuf {
    let run = MethodRun {
        steps: 4,
        checkpoint_every: 2,
        ..MethodRun::new("grpo")
    };
    let cfg = run.write(dir, "run");
    let root = dir.join("run");
    run_train(&cfg, &root, &[]);
    root
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for entry in std::fs::read_dir(from).expect("read dir").flatten() {
        let path = entry.path();
        let target = to.join(entry.file_name());
        if path.is_dir() {
            copy_dir(&path, &target);
        } else {
            std::fs::copy(&path, &target).expect("copy");
        }
    }
}

/// (head id, ids oldest first) of a root.
fn ids(root: &Path) -> (String, Vec<String>) {
    let lineage = keel_integration::head_lineage(root);
    let head = lineage.first().expect("a head").id.clone();
    let mut all: Vec<(u64, String)> = keel_integration::checkpoints(root)
        .into_iter()
        .map(|m| (m.step, m.id))
        .collect();
    all.sort();
    (head, all.into_iter().map(|(_, id)| id).collect())
}

fn newest_head_file(root: &Path) -> std::path::PathBuf {
    let dir = root.join("branches/main");
    let mut heads: Vec<_> = std::fs::read_dir(&dir)
        .expect("heads")
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("HEAD."))
        })
        .collect();
    heads.sort();
    heads.pop().expect("a head object")
}

#[test]
fn ckpt_commands_survey_a_root_with_a_damaged_head_or_manifest() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clean = trained_root(dir.path());
    let (head, all) = ids(&clean);
    assert_eq!(all.len(), 3, "{all:?}");
    let previous = &all[1];

    // The head names a checkpoint whose manifest is gone.
    let root = dir.path().join("missing");
    copy_dir(&clean, &root);
    std::fs::remove_file(root.join(format!("checkpoints/{head}/MANIFEST.json"))).expect("rm");
    for cmd in [["ckpt", "list"], ["ckpt", "lineage"]] {
        let (ok, text) = keel(&cmd, &root);
        assert!(ok, "{cmd:?}: {text}");
        assert!(
            text.contains(previous.as_str()),
            "{cmd:?} lists the readable ones: {text}"
        );
        assert!(
            text.contains(&format!("damaged: the head of branch main: it names checkpoint {head}, which does not exist")),
            "{cmd:?}: {text}"
        );
        assert!(
            text.contains(&format!("resume from {previous}"))
                && text.contains(&format!("--from {previous}")),
            "{cmd:?} names the checkpoint to resume from: {text}"
        );
    }
    let (ok, text) = keel(&["ckpt", "verify", previous], &root);
    assert!(ok, "verify works on a root with a damaged head: {text}");

    // The head object itself is garbage.
    let root = dir.path().join("garbled-head");
    copy_dir(&clean, &root);
    std::fs::write(newest_head_file(&root), b"\x00not a head").expect("garble");
    let (ok, text) = keel(&["ckpt", "list"], &root);
    assert!(ok, "{text}");
    assert!(text.contains("the head cannot be read"), "{text}");
    assert!(text.contains(&format!("resume from {head}")), "{text}");

    // A manifest that is not the head's is garbage: the others are listed.
    let root = dir.path().join("garbled-manifest");
    copy_dir(&clean, &root);
    std::fs::write(
        root.join(format!("checkpoints/{previous}/MANIFEST.json")),
        b"{",
    )
    .expect("garble");
    let (ok, text) = keel(&["ckpt", "lineage"], &root);
    assert!(ok, "{text}");
    assert!(
        text.contains(&format!("damaged: checkpoint {previous}")),
        "{text}"
    );
    assert!(text.contains(&head) && text.contains(&all[0]), "{text}");
}
