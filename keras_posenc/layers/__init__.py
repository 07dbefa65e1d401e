"""One public layer per module."""
