//! A tokenizer failure that the counter handles prints nothing, while any other panic still
//! reaches the process's panic hook. (Its own test binary: it installs a panic hook.)

use protoprompt_core::tokens::Encoding;
use std::sync::atomic::{AtomicUsize, Ordering};

static REPORTED: AtomicUsize = AtomicUsize::new(0);

#[test]
fn caught_tokenizer_panics_are_silent_and_others_are_reported() {
    std::panic::set_hook(Box::new(|_| {
        REPORTED.fetch_add(1, Ordering::SeqCst);
    }));
    // A megabyte of spaces exceeds the regex engine's backtracking limit inside tiktoken-rs,
    // which unwraps the error: the counter catches that and halves the text.
    let spaces = " ".repeat(1 << 20);
    let n = Encoding::O200kBase.count_whole(&spaces).unwrap();
    assert!(n > 0);
    assert_eq!(
        REPORTED.load(Ordering::SeqCst),
        0,
        "a handled panic was reported"
    );
    let outside = std::panic::catch_unwind(|| panic!("not the tokenizer's"));
    assert!(outside.is_err());
    assert_eq!(
        REPORTED.load(Ordering::SeqCst),
        1,
        "other panics still reach the hook"
    );
}
