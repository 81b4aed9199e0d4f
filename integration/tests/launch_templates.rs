//! `keel launch ray|slurm|k8s --print`: each file renders and is valid in its format (the Ray
//! driver parses as Python, the sbatch script passes `bash -n` and, where Slurm is installed,
//! `sbatch --test-only`, the manifest parses as YAML with the expected JobSet structure), and
//! hostile values — quotes, spaces, `$(...)`, backticks, `;`, newlines — in the keel path, the
//! run root, the config and the trainer arguments arrive unchanged and run nothing.
//!
//! The sbatch script also runs for real under bash with a stand-in `srun` (drops its options,
//! runs the command) and `tests/python/fake_keel.py` as keel: ranks, the restart of a failed
//! generator, the trainer's exit status, and SIGTERM forwarded to every role.
//!
//! Needs python3 with PyYAML (scripts/setup.sh installs it with Ray).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use keel_integration::{keel_bin, wait_exit, wait_for};
use serde_json::Value;

/// A directory name no template may interpret: quotes, spaces, command substitution,
/// backticks, `;`, a variable and a Kubernetes variable reference.
const HOSTILE: &str = "it's \"a\" $(touch canary) `touch canary2`; $HOME $(JOB_COMPLETION_INDEX)";

fn fake_keel_source() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/python/fake_keel.py")
}

/// A work dir with a hostile subdirectory holding an executable copy of the fake keel and a
/// config with hostile text.
struct Hostile {
    dir: tempfile::TempDir,
    base: PathBuf,
    keel: String,
    config: PathBuf,
    config_text: String,
    run_root: String,
}

fn hostile(generators: usize, grace_s: u64) -> Hostile {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = dir.path().join(HOSTILE);
    std::fs::create_dir_all(&base).expect("hostile dir");
    let keel = base.join("keel $(touch canary3)");
    std::fs::copy(fake_keel_source(), &keel).expect("copy fake keel");
    let config = base.join("run.toml");
    let config_text = format!(
        "# a comment with 'quotes' \"and\" $(touch canary4) `x` ${{HOME}} ''' \"\"\" \\ é\n\
         # KEEL_CONFIG_EOF '\\n' \\t $(JOB_COMPLETION_INDEX) @KEEL_PLAN@ @RUN_ROOT@\n\
         [run]\nname = \"tiny-launch\"\nsigterm_grace_s = {grace_s}\n\n\
         [rollout]\ngenerators = {generators}\n\n\
         [env]\nname = \"calc\"\n"
    );
    std::fs::write(&config, &config_text).expect("config");
    let run_root = base.join("run root").to_str().expect("utf8").to_owned();
    Hostile {
        keel: keel.to_str().expect("utf8").to_owned(),
        base,
        config,
        config_text,
        run_root,
        dir,
    }
}

impl Hostile {
    /// No `$(touch ...)` or backtick in any value ran.
    fn assert_nothing_ran(&self) {
        for dir in [self.dir.path(), self.base.as_path()] {
            for entry in std::fs::read_dir(dir).expect("list") {
                let name = entry.expect("entry").file_name();
                let name = name.to_string_lossy();
                assert!(
                    !name.starts_with("canary"),
                    "{name} was created: a value ran as code"
                );
            }
        }
    }

    /// The trainer arguments after `--`: one with a newline and a substitution, and a branch
    /// (which the generators get too).
    fn trainer_args(&self) -> Vec<String> {
        vec![
            "--steps".into(),
            "3".into(),
            "--summary-json".into(),
            format!(
                "{}/sum $(touch canary6)\nnext line.json",
                self.base.display()
            ),
            "--branch".into(),
            BRANCH.into(),
        ]
    }
}

/// A branch name no template may interpret.
const BRANCH: &str = "b 'x' $(touch canary7)";

fn keel(args: &[&str], cwd: &Path) -> Output {
    Command::new(keel_bin())
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run keel")
}

fn ok_stdout(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what} failed ({}): {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).expect("utf8")
}

fn render(engine: &str, h: &Hostile, extra: &[&str]) -> String {
    let mut args: Vec<String> = vec![
        "launch".into(),
        engine.into(),
        "--print".into(),
        "--config".into(),
        h.config.to_str().expect("utf8").into(),
        "--run-root".into(),
        h.run_root.clone(),
        "--keel".into(),
        h.keel.clone(),
        "--max-restarts".into(),
        "2".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args.push("--".into());
    args.extend(h.trainer_args());
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    ok_stdout(&keel(&argv, h.dir.path()), &format!("keel launch {engine}"))
}

/// Runs python3 on `code` with `args`; its stdout.
fn python(code: &str, args: &[&str]) -> String {
    let out = Command::new("python3")
        .arg("-c")
        .arg(code)
        .args(args)
        .output()
        .expect("python3 must be installed (scripts/setup.sh)");
    ok_stdout(&out, "python3")
}

/// The driver's AST with the plan's string blanked out, and the plan.
const READ_DRIVER: &str = r#"
import ast, json, sys
tree = ast.parse(open(sys.argv[1], encoding="utf-8").read())
plans = [n for n in ast.walk(tree) if isinstance(n, ast.Assign)
         and any(isinstance(t, ast.Name) and t.id == "PLAN" for t in n.targets)]
assert len(plans) == 1, "one PLAN assignment"
call = plans[0].value
assert isinstance(call, ast.Call) and ast.unparse(call.func) == "json.loads"
assert len(call.args) == 1 and isinstance(call.args[0], ast.Constant)
plan = json.loads(call.args[0].value)
call.args[0].value = ""
print(json.dumps({"plan": plan, "shape": ast.dump(tree)}))
"#;

#[test]
fn ray_driver_parses_as_python_and_carries_hostile_values_as_data() {
    let h = hostile(3, 40);
    let driver = render(
        "ray",
        &h,
        &[
            "--num-gpus-trainer",
            "1",
            "--num-gpus-generator",
            "0.5",
            "--address",
            "ray://x:1",
        ],
    );
    assert!(driver.starts_with("#!/usr/bin/env python3"));
    let path = h.dir.path().join("driver.py");
    std::fs::write(&path, &driver).expect("write");
    let read: Value =
        serde_json::from_str(&python(READ_DRIVER, &[path.to_str().expect("utf8")])).expect("json");
    let plan = &read["plan"];
    assert_eq!(plan["address"], "ray://x:1");
    assert_eq!(plan["engine_grace_s"], 70, "run.sigterm_grace_s + 30");
    assert_eq!(plan["max_restarts"], 2);
    assert_eq!(plan["run_root"], h.run_root.as_str());
    let roles = plan["roles"].as_array().expect("roles");
    assert_eq!(
        roles.len(),
        4,
        "the trainer and rollout.generators = 3 ranks"
    );
    let mut trainer_argv = vec![
        h.keel.clone(),
        "trainer".into(),
        "--run-root".into(),
        h.run_root.clone(),
    ];
    trainer_argv.extend(h.trainer_args());
    assert_eq!(roles[0]["argv"], serde_json::json!(trainer_argv));
    assert_eq!(roles[0]["config_text"], h.config_text.as_str());
    assert_eq!(
        (roles[0]["gpus"].as_f64(), roles[0]["restart_on"].as_str()),
        (Some(1.0), Some("signal"))
    );
    for (rank, role) in roles[1..].iter().enumerate() {
        assert_eq!(
            role["argv"],
            serde_json::json!([
                h.keel,
                "generator",
                "--rank",
                rank.to_string(),
                "--run-root",
                h.run_root,
                "--branch",
                BRANCH
            ])
        );
        // LH-6: a config without URL credentials reaches the generators through the run root.
        assert_eq!(role["config_text"], serde_json::Value::Null);
        assert_eq!(
            (role["gpus"].as_f64(), role["restart_on"].as_str()),
            (Some(0.5), Some("failure"))
        );
    }

    // The same driver for plain values has the same syntax tree: the hostile values added no
    // code, only data.
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("c.toml"), "[rollout]\ngenerators = 3\n").expect("config");
    let plain = ok_stdout(
        &keel(
            &[
                "launch",
                "ray",
                "--print",
                "--config",
                "c.toml",
                "--run-root",
                "run",
                "--keel",
                "/k",
            ],
            dir.path(),
        ),
        "keel launch ray",
    );
    let plain_path = dir.path().join("driver.py");
    std::fs::write(&plain_path, plain).expect("write");
    let plain_read: Value =
        serde_json::from_str(&python(READ_DRIVER, &[plain_path.to_str().expect("utf8")]))
            .expect("json");
    assert_eq!(read["shape"], plain_read["shape"]);
    h.assert_nothing_ran();
}

/// `#SBATCH` lines of a component, in order (`hetjob` separates them).
fn sbatch_components(script: &str) -> Vec<Vec<String>> {
    let mut components = vec![Vec::new()];
    for line in script.lines().filter_map(|l| l.strip_prefix("#SBATCH ")) {
        if line.trim() == "hetjob" {
            components.push(Vec::new());
        } else if let Some(last) = components.last_mut() {
            last.push(line.trim().to_owned());
        }
    }
    components
}

/// A directory with a stand-in `srun`: drops srun's own options, runs the command.
fn fake_srun() -> tempfile::TempDir {
    let bin = tempfile::tempdir().expect("tempdir");
    let srun = bin.path().join("srun");
    std::fs::write(
        &srun,
        "#!/bin/bash\nwhile [[ $# -gt 0 && $1 == -* ]]; do shift; done\nexec \"$@\"\n",
    )
    .expect("srun");
    let chmod = Command::new("chmod")
        .arg("+x")
        .arg(&srun)
        .status()
        .expect("chmod");
    assert!(chmod.success());
    bin
}

fn fake_records(run_root: &str, prefix: &str) -> Vec<Value> {
    let dir = Path::new(run_root).join("fake");
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for e in entries {
        let name = e.expect("entry").file_name().to_string_lossy().to_string();
        if name.starts_with(prefix) && name.ends_with(".json") {
            let text = std::fs::read_to_string(dir.join(&name)).expect("record");
            if let Ok(v) = serde_json::from_str(&text) {
                out.push(v);
            }
        }
    }
    out
}

#[test]
fn sbatch_script_is_valid_and_runs_the_roles_with_hostile_values_intact() {
    let h = hostile(2, 1);
    let script = render(
        "slurm",
        &h,
        &[
            "--num-gpus-trainer",
            "1",
            "--partition",
            "gpu",
            "--time",
            "1-00:00:00",
        ],
    );
    let path = h.dir.path().join("keel.sbatch");
    std::fs::write(&path, &script).expect("write");
    let syntax = Command::new("bash")
        .arg("-n")
        .arg(&path)
        .output()
        .expect("bash");
    assert!(
        syntax.status.success(),
        "bash -n: {}",
        String::from_utf8_lossy(&syntax.stderr)
    );
    if Command::new("sbatch")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        let out = Command::new("sbatch")
            .arg("--test-only")
            .arg(&path)
            .output()
            .expect("sbatch");
        assert!(
            out.status.success(),
            "sbatch --test-only: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    } else {
        eprintln!("sbatch is not installed: skipping `sbatch --test-only` (bash -n passed)");
    }

    // The directives: job-wide ones first, then a component per role.
    let components = sbatch_components(&script);
    assert_eq!(components.len(), 2, "{components:?}");
    for line in [
        "--requeue",
        "--signal=B:TERM@31",
        "--ntasks=1",
        "--gpus-per-task=1",
        "--partition=gpu",
        "--time=1-00:00:00",
    ] {
        assert!(
            components[0].iter().any(|l| l == line),
            "{line} not in {:?}",
            components[0]
        );
    }
    for line in ["--ntasks=2", "--cpus-per-task=1", "--partition=gpu"] {
        assert!(
            components[1].iter().any(|l| l == line),
            "{line} not in {:?}",
            components[1]
        );
    }
    assert!(!components[1].iter().any(|l| l.starts_with("--gpus")));
    let gen_lines: Vec<&str> = script
        .lines()
        .filter(|l| l.contains("generator --rank \"$rank\""))
        .collect();
    assert_eq!(
        gen_lines.len(),
        1,
        "one srun line per rank, in a loop over $rank"
    );

    // Run it: generator 1 fails once and is restarted; the trainer's status is the script's.
    let bin = fake_srun();
    let path_env = format!(
        "{}:{}",
        bin.path().display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let fake = Path::new(&h.run_root).join("fake");
    std::fs::create_dir_all(&fake).expect("fake dir");
    std::fs::write(fake.join("fail-once-1"), "").expect("fail-once");
    let mut child = Command::new("bash")
        .arg(&path)
        .current_dir(h.dir.path())
        .env("PATH", &path_env)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run the script");
    wait_for(
        "the trainer and both ranks (rank 1 twice)",
        Duration::from_secs(60),
        || {
            fake_records(&h.run_root, "trainer-").len() == 1
                && fake_records(&h.run_root, "generator-0-").len() == 1
                && fake_records(&h.run_root, "generator-1-").len() == 2
        },
    );
    std::fs::write(fake.join("finish"), "3").expect("finish");
    let status = wait_exit(&mut child, Duration::from_secs(60), String::new);
    assert_eq!(status.code(), Some(3), "the trainer's exit status");
    let trainer = &fake_records(&h.run_root, "trainer-")[0];
    let argv: Vec<String> = serde_json::from_value(trainer["argv"].clone()).expect("argv");
    assert_eq!(argv[1], "trainer");
    let config_at = argv.iter().position(|a| a == "--config").expect("--config");
    assert_eq!(
        &argv[2..],
        [
            &["--config".to_owned(), argv[config_at + 1].clone()][..],
            &h.trainer_args()[..],
            &["--run-root".to_owned(), h.run_root.clone()][..]
        ]
        .concat()
        .as_slice()
    );
    assert_eq!(trainer["config_text"], h.config_text.as_str());
    for rank in 0..2 {
        for rec in fake_records(&h.run_root, &format!("generator-{rank}-")) {
            let argv: Vec<String> = serde_json::from_value(rec["argv"].clone()).expect("argv");
            assert_eq!(
                argv[1..],
                [
                    "generator",
                    "--rank",
                    &rank.to_string(),
                    "--run-root",
                    &h.run_root,
                    "--branch",
                    BRANCH
                ]
            );
        }
    }
    h.assert_nothing_ran();

    // Again, stopped by SIGTERM (as Slurm sends it): every role gets it, the script exits 0.
    std::fs::remove_dir_all(&fake).expect("clean");
    let mut child = Command::new("bash")
        .arg(&path)
        .current_dir(h.dir.path())
        .env("PATH", &path_env)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run the script");
    wait_for("every role", Duration::from_secs(60), || {
        fake_records(&h.run_root, "trainer-").len() == 1
            && fake_records(&h.run_root, "generator-").len() == 2
    });
    let kill = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(kill.success());
    let status = wait_exit(&mut child, Duration::from_secs(60), String::new);
    assert_eq!(status.code(), Some(0), "the trainer stopped cleanly");
    for role in ["trainer", "generator-0", "generator-1"] {
        assert!(
            fake.join(format!("{role}-sigterm")).exists(),
            "{role} got no SIGTERM"
        );
    }
}

/// The manifest's documents as JSON (PyYAML reads YAML 1.1, as Kubernetes' Go parser does).
fn yaml_docs(text: &str) -> Vec<Value> {
    let code = "import json, sys, yaml\n\
                print(json.dumps(list(yaml.safe_load_all(sys.stdin.read()))))";
    let mut child = Command::new("python3")
        .arg("-c")
        .arg(code)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 must be installed (scripts/setup.sh)");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(text.as_bytes()).expect("write yaml");
    }
    let out = child.wait_with_output().expect("python3");
    assert!(
        out.status.success(),
        "the manifest does not parse as YAML (or PyYAML is missing: scripts/setup.sh installs it): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("json")
}

/// What the kubelet makes of `$(VAR)` references in a command (`$$` is one `$`; an unknown
/// variable stays as written), for the variables a pod has.
fn kubelet_expand(s: &str, env: &[(&str, &str)]) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        if let Some(tail) = after.strip_prefix('$') {
            out.push('$');
            rest = tail;
        } else if let Some(body) = after.strip_prefix('(') {
            match body.find(')') {
                Some(end) => {
                    let name = &body[..end];
                    match env.iter().find(|(k, _)| *k == name) {
                        Some((_, v)) => out.push_str(v),
                        None => out.push_str(&format!("$({name})")),
                    }
                    rest = &body[end + 1..];
                }
                None => {
                    out.push_str("$(");
                    rest = body;
                }
            }
        } else {
            out.push('$');
            rest = after;
        }
    }
    out.push_str(rest);
    out
}

#[test]
fn jobset_manifest_parses_with_ranks_restarts_and_grace() {
    let h = hostile(3, 50);
    let text = render(
        "k8s",
        &h,
        &[
            "--image",
            "registry.example/keel:1 \"$(x)\"",
            "--name",
            "keel-test",
            "--namespace",
            "ml",
            "--env-secret",
            "s3-creds",
            "--num-gpus-trainer",
            "2",
            "--num-cpus-generator",
            "1.5",
        ],
    );
    let docs = yaml_docs(&text);
    assert_eq!(docs.len(), 2, "a ConfigMap and the JobSet");
    let (cm, js) = (&docs[0], &docs[1]);
    assert_eq!(cm["kind"], "ConfigMap");
    assert_eq!(cm["metadata"]["name"], "keel-test-config");
    assert_eq!(cm["metadata"]["namespace"], "ml");
    assert_eq!(cm["data"]["config.toml"], h.config_text.as_str());
    assert_eq!(js["apiVersion"], "jobset.x-k8s.io/v1alpha2");
    assert_eq!(js["kind"], "JobSet");
    assert_eq!(js["metadata"]["name"], "keel-test");
    assert_eq!(js["spec"]["failurePolicy"]["maxRestarts"], 2);
    assert_eq!(
        js["spec"]["successPolicy"]["targetReplicatedJobs"],
        serde_json::json!(["trainer"])
    );
    let jobs = js["spec"]["replicatedJobs"]
        .as_array()
        .expect("replicatedJobs");
    assert_eq!(jobs.len(), 2);
    let (trainer, generators) = (&jobs[0], &jobs[1]);
    assert_eq!(
        (trainer["name"].as_str(), trainer["replicas"].as_u64()),
        (Some("trainer"), Some(1))
    );
    assert_eq!(generators["name"], "generators");
    let gspec = &generators["template"]["spec"];
    assert_eq!(gspec["completionMode"], "Indexed");
    assert_eq!(
        (gspec["completions"].as_u64(), gspec["parallelism"].as_u64()),
        (Some(3), Some(3))
    );
    assert_eq!(gspec["backoffLimitPerIndex"], 2);
    let tpod = &trainer["template"]["spec"]["template"]["spec"];
    let gpod = &gspec["template"]["spec"];
    for pod in [tpod, gpod] {
        assert_eq!(
            pod["terminationGracePeriodSeconds"], 80,
            "run.sigterm_grace_s + 30"
        );
        assert_eq!(pod["restartPolicy"], "Never");
        let c = &pod["containers"][0];
        assert_eq!(c["image"], "registry.example/keel:1 \"$(x)\"");
        assert_eq!(
            c["envFrom"],
            serde_json::json!([{"secretRef": {"name": "s3-creds"}}])
        );
    }
    let tc = &tpod["containers"][0];
    assert_eq!(tc["resources"]["limits"]["nvidia.com/gpu"], 2);
    assert_eq!(
        gpod["containers"][0]["resources"]["requests"]["cpu"],
        "1500m"
    );
    for pod in [tpod, gpod] {
        assert_eq!(
            pod["containers"][0]["volumeMounts"][0]["mountPath"],
            "/etc/keel"
        );
        assert_eq!(pod["volumes"][0]["configMap"]["name"], "keel-test-config");
    }

    // As the kubelet expands them: the hostile values come back unchanged, and the rank is
    // the pod's completion index.
    let env = [("JOB_COMPLETION_INDEX", "2"), ("HOME", "/root"), ("x", "X")];
    let expand = |c: &Value| -> Vec<String> {
        c["command"]
            .as_array()
            .expect("command")
            .iter()
            .map(|a| kubelet_expand(a.as_str().expect("string"), &env))
            .collect()
    };
    let mut want = vec![
        h.keel.clone(),
        "trainer".into(),
        "--config".into(),
        "/etc/keel/config.toml".into(),
        "--run-root".into(),
        h.run_root.clone(),
    ];
    want.extend(h.trainer_args());
    assert_eq!(expand(tc), want);
    assert_eq!(
        expand(&gpod["containers"][0]),
        [
            h.keel.as_str(),
            "generator",
            "--rank",
            "2",
            "--run-root",
            &h.run_root,
            "--branch",
            BRANCH
        ]
    );
}

#[test]
fn launch_refuses_what_it_cannot_do_right() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::write(dir.path().join("c.toml"), "[rollout]\ngenerators = 2\n").expect("config");
    let base = ["launch", "slurm", "--config", "c.toml", "--run-root", "r"];
    let out = keel(&base, dir.path());
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--print"));
    let out = keel(
        &[&base[..], &["--print", "--generators", "3"]].concat(),
        dir.path(),
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(err.contains("rollout.generators = 2"), "{err}");
    let out = keel(
        &[&base[..], &["--print", "--partition", "a;b"]].concat(),
        dir.path(),
    );
    assert!(!out.status.success(), "an unsafe #SBATCH value is refused");
}
