"""The builder's room for the context message: its blocks, options, plan and query, and the
count memo of texts a turn counts again."""
