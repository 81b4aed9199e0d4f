//! What the learner's benchmark binaries share: `--key value` flags and the process's peak
//! resident memory.

use std::collections::HashMap;

use keel_learner::hf::HfConfig;

/// A benchmark's result: any error ends it with its message.
pub type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// The command line's `--key value` pairs.
pub fn flags() -> HashMap<String, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    args.chunks(2)
        .filter_map(|c| Some((c[0].trim_start_matches("--").to_string(), c.get(1)?.clone())))
        .collect()
}

/// Flag `k` as a number, `d` when absent.
pub fn num(f: &HashMap<String, String>, k: &str, d: usize) -> Res<usize> {
    Ok(match f.get(k) {
        Some(v) => v.parse().map_err(|e| format!("--{k} {v}: {e}"))?,
        None => d,
    })
}

/// Peak resident memory of this process, MiB (`keel_learner::host_memory`).
pub fn peak_mib() -> Res<f64> {
    keel_learner::host_memory::peak_rss_mib().ok_or_else(|| "no VmHWM in /proc/self/status".into())
}

/// A Llama-shaped config of `--hidden` (512), `--layers` (`layers`) and `--vocab` (16384):
/// MLP width 4x hidden, 8 heads, untied embeddings.
pub fn llama_config(f: &HashMap<String, String>, layers: usize) -> Res<HfConfig> {
    let (h, layers, vocab) = (
        num(f, "hidden", 512)?,
        num(f, "layers", layers)?,
        num(f, "vocab", 16384)?,
    );
    Ok(HfConfig::from_value(serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
        "hidden_size": h, "intermediate_size": 4 * h, "num_hidden_layers": layers,
        "num_attention_heads": 8, "num_key_value_heads": 8, "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu",
        "tie_word_embeddings": false, "attention_bias": false, "mlp_bias": false,
    }))?)
}
