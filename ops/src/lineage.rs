//! `keel ckpt lineage`: the checkpoints of a run root as a tree (each manifest names its parent),
//! with tags, branch and the branch heads marked.

use std::collections::BTreeMap;

use keel_store::{BranchHead, CheckpointManifest};

/// The tree as text: one line per checkpoint, children under their parent in step order.
/// Checkpoints whose parent is not listed (collected, or a root) start a tree of their own.
pub fn render_tree(all: &[CheckpointManifest], heads: &[BranchHead]) -> String {
    let ids: std::collections::BTreeSet<&str> = all.iter().map(|m| m.id.as_str()).collect();
    let mut children: BTreeMap<Option<&str>, Vec<&CheckpointManifest>> = BTreeMap::new();
    for m in all {
        let parent = m.parent.as_deref().filter(|p| ids.contains(p));
        children.entry(parent).or_default().push(m);
    }
    for list in children.values_mut() {
        list.sort_by(|a, b| {
            (a.step, a.created_unix_ms, &a.id).cmp(&(b.step, b.created_unix_ms, &b.id))
        });
    }
    let mut out = String::new();
    let roots = children.get(&None).cloned().unwrap_or_default();
    let n = roots.len();
    for (i, m) in roots.into_iter().enumerate() {
        write_node(&mut out, m, &children, heads, "", i + 1 == n, true);
    }
    out
}

/// ` <- HEAD <branch>` for each head naming checkpoint `id`.
pub fn head_marks(heads: &[BranchHead], id: &str) -> String {
    heads
        .iter()
        .filter(|h| h.id == id)
        .map(|h| format!(" <- HEAD {}", h.branch))
        .collect()
}

fn write_node(
    out: &mut String,
    m: &CheckpointManifest,
    children: &BTreeMap<Option<&str>, Vec<&CheckpointManifest>>,
    heads: &[BranchHead],
    prefix: &str,
    last: bool,
    root: bool,
) {
    let (branch_mark, child_prefix) = if root {
        ("", String::new())
    } else if last {
        ("└── ", format!("{prefix}    "))
    } else {
        ("├── ", format!("{prefix}│   "))
    };
    let tags = if m.tags.is_empty() {
        String::new()
    } else {
        format!(" [{}]", m.tags.join(", "))
    };
    let head = head_marks(heads, &m.id);
    let eval = m
        .metrics
        .get("rollout_success")
        .map(|v| format!(" success {v:.2}"))
        .unwrap_or_default();
    out.push_str(&format!(
        "{prefix}{branch_mark}{}  step {}  branch {}{tags}{eval}{}\n",
        m.id, m.step, m.branch, head
    ));
    let kids = children
        .get(&Some(m.id.as_str()))
        .cloned()
        .unwrap_or_default();
    let n = kids.len();
    for (i, c) in kids.into_iter().enumerate() {
        write_node(out, c, children, heads, &child_prefix, i + 1 == n, false);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn manifest(
        id: &str,
        parent: Option<&str>,
        step: u64,
        branch: &str,
        tags: &[&str],
    ) -> CheckpointManifest {
        let json = serde_json::json!({
            "format_version": 1, "id": id, "parent": parent, "branch": branch, "step": step,
            "policy_version": step, "created_unix_ms": step, "config_hash": "0", "reference": null,
            "tags": tags, "files": [], "data": {"next_task_index": 0, "next_batch_seq": 0,
            "consumed_batches": [], "pending_tasks": []}, "metrics": {}
        });
        serde_json::from_value(json).expect("manifest json")
    }

    #[test]
    fn lineage_tree_shows_branches_and_heads() {
        let all = vec![
            manifest("a", None, 0, "main", &["sft", "healthy"]),
            manifest("b", Some("a"), 25, "main", &["healthy"]),
            manifest("c", Some("b"), 50, "main", &[]),
            manifest("d", Some("b"), 25, "rewind-1", &["rewind", "healthy"]),
        ];
        let heads = vec![
            BranchHead {
                branch: "main".into(),
                generation: 3,
                id: "c".into(),
            },
            BranchHead {
                branch: "rewind-1".into(),
                generation: 1,
                id: "d".into(),
            },
        ];
        let tree = render_tree(&all, &heads);
        let want = "\
a  step 0  branch main [sft, healthy]
└── b  step 25  branch main [healthy]
    ├── d  step 25  branch rewind-1 [rewind, healthy] <- HEAD rewind-1
    └── c  step 50  branch main <- HEAD main
";
        assert_eq!(tree, want);
    }
}
