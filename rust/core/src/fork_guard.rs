//! Keeps `fork` from copying a half-built tokenizer into a child process.
//!
//! Tokenizers are built lazily, sometimes on a helper thread while the GIL is released (the
//! first pack, `preload(wait=False)`). A `fork` in that window (multiprocessing's default on
//! Linux) would copy the lazy cell mid-build, and the child's first count would wait
//! forever for a builder thread that does not exist there. Every build holds `BUILDS`; a
//! `pthread_atfork` prepare handler takes it too (waiting for a running build, ~0.1 s) and
//! the parent and child handlers release it.
use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, Once};

static BUILDS: Mutex<()> = Mutex::new(());

/// Test hook (the binding's `_core._hold_next_build_until_fork`): the next build, once it holds
/// `BUILDS`, waits for a fork's prepare handler to start, so a test forks during a build
/// for certain instead of hoping a sleep lands inside one.
static HOLD_NEXT: AtomicBool = AtomicBool::new(false);
static HOLDING: AtomicBool = AtomicBool::new(false);
static FORK_BEGAN: AtomicBool = AtomicBool::new(false);

thread_local! {
    /// Held by the forking thread from prepare to the parent / child handler.
    static HELD: RefCell<Option<MutexGuard<'static, ()>>> = const { RefCell::new(None) };
}

fn around_build(build: &dyn Fn()) {
    let _held = BUILDS.lock().unwrap_or_else(|e| e.into_inner());
    if HOLD_NEXT.swap(false, Ordering::SeqCst) {
        HOLDING.store(true, Ordering::SeqCst);
        while !FORK_BEGAN.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        HOLDING.store(false, Ordering::SeqCst);
    }
    build();
}

/// Arm the test hook for the next build.
pub fn hold_next_build_until_fork() {
    FORK_BEGAN.store(false, Ordering::SeqCst);
    HOLD_NEXT.store(true, Ordering::SeqCst);
}

/// Whether a build is held by the test hook (it holds `BUILDS` and waits for a fork).
pub fn build_is_held() -> bool {
    HOLDING.load(Ordering::SeqCst)
}

extern "C" fn prepare() {
    FORK_BEGAN.store(true, Ordering::SeqCst);
    let guard = BUILDS.lock().unwrap_or_else(|e| e.into_inner());
    HELD.with(|h| *h.borrow_mut() = Some(guard));
}

extern "C" fn release() {
    HELD.with(|h| drop(h.borrow_mut().take()));
}

/// Hold `BUILDS` around every tokenizer build ([`crate::tokens::set_build_guard`]) and
/// before every `fork` (once per process; the Python binding calls it on import).
pub fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        crate::tokens::set_build_guard(around_build);
        // SAFETY: registers three handlers that only lock/unlock `BUILDS` on the
        // forking thread; they never call into Python.
        unsafe {
            libc::pthread_atfork(Some(prepare), Some(release), Some(release));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A held build goes on once a fork's prepare handler begins, and the fork then holds
    /// the lock until its parent handler releases it.
    #[test]
    fn a_held_build_waits_for_the_fork_to_begin() {
        install();
        install(); // once per process
        hold_next_build_until_fork();
        let built = std::sync::Arc::new(AtomicBool::new(false));
        let flag = built.clone();
        let build =
            std::thread::spawn(move || around_build(&|| flag.store(true, Ordering::SeqCst)));
        while !build_is_held() {
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        prepare(); // waits for the held build to finish
        assert!(
            BUILDS.try_lock().is_err(),
            "the forking thread holds the lock"
        );
        release();
        build.join().unwrap();
        assert!(built.load(Ordering::SeqCst));
        assert!(!build_is_held());
    }
}
