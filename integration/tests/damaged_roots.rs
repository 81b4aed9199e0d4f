//! `keel ckpt list / lineage / verify` on run roots whose head or manifests are damaged (issue 32
//! item 9, CKL-1, SY-1, SY-2): every readable checkpoint is still shown, the damage is named, and
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
    keel_integration::copy_dir(&clean, &root);
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
    keel_integration::copy_dir(&clean, &root);
    std::fs::write(newest_head_file(&root), b"\x00not a head").expect("garble");
    let (ok, text) = keel(&["ckpt", "list"], &root);
    assert!(ok, "{text}");
    assert!(text.contains("the head cannot be read"), "{text}");
    assert!(text.contains(&format!("resume from {head}")), "{text}");

    // A manifest that is not the head's is garbage: the others are listed.
    let root = dir.path().join("garbled-manifest");
    keel_integration::copy_dir(&clean, &root);
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

// ---- issue 32 items 7, 8 and 10a: odd names, planted links, dead storage --------------------

/// Explicit S3 settings for a child keel (the test server's, never the cloud metadata address).
fn s3_env(cmd: &mut Command, endpoint: &str) {
    let var = |k: &str, default: &str| std::env::var(k).unwrap_or_else(|_| default.to_string());
    cmd.env("AWS_ENDPOINT_URL", endpoint)
        .env("AWS_ACCESS_KEY_ID", var("AWS_ACCESS_KEY_ID", "keel-test"))
        .env(
            "AWS_SECRET_ACCESS_KEY",
            var("AWS_SECRET_ACCESS_KEY", "keel-test-secret"),
        )
        .env("AWS_REGION", var("AWS_REGION", "us-east-1"))
        .env("AWS_ALLOW_HTTP", "true")
        .env("AWS_EC2_METADATA_DISABLED", "true");
}

/// `keel <args> --run-root <s3 root>` against `endpoint`: (success, stdout + stderr).
fn keel_s3(args: &[&str], root: &str, endpoint: &str) -> (bool, String) {
    let mut cmd = Command::new(keel_bin());
    cmd.args(args)
        .args(["--run-root", root])
        .env("KEEL_LOG", "warn");
    s3_env(&mut cmd, endpoint);
    let out = tempfile::NamedTempFile::new().expect("output file");
    let file = out.reopen().expect("output file");
    let status = keel_integration::Guarded::spawn(
        cmd.stdout(file.try_clone().expect("output file"))
            .stderr(file),
    )
    .expect("start keel")
    .wait()
    .expect("wait keel");
    let text = std::fs::read_to_string(out.path()).unwrap_or_default();
    (status.success(), text)
}

/// Stores `bytes` at `s3://<bucket>/<key>` with any name (a newline included): a signed PUT
/// through curl, as a person planting it by hand would.
fn plant_s3(endpoint: &str, root: &str, rel: &str, bytes: &[u8]) {
    let path = root.strip_prefix("s3://").expect("an s3 root");
    let encoded: String = format!("{path}/{rel}")
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' | b'/' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect();
    let body = tempfile::NamedTempFile::new().expect("body");
    std::fs::write(body.path(), bytes).expect("body");
    let user = format!(
        "{}:{}",
        std::env::var("AWS_ACCESS_KEY_ID").unwrap_or_else(|_| "keel-test".into()),
        std::env::var("AWS_SECRET_ACCESS_KEY").unwrap_or_else(|_| "keel-test-secret".into())
    );
    let out = Command::new("curl")
        .args([
            "-s",
            "-f",
            "--aws-sigv4",
            "aws:amz:us-east-1:s3",
            "--user",
            &user,
            "-T",
        ])
        .arg(body.path())
        .arg(format!("{endpoint}/{encoded}"))
        .output()
        .expect("run curl");
    assert!(out.status.success(), "plant {rel:?}: {out:?}");
}

/// Issue 32 item 7: one object under `batches/` (and one under `checkpoints/`) with a newline in
/// its name blocked every resume on S3 with a message about credentials. Names keel never
/// writes are skipped (LI-1, LI-2): the run resumes and finishes, `keel ckpt list` works.
#[test]
fn an_odd_object_name_on_s3_never_blocks_a_resume() {
    let endpoint = keel_integration::s3_endpoint();
    let dir = tempfile::tempdir().expect("tempdir");
    let root = keel_integration::s3_root("odd-name");
    let train = |steps: u64| {
        let config = dir.path().join(format!("tiny-{steps}.toml"));
        std::fs::write(
            &config,
            keel_integration::tiny_config_unguarded(steps, 2, "sync", 1),
        )
        .expect("config");
        let config = config.to_str().expect("utf-8").to_string();
        keel_s3(
            &["train", "--no-progress", "--config", &config],
            &root,
            &endpoint,
        )
    };
    let (ok, text) = train(2);
    assert!(ok, "first run: {text}");
    plant_s3(&endpoint, &root, "batches/0000000003\nname.krb", b"planted");
    plant_s3(&endpoint, &root, "checkpoints/bad\nid/MANIFEST.json", b"{}");
    plant_s3(&endpoint, &root, "branches/main/HEAD.0000000099\n", b"x");
    let (ok, text) = train(4);
    assert!(ok, "the resume survives the odd names: {text}");
    assert!(!text.contains("credentials"), "{text}");
    let (ok, text) = keel_s3(&["ckpt", "list"], &root, &endpoint);
    assert!(ok, "{text}");
    assert!(text.contains("step 4") || text.contains(" 4 "), "{text}");
}

/// Files under `dir`, walked without following links: (path, is a link).
fn walk_no_follow(dir: &Path, out: &mut Vec<(std::path::PathBuf, bool)>) {
    for entry in std::fs::read_dir(dir).expect("read dir").flatten() {
        let ft = entry.file_type().expect("file type");
        if ft.is_dir() {
            walk_no_follow(&entry.path(), out);
        } else {
            out.push((entry.path(), ft.is_symlink()));
        }
    }
}

/// Issue 32 item 8: links planted in a local run root — a batch-named link to a file outside, a
/// linked folder under `batches/`, linked `checkpoints/` and `lives/` entries — are never
/// followed: the resumed run finishes, and no byte of the outside files enters the root.
#[test]
fn planted_links_in_a_local_root_are_never_followed() {
    let dir = tempfile::tempdir().expect("tempdir");
    let outside = tempfile::tempdir().expect("outside");
    let secret = b"SECRET-OUTSIDE-THE-RUN-ROOT";
    std::fs::write(outside.path().join("0000000001.krb"), secret).expect("secret");
    std::fs::write(outside.path().join("MANIFEST.json"), secret).expect("secret");
    let run = |steps: u64| MethodRun {
        steps,
        checkpoint_every: 2,
        ..MethodRun::new("grpo")
    };
    let cfg = run(2).write(dir.path(), "run");
    let root = dir.path().join("run");
    run_train(&cfg, &root, &[]);
    let link = |target: &Path, at: &str| {
        let at = root.join(at);
        std::fs::create_dir_all(at.parent().expect("parent")).expect("mkdir");
        std::os::unix::fs::symlink(target, at).expect("link");
    };
    let planted = outside.path().join("0000000001.krb");
    for seq in [3, 4, 5, 6, 7, 8, 9] {
        link(&planted, &format!("batches/{seq:010}.krb"));
    }
    link(outside.path(), "batches/linked");
    link(outside.path(), "checkpoints/linked");
    link(&planted, "lives/0000000099.json");
    let cfg = run(4).write(dir.path(), "run");
    run_train(&cfg, &root, &[]);
    for cmd in [["ckpt", "list"], ["ckpt", "lineage"]] {
        let (ok, text) = keel(&cmd, &root);
        assert!(ok, "{cmd:?}: {text}");
    }
    let mut files = Vec::new();
    walk_no_follow(&root, &mut files);
    for (path, is_link) in files {
        if is_link {
            continue;
        }
        let bytes = std::fs::read(&path).expect("read");
        assert!(
            !bytes.windows(secret.len()).any(|w| w == secret),
            "{} holds bytes of a file outside the run root",
            path.display()
        );
    }
    assert_eq!(std::fs::read(&planted).expect("target"), secret);
}

/// Issue 32 item 10a: storage killed mid-run ends the run within its retry budget (HL-1, HL-2):
/// it took 182 s with a 60 s budget. The budget is 10 s here; the run must end within 1.5
/// budgets of the kill.
#[test]
fn killed_storage_fails_the_run_within_one_and_a_half_budgets() {
    let mut server = keel_integration::OwnSeaweed::start();
    let endpoint = server.endpoint.clone();
    std::env::set_var("AWS_ENDPOINT_URL", &endpoint);
    let rt = keel_integration::test_rt();
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("tiny.toml");
    std::fs::write(
        &config,
        keel_integration::tiny_config_unguarded(100_000, 2, "async", 2),
    )
    .expect("config");
    let root = keel_integration::s3_root("killed-storage");
    let log = dir.path().join("train.log");
    let budget = 10u64;
    let mut cmd = Command::new(keel_bin());
    cmd.args(["train", "--no-progress", "--config"])
        .arg(&config)
        .args(["--run-root", &root])
        .env("KEEL_S3_RETRY_TIMEOUT_S", budget.to_string())
        .env("KEEL_LOG", "warn")
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).expect("log"));
    s3_env(&mut cmd, &endpoint);
    let mut child = keel_integration::Guarded::spawn(&mut cmd).expect("start keel train");
    let store = keel_store::RunStore::open(&root).expect("open");
    // Progress, not time: kill once a checkpoint past step 2 is committed.
    while rt
        .block_on(store.latest_checkpoint())
        .ok()
        .flatten()
        .is_none_or(|m| m.step < 2)
    {
        assert!(
            child.try_wait().expect("wait").is_none(),
            "the run ended early"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    server.kill();
    let killed = std::time::Instant::now();
    let status = child.wait().expect("wait");
    let took = killed.elapsed();
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(!status.success(), "no storage, no success:\n{text}");
    eprintln!("storage killed: the run failed after {took:?} (budget {budget} s)");
    assert!(
        took.as_secs_f64() < budget as f64 * 1.5,
        "failing took {took:?}, over 1.5 x the {budget} s budget:\n{text}"
    );
    assert!(
        !text.contains("credentials in the AWS_* environment"),
        "a dead endpoint is not a credentials problem:\n{text}"
    );
}
