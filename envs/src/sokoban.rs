//! `sokoban`: small box-pushing puzzles rendered as text.
//!
//! The room is a `w × h` grid rendered row by row, one word per cell, rows separated by `|`:
//! `#` wall, `_` floor, `.` target, `$` box, `*` box on a target, `@` player, `+` player on a
//! target (the border is an implicit wall). Actions: `up`, `down`, `left`, `right`; walking into a
//! wall or pushing a box into a wall or another box leaves the room unchanged (a valid action).
//! Reward 1 once every box is on a target (the episode then ends).
//!
//! Difficulty 1..=4: 4×4 with one box, 5×5 with one box, 5×5 with two boxes, 6×6 with two boxes;
//! `max_turns` 10, 14, 20, 24. Puzzles come from reverse play (pulling boxes off their targets),
//! so every puzzle is solvable; the oracle is a breadth-first search over (player, boxes).
//!
//! Invariants (beside EN-1..EN-9):
//! - SK-1 Every generated puzzle has a shortest solution of at least `2 + difficulty` and at most
//!   `max_turns − 3` moves, which the oracle follows.
//! - SK-2 Held-out templates: interior-wall pattern 4 occurs only in eval tasks.

use std::collections::{HashMap, VecDeque};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::env::{outcome_of, Env, StepOutcome};
use crate::error::EnvError;
use crate::search_qa::INVALID;
use crate::snapshot::EnvSnapshot;
use crate::split::Split;

const MOVES: [(&str, i32, i32); 4] = [
    ("up", 0, -1),
    ("down", 0, 1),
    ("left", -1, 0),
    ("right", 1, 0),
];
const PATTERNS: usize = 5;
const HELD_OUT_PATTERN: usize = 4;

/// (player, boxes sorted): a search state.
type State = (usize, Vec<usize>);

/// The `sokoban` environment. Until the first `reset` it is terminal (EN-4).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct SokobanEnv {
    difficulty: usize,
    w: usize,
    h: usize,
    walls: Vec<bool>,
    targets: Vec<usize>,
    boxes: Vec<usize>,
    player: usize,
    turns: usize,
    done: bool,
    solved: bool,
}

/// The words of `sokoban` (TK-1).
pub fn vocabulary() -> Vec<String> {
    [
        "up", "down", "left", "right", "#", "_", ".", "$", "*", "@", "+", "|", "error", "invalid",
        "action", "task", "push", "every", "box", "onto", "a", "target",
    ]
    .iter()
    .map(|w| w.to_string())
    .collect()
}

impl SokobanEnv {
    /// A new env at `difficulty` (clamped to 1..=4).
    pub fn new(difficulty: usize) -> Self {
        let mut env = SokobanEnv {
            difficulty: difficulty.clamp(1, 4),
            w: 0,
            h: 0,
            walls: vec![],
            targets: vec![],
            boxes: vec![],
            player: 0,
            turns: 0,
            done: true,
            solved: false,
        };
        env.generate(0);
        env.done = true;
        env
    }

    fn dims(&self) -> (usize, usize, usize) {
        match self.difficulty {
            1 => (4, 4, 1),
            2 => (5, 5, 1),
            3 => (5, 5, 2),
            _ => (6, 6, 2),
        }
    }

    fn neighbour(&self, cell: usize, dx: i32, dy: i32) -> Option<usize> {
        let (x, y) = ((cell % self.w) as i32 + dx, (cell / self.w) as i32 + dy);
        if x < 0 || y < 0 || x >= self.w as i32 || y >= self.h as i32 {
            return None;
        }
        let c = y as usize * self.w + x as usize;
        (!self.walls[c]).then_some(c)
    }

    fn generate(&mut self, seed: u64) {
        let (w, h, n_boxes) = self.dims();
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x736f_6b6f);
        let patterns = if Split::of_seed(seed) == Split::Eval {
            PATTERNS
        } else {
            HELD_OUT_PATTERN
        };
        loop {
            let pattern = rng.gen_range(0..patterns);
            self.w = w;
            self.h = h;
            self.walls = vec![false; w * h];
            let wall_cells: Vec<(usize, usize)> = match pattern {
                0 => vec![],
                1 => vec![(w / 2, h / 2)],
                2 => vec![(1, 1), (w - 2, h - 2)],
                3 => vec![(w / 2, 0), (w / 2, 1)],
                _ => vec![(0, h - 1), (1, h - 1), (0, h - 2)],
            };
            for (x, y) in wall_cells {
                self.walls[y * w + x] = true;
            }
            let free: Vec<usize> = (0..w * h).filter(|&c| !self.walls[c]).collect();
            let picks = crate::lexicon::pick(&free, n_boxes + 1, &mut rng);
            self.targets = picks[..n_boxes].to_vec();
            self.targets.sort_unstable();
            self.boxes = self.targets.clone();
            self.player = picks[n_boxes];
            // Reverse play: walk, sometimes pulling the box behind the player.
            for _ in 0..(8 + 6 * self.difficulty) {
                let (_, dx, dy) = MOVES[rng.gen_range(0..4)];
                let Some(to) = self.neighbour(self.player, dx, dy) else {
                    continue;
                };
                if self.boxes.contains(&to) {
                    continue;
                }
                let behind = self.neighbour(self.player, -dx, -dy);
                let from = self.player;
                self.player = to;
                if let Some(b) = behind.filter(|b| self.boxes.contains(b)) {
                    if rng.gen_bool(0.7) {
                        let i = self.boxes.iter().position(|x| *x == b).unwrap_or(0);
                        self.boxes[i] = from;
                    }
                }
            }
            self.boxes.sort_unstable();
            if let Some(path) = self.solve() {
                if path.len() >= 2 + self.difficulty && path.len() + 3 <= self.max_turns() {
                    return;
                }
            }
        }
    }

    fn is_solved(boxes: &[usize], targets: &[usize]) -> bool {
        boxes.iter().all(|b| targets.contains(b))
    }

    /// The state after moving `(dx, dy)` from `s` (unchanged when blocked).
    fn advance(&self, s: &State, dx: i32, dy: i32) -> State {
        let (player, boxes) = s;
        let Some(to) = self.neighbour(*player, dx, dy) else {
            return s.clone();
        };
        if let Some(i) = boxes.iter().position(|b| *b == to) {
            match self.neighbour(to, dx, dy) {
                Some(beyond) if !boxes.contains(&beyond) => {
                    let mut nb = boxes.clone();
                    nb[i] = beyond;
                    nb.sort_unstable();
                    (to, nb)
                }
                _ => s.clone(),
            }
        } else {
            (to, boxes.clone())
        }
    }

    /// Shortest move sequence from the current state (BFS), if any.
    fn solve(&self) -> Option<Vec<usize>> {
        let start: State = (self.player, self.boxes.clone());
        if Self::is_solved(&start.1, &self.targets) {
            return Some(vec![]);
        }
        let mut prev: HashMap<State, (State, usize)> = HashMap::new();
        let mut queue = VecDeque::from([start.clone()]);
        prev.insert(start.clone(), (start.clone(), usize::MAX));
        while let Some(s) = queue.pop_front() {
            for (m, &(_, dx, dy)) in MOVES.iter().enumerate() {
                let n = self.advance(&s, dx, dy);
                if prev.contains_key(&n) {
                    continue;
                }
                prev.insert(n.clone(), (s.clone(), m));
                if Self::is_solved(&n.1, &self.targets) {
                    let mut path = vec![];
                    let mut cur = n;
                    while cur != start {
                        let (p, m) = prev[&cur].clone();
                        path.push(m);
                        cur = p;
                    }
                    path.reverse();
                    return Some(path);
                }
                queue.push_back(n);
            }
        }
        None
    }

    fn render(&self) -> String {
        let mut rows = Vec::with_capacity(self.h);
        for y in 0..self.h {
            let row: Vec<&str> = (0..self.w)
                .map(|x| {
                    let c = y * self.w + x;
                    let (t, b, p) = (
                        self.targets.contains(&c),
                        self.boxes.contains(&c),
                        self.player == c,
                    );
                    match (self.walls[c], b, p, t) {
                        (true, ..) => "#",
                        (_, true, _, true) => "*",
                        (_, true, _, false) => "$",
                        (_, _, true, true) => "+",
                        (_, _, true, false) => "@",
                        (_, _, _, true) => ".",
                        _ => "_",
                    }
                })
                .collect();
            rows.push(row.join(" "));
        }
        rows.join(" | ")
    }
}

impl Env for SokobanEnv {
    fn name(&self) -> &str {
        "sokoban"
    }

    /// The number of boxes: `boxes-1` or `boxes-2`.
    fn task_type(&self) -> String {
        format!("boxes-{}", self.boxes.len())
    }

    fn reset(&mut self, task_seed: u64) -> String {
        self.generate(task_seed);
        self.turns = 0;
        self.done = false;
        self.solved = false;
        format!("task push every box onto a target {}", self.render())
    }

    fn step(&mut self, action: &str) -> StepOutcome {
        if self.done {
            return outcome_of(self, INVALID.into(), 0.0, true, true);
        }
        self.turns += 1;
        let words: Vec<&str> = action.split_whitespace().collect();
        let mv = match words[..] {
            [word] => MOVES.iter().find(|m| m.0 == word),
            _ => None,
        };
        let (obs, invalid) = match mv {
            Some(&(_, dx, dy)) => {
                let (p, b) = self.advance(&(self.player, self.boxes.clone()), dx, dy);
                self.player = p;
                self.boxes = b;
                self.solved = Self::is_solved(&self.boxes, &self.targets);
                (self.render(), false)
            }
            None => (INVALID.to_string(), true),
        };
        self.done = self.solved || self.turns >= self.max_turns();
        let reward = if self.solved { 1.0 } else { 0.0 };
        outcome_of(
            self,
            if self.solved { String::new() } else { obs },
            reward,
            self.done,
            invalid,
        )
    }

    fn oracle_action(&self) -> String {
        match self.solve() {
            Some(path) if !path.is_empty() => MOVES[path[0]].0.to_string(),
            _ => "up".into(),
        }
    }

    fn max_turns(&self) -> usize {
        [10, 14, 20, 24][self.difficulty - 1]
    }

    fn success(&self) -> bool {
        self.solved
    }

    fn vocabulary(&self) -> Vec<String> {
        vocabulary()
    }

    fn admissible_actions(&self) -> Vec<String> {
        if self.done {
            return Vec::new();
        }
        MOVES.iter().map(|m| m.0.to_string()).collect()
    }

    fn anchor_state(&self) -> String {
        format!("{} done {}", self.render(), self.done)
    }

    fn snapshot(&self) -> Result<EnvSnapshot, EnvError> {
        EnvSnapshot::of("sokoban", self)
    }

    fn restore(&mut self, snapshot: &EnvSnapshot) -> Result<(), EnvError> {
        *self = snapshot.decode("sokoban")?;
        Ok(())
    }
}
