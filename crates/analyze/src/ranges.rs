//! Outstanding memory mappings of one process, as non-overlapping ranges.
//!
//! mmap, munmap and mremap work on page ranges, not blocks: a munmap may
//! cut the middle out of a mapping or span several, and mremap moves or
//! resizes one. Each piece remembers the mapping it came from (`origin`),
//! so a mapping split in two still counts as one allocation.

use std::collections::BTreeMap;

/// One outstanding piece of a mapping: `[start, end)` in the map key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// End address, exclusive.
    pub end: u64,
    /// When the mapping was created.
    pub ts: u64,
    /// Stack of the mmap (or of the mremap that grew it).
    pub stack: u64,
    /// Id of the mapping this piece came from.
    pub origin: u64,
}

/// The outstanding mappings of one process.
#[derive(Debug, Clone, Default)]
pub struct RangeSet {
    regions: BTreeMap<u64, Region>,
}

impl RangeSet {
    /// True when no mapping is outstanding.
    pub fn is_empty(&self) -> bool {
        self.regions.is_empty()
    }

    /// Outstanding pieces as `(start, region)`, in address order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &Region)> + '_ {
        self.regions.iter().map(|(&s, r)| (s, r))
    }

    /// Total bytes mapped.
    #[cfg(test)]
    pub fn bytes(&self) -> u64 {
        self.regions.iter().map(|(&s, r)| r.end - s).sum()
    }

    /// Adds `[start, end)`, replacing whatever overlapped it (as
    /// `MAP_FIXED` does). Returns the bytes it replaced.
    pub fn insert(&mut self, start: u64, region: Region) -> u64 {
        bytes(&self.insert_pieces(start, region))
    }

    /// [`RangeSet::insert`], returning the pieces it replaced.
    pub fn insert_pieces(&mut self, start: u64, region: Region) -> Vec<(u64, Region)> {
        let replaced = self.remove(start, region.end);
        if region.end > start {
            self.regions.insert(start, region);
        }
        replaced
    }

    /// Removes `[lo, hi)` from every piece it overlaps, splitting pieces
    /// that stick out on either side. Returns the removed parts, clipped
    /// to `[lo, hi)`, in address order.
    pub fn remove(&mut self, lo: u64, hi: u64) -> Vec<(u64, Region)> {
        let mut removed = Vec::new();
        if hi <= lo {
            return removed;
        }
        // The piece starting before `lo` may reach into the range.
        let mut starts: Vec<u64> = Vec::new();
        if let Some((&s, r)) = self.regions.range(..lo).next_back() {
            if r.end > lo {
                starts.push(s);
            }
        }
        starts.extend(self.regions.range(lo..hi).map(|(&s, _)| s));
        for s in starts {
            let r = self.regions.remove(&s).expect("start listed above");
            if s < lo {
                self.regions.insert(s, Region { end: lo, ..r });
            }
            if r.end > hi {
                self.regions.insert(hi, Region { end: r.end, ..r });
            }
            removed.push((
                s.max(lo),
                Region {
                    end: r.end.min(hi),
                    ..r
                },
            ));
        }
        removed
    }

    /// Applies `mremap(old, old_size, new_size)` landing at `new`, the way
    /// realloc is treated: whatever was tracked in `[old, old+old_size)`
    /// and at the destination is released, and `[new, new+new_size)` is a
    /// new mapping made by the mremap call (`made_by`: its stack and time).
    /// Returns the bytes removed.
    #[cfg(test)]
    pub fn remap(
        &mut self,
        old: u64,
        old_size: u64,
        new: u64,
        new_size: u64,
        made_by: Region,
    ) -> u64 {
        bytes(&self.remap_pieces(old, old_size, new, new_size, made_by))
    }

    /// [`RangeSet::remap`], returning the pieces it removed.
    pub fn remap_pieces(
        &mut self,
        old: u64,
        old_size: u64,
        new: u64,
        new_size: u64,
        made_by: Region,
    ) -> Vec<(u64, Region)> {
        let mut removed = self.remove(old, old.saturating_add(old_size));
        let new_end = new.saturating_add(new_size);
        removed.extend(self.remove(new, new_end));
        if new_end > new {
            self.regions.insert(
                new,
                Region {
                    end: new_end,
                    ..made_by
                },
            );
        }
        removed
    }
}

/// The bytes of `pieces`.
pub fn bytes(pieces: &[(u64, Region)]) -> u64 {
    pieces.iter().map(|(s, r)| r.end - s).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reg(end: u64, origin: u64) -> Region {
        Region {
            end,
            ts: origin,
            stack: origin,
            origin,
        }
    }

    fn pieces(s: &RangeSet) -> Vec<(u64, u64, u64)> {
        s.iter().map(|(st, r)| (st, r.end, r.origin)).collect()
    }

    #[test]
    fn partial_munmap_splits_and_spans() {
        let mut s = RangeSet::default();
        s.insert(0x1000, reg(0x5000, 1));
        s.insert(0x8000, reg(0x9000, 2));
        // Cut a hole in the middle of the first mapping.
        let r = s.remove(0x2000, 0x3000);
        assert_eq!(r.len(), 1);
        assert_eq!(
            pieces(&s),
            vec![
                (0x1000, 0x2000, 1),
                (0x3000, 0x5000, 1),
                (0x8000, 0x9000, 2)
            ]
        );
        // A munmap spanning the tail of one, a gap, and the head of the next.
        let r = s.remove(0x4000, 0x8800);
        assert_eq!(
            r.iter().map(|(a, r)| r.end - a).sum::<u64>(),
            0x1000 + 0x800
        );
        assert_eq!(
            pieces(&s),
            vec![
                (0x1000, 0x2000, 1),
                (0x3000, 0x4000, 1),
                (0x8800, 0x9000, 2)
            ]
        );
        // A munmap over nothing.
        assert!(s.remove(0x20000, 0x30000).is_empty());
        assert_eq!(s.bytes(), 0x1000 + 0x1000 + 0x800);
    }

    #[test]
    fn mmap_over_existing_replaces() {
        let mut s = RangeSet::default();
        s.insert(0x1000, reg(0x3000, 1));
        assert_eq!(s.insert(0x2000, reg(0x4000, 2)), 0x1000);
        assert_eq!(pieces(&s), vec![(0x1000, 0x2000, 1), (0x2000, 0x4000, 2)]);
    }

    #[test]
    fn mremap_is_a_free_of_the_old_range_and_a_new_mapping() {
        let mut s = RangeSet::default();
        s.insert(0x1000, reg(0x3000, 1));
        // Move and grow: the whole new range belongs to the mremap (7).
        assert_eq!(s.remap(0x1000, 0x2000, 0x10000, 0x3000, reg(0, 7)), 0x2000);
        assert_eq!(pieces(&s), vec![(0x10000, 0x13000, 7)]);
        // Shrink in place.
        assert_eq!(s.remap(0x10000, 0x3000, 0x10000, 0x1000, reg(0, 8)), 0x3000);
        assert_eq!(pieces(&s), vec![(0x10000, 0x11000, 8)]);
        // Half of a mapping moves: the rest stays with its maker.
        s.insert(0x20000, reg(0x24000, 2));
        assert_eq!(s.remap(0x22000, 0x2000, 0x40000, 0x2000, reg(0, 9)), 0x2000);
        assert_eq!(
            pieces(&s),
            vec![
                (0x10000, 0x11000, 8),
                (0x20000, 0x22000, 2),
                (0x40000, 0x42000, 9)
            ]
        );
        // Remap of a range mapped before attach: the new range is tracked.
        assert_eq!(s.remap(0x50000, 0x1000, 0x60000, 0x3000, reg(0, 10)), 0);
        assert_eq!(pieces(&s).last(), Some(&(0x60000, 0x63000, 10)));
    }
}
