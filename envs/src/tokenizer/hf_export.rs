//! Export of a [`Tokenizer`] as a Hugging Face tokenizer folder (TK-5): `tokenizer.json` for
//! the `tokenizers` library and `tokenizer_config.json` for `transformers`.
//!
//! The export mirrors [`Tokenizer::encode`]: a `WordLevel` model over every id (special tokens
//! included), a `WhitespaceSplit` pre-tokenizer, no normalizer (encode is case-sensitive), no
//! post-processor (encode adds no `<bos>`) and no decoder (`tokenizers` then joins words with
//! single spaces, as [`Tokenizer::decode`] does). The four special tokens are `added_tokens`
//! with `special: true`. The model's `unk_token` is `<unk>`, which is no id (TK-1 leaves no
//! room for one), so encoding an unknown word fails there as it does here (TK-3).
//!
//! The chat template renders keel's trajectory layout (see [`crate::demo`]):
//! `<bos> prompt <agent> action <eot> observation <agent> …`; every non-assistant message
//! (user, system, tool) ends with `<agent>`, every assistant message with `<eot>`, so a
//! generation prompt needs nothing more.

use serde_json::{json, Map, Value};

use super::{Tokenizer, SPECIAL_WORDS, UNKNOWN};

/// The `tokenizers` library's serialization format version.
const FORMAT_VERSION: &str = "1.0";

impl Tokenizer {
    /// The Hugging Face `tokenizer.json` of this tokenizer (TK-5).
    pub fn hf_tokenizer_json(&self) -> String {
        json!({
            "version": FORMAT_VERSION,
            "truncation": null,
            "padding": null,
            "added_tokens": self.hf_added_tokens(),
            "normalizer": null,
            "pre_tokenizer": {"type": "WhitespaceSplit"},
            "post_processor": null,
            "decoder": null,
            "model": {
                "type": "WordLevel",
                "vocab": self.hf_vocab(),
                "unk_token": UNKNOWN,
            },
        })
        .to_string()
    }

    /// The Hugging Face `tokenizer_config.json` of this tokenizer: special tokens (`<eot>` is
    /// the eos token: it ends an agent turn), no unk token, and the chat template of keel's
    /// trajectory layout; `model_max_length` is the model's context length in tokens.
    pub fn hf_tokenizer_config_json(&self, model_max_length: usize) -> String {
        let special = self.special();
        json!({
            "tokenizer_class": "PreTrainedTokenizerFast",
            "bos_token": self.word(special.bos),
            "eos_token": self.word(special.eot),
            "pad_token": self.word(special.pad),
            "additional_special_tokens": [self.word(special.agent)],
            "model_max_length": model_max_length,
            "clean_up_tokenization_spaces": false,
            "chat_template": self.hf_chat_template(),
        })
        .to_string()
    }

    /// One `added_tokens` entry per special token, in id order.
    fn hf_added_tokens(&self) -> Vec<Value> {
        (0..SPECIAL_WORDS.len() as u32)
            .map(|id| {
                json!({
                    "id": id,
                    "content": self.word(id),
                    "single_word": false,
                    "lstrip": false,
                    "rstrip": false,
                    "normalized": false,
                    "special": true,
                })
            })
            .collect()
    }

    /// Every word (special tokens included) mapped to its id.
    fn hf_vocab(&self) -> Map<String, Value> {
        self.words
            .iter()
            .enumerate()
            .map(|(id, word)| (word.clone(), Value::from(id as u32)))
            .collect()
    }

    /// Jinja: `<bos>`, then each message's content followed by `<eot>` (assistant) or
    /// `<agent>` (anyone else), all separated by single spaces.
    fn hf_chat_template(&self) -> String {
        [
            "{{ bos_token }}{% for message in messages %}",
            " {{ message['content'] }} ",
            "{% if message['role'] == 'assistant' %}{{ eos_token }}{% else %}",
            self.word(self.special().agent),
            "{% endif %}{% endfor %}",
        ]
        .concat()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::registry::{tokenizer_for, EnvConfig, ENVS};

    fn parse(text: &str) -> Value {
        serde_json::from_str(text).expect("the export is valid JSON")
    }

    /// The tokenizer of every built-in env of the registry, at its largest difficulty.
    fn all_tokenizers() -> Vec<Tokenizer> {
        ENVS.iter()
            .filter(|e| e.max_difficulty > 0)
            .map(|e| tokenizer_for(&EnvConfig::new(e.name, e.max_difficulty)).unwrap())
            .collect()
    }

    /// What the `tokenizers` library does with the export: split on whitespace (after splitting
    /// out the added tokens, which are whole words here), look every piece up in the vocab.
    fn encode_like_hf(export: &Value, text: &str) -> Option<Vec<u32>> {
        let vocab = &export["model"]["vocab"];
        text.split_whitespace()
            .map(|w| vocab.get(w).and_then(Value::as_u64).map(|id| id as u32))
            .collect()
    }

    #[test]
    fn tk5_vocab_maps_every_word_to_its_id() {
        for tok in all_tokenizers() {
            let export = parse(&tok.hf_tokenizer_json());
            let vocab = export["model"]["vocab"].as_object().unwrap();
            assert_eq!(vocab.len(), tok.vocab_size());
            for id in 0..tok.vocab_size() as u32 {
                assert_eq!(
                    vocab[tok.word(id)],
                    Value::from(id),
                    "word {:?}",
                    tok.word(id)
                );
            }
        }
    }

    #[test]
    fn tk5_special_tokens_are_added_and_special() {
        let tok = Tokenizer::calc();
        let export = parse(&tok.hf_tokenizer_json());
        let added = export["added_tokens"].as_array().unwrap();
        let s = tok.special();
        let expected = [
            (s.pad, "<pad>"),
            (s.bos, "<bos>"),
            (s.eot, "<eot>"),
            (s.agent, "<agent>"),
        ];
        assert_eq!(added.len(), expected.len());
        for (entry, (id, content)) in added.iter().zip(expected) {
            assert_eq!(entry["id"], Value::from(id));
            assert_eq!(entry["content"], content);
            assert_eq!(entry["special"], true);
            assert_eq!(entry["normalized"], false);
            assert_eq!(export["model"]["vocab"][content], Value::from(id));
        }
    }

    #[test]
    fn tk5_pipeline_mirrors_encode() {
        let tok = Tokenizer::calc();
        let export = parse(&tok.hf_tokenizer_json());
        assert_eq!(export["version"], "1.0");
        assert_eq!(export["model"]["type"], "WordLevel");
        assert_eq!(export["pre_tokenizer"], json!({"type": "WhitespaceSplit"}));
        for key in [
            "normalizer",
            "post_processor",
            "decoder",
            "truncation",
            "padding",
        ] {
            assert_eq!(export[key], Value::Null, "{key}");
        }
        // The unk token is no id, so unknown words fail to encode there too (TK-3).
        let unk = export["model"]["unk_token"].as_str().unwrap();
        assert_eq!(tok.token(unk), None);
        for text in [
            "task 3 + 4 * 5 - 2",
            "<bos> calc -7 * 9 <eot>",
            " result\t-63\n",
            "Task 3",
        ] {
            assert_eq!(
                encode_like_hf(&export, text),
                tok.encode(text).ok(),
                "{text:?}"
            );
        }
    }

    #[test]
    fn tk5_config_names_the_special_tokens_and_the_layout() {
        let tok = Tokenizer::calc();
        let config = parse(&tok.hf_tokenizer_config_json(512));
        assert_eq!(config["tokenizer_class"], "PreTrainedTokenizerFast");
        assert_eq!(config["bos_token"], "<bos>");
        assert_eq!(config["eos_token"], "<eot>");
        assert_eq!(config["pad_token"], "<pad>");
        assert_eq!(config["additional_special_tokens"], json!(["<agent>"]));
        assert_eq!(config.get("unk_token"), None);
        assert_eq!(config["model_max_length"], 512);
        assert_eq!(config["clean_up_tokenization_spaces"], false);
        let template = config["chat_template"].as_str().unwrap();
        assert!(template.starts_with("{{ bos_token }}"));
        assert!(template.contains("{{ eos_token }}{% else %}<agent>{% endif %}"));
    }
}
