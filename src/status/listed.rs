//! [`Listed`]: the ids a snapshot enables, deduplicated, built from the request's
//! chunks as they are consumed: a bitmap over the ids' range when no bigger than
//! the ids, else a hash set. [`Listed::encode`] writes the listing other replicas
//! read. Why and sizes: docs/status-sync.md, "The snapshot and its floor".

use std::collections::HashSet;

use foldhash::fast::RandomState;

use crate::domain::UserId;

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

/// The listing's encoding (see the module doc).
const FORMAT: u8 = 1;

impl Listed {
    /// The listing as stored for the other replicas (see the module doc).
    pub(super) fn encode(&self) -> Vec<u8> {
        let mut ids: Vec<u64> = self.iter().collect();
        if matches!(self.ids, Ids::Hashed(_)) {
            ids.sort_unstable();
        }
        let mut out = Vec::with_capacity(ids.len() + 16);
        out.push(FORMAT);
        let mut last = 0;
        for id in ids {
            let mut gap = id - last;
            last = id;
            loop {
                // The low seven bits; the high bit says more follow.
                let byte = (gap & 0x7f) as u8;
                gap >>= 7;
                if gap == 0 {
                    out.push(byte);
                    break;
                }
                out.push(byte | 0x80);
            }
        }
        out
    }

    /// A listing [`Listed::encode`] made; `None` for anything else (another
    /// format, a truncated or overlong gap, ids that do not ascend or are not
    /// a user's): the caller reads the rows instead.
    pub(super) fn decode(bytes: &[u8]) -> Option<Listed> {
        let (&format, mut rest) = bytes.split_first()?;
        if format != FORMAT {
            return None;
        }
        let mut chunks = Vec::new();
        let mut chunk = Vec::with_capacity(CHUNK);
        let mut last = 0u64;
        while !rest.is_empty() {
            let mut gap = 0u64;
            let mut shift = 0;
            loop {
                let (&byte, tail) = rest.split_first()?;
                rest = tail;
                if shift > 63 || (shift == 63 && byte & 0x7e != 0) {
                    return None;
                }
                gap |= u64::from(byte & 0x7f) << shift;
                shift += 7;
                if byte & 0x80 == 0 {
                    break;
                }
            }
            last = last
                .checked_add(gap)
                .filter(|id| gap > 0 && *id <= UserId::MAX)?;
            chunk.push(last);
            if chunk.len() == CHUNK {
                chunks.push(std::mem::replace(&mut chunk, Vec::with_capacity(CHUNK)));
            }
        }
        chunks.push(chunk);
        Some(Listed::new(chunks))
    }
}

/// Ids per chunk while a listing is decoded.
const CHUNK: usize = 100_000;

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
    fn a_listing_decodes_to_what_was_encoded() {
        let top = UserId::MAX;
        for ids in [
            vec![],
            vec![1],
            vec![3, 10, 17, 24, 1_000_000, 1_000_001],
            vec![5, top / 3, top - 1, top],
            (0..300_000).map(|i| i * 7 + 3).collect(),
        ] {
            let listed = Listed::new(vec![ids.clone()]);
            let bytes = listed.encode();
            let back = Listed::decode(&bytes).unwrap();
            let mut got: Vec<u64> = back.iter().collect();
            got.sort_unstable();
            assert_eq!(got, ids);
        }
        // About a byte an id for sellers' ids.
        let spread = Listed::new(vec![(0..300_000).map(|i| i * 7 + 3).collect()]);
        assert_eq!(spread.encode().len(), 1 + 300_000);
    }

    #[test]
    fn a_bad_listing_is_refused() {
        let good = Listed::new(vec![vec![5, 300]]).encode();
        assert!(Listed::decode(&good).is_some());
        let largest = [vec![FORMAT], vec![0xff; 8], vec![0x7f]].concat();
        let got = Listed::decode(&largest).unwrap();
        assert_eq!(got.iter().collect::<Vec<_>>(), [UserId::MAX]);
        for bad in [
            vec![],
            vec![2, 5],
            good[..good.len() - 1].to_vec(),
            vec![FORMAT, 5, 0],
            vec![FORMAT, 0],
            // Past 64 bits; past the largest user id; too many bytes.
            [vec![FORMAT], vec![0xff; 9], vec![0x7f]].concat(),
            [vec![FORMAT], vec![0xff; 9], vec![0x01]].concat(),
            [vec![FORMAT], vec![0x80; 10], vec![0x00]].concat(),
        ] {
            assert!(Listed::decode(&bad).is_none(), "{bad:?}");
        }
    }

    #[test]
    fn the_largest_ids_fit() {
        let top = crate::domain::UserId::MAX;
        let set = listed(&[&[top, top - 1, top - 200]]);
        assert!(matches!(set.ids, Ids::Bits { .. }));
        assert_eq!(set.iter().collect::<Vec<_>>(), [top - 200, top - 1, top]);
    }
}
