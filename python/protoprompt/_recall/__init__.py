"""The room for what a turn recalls: candidates ranked from the memory store, the index of
evicted turns, and the ledger of what was recalled."""
