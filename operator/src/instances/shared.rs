//! Access to the describe cache, owned or shared.
//!
//! The allocator's steps only touch the cache between EC2 calls, never across one, so the
//! same code runs on a cache a test owns and on the one the operator's actors share (a lock
//! taken for each short update, released before the next call goes out).

use std::sync::{Arc, PoisonError, RwLock};

use super::InstanceCache;

/// The describe cache shared by the instances manager, the allocators and the publisher.
pub type SharedCache = Arc<RwLock<InstanceCache>>;

/// A new, empty shared cache.
pub fn shared() -> SharedCache {
    Arc::new(RwLock::new(InstanceCache::new()))
}

/// Something through which the cache can be read and changed for a moment.
pub trait CacheAccess {
    /// Runs `f` on the cache; `f` must not block.
    fn with<R>(&mut self, f: impl FnOnce(&mut InstanceCache) -> R) -> R;
}

impl CacheAccess for InstanceCache {
    fn with<R>(&mut self, f: impl FnOnce(&mut InstanceCache) -> R) -> R {
        f(self)
    }
}

impl CacheAccess for SharedCache {
    fn with<R>(&mut self, f: impl FnOnce(&mut InstanceCache) -> R) -> R {
        // Every change is one complete insert or removal, so a cache left by a panicking
        // writer is still consistent: use it as is.
        let mut guard = self.write().unwrap_or_else(PoisonError::into_inner);
        f(&mut guard)
    }
}
