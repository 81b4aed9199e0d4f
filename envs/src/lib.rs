//! keel's built-in multi-turn text environments, their oracles, tokenizer and demonstrations.
//!
//! - [`mod@env`]: the [`Env`] trait every environment implements.
//! - [`calc`]: tool-integrated arithmetic, the one built-in environment.
//! - [`split`]: disjoint train and held-out eval task seeds.
//! - [`tokenizer`]: the word-level tokenizer over the environments' vocabulary.
//! - [`demo`]: oracle demonstrations in keel's trajectory token layout.
//!
//! Everything is deterministic: tasks are functions of their seed, demonstrations of their seeds.

#![deny(missing_docs)]

pub mod calc;
pub mod demo;
pub mod env;
pub mod error;
pub mod split;
pub mod tokenizer;

pub use calc::{CalcConfig, CalcEnv};
pub use demo::{demonstrations, Demonstration};
pub use env::{Env, StepOutcome};
pub use error::EnvError;
pub use split::{task_seed, Split};
pub use tokenizer::{SpecialTokens, Tokenizer};

/// Names [`make_env`] knows.
pub const ENV_NAMES: &[&str] = &["calc"];

/// The environment called `name` with `n_ops` operations per task.
pub fn make_env(name: &str, n_ops: usize) -> Result<Box<dyn Env>, EnvError> {
    match name {
        "calc" => {
            let cfg = CalcConfig { n_ops };
            cfg.validate()?;
            Ok(Box::new(CalcEnv::new(cfg)))
        }
        _ => Err(EnvError::UnknownEnv {
            name: error::quote(name),
            known: ENV_NAMES.join(", "),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn make_env_by_name() {
        let env = make_env("calc", 3).unwrap();
        assert_eq!(env.name(), "calc");
        assert_eq!(env.max_turns(), 5);
        assert!(matches!(
            make_env("calc", 0),
            Err(EnvError::InvalidConfig { .. })
        ));
        let err = make_env("maze", 2).err().unwrap();
        assert_eq!(
            err.to_string(),
            "unknown environment `maze`; known environments: calc"
        );
    }
}
