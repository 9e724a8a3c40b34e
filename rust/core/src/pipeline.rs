//! Appending a long history to an [`IndexedHistory`] on two threads: the caller classifies
//! the next chunk of items (an embedding reads its own objects there, under its own lock)
//! while a scoped helper thread appends the previous chunk to the index, so a cold start
//! costs about the larger of the two instead of their sum. A failed classification puts the
//! index back as it was, memory included.

use crate::indexed::IndexedHistory;
use crate::items::ItemMeta;

/// Items classified per step (bounds the full-size copies: up to three chunks are alive
/// while pipelined). At 100k items, 2048 gave the speed of 4096 with a peak 6-8 MB lower
/// (4096: +13-19 MB over the unpipelined path, 1024: slower).
pub const CLASSIFY_CHUNK: usize = 2048;

/// Runs a wait, or work that needs no lock of the embedding's, with that lock released (the
/// Python binding: the GIL). `|f| f()` for a caller with no such lock.
pub type Blocking<'a> = &'a dyn Fn(&mut (dyn FnMut() + Send));

/// Run `f` once through `blocking`.
pub fn run_blocking<T: Send>(blocking: Blocking<'_>, f: impl FnOnce() -> T + Send) -> T {
    let mut f = Some(f);
    let mut out = None;
    blocking(&mut || {
        if let Some(f) = f.take() {
            out = Some(f());
        }
    });
    out.unwrap_or_else(|| panic!("a Blocking must run the closure it is given"))
}

impl IndexedHistory {
    /// Append `total` items, classified by `classify(first_position, count)` (at most
    /// [`CLASSIFY_CHUNK`] at a time, positions from `self.len()` on; fewer than `count`
    /// items ends the append). On an error of `classify` the index is put back as it was
    /// and the error returned.
    pub fn append_classified<E>(
        &mut self,
        total: usize,
        mut classify: impl FnMut(usize, usize) -> Result<Vec<ItemMeta>, E>,
        blocking: Blocking<'_>,
    ) -> Result<(), E> {
        let start = self.len();
        let mark = self.mark();
        let outcome = if total <= CLASSIFY_CHUNK {
            classify(start, total).map(|metas| run_blocking(blocking, || self.append(metas)))
        } else {
            self.append_pipelined(total, &mut classify, blocking)
        };
        if outcome.is_err() {
            run_blocking(blocking, || self.undo(mark));
        }
        outcome
    }

    fn append_pipelined<E>(
        &mut self,
        total: usize,
        classify: &mut dyn FnMut(usize, usize) -> Result<Vec<ItemMeta>, E>,
        blocking: Blocking<'_>,
    ) -> Result<(), E> {
        let mut position = self.len();
        let end = position + total;
        let (index, mut notes) = self.appender();
        std::thread::scope(|scope| {
            // A chunk and the number of items still to come after it.
            let (send, receive) = std::sync::mpsc::sync_channel::<(Vec<ItemMeta>, usize)>(1);
            let helper = scope.spawn(move || {
                let mut first = true;
                for (metas, rest) in receive {
                    index.extend(metas);
                    if std::mem::take(&mut first) && rest > 0 {
                        // Sized from the first chunk: the rest is stored without regrowth.
                        index.reserve(rest);
                    }
                }
            });
            let mut outcome = Ok(());
            while position < end {
                let metas = match classify(position, CLASSIFY_CHUNK.min(end - position)) {
                    Ok(metas) if metas.is_empty() => break, // fewer items than said
                    Ok(metas) => metas,
                    Err(e) => {
                        outcome = Err(e);
                        break;
                    }
                };
                position += metas.len();
                let rest = end.saturating_sub(position);
                notes.note(&metas, rest);
                // Wait for the helper (when it is behind) with the lock released.
                let sent = match send.try_send((metas, rest)) {
                    Err(std::sync::mpsc::TrySendError::Full(chunk)) => {
                        run_blocking(blocking, || send.send(chunk).is_ok())
                    }
                    other => other.is_ok(),
                };
                if !sent {
                    break; // the helper panicked: reported by the join below
                }
            }
            drop(send);
            if let Err(panic) = run_blocking(blocking, || helper.join()) {
                std::panic::resume_unwind(panic);
            }
            outcome
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn metas(n: usize) -> Vec<ItemMeta> {
        (0..n)
            .map(|i| {
                let item = match i % 3 {
                    0 => json!({"role": "user", "content": format!("q{i}")}),
                    1 => json!({"type": "function_call", "call_id": format!("c{i}"),
                                "name": "f", "arguments": "{}"}),
                    _ => json!({"type": "function_call_output", "call_id": format!("c{}", i - 1),
                                "output": "ok"}),
                };
                ItemMeta::from_json(&item).expect("a valid item")
            })
            .collect()
    }

    fn direct(f: &mut (dyn FnMut() + Send)) {
        f();
    }

    #[test]
    fn a_pipelined_append_equals_one_append() {
        for n in [
            0,
            5,
            CLASSIFY_CHUNK,
            CLASSIFY_CHUNK + 1,
            3 * CLASSIFY_CHUNK + 7,
        ] {
            let all = metas(n);
            let mut one = IndexedHistory::new();
            one.append(all.clone());
            let mut chunked = IndexedHistory::new();
            let mut asked = Vec::new();
            chunked
                .append_classified::<()>(
                    n,
                    |first, count| {
                        asked.push((first, count));
                        Ok(all[first..first + count].to_vec())
                    },
                    &direct,
                )
                .unwrap();
            assert_eq!(chunked.snapshot(b""), one.snapshot(b""), "{n} items");
            assert_eq!(asked.iter().map(|a| a.1).sum::<usize>(), n);
            assert!(asked.iter().all(|a| a.1 <= CLASSIFY_CHUNK));
        }
    }

    #[test]
    fn a_failed_chunk_leaves_the_index_as_it_was() {
        let before = metas(10);
        for fail_at in [0, CLASSIFY_CHUNK, 2 * CLASSIFY_CHUNK] {
            let mut index = IndexedHistory::new();
            index.append(before.clone());
            let snapshot = index.snapshot(b"");
            let more = metas(3 * CLASSIFY_CHUNK);
            let outcome = index.append_classified(
                more.len(),
                |first, count| {
                    let i = first - 10;
                    if (i..i + count).contains(&fail_at) {
                        Err(format!("bad item {}", first + fail_at - i))
                    } else {
                        Ok(more[i..i + count].to_vec())
                    }
                },
                &direct,
            );
            assert_eq!(outcome, Err(format!("bad item {}", 10 + fail_at)));
            assert_eq!(index.snapshot(b""), snapshot, "failed at {fail_at}");
        }
    }

    #[test]
    fn fewer_items_than_said_end_the_append() {
        let all = metas(CLASSIFY_CHUNK + 10);
        let mut index = IndexedHistory::new();
        let mut calls = 0;
        index
            .append_classified::<()>(
                3 * CLASSIFY_CHUNK,
                |first, count| {
                    calls += 1;
                    Ok(all[first.min(all.len())..(first + count).min(all.len())].to_vec())
                },
                &direct,
            )
            .unwrap();
        assert_eq!(index.len(), all.len());
        assert_eq!(calls, 3); // the third returned nothing: no loop on nothing
    }
}
