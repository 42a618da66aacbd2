//! A receipt engine's change counter, shared with its clients in memory (Linux).
//!
//! The engine adds one to it whenever a snapshot takes a project's lock, before anything under
//! the lock can read the watch's queue or change the latest tree, and whenever its own
//! directories change. A client whose run began on a quiet project (nothing queued, the
//! counter read before that was checked) and finds, at its end, the counter unchanged and the
//! watch's queue still empty (its own copy of the engine's inotify descriptor) knows that
//! nothing changed during the run: its receipt is empty, without asking the engine
//! ([`super::engine`]).
//!
//! One page of a `memfd`, mapped shared: the engine maps it to write, clients to read, its
//! descriptor sent to them over the engine's socket.

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

/// The mapping of one page holding the counter at its start.
#[derive(Debug)]
pub struct Page {
    at: std::ptr::NonNull<AtomicU64>,
    fd: OwnedFd,
}

// SAFETY: the mapping lives as long as the `Page`, and the counter is only reached atomically.
unsafe impl Send for Page {}
// SAFETY: as above.
unsafe impl Sync for Page {}

const SIZE: usize = 4096;

impl Page {
    /// A new page (the engine's), the counter at 0.
    #[cfg(target_os = "linux")]
    pub fn create() -> std::io::Result<Page> {
        let fd = rustix::fs::memfd_create("agent-bash-engine", rustix::fs::MemfdFlags::CLOEXEC)?;
        rustix::fs::ftruncate(&fd, SIZE as u64)?;
        Page::map(fd, true)
    }

    /// The page of an engine, from the descriptor it sent (read only).
    pub fn open(fd: OwnedFd) -> std::io::Result<Page> {
        let st = rustix::fs::fstat(&fd)?;
        if (st.st_size as u64) < SIZE as u64 {
            return Err(std::io::Error::other("the engine's page is too small"));
        }
        Page::map(fd, false)
    }

    fn map(fd: OwnedFd, write: bool) -> std::io::Result<Page> {
        let prot = match write {
            true => libc::PROT_READ | libc::PROT_WRITE,
            false => libc::PROT_READ,
        };
        use std::os::fd::AsRawFd;
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

    fn counter(&self) -> &AtomicU64 {
        // SAFETY: the page is mapped (and aligned) while `self` lives; shared memory is only
        // reached through this atomic.
        unsafe { self.at.as_ref() }
    }

    /// The counter now.
    pub fn now(&self) -> u64 {
        self.counter().load(Ordering::SeqCst)
    }

    /// One more (the engine's page only).
    pub fn bump(&self) {
        self.counter().fetch_add(1, Ordering::SeqCst);
    }

    /// Its descriptor, to send to a client.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Drop for Page {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped once.
        unsafe { libc::munmap(self.at.as_ptr().cast(), SIZE) };
    }
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    use super::*;

    /// A client's mapping sees the engine's counts, and cannot write them.
    #[test]
    fn clients_see_the_engines_count() {
        let engine = Page::create().unwrap();
        let client = Page::open(engine.fd().try_clone_to_owned().unwrap()).unwrap();
        assert_eq!(client.now(), 0);
        engine.bump();
        engine.bump();
        assert_eq!(client.now(), 2);
    }
}
