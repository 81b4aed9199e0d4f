//! The generated knowledge base behind `search-qa` and `search-team`: a small world of people,
//! cities, countries and companies per task, one document per fact, and single- or multi-hop
//! questions over chains of relations.
//!
//! Invariants:
//! - KB-1 A world and its question are a pure function of (seed, max hops); names are distinct
//!   within a world, so every relation chain has exactly one answer.
//! - KB-2 Train seeds only ask person-rooted templates; the company- and city-rooted templates
//!   are held out for eval seeds (which ask every template).
//! - KB-3 The oracle query for hop `i` (`search {entity_i} {relation keyword}`) ranks that hop's
//!   fact document first, so the oracle resolves one hop per search.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::bm25::Bm25;
use crate::lexicon::{self, WordList};
use crate::split::Split;

/// Names in the pool worlds draw from.
const NAME_POOL: usize = 200;
/// Snippets a search returns.
pub const TOP_K: usize = 2;

/// A relation between entities; its first word is the search keyword.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Rel {
    /// person → city
    Born,
    /// person → company
    Works,
    /// city → country
    Located,
    /// company → city
    Based,
}

impl Rel {
    fn phrase(self) -> &'static str {
        match self {
            Rel::Born => "born in",
            Rel::Works => "works for",
            Rel::Located => "located in",
            Rel::Based => "based in",
        }
    }

    /// The search keyword of the relation.
    pub fn keyword(self) -> &'static str {
        match self {
            Rel::Born => "born",
            Rel::Works => "works",
            Rel::Located => "located",
            Rel::Based => "based",
        }
    }
}

/// Question templates: the relation chain, the root kind, and the question text (`X` = root).
const TEMPLATES: [(&[Rel], Root, &str); 8] = [
    (&[Rel::Born], Root::Person, "question where was X born"),
    (&[Rel::Works], Root::Person, "question who does X work for"),
    (
        &[Rel::Born, Rel::Located],
        Root::Person,
        "question in which country was X born",
    ),
    (
        &[Rel::Works, Rel::Based],
        Root::Person,
        "question in which city is the employer of X based",
    ),
    (
        &[Rel::Works, Rel::Based, Rel::Located],
        Root::Person,
        "question in which country is the employer of X based",
    ),
    (&[Rel::Based], Root::Company, "question where is X based"),
    (
        &[Rel::Based, Rel::Located],
        Root::Company,
        "question in which country is X based",
    ),
    (
        &[Rel::Located],
        Root::City,
        "question in which country is the city X",
    ),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Root {
    Person,
    Company,
    City,
}

/// One task: its documents, question and the hop chain the answer follows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct World {
    /// One fact per document, in a seed-shuffled order.
    pub docs: Vec<String>,
    /// The question text.
    pub question: String,
    /// `chain[0]` is the root entity, `chain[i+1]` the answer of hop `i`; the last is the answer.
    pub chain: Vec<String>,
    /// The relation of each hop.
    pub rels: Vec<Rel>,
    /// Index of the template (held-out ones are 5..).
    pub template: usize,
}

/// Every word `search-qa`/`search-team` worlds use, in a fixed order.
pub fn words() -> WordList {
    let mut w = WordList::default();
    w.extend_text(TEMPLATES.iter().map(|t| t.2.replace('X', "")));
    w.extend_text(["born in works for located in based in doc no results"]);
    w.extend(lexicon::names(NAME_POOL));
    w
}

impl World {
    /// The world of `seed` with questions of at most `max_hops` hops (KB-1, KB-2).
    pub fn generate(seed: u64, max_hops: usize) -> World {
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7365_6172_6368);
        let pool = lexicon::names(NAME_POOL);
        let names = lexicon::pick(&pool, 14, &mut rng);
        let (persons, rest) = names.split_at(4);
        let (cities, rest) = rest.split_at(4);
        let (countries, companies) = rest.split_at(3);
        let mut docs = Vec::new();
        let mut fact = std::collections::HashMap::new();
        let mut add = |docs: &mut Vec<String>, a: &String, rel: Rel, b: &String| {
            docs.push(format!("{a} {} {b}", rel.phrase()));
            fact.insert((a.clone(), rel), b.clone());
        };
        for p in persons {
            add(
                &mut docs,
                p,
                Rel::Born,
                &cities[rng.gen_range(0..cities.len())],
            );
            add(
                &mut docs,
                p,
                Rel::Works,
                &companies[rng.gen_range(0..companies.len())],
            );
        }
        for c in cities {
            add(
                &mut docs,
                c,
                Rel::Located,
                &countries[rng.gen_range(0..countries.len())],
            );
        }
        for m in companies {
            add(
                &mut docs,
                m,
                Rel::Based,
                &cities[rng.gen_range(0..cities.len())],
            );
        }
        use rand::seq::SliceRandom;
        docs.shuffle(&mut rng);
        let allowed: Vec<usize> = (0..TEMPLATES.len())
            .filter(|&t| TEMPLATES[t].0.len() <= max_hops.max(1))
            .filter(|&t| Split::of_seed(seed) == Split::Eval || TEMPLATES[t].1 == Root::Person)
            .collect();
        let template = allowed[rng.gen_range(0..allowed.len())];
        let (rels, root, text) = TEMPLATES[template];
        let roots = match root {
            Root::Person => persons,
            Root::Company => companies,
            Root::City => cities,
        };
        let mut chain = vec![roots[rng.gen_range(0..roots.len())].clone()];
        for &r in rels {
            let next = fact
                .get(&(chain[chain.len() - 1].clone(), r))
                .cloned()
                .unwrap_or_default();
            chain.push(next);
        }
        World {
            docs,
            question: text.replace('X', &chain[0]),
            chain,
            rels: rels.to_vec(),
            template,
        }
    }

    /// Number of hops.
    pub fn hops(&self) -> usize {
        self.rels.len()
    }

    /// The gold answer.
    pub fn answer(&self) -> &str {
        self.chain.last().map_or("", String::as_str)
    }

    /// The top-[`TOP_K`] documents for the query words (BM-1).
    pub fn search(&self, query: &[&str]) -> Vec<&str> {
        let bm = Bm25::new(&self.docs);
        bm.top_k(query, TOP_K)
            .into_iter()
            .map(|i| self.docs[i].as_str())
            .collect()
    }

    /// The document stating hop `i`.
    pub fn hop_doc(&self, i: usize) -> String {
        format!(
            "{} {} {}",
            self.chain[i],
            self.rels[i].phrase(),
            self.chain[i + 1]
        )
    }

    /// The oracle's query for hop `i` (KB-3).
    pub fn hop_query(&self, i: usize) -> String {
        format!("search {} {}", self.chain[i], self.rels[i].keyword())
    }
}

/// Token-level F1 of a predicted answer against the gold words.
pub fn f1(predicted: &[&str], gold: &[&str]) -> f32 {
    if predicted.is_empty() || gold.is_empty() {
        return 0.0;
    }
    let mut remaining: Vec<&str> = gold.to_vec();
    let mut common = 0usize;
    for w in predicted {
        if let Some(i) = remaining.iter().position(|g| g == w) {
            remaining.swap_remove(i);
            common += 1;
        }
    }
    if common == 0 {
        return 0.0;
    }
    let p = common as f32 / predicted.len() as f32;
    let r = common as f32 / gold.len() as f32;
    2.0 * p * r / (p + r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::split::task_seed;

    #[test]
    fn kb1_kb3_every_hop_query_ranks_its_fact_first() {
        for i in 0..300 {
            for split in [Split::Train, Split::Eval] {
                let w = World::generate(task_seed(split, i), 3);
                assert_eq!(w, World::generate(task_seed(split, i), 3));
                for h in 0..w.hops() {
                    let q = w.hop_query(h);
                    let words: Vec<&str> = q.split_whitespace().skip(1).collect();
                    assert_eq!(w.search(&words)[0], w.hop_doc(h), "{w:?}");
                }
            }
        }
    }

    #[test]
    fn kb2_held_out_templates_only_in_eval() {
        let train: Vec<usize> = (0..500)
            .map(|i| World::generate(task_seed(Split::Train, i), 3).template)
            .collect();
        let eval: Vec<usize> = (0..500)
            .map(|i| World::generate(task_seed(Split::Eval, i), 3).template)
            .collect();
        assert!(train.iter().all(|&t| t < 5));
        assert!(eval.iter().any(|&t| t >= 5));
        assert!((0..500).all(|i| World::generate(task_seed(Split::Eval, i), 1).hops() == 1));
    }

    #[test]
    fn f1_gives_partial_credit() {
        assert_eq!(f1(&["bado"], &["bado"]), 1.0);
        assert!((f1(&["bado", "gelu"], &["bado"]) - 2.0 / 3.0).abs() < 1e-6);
        assert_eq!(f1(&[], &["bado"]), 0.0);
        assert_eq!(f1(&["x"], &["bado"]), 0.0);
    }
}
