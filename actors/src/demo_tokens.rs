//! SFT demonstrations rendered into model tokens with the chat codec, exactly as generators
//! render the episodes they sample (RO-1, CC-1..3), so the warm start trains the layout RL
//! samples in.
//!
//! Invariants:
//! - DT-1: tokens = `codec.prompt_with_tools(preamble, prompt, tools)` (mask 0), then per turn
//!   `codec.action(action)` (mask 1) and, unless it was the last turn, the observation as a
//!   message of its role (`user`, or `tool` answering a function call) through
//!   `codec.observation_messages(last token, …)` (mask 0).
//! - DT-2: a scaffolded prompt is `scaffold + " " + prompt` (PATS, RO-6), for demonstrations
//!   and generators alike ([`scaffolded_prompt`]).

use keel_envs::Demonstration;
use keel_learner::hf::{ChatCodec, ChatMessage};

use crate::error::ActorError;

/// One SFT sequence: `(tokens, loss mask)`.
pub type SftSequence = (Vec<u32>, Vec<u8>);

/// The prompt text with the PATS scaffold before it (DT-2); an empty scaffold is none.
pub fn scaffolded_prompt(scaffold: &str, prompt: &str) -> String {
    if scaffold.is_empty() {
        prompt.to_string()
    } else {
        format!("{scaffold} {prompt}")
    }
}

/// An env's preamble as the codec's chat messages.
pub fn chat_messages(preamble: &[keel_envs::PromptMessage]) -> Vec<ChatMessage> {
    preamble
        .iter()
        .map(|m| ChatMessage {
            tool_calls: m.tool_calls.clone(),
            ..ChatMessage::new(&m.role, &m.content)
        })
        .collect()
}

/// `d` as tokens and loss mask, its prompt after `scaffold` (DT-1, DT-2).
pub fn render_demonstration(
    codec: &ChatCodec,
    d: &Demonstration,
    scaffold: &str,
) -> Result<SftSequence, ActorError> {
    let preamble = chat_messages(&d.preamble);
    let prompt = scaffolded_prompt(scaffold, &d.prompt);
    let mut tokens = codec.prompt_with_tools(&preamble, &prompt, &d.tools)?;
    let mut mask = vec![0u8; tokens.len()];
    for turn in &d.turns {
        let action = codec.action(&turn.action)?;
        mask.extend(std::iter::repeat_n(1u8, action.len()));
        tokens.extend(action);
        if !turn.messages.is_empty() {
            let messages = chat_messages(&turn.messages);
            let ids = codec.observation_messages(tokens.last().copied(), &messages)?;
            mask.extend(std::iter::repeat_n(0u8, ids.len()));
            tokens.extend(ids);
        }
    }
    Ok((tokens, mask))
}

#[cfg(test)]
mod tests {
    use super::*;
    use keel_envs::{demonstrations, make_env, task_seed, Split, Tokenizer};

    fn codec() -> (Tokenizer, ChatCodec) {
        let t = Tokenizer::calc();
        let c = crate::TrainConfig::default().chat_codec(&t).expect("codec");
        (t, c)
    }

    /// CC-3 on the built-in tokenizer: a sampled turn decodes up to its first end-of-turn token
    /// with special tokens dropped (what TK-4 asked of the old word-level decoder).
    #[test]
    fn cc3_response_text_stops_at_end_of_turn() {
        let (t, c) = codec();
        let s = t.special();
        assert_eq!(c.end_of_turn(), s.eot);
        let mut ids = vec![s.bos];
        ids.extend(t.encode("answer 12").unwrap());
        ids.push(s.pad);
        ids.push(s.eot);
        ids.extend(t.encode("result 3").unwrap());
        assert_eq!(c.response_text(&ids).unwrap(), "answer 12");
        assert_eq!(c.response_text(&[s.eot]).unwrap(), "");
        assert_eq!(c.response_text(&[]).unwrap(), "");
    }

    /// DT-1 on the built-in tokenizer: keel's word layout `<bos> prompt <agent>`, then per
    /// turn `action <eot>` (mask 1) and `observation <agent>` (mask 0).
    #[test]
    fn dt1_built_in_layout() {
        let (t, c) = codec();
        let s = t.special();
        let mut env = make_env("calc", 2).expect("env");
        let seeds: Vec<u64> = (0..20).map(|i| task_seed(Split::Train, i)).collect();
        for d in demonstrations(&mut [env.as_mut()], &t, &seeds, 0.3, 5).expect("demos") {
            let (tokens, mask) = render_demonstration(&c, &d, "").expect("render");
            let mut want = vec![s.bos];
            want.extend(t.encode(&d.prompt).unwrap());
            want.push(s.agent);
            let mut want_mask = vec![0u8; want.len()];
            for turn in &d.turns {
                let a = t.encode(&turn.action).unwrap();
                want_mask.extend(std::iter::repeat_n(1, a.len() + 1));
                want.extend(a);
                want.push(s.eot);
                if let Some(o) = &turn.observation {
                    let o = t.encode(o).unwrap();
                    want_mask.extend(std::iter::repeat_n(0, o.len() + 1));
                    want.extend(o);
                    want.push(s.agent);
                }
            }
            assert_eq!(tokens, want);
            assert_eq!(mask, want_mask);
        }
    }
}
