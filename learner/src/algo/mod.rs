//! keel's algorithm library: small pure functions over tch tensors, one module per objective
//! and per estimator, each with its formula and numbered invariants, and a registry of named
//! presets that compose them ([`presets`]). The spec is `shared/specs/algorithms.md`; where it
//! marks a PROPOSAL, the module says "keel's choice".
//!
//! | module | what | spec |
//! |---|---|---|
//! | [`aggregation`] | token-mean / token-sum / seq-mean-* with global denominators | §1.2 |
//! | [`ppo`] | PPO clip, clip-higher, dual-clip (generic over the log-ratio) | §1.1 |
//! | [`gspo`] | sequence / segment ratio with stop-gradient routing | §1.6 |
//! | [`sorl`] | turn-level ratio and clipping-triggered normalisation | §6 |
//! | [`sao`] | DIS mask vs behaviour log-probs, length-adaptive λ | §3 |
//! | [`armor`] | mixed policy/reference ratio and the public code's options (partner, replace_old, renorm_adv) | §4 |
//! | [`seq_mask`] | ARLArena's sequence mask | §2.2 |
//! | [`reinforce`] | REINFORCE with truncated IS (bypass mode) | §1.10 |
//! | [`rollout_correction`] | truncated IS and sequence rejection against the rollout log-probs (verl `rollout_corr`) | §1.10 |
//! | [`kl`] | k1/abs/k2/k3 and "+" forms, KL loss, KL in reward, controllers | §1.8 |
//! | [`gae`] | skip-observation GAE, whitening | §1.3 |
//! | [`grpo`] | GRPO / Dr. GRPO over any grouping key | §1.4–1.5 |
//! | [`gigpo`] | GiGPO episode + anchor-state step groups (exact or by similarity) | §2.2 |
//! | [`sequence_ratio`] | difflib's SequenceMatcher ratio (GiGPO similarity) | §2.2 |
//! | [`drmas`] | Dr. MAS agent-wise grouping | §8 |
//! | [`rtpo`] | RTPO sibling advantages, branched-turn mask | §7 |
//! | [`value`] | value loss, explained variance, critic schedule | §1.3, §3.2 |
//! | [`dapo`] | group filter with retries, overlong shaping, invalid-action penalty | §1.7, §2.2 |
//! | [`presets`] | `Preset` enum + `PresetConfig` | §11 |

pub mod aggregation;
pub mod armor;
pub mod dapo;
pub mod drmas;
pub mod gae;
pub mod gigpo;
pub mod grpo;
pub mod gspo;
pub mod kl;
pub mod ppo;
pub mod presets;
#[cfg(test)]
mod properties;
pub mod reinforce;
pub mod rollout_correction;
pub mod rtpo;
pub mod sao;
pub mod seq_mask;
pub mod sequence_ratio;
pub mod sorl;
pub mod value;

pub use aggregation::{agg_loss, AggDenominators, AggMode};
pub use presets::{AdvantageKind, PolicyLossKind, Preset, PresetConfig, RatioBase};
