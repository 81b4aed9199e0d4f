//! PATS warm start (spec §5.3): the seed bank and scaffold-conditioned SFT.
//!
//! A policy that never saw a scaffold is thrown off by one: prepending even two dozen words to
//! its prompts collapsed the tiny model's success to 0 for the first RL steps. So, as the paper
//! does with its scaffold-conditioned SFT warm-up, the seed bank is reviewed from the
//! demonstrations themselves (one evidence card per demonstration, step 0, the configured
//! reviewer in the mode the task types' EMAs give) and every other demonstration carries its task
//! type's scaffold: the warm-started policy reads prompts with and without one, and evaluation
//! (never scaffolded) stays in distribution.
//!
//! Invariants:
//! - PS-1: a scaffolded demonstration is the plain one with its prompt rendered after the
//!   scaffold (`scaffold + " " + prompt`, DT-2), exactly what a generator renders (RO-6); its
//!   actions and observations are unchanged.
//! - PS-2: demonstrations of even index stay bare; one that would outgrow the context with its
//!   scaffold stays bare too.

use keel_envs::scaffold::{EpisodeRecord, GroupRecord, ScaffoldController, TurnRecord};
use keel_envs::{build_env, Demonstration};
use keel_learner::hf::ChatCodec;

use crate::config::TrainConfig;
use crate::demo_tokens::{render_demonstration, SftSequence};
use crate::error::ActorError;

/// `(start, end, invalid)` of one model turn inside a token stream.
pub type TurnSpanRef = (usize, usize, bool);

/// A sampled episode as PATS evidence: each turn's decoded action and the observation after it
/// (the observation tokens decoded with special tokens dropped).
pub fn episode_record(
    tokens: &[u32],
    turns: &[TurnSpanRef],
    reward: f32,
    codec: &ChatCodec,
) -> Result<EpisodeRecord, ActorError> {
    let turns = turns
        .iter()
        .enumerate()
        .map(|(k, &(start, end, invalid))| {
            let next = turns.get(k + 1).map_or(tokens.len(), |n| n.0);
            let observation = codec
                .tokenizer()
                .decode(&tokens[end.min(next)..next], true)?
                .trim()
                .to_string();
            Ok(TurnRecord {
                action: keel_envs::action::visible(&codec.response_text(&tokens[start..end])?)
                    .to_string(),
                observation,
                invalid,
            })
        })
        .collect::<Result<Vec<_>, ActorError>>()?;
    Ok(EpisodeRecord {
        reward,
        success: reward >= 1.0,
        turns,
    })
}

/// A demonstration as PATS evidence (its text as it is).
fn demo_record(d: &Demonstration) -> EpisodeRecord {
    EpisodeRecord {
        reward: if d.success { 1.0 } else { 0.0 },
        success: d.success,
        turns: d
            .turns
            .iter()
            .map(|t| TurnRecord {
                action: t.action.clone(),
                observation: t.observation.clone().unwrap_or_default(),
                invalid: false,
            })
            .collect(),
    }
}

/// Reviews the seed bank from `demos` (`(task seed, demonstration, bare rendering)`) with
/// `controller` at step 0 and scaffolds every other demonstration (PS-1, PS-2); answers the
/// SFT sequences.
pub fn seed_scaffold(
    cfg: &TrainConfig,
    codec: &ChatCodec,
    demos: Vec<(u64, Demonstration, SftSequence)>,
    controller: &mut ScaffoldController,
) -> Result<Vec<SftSequence>, ActorError> {
    let mut env = build_env(&cfg.env_config())?;
    let mut types = Vec::with_capacity(demos.len());
    let mut groups = Vec::with_capacity(demos.len());
    for (i, (seed, d, _)) in demos.iter().enumerate() {
        env.try_reset(*seed)?;
        let task_type = env.task_type();
        groups.push(GroupRecord {
            task_id: i as u64,
            task_type: task_type.clone(),
            episodes: vec![demo_record(d)],
        });
        types.push(task_type);
    }
    controller
        .observe_step(0, &groups)
        .map_err(|e| ActorError::Internal(format!("PATS seed review: {e}")))?;
    let mut out = Vec::with_capacity(demos.len());
    for (i, ((_, d, bare), task_type)) in demos.into_iter().zip(types).enumerate() {
        let scaffold = controller.render(&task_type);
        if i % 2 == 0 || scaffold.text.is_empty() {
            out.push(bare);
            continue;
        }
        let scaffolded = render_demonstration(codec, &d, &scaffold.text)?;
        out.push(if scaffolded.0.len() <= cfg.model.context_len {
            scaffolded
        } else {
            bare
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_envs::scaffold::ScaffoldConfig;
    use keel_envs::{demonstrations, make_env, task_seed, tokenizer_for, Split};

    #[test]
    fn ps1_ps2_scaffolded_demos_are_rendered_prompts_with_the_same_actions() {
        let mut cfg = TrainConfig::default();
        cfg.env.name = "household".into();
        cfg.env.difficulty = 1;
        cfg.model.context_len = 256;
        let tok = tokenizer_for(&cfg.env_config()).expect("tokenizer");
        let mut env = make_env("household", 1).expect("env");
        let seeds: Vec<u64> = (0..40)
            .map(|i| task_seed(Split::Train, 10_000 + i))
            .collect();
        let codec = cfg.chat_codec(&tok).expect("codec");
        let demos = demonstrations(&mut [env.as_mut()], &tok, &seeds, 0.3, 7).expect("demos");
        let plain: Vec<SftSequence> = demos
            .iter()
            .map(|d| render_demonstration(&codec, d, "").expect("render"))
            .collect();
        let mut c = ScaffoldController::with_rule_reviewer(ScaffoldConfig::default(), tok.clone())
            .expect("controller");
        let out = seed_scaffold(
            &cfg,
            &codec,
            seeds
                .iter()
                .copied()
                .zip(demos)
                .zip(plain.clone())
                .map(|((s, d), p)| (s, d, p))
                .collect(),
            &mut c,
        )
        .expect("seeded");
        assert!(c.bank().version() > 0, "the seed review added nothing");
        let mut scaffolded = 0;
        for (i, ((t, m), (pt, pm))) in out.iter().zip(&plain).enumerate() {
            if i % 2 == 0 {
                assert_eq!((t, m), (pt, pm), "demo {i} must stay bare");
                continue;
            }
            if t == pt {
                continue;
            }
            scaffolded += 1;
            env.reset(seeds[i]);
            let text = c.render(&env.task_type()).text;
            let prompt = env.reset(seeds[i]);
            let rendered = codec
                .prompt(&[], &format!("{text} {prompt}"))
                .expect("render");
            assert_eq!(
                &t[..rendered.len()],
                rendered.as_slice(),
                "demo {i}: prompt"
            );
            let extra = t.len() - pt.len();
            assert_eq!(t[0], pt[0], "demo {i}: <bos> first");
            assert_eq!(&t[extra + 1..], &pt[1..], "demo {i}: the rest is unchanged");
            assert_eq!(&m[extra + 1..], &pm[1..], "demo {i}: the mask is unchanged");
            assert!(m[..extra + 1].iter().all(|&x| x == 0));
        }
        assert!(scaffolded > 10, "{scaffolded} scaffolded demonstrations");
    }
}
