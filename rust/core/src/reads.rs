//! Where one call reads the item at a position from ([`CallReads`]), so that what a call
//! reads stays what it read.
//!
//! A call hands over its history as a list that holds positions `offset..` (a windowed read
//! hands over the newest part only), the new input, and takes the items it classifies for
//! the first time (`fresh_from..n_history`) in one step when it begins. An earlier position
//! is read from the caller's list when first needed and then kept, so the objects a result
//! returns are the objects that were classified and counted, whatever another thread or an
//! item's own code does to the caller's list meanwhile.

use rustc_hash::FxHashMap;

/// Why an item an index had seen cannot be read back from the caller's history list.
pub const GONE: &str = "is no longer in the history list: the items an index has seen must \
                        stay as they are, also while a call runs (another thread or an item's \
                        own code changed the list)";

/// Why a pack of a history suffix (`history_offset`) cannot read an earlier item.
pub const BEFORE_OFFSET: &str = "is before history_offset, not in the history list: a pack of \
                                 the newest items only may not need it (read the history from \
                                 HistoryIndex.window_start on)";

/// Where [`CallReads::locate`] finds a position.
#[derive(Debug, PartialEq, Eq)]
pub enum ReadFrom<'a, T> {
    /// Index into the new input.
    NewInput(usize),
    /// Index into the items taken when the call began.
    Fresh(usize),
    /// Read earlier in this call.
    Kept(&'a T),
    /// Index into the caller's history list (read it once, then [`CallReads::keep`] it).
    List(usize),
    /// Before the list's first position: not in it.
    BeforeList,
}

/// The read positions of one call and the objects (`T`: an embedding's item handle) read
/// from the caller's list so far.
#[derive(Debug)]
pub struct CallReads<T> {
    offset: usize,
    fresh_from: usize,
    n_history: usize,
    kept: FxHashMap<usize, T>,
}

impl<T> CallReads<T> {
    /// A call whose list holds positions `offset..`, which took `fresh_from..n_history`
    /// when it began, and whose new input starts at `n_history`.
    pub fn new(offset: usize, fresh_from: usize, n_history: usize) -> Self {
        CallReads {
            offset,
            fresh_from,
            n_history,
            kept: FxHashMap::default(),
        }
    }

    pub fn n_history(&self) -> usize {
        self.n_history
    }

    /// Where position `p` is read from.
    /// Why position `p` could not be read from the caller's list: it is before the list
    /// ([`BEFORE_OFFSET`]) or the list no longer holds it ([`GONE`]).
    pub fn unreadable(&self, p: usize) -> &'static str {
        match self.locate(p) {
            ReadFrom::BeforeList => BEFORE_OFFSET,
            _ => GONE,
        }
    }

    pub fn locate(&self, p: usize) -> ReadFrom<'_, T> {
        if p >= self.n_history {
            ReadFrom::NewInput(p - self.n_history)
        } else if p >= self.fresh_from {
            ReadFrom::Fresh(p - self.fresh_from)
        } else if let Some(obj) = self.kept.get(&p) {
            ReadFrom::Kept(obj)
        } else if p < self.offset {
            ReadFrom::BeforeList
        } else {
            ReadFrom::List(p - self.offset)
        }
    }

    /// Keep what was read from the list for position `p`, for the rest of the call.
    pub fn keep(&mut self, p: usize, obj: T) {
        self.kept.insert(p, obj);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn positions_are_read_from_where_the_call_took_them() {
        // List from position 10 on, positions 20..25 taken at the start, new input from 25.
        let mut reads = CallReads::new(10, 20, 25);
        let table = [
            (27, ReadFrom::NewInput(2)),
            (25, ReadFrom::NewInput(0)),
            (24, ReadFrom::Fresh(4)),
            (20, ReadFrom::Fresh(0)),
            (19, ReadFrom::List(9)),
            (10, ReadFrom::List(0)),
            (9, ReadFrom::BeforeList),
            (0, ReadFrom::BeforeList),
        ];
        for (p, want) in table {
            assert_eq!(reads.locate(p), want, "{p}");
        }
        reads.keep(12, "read once");
        assert_eq!(reads.locate(12), ReadFrom::Kept(&"read once"));
        assert_eq!(reads.locate(13), ReadFrom::List(3));
        assert_eq!(reads.n_history(), 25);
    }
}
