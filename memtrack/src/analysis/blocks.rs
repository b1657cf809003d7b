//! The blocks of one process's heap, by address: what the analysis looks up at every
//! allocation and free.
//!
//! An open-addressing table with linear probing and Fibonacci hashing of the address, insert
//! and look-up only: the analysis never removes a block (a freed one stays, marked freed) and
//! drops the whole table at an exec, so it needs none of a general hash map's work per insert.
//! The hash is not keyed: addresses chosen to collide (a crafted file) make look-ups slow,
//! never wrong.

use super::Block;

/// One slot: `key` 0 is an empty slot (address 0 lives in [`BlockMap::zero`]).
#[derive(Clone, Copy)]
struct Slot {
    key: u64,
    block: Block,
}

const EMPTY: Slot = Slot {
    key: 0,
    block: Block::Freed,
};

/// 2^64 / φ, odd: consecutive addresses land far apart in the table's top bits.
const FIB: u64 = 0x9E37_79B9_7F4A_7C15;

/// Address → [`Block`]; see the module docs.
pub(super) struct BlockMap {
    /// A power of two long (16 at first), at most 3/4 full.
    slots: Box<[Slot]>,
    len: usize,
    /// The length at which the next insert grows the table: 3/4 of its slots.
    grow_at: usize,
    /// 64 − log2(slots.len()): the top bits of the hash index the table.
    shift: u32,
    /// The block at address 0 (only damaged input has one; 0 marks an empty slot).
    zero: Option<Block>,
}

impl Default for BlockMap {
    fn default() -> Self {
        let mut m = BlockMap {
            slots: Box::new([]),
            len: 0,
            grow_at: 0,
            shift: 0,
            zero: None,
        };
        m.grow();
        m
    }
}

impl BlockMap {
    #[inline(always)]
    fn home(&self, addr: u64) -> usize {
        (addr.wrapping_mul(FIB) >> self.shift) as usize
    }

    /// The block at `addr`, if the map has one.
    #[inline(always)]
    pub(super) fn get_mut(&mut self, addr: u64) -> Option<&mut Block> {
        if addr == 0 {
            return self.zero.as_mut();
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(addr);
        loop {
            // SAFETY: `home` and `& mask` give an index below the slots' count (a power of
            // two, never 0: `default` makes 16), so no bounds check is needed per probe.
            let key = unsafe { self.slots.get_unchecked(i) }.key;
            if key == addr {
                // SAFETY: as above.
                return Some(&mut unsafe { self.slots.get_unchecked_mut(i) }.block);
            }
            if key == 0 {
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// Asks the CPU to bring the slot where a look-up of `addr` starts into its cache (a hint:
    /// no effect on what the map holds). The analysis calls it a few events ahead: a large
    /// heap's table does not fit in the cache, and its look-ups otherwise wait on memory.
    #[inline(always)]
    pub(super) fn prefetch(&self, addr: u64) {
        super::prefetch(&self.slots[self.home(addr)]);
    }

    /// Sets the block at `addr`; returns the one it replaces.
    #[inline(always)]
    pub(super) fn insert(&mut self, addr: u64, block: Block) -> Option<Block> {
        if addr == 0 {
            return self.zero.replace(block);
        }
        if self.len >= self.grow_at {
            self.grow();
        }
        let mask = self.slots.len() - 1;
        let mut i = self.home(addr);
        loop {
            // SAFETY: as in `get_mut`.
            let slot = unsafe { self.slots.get_unchecked_mut(i) };
            if slot.key == addr {
                return Some(std::mem::replace(&mut slot.block, block));
            }
            if slot.key == 0 {
                *slot = Slot { key: addr, block };
                self.len += 1;
                return None;
            }
            i = (i + 1) & mask;
        }
    }

    /// Doubles the table (16 slots at first) and places every block again.
    #[cold]
    #[inline(never)]
    fn grow(&mut self) {
        let n = (self.slots.len() * 2).max(16);
        let old = std::mem::replace(&mut self.slots, vec![EMPTY; n].into_boxed_slice());
        self.shift = 64 - n.trailing_zeros();
        self.grow_at = n / 4 * 3;
        let mask = n - 1;
        for s in old.iter().filter(|s| s.key != 0) {
            let mut i = self.home(s.key);
            while self.slots[i].key != 0 {
                i = (i + 1) & mask;
            }
            self.slots[i] = *s;
        }
    }

    /// The table's size in bytes.
    pub(super) fn table_bytes(&self) -> usize {
        size_of_val(&*self.slots)
    }

    /// Every block, in no particular order.
    pub(super) fn values(&self) -> impl Iterator<Item = &Block> {
        self.zero
            .iter()
            .chain(self.slots.iter().filter(|s| s.key != 0).map(|s| &s.block))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn same(a: Option<Block>, b: Option<Block>) -> bool {
        match (a, b) {
            (Some(Block::Live(x, a)), Some(Block::Live(y, b))) => (x, a) == (y, b),
            (Some(Block::Freed), Some(Block::Freed)) | (None, None) => true,
            _ => false,
        }
    }

    /// Against std's HashMap: inserts that replace and that add (growing the table many
    /// times), look-ups that hit and miss, address 0, clustered and spread addresses.
    #[test]
    fn behaves_as_a_map() {
        let mut m = BlockMap::default();
        let mut model: HashMap<u64, Block> = HashMap::new();
        let mut x: u64 = 0x1234_5678;
        for i in 0..200_000u64 {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
            // Mostly a heap's 16-byte-aligned addresses near each other, some far, some 0.
            let addr = match x >> 60 {
                0 => 0,
                1..=3 => x >> 8,
                _ => 0x5555_0000_0000 + ((x >> 20) % 50_000) * 16,
            };
            let block = if i % 3 == 0 {
                Block::Freed
            } else {
                Block::Live(i, i as u32 ^ 7)
            };
            if x & 1 == 0 {
                assert!(
                    same(m.insert(addr, block), model.insert(addr, block)),
                    "insert {addr:#x}"
                );
            } else {
                assert!(
                    same(m.get_mut(addr).copied(), model.get(&addr).copied()),
                    "get {addr:#x}"
                );
            }
        }
        assert_eq!(m.len + usize::from(m.zero.is_some()), model.len());
        assert_eq!(m.values().count(), model.len());
        let live = |it: &mut dyn Iterator<Item = &Block>| -> u64 {
            it.map(|b| match b {
                Block::Live(s, _) => *s,
                Block::Freed => 0,
            })
            .sum()
        };
        assert_eq!(live(&mut m.values()), live(&mut model.values()));
        assert!(m.len * 4 <= m.slots.len() * 3);
    }
}
