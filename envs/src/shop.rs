//! `shop`: a WebShop-like store (the procedural counterpart of WebShop).
//!
//! Each task generates a catalog of products (category, colour, material, price, selectable
//! options) and an instruction such as `task buy a red cotton shirt size medium under 40
//! dollars`. Pages and actions:
//! - `search W…` (any page) shows the top five products by BM25 over their titles:
//!   `results item 17 red cotton shirt 25 dollars item 4 …`;
//! - `click item N` (results page) opens a product page with its price and options;
//! - `select size medium` / `select pack two` (product page) picks an option;
//! - `back` returns to the results; `buy` (product page) ends the episode.
//!
//! Reward (WebShop-style) = matched / required over {category, colour, material (difficulty ≥ 2),
//! each required option, price < budget}; success = reward 1. Difficulty 1..=4 grows the catalog,
//! the attributes and options required, the look-alike products (same title, over budget or
//! without the wanted size; from difficulty 2) and the horizon (`max_turns = 7 + difficulty`).
//!
//! Invariants (beside EN-1..EN-9):
//! - SH-1 Exactly one product matches every requirement, and at most two others share its
//!   title, so the oracle query (`search {colour} {material} {category}`) lists it in the top
//!   five (BM-1).
//! - SH-2 Held-out templates: the categories `chair` and `hat` are bought only in eval tasks.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::bm25::Bm25;
use crate::env::{outcome_of, Env, StepOutcome};
use crate::error::EnvError;
use crate::lexicon::{numbers, WordList};
use crate::search_qa::INVALID;
use crate::snapshot::EnvSnapshot;
use crate::split::Split;

const CATEGORIES: [&str; 8] = [
    "shirt", "shoes", "jacket", "mug", "lamp", "bag", "chair", "hat",
];
const HELD_OUT: usize = 6;
const COLORS: [&str; 6] = ["red", "blue", "green", "black", "white", "gray"];
const MATERIALS: [&str; 5] = ["cotton", "leather", "wool", "steel", "glass"];
const SIZES: [&str; 3] = ["small", "medium", "large"];
const PACKS: [&str; 3] = ["one", "two", "four"];
const RESULTS: usize = 5;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Product {
    id: u32,
    category: usize,
    color: usize,
    material: usize,
    price: u32,
    sizes: Vec<usize>,
    packs: Vec<usize>,
}

impl Product {
    fn title(&self) -> String {
        format!(
            "{} {} {}",
            COLORS[self.color], MATERIALS[self.material], CATEGORIES[self.category]
        )
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
enum Page {
    Home,
    Results(Vec<u32>),
    Item(u32, Vec<u32>),
}

/// The `shop` environment. Until the first `reset` it is terminal (EN-4).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ShopEnv {
    difficulty: usize,
    catalog: Vec<Product>,
    target: Product,
    budget: u32,
    want_size: Option<usize>,
    want_pack: Option<usize>,
    page: Page,
    size: Option<usize>,
    pack: Option<usize>,
    turns: usize,
    done: bool,
    reward: f32,
}

/// The words of `shop` (TK-1).
pub fn vocabulary() -> Vec<String> {
    let mut w = WordList::default();
    w.extend_text([
        "task buy a size pack under dollars search click item select back results",
        "price options selected no error invalid action",
    ]);
    w.extend(CATEGORIES)
        .extend(COLORS)
        .extend(MATERIALS)
        .extend(SIZES)
        .extend(PACKS);
    w.extend(numbers(0, 99));
    w.into_vec()
}

impl ShopEnv {
    /// A new env at `difficulty` (clamped to 1..=4).
    pub fn new(difficulty: usize) -> Self {
        let mut env = ShopEnv {
            difficulty: difficulty.clamp(1, 4),
            catalog: Vec::new(),
            target: Product {
                id: 0,
                category: 0,
                color: 0,
                material: 0,
                price: 0,
                sizes: vec![],
                packs: vec![],
            },
            budget: 0,
            want_size: None,
            want_pack: None,
            page: Page::Home,
            size: None,
            pack: None,
            turns: 0,
            done: true,
            reward: 0.0,
        };
        env.generate(0);
        env.done = true;
        env
    }

    fn generate(&mut self, seed: u64) {
        let d = self.difficulty;
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x7368_6f70);
        let n_cat = if Split::of_seed(seed) == Split::Eval {
            CATEGORIES.len()
        } else {
            HELD_OUT
        };
        let mut ids: Vec<u32> = (1..=99).collect();
        use rand::seq::SliceRandom;
        ids.shuffle(&mut rng);
        let opts = |rng: &mut ChaCha8Rng, on: bool| -> Vec<usize> {
            if !on {
                return vec![];
            }
            let mut v: Vec<usize> = (0..3).filter(|_| rng.gen_bool(0.6)).collect();
            if v.is_empty() {
                v.push(rng.gen_range(0..3));
            }
            v
        };
        let budget = rng.gen_range(3..=9) * 10;
        let target = Product {
            id: ids[0],
            category: rng.gen_range(0..n_cat),
            color: rng.gen_range(0..COLORS.len()),
            material: if d >= 2 {
                rng.gen_range(0..MATERIALS.len())
            } else {
                0
            },
            price: rng.gen_range(5..budget),
            sizes: opts(&mut rng, d >= 2),
            packs: opts(&mut rng, d >= 4),
        };
        let want_size = (d >= 2).then(|| target.sizes[rng.gen_range(0..target.sizes.len())]);
        let want_pack = (d >= 4).then(|| target.packs[rng.gen_range(0..target.packs.len())]);
        let mut catalog = vec![target.clone()];
        // From difficulty 2, two look-alikes that fail the price or the options (SH-1), then
        // random products.
        let look_alikes = if d >= 2 { 2 } else { 0 };
        for (k, &id) in ids.iter().enumerate().skip(1).take(look_alikes) {
            let mut p = target.clone();
            p.id = id;
            if k == 1 {
                p.price = rng.gen_range(budget..=99);
            } else {
                p.sizes.retain(|s| Some(*s) != want_size);
                if p.sizes.is_empty() {
                    p.price = rng.gen_range(budget..=99);
                }
            }
            catalog.push(p);
        }
        for &id in ids.iter().take(6 + 4 * d).skip(3) {
            let p = Product {
                id,
                category: rng.gen_range(0..CATEGORIES.len()),
                color: rng.gen_range(0..COLORS.len()),
                material: if d >= 2 {
                    rng.gen_range(0..MATERIALS.len())
                } else {
                    0
                },
                price: rng.gen_range(5..=99),
                sizes: opts(&mut rng, d >= 2),
                packs: opts(&mut rng, d >= 4),
            };
            if p.title() != target.title() {
                catalog.push(p);
            }
        }
        catalog.shuffle(&mut rng);
        *self = ShopEnv {
            difficulty: d,
            catalog,
            target,
            budget,
            want_size,
            want_pack,
            page: Page::Home,
            size: None,
            pack: None,
            turns: 0,
            done: false,
            reward: 0.0,
        };
    }

    fn instruction(&self) -> String {
        let t = &self.target;
        let material = if self.difficulty >= 2 {
            format!("{} ", MATERIALS[t.material])
        } else {
            String::new()
        };
        let mut s = format!(
            "task buy a {} {material}{}",
            COLORS[t.color], CATEGORIES[t.category]
        );
        if let Some(z) = self.want_size {
            s.push_str(&format!(" size {}", SIZES[z]));
        }
        if let Some(p) = self.want_pack {
            s.push_str(&format!(" pack {}", PACKS[p]));
        }
        s + &format!(" under {} dollars", self.budget)
    }

    fn product(&self, id: u32) -> Option<&Product> {
        self.catalog.iter().find(|p| p.id == id)
    }

    fn search(&self, query: &[&str]) -> Vec<u32> {
        let titles: Vec<String> = self.catalog.iter().map(Product::title).collect();
        Bm25::new(&titles)
            .top_k(query, RESULTS)
            .into_iter()
            .map(|i| self.catalog[i].id)
            .collect()
    }

    fn results_text(&self, ids: &[u32]) -> String {
        if ids.is_empty() {
            return "results no".into();
        }
        let items: Vec<String> = ids
            .iter()
            .filter_map(|&id| {
                self.product(id)
                    .map(|p| format!("item {id} {} {} dollars", p.title(), p.price))
            })
            .collect();
        format!("results {}", items.join(" "))
    }

    fn item_text(&self, p: &Product) -> String {
        let mut s = format!("item {} {} price {} dollars", p.id, p.title(), p.price);
        if !p.sizes.is_empty() || !p.packs.is_empty() {
            s.push_str(" options");
            for &z in &p.sizes {
                s.push_str(&format!(" size {}", SIZES[z]));
            }
            for &k in &p.packs {
                s.push_str(&format!(" pack {}", PACKS[k]));
            }
        }
        s
    }

    /// WebShop-style score of buying `p` with the selected options.
    fn score(&self, p: &Product) -> f32 {
        let t = &self.target;
        let mut checks = vec![
            p.category == t.category,
            p.color == t.color,
            p.price < self.budget,
        ];
        if self.difficulty >= 2 {
            checks.push(p.material == t.material);
        }
        if let Some(z) = self.want_size {
            checks.push(self.size == Some(z));
        }
        if let Some(k) = self.want_pack {
            checks.push(self.pack == Some(k));
        }
        checks.iter().filter(|&&c| c).count() as f32 / checks.len() as f32
    }

    fn apply(&mut self, w: &[&str]) -> Option<(String, f32)> {
        match (w, self.page.clone()) {
            (["search", q @ ..], _) if !q.is_empty() => {
                let ids = self.search(q);
                let text = self.results_text(&ids);
                self.page = Page::Results(ids);
                Some((text, 0.0))
            }
            (["click", "item", n], Page::Results(ids)) => {
                let id: u32 = n.parse().ok().filter(|id| ids.contains(id))?;
                let text = self.item_text(self.product(id)?);
                self.page = Page::Item(id, ids);
                self.size = None;
                self.pack = None;
                Some((text, 0.0))
            }
            (["select", kind, v], Page::Item(id, _)) => {
                let p = self.product(id)?;
                match *kind {
                    "size" => {
                        self.size = Some(
                            SIZES
                                .iter()
                                .position(|s| s == v)
                                .filter(|i| p.sizes.contains(i))?,
                        )
                    }
                    "pack" => {
                        self.pack = Some(
                            PACKS
                                .iter()
                                .position(|s| s == v)
                                .filter(|i| p.packs.contains(i))?,
                        )
                    }
                    _ => return None,
                }
                Some((format!("selected {kind} {v}"), 0.0))
            }
            (["back"], Page::Item(_, ids)) => {
                let text = self.results_text(&ids);
                self.page = Page::Results(ids);
                Some((text, 0.0))
            }
            (["buy"], Page::Item(id, _)) => {
                let r = self.score(self.product(id)?);
                self.done = true;
                self.reward = r;
                Some((String::new(), r))
            }
            _ => None,
        }
    }
}

impl Env for ShopEnv {
    fn name(&self) -> &str {
        "shop"
    }

    /// The category of the product to buy, e.g. `shirt`.
    fn task_type(&self) -> String {
        CATEGORIES[self.target.category].to_string()
    }

    fn reset(&mut self, task_seed: u64) -> String {
        self.generate(task_seed);
        self.instruction()
    }

    fn step(&mut self, action: &str) -> StepOutcome {
        if self.done {
            return outcome_of(self, INVALID.into(), 0.0, true, true);
        }
        self.turns += 1;
        let words: Vec<&str> = action.split_whitespace().collect();
        let (obs, reward, invalid) = match self.apply(&words) {
            Some((obs, r)) => (obs, r, false),
            None => (INVALID.to_string(), 0.0, true),
        };
        if self.turns >= self.max_turns() {
            self.done = true;
        }
        outcome_of(self, obs, reward, self.done, invalid)
    }

    fn oracle_action(&self) -> String {
        let t = &self.target;
        let query = self.oracle_search();
        match &self.page {
            Page::Home => query,
            Page::Results(ids) if ids.contains(&t.id) => format!("click item {}", t.id),
            Page::Results(_) => query,
            Page::Item(id, _) if *id != t.id => "back".into(),
            Page::Item(..) => match (self.want_size, self.want_pack) {
                (Some(z), _) if self.size != Some(z) => format!("select size {}", SIZES[z]),
                (_, Some(k)) if self.pack != Some(k) => format!("select pack {}", PACKS[k]),
                _ => "buy".into(),
            },
        }
    }

    fn max_turns(&self) -> usize {
        7 + self.difficulty
    }

    fn success(&self) -> bool {
        self.reward >= 1.0
    }

    fn vocabulary(&self) -> Vec<String> {
        vocabulary()
    }

    fn admissible_actions(&self) -> Vec<String> {
        if self.done {
            return Vec::new();
        }
        let mut out: Vec<String> = CATEGORIES.iter().map(|c| format!("search {c}")).collect();
        out.push(self.oracle_search());
        match &self.page {
            Page::Home => {}
            Page::Results(ids) => out.extend(ids.iter().map(|id| format!("click item {id}"))),
            Page::Item(id, _) => {
                if let Some(p) = self.product(*id) {
                    out.extend(p.sizes.iter().map(|&z| format!("select size {}", SIZES[z])));
                    out.extend(p.packs.iter().map(|&k| format!("select pack {}", PACKS[k])));
                }
                out.push("back".into());
                out.push("buy".into());
            }
        }
        out
    }

    fn anchor_state(&self) -> String {
        format!(
            "{} page {:?} size {:?} pack {:?} done {}",
            self.instruction(),
            self.page,
            self.size,
            self.pack,
            self.done
        )
    }

    fn snapshot(&self) -> Result<EnvSnapshot, EnvError> {
        EnvSnapshot::of("shop", self)
    }

    fn restore(&mut self, snapshot: &EnvSnapshot) -> Result<(), EnvError> {
        *self = snapshot.decode("shop")?;
        Ok(())
    }
}

impl ShopEnv {
    fn oracle_search(&self) -> String {
        let t = &self.target;
        if self.difficulty >= 2 {
            format!(
                "search {} {} {}",
                COLORS[t.color], MATERIALS[t.material], CATEGORIES[t.category]
            )
        } else {
            format!("search {} {}", COLORS[t.color], CATEGORIES[t.category])
        }
    }
}
