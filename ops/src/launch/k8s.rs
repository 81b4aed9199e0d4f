//! `keel launch k8s --print`: a JobSet (`ops/launch/jobset.yaml`, jobset.x-k8s.io/v1alpha2)
//! with the trainer and an Indexed Job of generators, and a ConfigMap with the config.
//!
//! Invariants:
//! - K8-2 (LH-1): every value is a YAML double-quoted scalar of printable ASCII (`yaml_str`); those
//!   in `command` also have `$` doubled (`k8s_literal`), so the only `$(...)` the kubelet
//!   expands is the rank's `$(JOB_COMPLETION_INDEX)`.
//! - K8-1: a generator's rank is its pod's completion index; failed ranks are replaced one
//!   by one (`backoffLimitPerIndex`), and the JobSet restarts as a whole (`maxRestarts`) only
//!   when the trainer or a rank fails for good; terminationGracePeriodSeconds is the engine
//!   grace (LH-4).

use anyhow::{bail, Result};
use clap::Args;

use super::plan::{whole, CommonArgs, KeelDefault, Plan, Resources, RANK_ARG};
use super::quote::{k8s_literal, yaml_str};
use super::template::fill;

const MANIFEST: &str = include_str!("../../launch/jobset.yaml");

/// Where the ConfigMap is mounted in the trainer's pod.
const CONFIG_DIR: &str = "/etc/keel";

/// `keel launch k8s`.
#[derive(Args, Debug)]
pub struct K8sArgs {
    #[command(flatten)]
    pub common: CommonArgs,
    /// Container image with the keel binary (and its libraries).
    #[arg(long)]
    pub image: String,
    /// JobSet name, a DNS label of at most 40 characters (default keel-<run.name>).
    #[arg(long)]
    pub name: Option<String>,
    /// Namespace of the JobSet and its ConfigMap (default: kubectl's).
    #[arg(long)]
    pub namespace: Option<String>,
    /// A Secret whose keys become every role's environment (e.g. AWS_ACCESS_KEY_ID,
    /// AWS_SECRET_ACCESS_KEY, AWS_ENDPOINT for an s3:// run root); repeatable.
    #[arg(long)]
    pub env_secret: Vec<String>,
    /// The extended resource that counts GPUs.
    #[arg(long, default_value = "nvidia.com/gpu")]
    pub gpu_resource: String,
}

/// The manifest, rendered.
pub fn render(args: &K8sArgs) -> Result<String> {
    let plan = Plan::resolve(&args.common, KeelDefault::OnPath)?;
    if plan.generators == 0 {
        bail!("rollout.generators is 0: the JobSet needs at least one generator");
    }
    if !plan.run_root.contains("://") {
        eprintln!(
            "warning: the run root {} is a local path: every pod must see the same directory \
             there (a shared volume, which this manifest does not mount); an s3:// run root \
             needs nothing",
            plan.run_root
        );
    }
    let name = match &args.name {
        Some(n) => dns_label(n)?,
        None => dns_label(&default_name(&plan.run_name))?,
    };
    let namespace = match &args.namespace {
        Some(ns) => format!("  namespace: {}\n", yaml_str(&dns_label(ns)?)),
        None => String::new(),
    };
    let (config_map, config_arg, mounts, volumes) = match &plan.config_text {
        None => (String::new(), None, "[]".to_owned(), "[]".to_owned()),
        Some(text) => {
            let cm = format!("{name}-config");
            (
                format!(
                    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {}\n{namespace}data:\n  \
                     config.toml: {}\n---\n",
                    yaml_str(&cm),
                    yaml_str(text)
                ),
                Some(format!("{CONFIG_DIR}/config.toml")),
                format!(
                    "[{{name: config, mountPath: {}, readOnly: true}}]",
                    yaml_str(CONFIG_DIR)
                ),
                format!("[{{name: config, configMap: {{name: {}}}}}]", yaml_str(&cm)),
            )
        }
    };
    let env_from: Vec<String> = args
        .env_secret
        .iter()
        .map(|s| format!("{{secretRef: {{name: {}}}}}", yaml_str(s)))
        .collect();
    let command = |argv: &[String]| -> Vec<String> {
        argv.iter().map(|a| yaml_str(&k8s_literal(a))).collect()
    };
    let trainer_command = command(&plan.trainer_argv(config_arg.as_deref()));
    let generator_config = config_arg
        .as_deref()
        .filter(|_| plan.generators_need_config);
    let mut generator_command = command(&plan.generator_argv("0", generator_config));
    // The one value the kubelet expands (K8-1); the Job controller sets it in every pod.
    generator_command[RANK_ARG] = yaml_str("$(JOB_COMPLETION_INDEX)");
    fill(
        MANIFEST,
        &[
            ("CONFIG_MAP", config_map),
            ("NAME", yaml_str(&name)),
            ("NAMESPACE", namespace),
            ("MAX_RESTARTS", plan.max_restarts.to_string()),
            ("ENGINE_GRACE_S", plan.engine_grace_s().to_string()),
            ("IMAGE", yaml_str(&args.image)),
            ("TRAINER_COMMAND", flow_seq(&trainer_command)),
            (
                "TRAINER_RESOURCES",
                resources(plan.trainer, &args.gpu_resource, "trainer")?,
            ),
            ("ENV_FROM", flow_seq(&env_from)),
            ("CONFIG_MOUNTS", mounts),
            ("CONFIG_VOLUMES", volumes),
            ("GENERATORS", plan.generators.to_string()),
            ("GENERATOR_COMMAND", flow_seq(&generator_command)),
            (
                "GENERATOR_RESOURCES",
                resources(plan.generator, &args.gpu_resource, "generator")?,
            ),
        ],
    )
}

/// `keel launch k8s`: only prints (apply with `kubectl apply -f`).
pub fn run(args: K8sArgs) -> Result<()> {
    if !args.common.print {
        bail!(
            "keel launch k8s only renders the manifest: `keel launch k8s --print ... > keel.yaml` \
             and apply it with `kubectl apply -f keel.yaml`"
        );
    }
    print!("{}", render(&args)?);
    Ok(())
}

/// `[a, b, ...]`: a YAML flow sequence of scalars already quoted.
fn flow_seq(items: &[String]) -> String {
    format!("[{}]", items.join(", "))
}

/// `{requests: {cpu: ...}, limits: {GPU: n}}` as a YAML flow mapping.
fn resources(r: Resources, gpu_resource: &str, role: &str) -> Result<String> {
    let millis = (r.cpus * 1000.0).round() as u64;
    let gpus = whole(r.gpus, &format!("--num-gpus-{role}"))?;
    let requests = if millis > 0 {
        format!("requests: {{cpu: {}}}", yaml_str(&format!("{millis}m")))
    } else {
        "requests: {}".to_owned()
    };
    let limits = if gpus > 0 {
        format!("limits: {{{}: {gpus}}}", yaml_str(gpu_resource))
    } else {
        "limits: {}".to_owned()
    };
    Ok(format!("{{{requests}, {limits}}}"))
}

/// keel-<run name>, lower-cased, other characters as `-`, cut to 40.
fn default_name(run: &str) -> String {
    let mut s: String = format!("keel-{run}")
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect();
    s.truncate(40);
    while s.ends_with('-') {
        s.pop();
    }
    s
}

/// `s` if it is a DNS label (RFC 1035: a-z, 0-9, `-`; a letter first, no `-` last) of at most
/// 40 characters, which leaves room in pod names for the JobSet's suffixes.
fn dns_label(s: &str) -> Result<String> {
    let ok = (1..=40).contains(&s.len())
        && s.starts_with(|c: char| c.is_ascii_lowercase())
        && !s.ends_with('-')
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-');
    if !ok {
        bail!("{s:?} is not a DNS label of at most 40 characters (a-z, 0-9, '-'; a letter first)");
    }
    Ok(s.to_owned())
}

#[cfg(test)]
mod tests {
    use super::{default_name, dns_label, resources};
    use crate::launch::plan::Resources;

    #[test]
    fn names_are_dns_labels() {
        assert_eq!(default_name("Quick_Start.v2"), "keel-quick-start-v2");
        assert_eq!(default_name(&"x".repeat(60)).len(), 40);
        assert!(dns_label(&default_name("--")).is_ok());
        for bad in ["Keel", "1keel", "keel-", "ke el", "k\"", ""] {
            assert!(dns_label(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn resources_are_millicores_and_whole_gpus() {
        let r = resources(
            Resources {
                cpus: 1.5,
                gpus: 2.0,
            },
            "nvidia.com/gpu",
            "trainer",
        );
        assert_eq!(
            r.expect("whole"),
            r#"{requests: {cpu: "1500m"}, limits: {"nvidia.com/gpu": 2}}"#
        );
        let half = resources(
            Resources {
                cpus: 1.0,
                gpus: 0.5,
            },
            "nvidia.com/gpu",
            "generator",
        );
        assert!(half
            .unwrap_err()
            .to_string()
            .contains("--num-gpus-generator"));
    }
}
