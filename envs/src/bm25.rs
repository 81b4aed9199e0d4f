//! Okapi BM25 ranking over a small in-memory collection of word-level documents: the `search`
//! tool of `search-qa`, `search-team` and `shop`.
//!
//! `score(q, d) = Σ_{t ∈ q} idf(t) · f(t,d)·(k1+1) / (f(t,d) + k1·(1 − b + b·|d|/avgdl))` with
//! `idf(t) = ln(1 + (N − n(t) + 0.5)/(n(t) + 0.5))`, `k1 = 1.2`, `b = 0.75` (Lucene's variant,
//! always positive). Kept in-house rather than taken from a BM25 crate because the envs need a
//! ranking that is bit-for-bit deterministic, ties included (EN-1, EN-7).
//!
//! Invariants:
//! - BM-1 `top_k` is deterministic: documents are ordered by score, then by index (stable ties).
//! - BM-2 Documents with score 0 (no query word) are never returned.

/// Term-frequency saturation.
const K1: f64 = 1.2;
/// Length normalisation.
const B: f64 = 0.75;

/// A ranked collection of documents, each a list of words.
pub struct Bm25<'a> {
    docs: Vec<Vec<&'a str>>,
    avgdl: f64,
}

impl<'a> Bm25<'a> {
    /// Indexes whitespace-separated documents.
    pub fn new(docs: &'a [String]) -> Self {
        let docs: Vec<Vec<&str>> = docs
            .iter()
            .map(|d| d.split_whitespace().collect())
            .collect();
        let total: usize = docs.iter().map(Vec::len).sum();
        let avgdl = if docs.is_empty() {
            1.0
        } else {
            (total as f64 / docs.len() as f64).max(1.0)
        };
        Bm25 { docs, avgdl }
    }

    /// BM25 score of document `i` for the query words.
    pub fn score(&self, query: &[&str], i: usize) -> f64 {
        let n = self.docs.len() as f64;
        let doc = &self.docs[i];
        let dl = doc.len() as f64;
        let mut seen = std::collections::HashSet::new();
        query
            .iter()
            .filter(|t| seen.insert(**t))
            .map(|t| {
                let f = doc.iter().filter(|w| *w == t).count() as f64;
                if f == 0.0 {
                    return 0.0;
                }
                let nt = self.docs.iter().filter(|d| d.contains(t)).count() as f64;
                let idf = (1.0 + (n - nt + 0.5) / (nt + 0.5)).ln();
                idf * f * (K1 + 1.0) / (f + K1 * (1.0 - B + B * dl / self.avgdl))
            })
            .sum()
    }

    /// Indices of the `k` best documents with a positive score (BM-1, BM-2).
    pub fn top_k(&self, query: &[&str], k: usize) -> Vec<usize> {
        let mut scored: Vec<(f64, usize)> = (0..self.docs.len())
            .map(|i| (self.score(query, i), i))
            .filter(|(s, _)| *s > 0.0)
            .collect();
        scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
        scored.into_iter().take(k).map(|(_, i)| i).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_rarer_and_denser_matches_first() {
        let docs: Vec<String> = [
            "bado born in gelu",
            "bado works for kuzo",
            "gelu located in mone",
            "kuzo based in gelu",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let bm = Bm25::new(&docs);
        assert_eq!(bm.top_k(&["bado", "born"], 2), vec![0, 1]);
        assert_eq!(bm.top_k(&["gelu"], 5), vec![0, 2, 3]); // equal scores: index order
        assert_eq!(bm.top_k(&["gelu", "located"], 1), vec![2]);
        assert!(bm.top_k(&["nothing"], 3).is_empty());
        assert_eq!(bm.top_k(&["in"], 10), vec![0, 2, 3]);
    }
}
