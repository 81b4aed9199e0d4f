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
//! - PS-1: a scaffolded demonstration is the plain one with the rendered scaffold's tokens put
//!   right after `<bos>` with loss mask 0 — exactly what `render_prompt(scaffold + " " + prompt)`
//!   gives a generator (RO-6); the action tokens and their mask are unchanged.
//! - PS-2: demonstrations of even index stay bare.

use keel_envs::scaffold::{EpisodeRecord, GroupRecord, ScaffoldController, TurnRecord};
use keel_envs::{build_env, Demonstration, Tokenizer};

use crate::config::TrainConfig;
use crate::error::ActorError;

/// One SFT sequence: `(tokens, loss mask)`.
pub type SftSequence = (Vec<u32>, Vec<u8>);

/// `(start, end, invalid)` of one model turn inside a token stream.
pub type TurnSpanRef = (usize, usize, bool);

/// An episode as PATS evidence: each turn's decoded action and the observation after it.
pub fn episode_record(
    tokens: &[u32],
    turns: &[TurnSpanRef],
    reward: f32,
    tok: &Tokenizer,
) -> EpisodeRecord {
    let turns = turns
        .iter()
        .enumerate()
        .map(|(k, &(start, end, invalid))| {
            let next = turns.get(k + 1).map_or(tokens.len(), |n| n.0);
            let observation = tok
                .decode(&tokens[end.min(next)..next])
                .replace("<agent>", "")
                .trim()
                .to_string();
            TurnRecord {
                action: tok.decode_action(&tokens[start..end]),
                observation,
                invalid,
            }
        })
        .collect();
    EpisodeRecord {
        reward,
        success: reward >= 1.0,
        turns,
    }
}

/// The maximal runs of mask-1 tokens: a demonstration's turns.
fn mask_turns(mask: &[u8]) -> Vec<TurnSpanRef> {
    let mut out = Vec::new();
    let mut start = None;
    for (t, &m) in mask.iter().chain(std::iter::once(&0)).enumerate() {
        match (m == 1, start) {
            (true, None) => start = Some(t),
            (false, Some(s)) => {
                out.push((s, t, false));
                start = None;
            }
            _ => {}
        }
    }
    out
}

/// Reviews the seed bank from `demos` (`(task seed, demonstration)`) with `controller` at step
/// 0 and scaffolds every other demonstration (PS-1, PS-2); answers the SFT sequences.
pub fn seed_scaffold(
    cfg: &TrainConfig,
    tok: &Tokenizer,
    demos: Vec<(u64, Demonstration)>,
    controller: &mut ScaffoldController,
) -> Result<Vec<SftSequence>, ActorError> {
    let mut env = build_env(&cfg.env.env_config())?;
    let mut types = Vec::with_capacity(demos.len());
    let mut groups = Vec::with_capacity(demos.len());
    for (i, (seed, d)) in demos.iter().enumerate() {
        env.reset(*seed);
        let task_type = env.task_type();
        let reward = if d.success { 1.0 } else { 0.0 };
        groups.push(GroupRecord {
            task_id: i as u64,
            task_type: task_type.clone(),
            episodes: vec![episode_record(
                &d.tokens,
                &mask_turns(&d.loss_mask),
                reward,
                tok,
            )],
        });
        types.push(task_type);
    }
    controller
        .observe_step(0, &groups)
        .map_err(|e| ActorError::Internal(format!("PATS seed review: {e}")))?;
    let mut out = Vec::with_capacity(demos.len());
    for (i, ((_, d), task_type)) in demos.into_iter().zip(types).enumerate() {
        let scaffold = controller.render(&task_type);
        if i % 2 == 0 || scaffold.text.is_empty() {
            out.push((d.tokens, d.loss_mask));
            continue;
        }
        let extra = tok.encode(&scaffold.text)?;
        let mut tokens = Vec::with_capacity(d.tokens.len() + extra.len());
        tokens.push(d.tokens[0]);
        tokens.extend_from_slice(&extra);
        tokens.extend_from_slice(&d.tokens[1..]);
        let mut mask = vec![0u8; extra.len() + 1];
        mask.extend_from_slice(&d.loss_mask[1..]);
        if tokens.len() <= cfg.model.context_len {
            out.push((tokens, mask));
        } else {
            out.push((d.tokens, d.loss_mask));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_envs::demo::render_prompt;
    use keel_envs::scaffold::ScaffoldConfig;
    use keel_envs::{demonstrations, make_env, task_seed, tokenizer_for, Split};

    #[test]
    fn ps1_ps2_scaffolded_demos_are_rendered_prompts_with_the_same_actions() {
        let mut cfg = TrainConfig::default();
        cfg.env.name = "household".into();
        cfg.env.difficulty = 1;
        cfg.model.context_len = 256;
        let tok = tokenizer_for(&cfg.env.env_config()).expect("tokenizer");
        let mut env = make_env("household", 1).expect("env");
        let seeds: Vec<u64> = (0..40)
            .map(|i| task_seed(Split::Train, 10_000 + i))
            .collect();
        let demos = demonstrations(env.as_mut(), &tok, &seeds, 0.3, 7).expect("demos");
        let plain: Vec<(Vec<u32>, Vec<u8>)> = demos
            .iter()
            .map(|d| (d.tokens.clone(), d.loss_mask.clone()))
            .collect();
        let mut c = ScaffoldController::with_rule_reviewer(ScaffoldConfig::default(), tok.clone())
            .expect("controller");
        let out = seed_scaffold(
            &cfg,
            &tok,
            seeds.iter().copied().zip(demos).collect(),
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
            let rendered = render_prompt(&tok, &format!("{text} {prompt}")).expect("render");
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
