//! The declaration of every config key: its allowed range and its doc, in one table. `keel config
//! explain` and `docs` are derived from it; the type and default come from `TrainConfig::default()`
//! itself, so they cannot be wrong.
//!
//! Invariants:
//! - CX-1: the table lists exactly the keys that `TrainConfig::default()` serialises to, no
//!   more and no fewer (test `table_matches_the_schema`); adding a config field without a row
//!   here fails the build's tests with the key's name.
//! - CX-2: a key's type and default shown to users are read from the serialised default
//!   config, never written by hand.

use crate::config::TrainConfig;

/// One config key: `section.key`, allowed range (as users write values) and what it does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDoc {
    /// `section.key` as written in TOML.
    pub key: &'static str,
    /// The allowed values.
    pub range: &'static str,
    /// What it does.
    pub doc: &'static str,
}

const fn k(key: &'static str, range: &'static str, doc: &'static str) -> KeyDoc {
    KeyDoc { key, range, doc }
}

/// Every config key (CX-1).
pub const KEYS: &[KeyDoc] = &[
    k("run.name", "1-64 chars of [A-Za-z0-9_-]", "Name of the run; the `run` label of every metric and the default run root runs/<name>."),
    k("run.seed", "any u64", "Seed of everything: model init, task order, sampling, minibatch order."),
    k("run.steps", "1..=2^40", "RL steps (learner updates) in total."),
    k("run.mode", "sync | async", "sync: generate, train, publish, repeat; async: generators run ahead within run.staleness_bound."),
    k("run.staleness_bound", ">= 1 in async mode", "Async: most policy versions between a sampled token and the update using it."),
    k("run.checkpoint_every", ">= 1", "Commit a checkpoint every this many RL steps (and at the end)."),
    k("run.device", "cpu | cuda | auto", "Torch device; auto = CUDA when available."),
    k("run.threads", "0..=4 x the machine's cores", "Torch intra-op threads (0 = torch's default)."),
    k("run.sigterm_grace_s", ">= 1", "On SIGTERM/SIGINT: seconds to finish the step, commit a checkpoint and exit 0 (else exit 1)."),
    k("run.metrics_log_flush_ms", "0 ..= 60000", "The metrics log (metrics/ in the run root) stores a segment at most this often while events come in: how fresh `keel report` is, against how many objects a long run makes (0 = a segment whenever the writer is free)."),
    k("run.checkpoint_multipart_bytes", ">= 1", "Checkpoint blobs at least this large go up as S3 multipart uploads (parts of max(this, 8 MiB))."),
    k("env.name", "calc | search-qa | household | shop | sokoban | solver-verifier | search-team | external | dataset", "Environment name (`keel env list`)."),
    k("env.difficulty", "1..=4 (1..=3 for search-qa, search-team)", "The difficulty knob; sets the horizon. `n_ops` is an alias (calc: operations per task)."),
    k("env.url", "http://... or https://... when env.name = external", "Base URL of an env server speaking keel's HTTP+JSON env protocol."),
    k("env.timeout_ms", ">= 1", "External env: deadline of one request."),
    k("env.retries", ">= 0", "External env: retries after a failed request (steps are idempotent per turn)."),
    k("env.auth_env", "an environment variable name, or empty", "External env: the variable whose value is sent as `Authorization: Bearer <value>` with every request (the token never sits in a config file); a named variable that is unset is a config error."),
    k("env.max_response_bytes", ">= 1", "External env: largest answer body accepted; a larger one fails its episode instead of being buffered."),
    k("env.train_file", "a .jsonl or .parquet file (local or s3://) when env.name = dataset", "Dataset env: the training rows in verl's layout (`prompt` as chat messages or a string, `data_source`, `reward_model.ground_truth`, `extra_info`); training task i is row i of a seeded per-epoch order, so checkpoints' data frontier is the dataset position. An s3:// file's folder is synced into $KEEL_MODEL_CACHE first, like a model folder (`keel data check FILE` shows how rows will look)."),
    k("env.eval_file", "a .jsonl or .parquet file (local or s3://) when env.name = dataset", "Dataset env: the held-out rows; eval task i is row i mod n, unshuffled."),
    k("env.verifier", "auto | exact | numeric | choice | gsm8k | math", "Dataset env: how answers are scored; auto picks per row by `data_source`, as verl's default_compute_score does where keel ports verl's scorer: `openai/gsm8k` gsm8k (verl's strict `#### N`, compared as a string), `lighteval/MATH`, `DigitalLearningGmbH/MATH-lighteval` and `HuggingFaceH4/MATH-500` math (verl's last \\boxed{} with hendrycks_math normalisation); other math sources numeric (keel's lenient \\boxed{} / last-number extraction, also available by name), multiple-choice sources choice, others exact. The oracle and SFT demonstrations write answers in the verifier's form (`#### 72`, `\\boxed{72}`)."),
    k("env.prompt_key", "a dotted path", "Dataset env: where a row's prompt is (default `prompt`; OpenRLHF-style JSONL: `input`)."),
    k("env.answer_key", "a dotted path", "Dataset env: where a row's ground truth is (default `reward_model.ground_truth`; OpenRLHF-style JSONL: `label`); a string, a number or a list of accepted answers."),
    k("env.shuffle", "true | false", "Dataset env: visit the training rows in a fresh seeded order each epoch (false: file order)."),
    k("env.shuffle_seed", "any u64", "Dataset env: the seed of that order."),
    k("env.max_turns", "2..=64", "Dataset env: turns of a row that names tools (`tools` or `extra_info.tools`: calculator, search); rows without tools are single-turn."),
    k("env.reward_url", "http://... or https://..., or empty", "Dataset env: a reward service scoring the model's final responses instead of the built-in verifiers: `POST /score` with batches of {data_source, prompt, response, ground_truth, extra_info} (verl's compute_score keywords; `response` is the whole decoded response, untrimmed, reasoning included: verl's solution_str) answered by one reward each, any finite number, passed through unclamped (verl's math_dapo -1 and format penalties keep their meaning); a non-finite reward or a failed request fails the episode, never becomes a reward. The oracle and SFT demonstrations are scored by the row's verifier, never sent. Asked `GET /health` at startup, so a service that is down or refuses its reward function stops the run before it starts. Reference server: envs/external/reward_server.py (calls a verl reward function file as verl does: by keyword, either verl signature, `--reward-kwargs JSON`)."),
    k("env.reward_timeout_ms", ">= 1", "Reward service: deadline of one request."),
    k("env.reward_retries", ">= 0", "Reward service: retries after a transport error or a 5xx answer (doubling backoff); a batch that still fails fails its episodes, it never becomes a reward."),
    k("env.reward_batch", "1..=4096", "Reward service: most answers per /score request; answers of concurrent episodes are gathered."),
    k("env.reward_batch_wait_ms", ">= 0", "Reward service: how long a batch waits for more answers after its first."),
    k("env.reward_concurrency", "1..=256", "Reward service: most /score requests in flight."),
    k("env.reward_auth_env", "an environment variable name, or empty", "Reward service: the variable whose value is sent as `Authorization: Bearer <value>`."),
    k("env.concurrency", "1..=65536", "Env calls (reset/step, simulated latency included) each env shard serves at once; each shard runs on its own thread and its env calls on a blocking pool, so one slow call holds only its own episode."),
    k("env.latency", "none | lognormal | pareto", "Simulated long-tailed step latency (async-vs-sync benchmarks)."),
    k("env.latency_ms", "> 0", "Latency median (lognormal) or minimum (pareto), milliseconds."),
    k("env.latency_shape", "> 0", "Lognormal sigma or Pareto tail index alpha."),
    k("env.latency_cap_ms", "> 0", "Longest simulated delay, milliseconds."),
    k("model.path", "a Hugging Face model folder (local or s3://), or empty", "The model to train (config.json, safetensors, tokenizer.json with a chat template; `keel train --model DIR`); an s3:// folder is synced into $KEEL_MODEL_CACHE (default ~/.cache/keel/models) with checksums first; empty trains the built-in tiny Llama-shaped model over the env's vocabulary (model.n_layer, d_model, n_head)."),
    k("model.dtype", "float32 | bfloat16", "Parameter and activation kind of every model. bfloat16 keeps f32 master weights and AdamW moments in the optimizer (the bf16 weights are the master rounded), so small updates are not lost; log-softmax and values are taken in f32."),
    k("model.critic_path", "a Hugging Face model folder (local or s3://), or empty", "First weights of the separate critic (learner.critic_model = \"separate\", SAO's default; `keel train --critic DIR`): its trunk, and its score head when present (else zero). Empty = a copy of the policy's trunk at the first RL update. Its vocab_size must cover the policy's."),
    k("model.lora.rank", "0 (off) or >= 1", "LoRA: rank of the adapters on the frozen model; 0 trains every weight. With adapters only they (and a shared value head) train, the optimizer holds only their state, checkpoints and the weight board carry only them (plus the base model's hash in learner.json), and the KL reference is the base with adapters off. `keel ckpt export` merges them into a plain folder; `--peft` writes adapter_config.json + adapter_model.safetensors instead."),
    k("model.lora.alpha", "> 0", "LoRA scaling: the update is (B A x) * alpha / rank, as PEFT's lora_alpha."),
    k("model.lora.dropout", "[0, 1)", "LoRA dropout on the adapters' input in training forwards (masks seeded per step, so resumes are exact); must be 0 with learner.activation_checkpointing."),
    k("model.lora.target_modules", "module names or suffixes (q_proj, self_attn.v_proj, ...) or [\"all-linear\"]", "Which linear modules get adapters, matched as PEFT does (a module's full name equals the entry or ends with .entry); an entry matching no module is an error listing the model's linear modules."),
    k("model.context_len", "16..=2^20, >= the env's horizon, <= the model folder's positions; with the model, and with a generator's KV cache (keys and values of every layer for min(episodes per batch, 256) + 1 sequences of this length), fits the machine's memory", "Longest token sequence (prompt + all turns): every episode ends truncated (reward 0) before it would pass it, an observation past it is cut, and an episode whose first prompt leaves no room for a turn is dropped and counted (RO-11). The tiny Llama model's max_position_embeddings. With `--model DIR` and no value in the config file it defaults to the folder's max_position_embeddings."),
    k("model.chat_template_kwargs", "a table of template variables", "Extra variables the chat template is rendered with, as transformers' apply_chat_template(**kwargs) and verl's data.apply_chat_template_kwargs: e.g. `enable_thinking = false` for Qwen3, `date_string = \"26 Jul 2024\"` to pin Llama 3's date (templates calling strftime_now get today's date otherwise)."),
    k("model.chat_template_check", "strict | template | off", "How turn-by-turn rendering (token-in/token-out: each observation is the template's rendering of the new turn alone, appended to the sampled tokens, as verl's agent loop) must agree with rendering the whole conversation, probed at start-up (CC-5): `strict` = identical; `template` = identical except the template's own text around earlier assistant turns (Qwen3 drops their <think> block once a user turn follows); `off` = no check. A template that fails is refused before anything runs."),
    k("model.n_layer", "1..=1024", "Decoder layers of the built-in tiny Llama-shaped model."),
    k("model.d_model", "8..=65536, a multiple of model.n_head; 16 bytes per parameter fit the machine's memory", "Hidden size (the SwiGLU MLP is 4x as wide)."),
    k("model.n_head", "1..=1024", "Attention heads (as many key/value heads); d_model / n_head must be even."),
    k("sft.steps", ">= 0", "SFT warm-start optimizer steps (0 skips the warm start)."),
    k("sft.batch_size", "1..=65536", "Demonstrations per SFT step."),
    k("sft.lr", "(0, 1]", "SFT learning rate."),
    k("sft.demos", "1..=10^7 when sft.steps > 0", "Demonstrations generated from train task seeds."),
    k("sft.noise", "[0, 1]", "Probability that a demonstrated turn is replaced by a plausible mistake."),
    k("sft.checkpoint_every", ">= 0", "Commit an SFT checkpoint (tag sft-partial) every this many SFT steps, so a killed run resumes SFT where it was; 0: only when stopped (SIGTERM during SFT always commits one). A resumed SFT ends bit-identical to an uninterrupted one."),
    k("rollout.tasks_per_batch", "1..=65536; x group_size <= 65536", "Distinct tasks per rollout batch."),
    k("rollout.group_size", "1..=1024; x tasks_per_batch <= 65536", "Episodes per task (a GRPO group)."),
    k("rollout.temperature", "(0, 10]", "Sampling temperature (1 = the policy itself)."),
    k("rollout.max_turn_tokens", "1..=2^20", "Most tokens the model may emit in one turn."),
    k("rollout.generators", "1..=1024", "Generator actors (keel train); with keel trainer, the generator ranks 0..N-1 it addresses work orders to (one keel generator --rank R process each)."),
    k("rollout.env_shards", "1..=1024", "Environment-shard actors, each on its own thread; episode e lives on shard e mod env_shards."),
    k("rollout.eval_tasks", "1..=10^6", "Held-out tasks per evaluation."),
    k(
        "rollout.eval_samples",
        "0..=64",
        "k of avg@k: sampled episodes per held-out task besides the greedy pass@1 one (0 = greedy only).",
    ),
    k("rollout.inflight_updates", "true | false", "Async mode: a newly published policy version reaches the samplers between decode steps and the episodes in flight continue under it (each turn records the version it was queued under, never newer than its oldest token; the batch's start version is what admission bounds, so no token exceeds run.staleness_bound and nothing is restarted). false: a batch is sampled with the version it started with."),
    k("rollout.batch_invariant", "auto | on | off", "Decode with fixed forward shapes (every slot, the whole context) and prefill each turn alone, so an episode's tokens and log-probs do not depend on which episodes share the sampler or when their observations arrived: streamed runs and crash resumes stay bit-reproducible on CPU. Costs full-width decode steps. auto = on in sync mode, off in async mode (whose batches depend on timing anyway, through the weight version each starts with); GPU kernels are not bit-deterministic across shapes, so off is the throughput choice there."),
    k("learner.algo", "a preset: keel algo list", "The RL algorithm preset (ppo, grpo, dr_grpo, gspo, dapo, sampo, sao, armor, so_ppo, so_grpo, rtpo, dr_mas, pats); its hyper-parameters are shown by keel algo show NAME and overridden by optional learner keys (weight_decay, clip_low, clip_high, dual_clip, loss_agg, kl_coef, gigpo_similarity (SAMPO: GiGPO step groups by SequenceMatcher ratio >= this, 0.95 in ARL-Arena), ...; policy_loss = ppo | gspo | reinforce picks the loss, rollout_is_threshold the REINFORCE truncation, 2.0 as in verl, 0 for none)."),
    k("learner.lr", "(0, 1]", "AdamW learning rate."),
    k("learner.max_grad_norm", "> 0", "Global gradient-norm clip."),
    k("learner.max_tokens_per_microbatch", ">= 0", "Most padded tokens (rows x length) in one forward/backward of an actor update; gradients accumulate over such micro-batches under the mini-batch's global denominators, then one optimizer step. 0 = the whole mini-batch at once. Not with seq_mask_delta."),
    k("learner.activation_checkpointing", "true | false", "Recompute each decoder layer's activations in the backward pass instead of keeping them: activation memory of one layer plus one residual stream per layer, for about one extra forward pass. Same gradients."),
    k("learner.lr_warmup_steps", ">= 0", "Learning-rate warm-up in updates: update u < W runs at lr * u / W (0 at the first, as verl and transformers); the preset's default is 0 (armor: 10, as its scripts)."),
    k("learner.lr_schedule", "constant | cosine", "Learning rate after the warm-up: constant, or half a cosine down to lr_min_ratio * lr at run.steps."),
    k("learner.lr_min_ratio", "[0, 1]", "Floor of the cosine schedule as a fraction of learner.lr."),
    k("learner.epochs", ">= 1", "Passes over each batch."),
    k("learner.minibatches", ">= 1", "Optimizer steps per pass."),
    k("learner.reference_kl", "true | false", "Keep a frozen reference policy (the weights at the first update) and report kl_ref (k3 KL to it) for presets without one; one extra forward pass per micro-batch, the loss is unchanged. keel arena sets it so every method's drift is comparable."),
    k("tracking.tensorboard", "true | false", "Write TensorBoard event files under <run root>/tensorboard/<branch>/ (local or S3): every step metric, eval success, checkpoint ids and the config as text; `tensorboard --logdir <run root>/tensorboard` shows one run per branch."),
    k("tracking.mlflow_url", "an http:// URL, or empty", "Log to this MLflow tracking server: one MLflow run per keel run and branch (params = the flattened config; per-step metrics; checkpoint ids, preset and env as tags). A server that is down never slows training: points wait in a bounded queue and what cannot be delivered is counted in keel_tracking_events_dropped_total."),
    k("tracking.mlflow_experiment", "a name, or empty", "MLflow experiment of the runs (created when missing); empty = keel."),
    k("tracking.flush_every_steps", ">= 1", "Steps between deliveries to the trackers when no checkpoint comes sooner (a TensorBoard segment file, an MLflow request; MLflow also sends after 2 s). Points at or before a step already delivered are never sent twice after a resume."),
    k("metrics.enabled", "true | false", "Serve Prometheus /metrics while training."),
    k("metrics.bind", "an IP address", "Address of /metrics; loopback unless you mean to expose it."),
    k("metrics.port", "0..=65535", "Port of /metrics (0 picks a free port, printed at start)."),
    k("metrics.pushgateway_url", "empty or http(s)://host:port", "Push the final metrics to this Prometheus Pushgateway when the run ends (batch jobs)."),
    k("guard.enabled", "true | false", "Collapse guard: skip non-finite steps and rewind on collapse; off = a non-finite step ends the run."),
    k("guard.max_consecutive_skips", ">= 1", "Non-finite steps in a row that trigger a rewind."),
    k("guard.window", ">= 1", "Healthy values in each median window (grad norm, KL)."),
    k("guard.warmup", ">= 0", "Healthy values needed before spikes are judged."),
    k("guard.grad_norm_spike_ratio", "0 (off) or > 1", "Rewind when the grad norm exceeds this many times its recent median."),
    k("guard.grad_norm_floor", ">= 0", "Grad norms at or below this are never spikes."),
    k("guard.kl_spike_ratio", "0 (off) or > 1", "Rewind when the KL to the behaviour policy exceeds this many times its recent median."),
    k("guard.kl_floor", ">= 0", "KL values at or below this are never spikes."),
    k("guard.max_rewinds", ">= 0", "Rewinds allowed before the run gives up with an error (keel train then exits 3)."),
    k("guard.rewind_lr_factor", "(0, 1]", "Learning rate multiplier applied at every rewind (1 keeps it)."),
    k("faults.nan_loss_at_step", ">= 0 (0 = off)", "TESTING AID: poison the update producing this policy version with NaN log-probs."),
    k("faults.nan_loss_count", ">= 1", "TESTING AID: attempts at that update poisoned in a row."),
    k("faults.nan_loss_model", "0 ..= number of [[agent_models]]", "TESTING AID: the model whose update is poisoned: 0 = the main model, k = the k-th [[agent_models]] (Dr. MAS)."),
    k("faults.lr_blowup_at_step", ">= 0 (0 = off)", "TESTING AID: before the update producing this version, set the learning rate to faults.lr_blowup_to."),
    k("faults.lr_blowup_to", "(0, 1]", "TESTING AID: the blown-up learning rate."),
    k("faults.learner_panic_at_step", ">= 0 (0 = off)", "TESTING AID: panic in the learner before the update producing this policy version (the run must end naming it)."),
    k("distributed.order_timeout_s", ">= 1", "keel trainer: seconds a work order may go unanswered before it is withdrawn and its task range (or evaluation pass) is issued again to a rank that answers; the silent rank gets work again once it is heard from (a process start, or a live process finding its order withdrawn)."),
    k("distributed.poll_ms", ">= 1", "keel trainer / keel generator: how often (ms) a process looks at the run root for work orders, results and weights."),
    k("armor.anchor_episodes", ">= 1 with algo armor", "ARMOR: episodes per task sampled from the reference policy; the first successful one joins the group (source = anchor) when the policy's episodes are neither all right nor all wrong."),
    k("armor.reference_reset_every", ">= 0", "ARMOR: copy the policy into the reference every this many steps (0 = never); each reset is a checkpoint tagged reference-reset that later checkpoints name as their reference."),
    k("armor.loss.mix_ratio", "(0, 1]; unset = auto", "ARMOR: weight r of the policy in the token mixture r*pi + (1-r)*q; unset = the batch's share of policy episodes (the reference's auto_mix_ratio: 15/16 for its 15 + 1 groups); 1 turns the ratio mixing off (a mix replacement then needs replace_ratio)."),
    k("armor.loss.mix_partner", "reference | one | old", "ARMOR: the mixture partner q: the reference policy (shipped scripts), the constant probability 1 (mix_probs_w_const) or pi_old (mix_probs_w_old)."),
    k("armor.loss.mix_on_anchors_only", "bool", "ARMOR: mix only on anchor (reference-sampled) rows; the policy's rows keep the plain ratio (mix_probs_on_ref_only)."),
    k("armor.loss.replace_old", "none | reference | mix | avg | max", "ARMOR: replace pi_old before mixing by the reference, the mixture of pi_old and the reference at replace_ratio, their even mixture, or their maximum (replace_old_probs + replace_method); none in the shipped scripts."),
    k("armor.loss.replace_ratio", "(0, 1], with replace_old = mix; unset = mix_ratio's r", "ARMOR: weight of pi_old in the mix replacement r_old*pi_old + (1-r_old)*pi_ref (the replacement's mix_probs_main_ratio); unset = the ratio mixing's r. Set it with mix_ratio = 1 to replace pi_old by the mixture while the ratio stays plain (the reference's mix_probs off), or to mix the two at different ratios."),
    k("armor.loss.replace_on_anchors_only", "bool", "ARMOR: the replacement applies to anchor rows only (replace_on_ref_only; true in the scripts)."),
    k("armor.loss.renorm_adv", "none | token | seq", "ARMOR: after a replacement, multiply anchor rows' advantages by min(pi_new_old / pi_old, 20) per token or by its mean over the row (renorm_adv)."),
    k("armor.loss.replace_on_advantage", "bool", "ARMOR: keep pi_old in the ratio and multiply the advantage by pi_old / pi_new_old instead (replace_on_adv)."),
    k("pats.alpha", "(0, 1]", "PATS: weight of a step's success rate in each task type's EMA."),
    k("pats.revise_threshold", "[0, 1]", "PATS: EMA at or above which a task type's scaffold is revised rather than expanded."),
    k("pats.compress_threshold", "[revise, 1]", "PATS: EMA at or above which a task type's scaffold is compressed."),
    k("pats.max_entries", ">= 1", "PATS: entries at which the bank is full (pressure 1: forced prune)."),
    k("pats.max_tokens", ">= 1", "PATS: rendered words at which the bank is full."),
    k("pats.render_words", ">= 1", "PATS: most scaffold words put before one training prompt."),
    k("pats.dedup_jaccard", "(0, 1]", "PATS: word-Jaccard at or above which a proposed entry duplicates an existing one."),
    k("pats.max_entry_words", ">= 1", "PATS: most words of one entry."),
    k("pats.history_len", ">= 1", "PATS: review decisions kept in the persisted scaffold state."),
    k("pats.reviewer_url", "empty or http://...", "PATS: an HTTP reviewer (e.g. an LLM service) that answers each review request with edits (protocol: envs/src/scaffold/http_reviewer.rs); empty = the deterministic rule reviewer. Edits are validated either way."),
    k("pats.reviewer_timeout_ms", ">= 1", "PATS: deadline of one HTTP review; a failed review leaves the bank unchanged and training goes on."),
    k("agent_models", "array of tables", "Dr. MAS: [[agent_models]] agents = [1], lr = ..., clip_low/clip_high/entropy_coef = ...: a separate model with its own optimizer for those agents (others use the main model)."),
];

/// One row of `keel config explain`: the declaration plus type and default from the schema.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyInfo {
    /// `section.key`.
    pub key: String,
    /// `integer`, `float`, `string`, `boolean`, `array` or `table`.
    pub kind: &'static str,
    /// The default as TOML.
    pub default: String,
    /// Allowed values.
    pub range: &'static str,
    /// What it does.
    pub doc: &'static str,
}

fn kind_of(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::String(_) => "string",
        serde_json::Value::Number(n) if n.is_f64() => "float",
        serde_json::Value::Number(_) => "integer",
        serde_json::Value::Bool(_) => "boolean",
        serde_json::Value::Array(_) => "array",
        serde_json::Value::Object(_) => "table",
        serde_json::Value::Null => "optional",
    }
}

/// Every `section.key` of the default config with its value (CX-2). Serialised through JSON so
/// that optional keys (unset by default) are listed too.
pub fn schema_keys() -> Vec<(String, serde_json::Value)> {
    let mut out = Vec::new();
    if let Ok(serde_json::Value::Object(root)) = serde_json::to_value(TrainConfig::default()) {
        for (section, v) in root {
            match v {
                serde_json::Value::Object(t) => {
                    for (k, v) in t {
                        let key = format!("{section}.{k}");
                        match v {
                            // A sub-table without a row of its own (`[armor.loss]`): its keys.
                            serde_json::Value::Object(sub)
                                if !KEYS.iter().any(|d| d.key == key) =>
                            {
                                out.extend(sub.into_iter().map(|(s, v)| (format!("{key}.{s}"), v)))
                            }
                            v => out.push((key, v)),
                        }
                    }
                }
                other => out.push((section, other)),
            }
        }
    }
    out
}

/// The full listing: every declared key with its type and default (CX-2), in table order.
pub fn explain() -> Vec<KeyInfo> {
    let schema = schema_keys();
    KEYS.iter()
        .map(|d| {
            let value = schema.iter().find(|(k, _)| k == d.key).map(|(_, v)| v);
            KeyInfo {
                key: d.key.to_string(),
                kind: value.map_or("?", kind_of),
                default: value.map_or_else(
                    || "?".into(),
                    |v| {
                        if v.is_null() {
                            "unset".into()
                        } else {
                            v.to_string()
                        }
                    },
                ),
                range: d.range,
                doc: d.doc,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_matches_the_schema() {
        let schema: Vec<String> = schema_keys().into_iter().map(|(k, _)| k).collect();
        assert!(
            schema.len() > 20,
            "the default config did not serialise: {schema:?}"
        );
        let declared: Vec<&str> = KEYS.iter().map(|d| d.key).collect();
        for key in &schema {
            assert!(
                declared.contains(&key.as_str()),
                "config key `{key}` has no row in actors/src/config_keys.rs KEYS: add one"
            );
        }
        for key in &declared {
            assert!(
                schema.iter().any(|k| k == key),
                "KEYS row `{key}` is not a config key any more: remove it"
            );
        }
        let mut sorted = declared.clone();
        sorted.dedup();
        assert_eq!(sorted.len(), declared.len(), "a key is declared twice");
    }

    #[test]
    fn explain_reads_types_and_defaults_from_the_schema() {
        let rows = explain();
        let steps = rows
            .iter()
            .find(|r| r.key == "run.steps")
            .expect("run.steps");
        assert_eq!((steps.kind, steps.default.as_str()), ("integer", "200"));
        let bind = rows
            .iter()
            .find(|r| r.key == "metrics.bind")
            .expect("metrics.bind");
        assert_eq!(bind.default, "\"127.0.0.1\"");
        assert!(rows.iter().all(|r| r.kind != "?"), "every row resolves");
    }
}
