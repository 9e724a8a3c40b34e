//! Which history positions a call's list holds, checked against the index before anything
//! is read: a call of `HistoryIndex.pack`, `count_window` or `cost_over` hands over a list
//! of the history from `offset` on, of which the first `history_len` items (all, without
//! one) are the history. Pure functions, tested in tables.

use std::fmt;

/// Why a call's history list does not line up with the index (or its pins with the list).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpanError {
    /// `history_len` is longer than the list.
    HistoryLen { history_len: usize, list_len: usize },
    /// `offset + history_len` overflows.
    OffsetTooLarge { offset: usize },
    /// A pinned position is not in the list.
    Pinned {
        at: usize,
        position: usize,
        offset: usize,
        n_history: usize,
    },
    /// The history is shorter than what the index holds (items were removed).
    Shrunk { n_history: usize, indexed: usize },
    /// The list starts past the indexed positions: the ones before it are unknown.
    OffsetPastIndex { offset: usize, indexed: usize },
    /// A call that reads indexed items only was given a list that is not exactly them
    /// (from `offset` on).
    NotIndexed {
        offset: usize,
        list_len: usize,
        indexed: usize,
    },
}

impl fmt::Display for SpanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            SpanError::HistoryLen {
                history_len,
                list_len,
            } => write!(
                f,
                "history_len is {history_len} but the list has {list_len} items"
            ),
            SpanError::OffsetTooLarge { offset } => {
                write!(f, "history_offset is {offset}, too large")
            }
            SpanError::Pinned {
                at,
                position,
                offset,
                n_history,
            } => write!(
                f,
                "pinned[{at}] is {position}, not a history position in the list (it holds \
                 positions {offset}..{n_history})"
            ),
            SpanError::Shrunk { n_history, indexed } => write!(
                f,
                "history has {n_history} items but the index already holds {indexed}; \
                 truncate or clear the index when items are removed"
            ),
            SpanError::OffsetPastIndex { offset, indexed } => write!(
                f,
                "history_offset is {offset} but the index holds {indexed} items: the \
                 positions before the list must be indexed"
            ),
            SpanError::NotIndexed {
                offset: 0,
                list_len,
                indexed,
            } => write!(
                f,
                "the history list must hold exactly the {indexed} indexed items, got {list_len}"
            ),
            SpanError::NotIndexed {
                offset,
                list_len,
                indexed,
            } => write!(
                f,
                "the history list must hold the indexed items from history_offset on: \
                 offset {offset} + {list_len} items, index {indexed}"
            ),
        }
    }
}

impl std::error::Error for SpanError {}

/// The history positions of a pack: `(listed, n_history)`, the number of history items in
/// the list and the length of the whole history, for a list of `list_len` items holding the
/// history from `offset` on (its first `history_len` items, or all), `pinned` positions and
/// an index of `indexed` items. The list must reach at least to the end of the index and
/// start inside it, and every pin must be in it.
pub fn pack_span(
    indexed: usize,
    list_len: usize,
    history_len: Option<usize>,
    offset: usize,
    pinned: &[usize],
) -> Result<(usize, usize), SpanError> {
    let listed = match history_len {
        Some(n) if n > list_len => {
            return Err(SpanError::HistoryLen {
                history_len: n,
                list_len,
            })
        }
        Some(n) => n,
        None => list_len,
    };
    let n_history = offset
        .checked_add(listed)
        .ok_or(SpanError::OffsetTooLarge { offset })?;
    if let Some((at, &position)) = pinned
        .iter()
        .enumerate()
        .find(|&(_, &p)| p >= n_history || p < offset)
    {
        return Err(SpanError::Pinned {
            at,
            position,
            offset,
            n_history,
        });
    }
    if n_history < indexed {
        return Err(SpanError::Shrunk { n_history, indexed });
    }
    if offset > indexed {
        return Err(SpanError::OffsetPastIndex { offset, indexed });
    }
    Ok((listed, n_history))
}

/// Check that a list of `list_len` items from `offset` on is exactly the `indexed` items of
/// the index (from `offset` on), for a call that reads indexed items only.
pub fn indexed_span(indexed: usize, list_len: usize, offset: usize) -> Result<(), SpanError> {
    if offset.checked_add(list_len) == Some(indexed) {
        Ok(())
    } else {
        Err(SpanError::NotIndexed {
            offset,
            list_len,
            indexed,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_spans_in_a_table() {
        use SpanError::*;
        // (indexed, list_len, history_len, offset, pinned) -> outcome
        #[allow(clippy::type_complexity)]
        let table: &[(
            (usize, usize, Option<usize>, usize, &[usize]),
            Result<(usize, usize), SpanError>,
        )] = &[
            ((0, 0, None, 0, &[]), Ok((0, 0))),
            ((3, 5, None, 0, &[]), Ok((5, 5))),
            ((3, 5, Some(4), 0, &[3]), Ok((4, 4))),
            ((5, 2, None, 3, &[3, 4]), Ok((2, 5))),
            ((5, 2, None, 5, &[]), Ok((2, 7))),
            (
                (0, 2, Some(3), 0, &[]),
                Err(HistoryLen {
                    history_len: 3,
                    list_len: 2,
                }),
            ),
            (
                (0, 1, None, usize::MAX, &[]),
                Err(OffsetTooLarge { offset: usize::MAX }),
            ),
            (
                (0, 2, None, 0, &[0, 2]),
                Err(Pinned {
                    at: 1,
                    position: 2,
                    offset: 0,
                    n_history: 2,
                }),
            ),
            (
                (4, 2, None, 2, &[1]),
                Err(Pinned {
                    at: 0,
                    position: 1,
                    offset: 2,
                    n_history: 4,
                }),
            ),
            (
                (4, 3, None, 0, &[]),
                Err(Shrunk {
                    n_history: 3,
                    indexed: 4,
                }),
            ),
            (
                (2, 3, None, 3, &[]),
                Err(OffsetPastIndex {
                    offset: 3,
                    indexed: 2,
                }),
            ),
        ];
        for &((indexed, list_len, history_len, offset, pinned), ref want) in table {
            assert_eq!(
                &pack_span(indexed, list_len, history_len, offset, pinned),
                want,
                "{indexed} {list_len} {history_len:?} {offset} {pinned:?}"
            );
        }
    }

    #[test]
    fn indexed_spans_and_their_messages() {
        assert_eq!(indexed_span(4, 4, 0), Ok(()));
        assert_eq!(indexed_span(4, 1, 3), Ok(()));
        assert_eq!(
            indexed_span(4, 3, 0).unwrap_err().to_string(),
            "the history list must hold exactly the 4 indexed items, got 3"
        );
        assert_eq!(
            indexed_span(4, 3, 2).unwrap_err().to_string(),
            "the history list must hold the indexed items from history_offset on: offset 2 + \
             3 items, index 4"
        );
        assert!(indexed_span(1, 1, usize::MAX).is_err());
        let shrunk = pack_span(4, 3, None, 0, &[]).unwrap_err().to_string();
        assert!(shrunk.contains("history has 3 items but the index already holds 4"));
    }
}
