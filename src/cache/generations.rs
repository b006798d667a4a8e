//! Invalidation by seller in O(1): [`Generations`], the hashed counters every
//! cache entry is stamped from as its fetch starts (docs/caching.md).

use std::sync::atomic::{AtomicU32, Ordering};

use crate::domain::UserId;

/// Per-seller generation counters, hashed into a fixed table (bounded memory,
/// lock-free reads: one atomic load per lookup).
pub struct Generations {
    slots: Box<[AtomicU32]>,
    /// 64 minus the table's bits: the hash's top bits index it.
    shift: u32,
}

const GENERATION_SLOTS_BITS: u32 = 16;

impl Default for Generations {
    fn default() -> Self {
        Generations::with_slots(GENERATION_SLOTS_BITS)
    }
}

impl Generations {
    /// A table of `2^bits` slots (at most `2^24`): more slots, fewer unrelated
    /// sellers expired with each one invalidated, 4 bytes a slot.
    pub fn with_slots(bits: u32) -> Self {
        let bits = bits.clamp(1, 24);
        Generations {
            slots: (0..1usize << bits).map(|_| AtomicU32::new(0)).collect(),
            shift: 64 - bits,
        }
    }

    fn slot(&self, user: UserId) -> &AtomicU32 {
        // Fibonacci hashing: the top bits of the product spread sequential ids.
        let index = (user.get().wrapping_mul(0x9E37_79B9_7F4A_7C15) >> self.shift) as usize;
        &self.slots[index % self.slots.len()]
    }

    pub fn current(&self, user: UserId) -> u32 {
        self.slot(user).load(Ordering::Acquire)
    }

    /// Makes every cached entry of `user` invisible and stops in-flight fetches
    /// started before now from being read back.
    pub fn invalidate(&self, user: UserId) {
        self.slot(user).fetch_add(1, Ordering::AcqRel);
    }
}
