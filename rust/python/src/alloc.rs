//! The allocator: mimalloc, committing memory as it is used.

/// mimalloc: the packer allocates and frees many small strings per item; glibc's malloc
/// showed pauses of hundreds of microseconds (fastbin consolidation) on the first allocation
/// after a large history was freed.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Option ids of mimalloc v3's `mi_option_e` (the version libmimalloc-sys builds by default).
const MI_OPTION_ARENA_EAGER_COMMIT: libmimalloc_sys::mi_option_t = 4;
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

/// Whether [`configure_allocator`] switched eager arena commit off.
static LAZY_COMMIT: std::sync::OnceLock<bool> = std::sync::OnceLock::new();

/// Commit the allocator's memory as it is used, not a whole arena up front: the eager default
/// kept 12-17 MB more resident after a cold 100k-item pack, at the same speed. Applied only
/// when both option ids read their defaults in this mimalloc (2 and 1000 ms), so a renumbered
/// mimalloc, or a user's own `MIMALLOC_ARENA_EAGER_COMMIT`, is left alone.
pub(crate) fn configure_allocator() -> bool {
    *LAZY_COMMIT.get_or_init(|| {
        // SAFETY: reads and sets plain integer options; no memory is touched.
        unsafe {
            let defaults = libmimalloc_sys::mi_option_get(MI_OPTION_ARENA_EAGER_COMMIT) == 2
                && libmimalloc_sys::mi_option_get(MI_OPTION_PURGE_DELAY) == 1000;
            if defaults {
                libmimalloc_sys::mi_option_set(MI_OPTION_ARENA_EAGER_COMMIT, 0);
            }
            defaults
        }
    })
}
