//! [`Listed`]: the ids a snapshot enables, as the replica that took it applies
//! them to its own memory. Built from the chunks the request parsed (consumed
//! as it goes, so the ids and the listing are not both held whole for long),
//! deduplicated, asked "is this seller listed?" once per entry of the set.
//!
//! A bitmap over the ids' range when they are dense enough for it to take no
//! more room than the ids themselves (8 bytes an id: a range of at most 64
//! times their number), which is what sellers' ids are: 10,000,000 ids spread
//! over 70,000,000 take 8.75 MB and answer with one memory read. Sparser ids
//! go to a hash set (about 16 bytes an id).

use std::collections::HashSet;

use foldhash::fast::RandomState;

/// Bits in a bitmap word.
const WORD: u64 = 64;

/// A range up to this many times the number of ids is kept as a bitmap.
const DENSE: u64 = 64;

pub(super) struct Listed {
    ids: Ids,
    len: usize,
}

enum Ids {
    /// Bit `i` of the map is id `base + i`.
    Bits {
        base: u64,
        words: Vec<u64>,
    },
    Hashed(HashSet<u64, RandomState>),
}

impl Listed {
    /// The distinct ids of `chunks`.
    pub(super) fn new(chunks: Vec<Vec<u64>>) -> Listed {
        let mut ids = chunks.iter().flatten().copied();
        let Some(first) = ids.next() else {
            return Listed {
                ids: Ids::Bits {
                    base: 0,
                    words: Vec::new(),
                },
                len: 0,
            };
        };
        let (min, max, count) = ids.fold((first, first, 1u64), |(lo, hi, n), id| {
            (lo.min(id), hi.max(id), n + 1)
        });
        let range = (max - min).saturating_add(1);
        let mut len = 0;
        let ids = if range / DENSE <= count {
            // At most 64 times `count` bits: no more words than ids.
            let words_needed = usize::try_from(range.div_ceil(WORD)).unwrap_or(usize::MAX);
            let mut words = vec![0u64; words_needed];
            for chunk in chunks {
                for id in chunk {
                    let bit = id - min;
                    // In bounds: `min <= id <= max` and `words` covers the range.
                    let word = &mut words[(bit / WORD) as usize];
                    let mask = 1 << (bit % WORD);
                    len += usize::from(*word & mask == 0);
                    *word |= mask;
                }
            }
            Ids::Bits { base: min, words }
        } else {
            let mut set = HashSet::with_capacity_and_hasher(
                usize::try_from(count).unwrap_or(0),
                RandomState::default(),
            );
            for chunk in chunks {
                set.extend(chunk);
            }
            len = set.len();
            Ids::Hashed(set)
        };
        Listed { ids, len }
    }

    /// Distinct ids listed.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    pub(super) fn contains(&self, id: u64) -> bool {
        match &self.ids {
            Ids::Bits { base, words } => id.checked_sub(*base).is_some_and(|bit| {
                usize::try_from(bit / WORD)
                    .ok()
                    .and_then(|w| words.get(w))
                    .is_some_and(|word| word & (1 << (bit % WORD)) != 0)
            }),
            Ids::Hashed(set) => set.contains(&id),
        }
    }

    /// Every listed id once (in increasing order when they are a bitmap).
    pub(super) fn iter(&self) -> Box<dyn Iterator<Item = u64> + Send + '_> {
        match &self.ids {
            Ids::Bits { base, words } => {
                Box::new(words.iter().enumerate().flat_map(move |(w, &word)| {
                    let start = base + w as u64 * WORD;
                    Bits(word).map(move |bit| start + bit)
                }))
            }
            Ids::Hashed(set) => Box::new(set.iter().copied()),
        }
    }
}

/// The set bits of a word, lowest first.
struct Bits(u64);

impl Iterator for Bits {
    type Item = u64;

    fn next(&mut self) -> Option<u64> {
        if self.0 == 0 {
            return None;
        }
        let bit = u64::from(self.0.trailing_zeros());
        self.0 &= self.0 - 1;
        Some(bit)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(chunks: &[&[u64]]) -> Listed {
        Listed::new(chunks.iter().map(|c| c.to_vec()).collect())
    }

    #[test]
    fn dense_ids_are_a_bitmap_sparse_ones_a_hash_set() {
        let dense = listed(&[&[70, 5, 64], &[5, 128, 6]]);
        assert!(matches!(dense.ids, Ids::Bits { base: 5, .. }));
        let sparse = listed(&[&[1, u64::MAX / 2, 3]]);
        assert!(matches!(sparse.ids, Ids::Hashed(_)));
        for set in [&dense, &sparse] {
            assert!(!set.contains(0) && !set.contains(4) && !set.contains(u64::MAX));
        }
        assert_eq!(dense.len(), 5);
        assert_eq!(dense.iter().collect::<Vec<_>>(), [5, 6, 64, 70, 128]);
        assert!([5, 6, 64, 70, 128].iter().all(|id| dense.contains(*id)));
        assert!(!dense.contains(129) && !dense.contains(7) && !dense.contains(63));
        assert_eq!(sparse.len(), 3);
        let mut got: Vec<u64> = sparse.iter().collect();
        got.sort_unstable();
        assert_eq!(got, [1, 3, u64::MAX / 2]);
        assert!(sparse.contains(u64::MAX / 2) && !sparse.contains(2));
    }

    #[test]
    fn nothing_listed() {
        let empty = listed(&[&[], &[]]);
        assert_eq!(empty.len(), 0);
        assert_eq!(empty.iter().count(), 0);
        assert!(!empty.contains(0) && !empty.contains(1));
    }

    #[test]
    fn the_largest_ids_fit() {
        let top = crate::domain::UserId::MAX;
        let set = listed(&[&[top, top - 1, top - 200]]);
        assert!(matches!(set.ids, Ids::Bits { .. }));
        assert_eq!(set.iter().collect::<Vec<_>>(), [top - 200, top - 1, top]);
    }
}
