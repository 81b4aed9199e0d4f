//! Derived seeds: every random stream in a run is a pure function of the run seed and the
//! coordinates of the work it serves (task, version, step), never of wall-clock time or of
//! how many times a process restarted.

/// Mixes `parts` into one 64-bit seed (splitmix64 over the sequence).
pub fn mix_seed(parts: &[u64]) -> u64 {
    let mut h: u64 = 0x9E37_79B9_7F4A_7C15;
    for &p in parts {
        h ^= p
            .wrapping_add(0x9E37_79B9_7F4A_7C15)
            .wrapping_add(h << 6)
            .wrapping_add(h >> 2);
        h = splitmix64(h);
    }
    h
}

fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_and_values_matter() {
        assert_ne!(mix_seed(&[1, 2]), mix_seed(&[2, 1]));
        assert_ne!(mix_seed(&[1, 2]), mix_seed(&[1, 3]));
        assert_eq!(mix_seed(&[5, 6, 7]), mix_seed(&[5, 6, 7]));
    }
}
