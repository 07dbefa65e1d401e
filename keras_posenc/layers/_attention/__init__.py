"""The parts of `RelativeMultiHeadAttention`, one mixin per path.

One module per path, each a mixin of the layer: `cached` (full and rolling
caches), `local` (block-local bands), `lsh` (LSH attention), `packed` (packed
rows), `rotary` (rotary queries and keys), and `checks` (its argument and call
checks). Which path takes which argument: `docs/attention.md`.
"""
