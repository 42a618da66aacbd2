//! A receipt engine's change counter and its runs' slots, shared with its clients in memory
//! (Linux).
//!
//! The engine adds one to the counter whenever a snapshot takes a project's lock, before
//! anything under the lock can read the watch's queue or change the latest tree, and whenever
//! its own directories change. A client whose run began on a quiet project (nothing queued, the
//! counter read before that was checked) and finds, at its end, the counter unchanged and the
//! watch's queue still empty (its own copy of the engine's inotify descriptor) knows that
//! nothing changed during the run: its receipt is empty, without asking the engine
//! ([`super::engine`]).
//!
//! The slots let a run begin without asking either. Each client connection is given a block of
//! them. A client that finds the project as quiet as at its latest mark claims a free slot of
//! its block with the number of that mark's snapshot, then reads the counter again: unchanged,
//! its claim was written before any later snapshot took the lock, and that snapshot adopts it
//! (a run of the engine, begun at the claimed snapshot) before it gives the timeline a new
//! one. A claim the engine never adopted, because nothing was snapshotted meanwhile, is freed
//! by its client at a quiet end: no message at all. Moved, the claim may have come too late for
//! the snapshot that moved it: the client takes it back (or closes the run it became) and asks.
//!
//! One page of a `memfd`, mapped shared, its descriptor sent to clients over the engine's
//! socket. Every word is reached atomically (`SeqCst`: a claim, the counter's reads around it
//! and the engine's count and adoption are one order).

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// The mapping of one page: the counter, then [`BLOCKS`] blocks of [`PER_BLOCK`] slots.
#[derive(Debug)]
pub struct Page {
    at: std::ptr::NonNull<AtomicU64>,
    fd: OwnedFd,
}

// SAFETY: the mapping lives as long as the `Page`, and its words are only reached atomically.
unsafe impl Send for Page {}
// SAFETY: as above.
unsafe impl Sync for Page {}

const SIZE: usize = 4096;
const WORDS: usize = SIZE / 8;
/// Slots start at this word (the first ones hold the counter and room to grow).
const FIRST_SLOT: usize = 8;
/// Slots per client connection: runs it can have begun without asking at once.
pub const PER_BLOCK: usize = 8;
/// Client connections that can have a block at once (the others ask at every begin).
pub const BLOCKS: usize = (WORDS - FIRST_SLOT) / PER_BLOCK;

/// A slot's word: free, claimed by its client (the snapshot number it began at), or adopted
/// by the engine (the run's id).
const FREE: u64 = 0;
const CLAIMED: u64 = 1 << 62;
const ADOPTED: u64 = 2 << 62;
const TAG: u64 = 3 << 62;

/// What became of a claim its client takes back.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    /// Nobody adopted it: the slot is free again.
    Back,
    /// The engine adopted it as this run (the slot stays the client's until it frees it).
    Run(u64),
}

impl Page {
    /// A new page (the engine's), the counter at 0, every slot free.
    #[cfg(target_os = "linux")]
    pub fn create() -> std::io::Result<Page> {
        let fd = rustix::fs::memfd_create("agent-bash-engine", rustix::fs::MemfdFlags::CLOEXEC)?;
        rustix::fs::ftruncate(&fd, SIZE as u64)?;
        // No permission bits: only a descriptor reaches it (the engine's, and the copies it
        // sends), not a path such as `/proc/<pid>/fd/<n>` (root aside).
        rustix::fs::fchmod(&fd, rustix::fs::Mode::empty())?;
        Page::map(fd)
    }

    /// The page of an engine, from the descriptor it sent.
    pub fn open(fd: OwnedFd) -> std::io::Result<Page> {
        let st = rustix::fs::fstat(&fd)?;
        if (st.st_size as u64) < SIZE as u64 {
            return Err(std::io::Error::other("the engine's page is too small"));
        }
        Page::map(fd)
    }

    fn map(fd: OwnedFd) -> std::io::Result<Page> {
        use std::os::fd::AsRawFd;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: a new shared mapping of a descriptor we own, checked below; nothing else maps
        // this address.
        let at = unsafe {
            libc::mmap(std::ptr::null_mut(), SIZE, prot, libc::MAP_SHARED, fd.as_raw_fd(), 0)
        };
        if at == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let at = std::ptr::NonNull::new(at.cast::<AtomicU64>())
            .ok_or_else(|| std::io::Error::other("mmap gave a null address"))?;
        Ok(Page { at, fd })
    }

    fn word(&self, i: usize) -> &AtomicU64 {
        assert!(i < WORDS);
        // SAFETY: the page is mapped (and aligned) while `self` lives, `i` is within it, and
        // shared memory is only reached through atomics.
        unsafe { self.at.add(i).as_ref() }
    }

    fn slot(&self, block: usize, i: usize) -> &AtomicU64 {
        assert!(block < BLOCKS && i < PER_BLOCK);
        self.word(FIRST_SLOT + block * PER_BLOCK + i)
    }

    /// The counter now.
    pub fn now(&self) -> u64 {
        self.word(0).load(Ordering::SeqCst)
    }

    /// One more (the engine's page only).
    pub fn bump(&self) {
        self.word(0).fetch_add(1, Ordering::SeqCst);
    }

    /// Its descriptor, to send to a client.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// A client claims a free slot of its `block` for a run beginning at snapshot `seq`: the
    /// slot's index, `None` when all are taken.
    pub fn claim(&self, block: usize, seq: u64) -> Option<usize> {
        let claim = CLAIMED | (seq & !TAG);
        (0..PER_BLOCK).find(|&i| {
            let slot = self.slot(block, i);
            slot.compare_exchange(FREE, claim, Ordering::SeqCst, Ordering::SeqCst).is_ok()
        })
    }

    /// A client takes back its claim on slot `i`, or learns the run the engine made of it.
    pub fn take_back(&self, block: usize, i: usize) -> Taken {
        let slot = self.slot(block, i);
        let mut word = slot.load(Ordering::SeqCst);
        loop {
            if word & TAG != CLAIMED {
                return Taken::Run(word & !TAG);
            }
            match slot.compare_exchange(word, FREE, Ordering::SeqCst, Ordering::SeqCst) {
                Ok(_) => return Taken::Back,
                Err(now) => word = now,
            }
        }
    }

    /// The run slot `i` became, once the engine adopted it.
    pub fn adopted(&self, block: usize, i: usize) -> Option<u64> {
        let word = self.slot(block, i).load(Ordering::SeqCst);
        (word & TAG == ADOPTED).then_some(word & !TAG)
    }

    /// Slot `i` free again (its client's, once the engine no longer needs it).
    pub fn free(&self, block: usize, i: usize) {
        self.slot(block, i).store(FREE, Ordering::SeqCst);
    }

    /// The engine adopts every claim of `block` made at snapshot `seq`, each as the run
    /// `next()` gives: the slots and runs adopted. A claim of another snapshot is left to its
    /// client, which takes it back.
    pub fn adopt(
        &self,
        block: usize,
        seq: u64,
        mut next: impl FnMut() -> u64,
    ) -> Vec<(usize, u64)> {
        let claim = CLAIMED | (seq & !TAG);
        let mut adopted = Vec::new();
        for i in 0..PER_BLOCK {
            let slot = self.slot(block, i);
            if slot.load(Ordering::SeqCst) != claim {
                continue;
            }
            let run = next();
            let word = ADOPTED | (run & !TAG);
            if slot.compare_exchange(claim, word, Ordering::SeqCst, Ordering::SeqCst).is_ok() {
                adopted.push((i, run));
            }
        }
        adopted
    }

    /// Every slot of `block` free (its connection ended).
    pub fn clear(&self, block: usize) {
        for i in 0..PER_BLOCK {
            self.free(block, i);
        }
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.at.as_ptr().cast(), SIZE) };
    }
}

#[cfg(test)]
#[cfg(target_os = "linux")]
mod tests {
    use super::*;

    fn pair() -> (Page, Page) {
        let engine = Page::create().unwrap();
        let client = Page::open(engine.fd().try_clone_to_owned().unwrap()).unwrap();
        (engine, client)
    }

    /// A client's mapping sees the engine's counts; the page has no permission bits.
    #[test]
    fn clients_see_the_engines_count() {
        let (engine, client) = pair();
        assert_eq!(rustix::fs::fstat(engine.fd()).unwrap().st_mode & 0o7777, 0);
        assert_eq!(client.now(), 0);
        engine.bump();
        engine.bump();
        assert_eq!(client.now(), 2);
    }

    /// A claim is adopted only at its snapshot, once; taken back, it is free; a full block
    /// claims nothing.
    #[test]
    fn claims_are_adopted_or_taken_back() {
        let (engine, client) = pair();
        let a = client.claim(3, 7).unwrap();
        let b = client.claim(3, 6).unwrap();
        assert_ne!(a, b);
        let mut next = 100;
        let adopted = engine.adopt(3, 7, || {
            next += 1;
            next
        });
        assert_eq!(adopted, vec![(a, 101)]);
        assert!(engine.adopt(3, 7, || 999).is_empty(), "adopted twice");
        assert_eq!(client.adopted(3, a), Some(101));
        assert_eq!(client.take_back(3, a), Taken::Run(101));
        assert_eq!(client.take_back(3, b), Taken::Back);
        assert_eq!(client.adopted(3, b), None);
        assert!(engine.adopt(3, 6, || 5).is_empty(), "a claim taken back was adopted");
        // The block's other slots, then none.
        let rest: Vec<_> = (0..PER_BLOCK).map(|_| client.claim(3, 1)).collect();
        assert_eq!(rest.iter().filter(|s| s.is_some()).count(), PER_BLOCK - 1);
        assert_eq!(client.claim(3, 1), None);
        assert_eq!(client.claim(4, 1), Some(0), "blocks are apart");
        engine.clear(3);
        assert_eq!(client.claim(3, 1), Some(0));
    }

    /// A claim raced by the engine's adoption on another thread ends exactly one way: adopted
    /// (the client learns the run) or taken back (the engine made no run of it).
    #[test]
    fn a_claim_and_its_adoption_race_to_one_outcome() {
        let (engine, client) = pair();
        for round in 0..2000u64 {
            let slot = client.claim(0, round).unwrap();
            let (adopted, taken) = std::thread::scope(|s| {
                let e = s.spawn(|| engine.adopt(0, round, || round + 1_000_000));
                let taken = client.take_back(0, slot);
                (e.join().unwrap(), taken)
            });
            match taken {
                Taken::Back => assert!(adopted.is_empty(), "round {round}: both"),
                Taken::Run(run) => assert_eq!(adopted, vec![(slot, run)], "round {round}"),
            }
            client.free(0, slot);
        }
    }
}
