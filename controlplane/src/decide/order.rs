//! The seeded task order of an epoch.
//!
//! The generator is SplitMix64, written out here rather than taken from a crate, so that the order
//! of a given `(seed, epoch)` never changes with a dependency's version: a checkpoint written today
//! must resume into the same order tomorrow.

/// SplitMix64: a small, fast generator whose output for a seed is fixed forever.
struct SplitMix64 {
    state: u64,
}

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut mixed = self.state;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        mixed ^ (mixed >> 31)
    }

    /// A value in `0..bound`, by multiply-shift; the bias is below 2^-32 for any `u32` bound.
    fn below(&mut self, bound: u32) -> u32 {
        debug_assert!(bound > 0);
        ((u128::from(self.next()) * u128::from(bound)) >> 64) as u32
    }
}

/// The order in which the `count` planned tasks of `epoch` are handed out: a permutation of
/// `0..count` fixed by `(seed, epoch)` (Fisher-Yates over SplitMix64).
pub(crate) fn epoch_order(count: u32, seed: u64, epoch: u32) -> Vec<u32> {
    let mut generator = SplitMix64 {
        state: seed ^ u64::from(epoch).wrapping_mul(0xD1B5_4A32_D192_ED03),
    };
    let mut order: Vec<u32> = (0..count).collect();
    for index in (1..order.len()).rev() {
        // `index` < `count` <= u32::MAX, so `index + 1` fits in u32.
        let other = generator.below(index as u32 + 1) as usize;
        order.swap(index, other);
    }
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_is_a_permutation() {
        let mut sut = epoch_order(1000, 7, 0);
        sut.sort_unstable();
        assert_eq!(sut, (0..1000).collect::<Vec<u32>>());
    }

    #[test]
    fn order_is_fixed_by_seed_and_epoch() {
        assert_eq!(epoch_order(100, 7, 1), epoch_order(100, 7, 1));
        assert_ne!(epoch_order(100, 7, 0), epoch_order(100, 7, 1));
        assert_ne!(epoch_order(100, 7, 0), epoch_order(100, 8, 0));
        assert_ne!(epoch_order(100, 7, 0), (0..100).collect::<Vec<u32>>());
    }

    #[test]
    fn order_of_a_known_seed_never_changes() {
        // Pinned so that a change to the generator, which would break resuming old checkpoints,
        // fails here.
        assert_eq!(epoch_order(8, 42, 3), PINNED_ORDER_8_42_3.to_vec());
    }

    const PINNED_ORDER_8_42_3: [u32; 8] = [5, 6, 7, 0, 1, 4, 3, 2];
}
