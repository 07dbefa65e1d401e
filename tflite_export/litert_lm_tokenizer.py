"""The tokenizer of a `.litertlm` bundle: the byte tokenizer, or a checked file.

LiteRT-LM reads an HF `tokenizer.json`. `byte_tokenizer` writes one whose id
b is byte b (ids past 255 special tokens); a user's file is read with HF
`tokenizers` and refused unless its ids are exactly the model's.
"""

import json
import os
import pathlib

#: The pip extra that installs the builder, the engine and `tokenizers`.
EXTRA = "pip install 'keras_posenc[litertlm]'"


def _fail(name, expected, received, error=ValueError):
    raise error(f"`{name}` must be {expected}. Received: {name}={received!r}")


def byte_tokenizer(vocab_size, start_token=None, stop_tokens=()):
    """An HF `tokenizer.json` (text) mapping byte b to id b, for `vocab_size` ids.

    A byte-level BPE with no merges: each UTF-8 byte of a text is one token,
    id = the byte. Ids past 255 are special tokens: `<bos>` for
    `start_token`, `<eos>` (`<eos_1>`, ...) for the stop tokens, `<extra_i>`
    for the others.
    """
    if vocab_size < 256:
        _fail(
            "tokenizer", "a tokenizer.json path for a vocabulary under 256 ids", "bytes"
        )
    vocab = {char: byte for byte, char in _byte_chars().items()}
    special, stops = [], list(stop_tokens)
    for index in range(256, vocab_size):
        if index == start_token:
            name = "<bos>"
        elif index in stops:
            rank = stops.index(index)
            name = "<eos>" if rank == 0 else f"<eos_{rank}>"
        else:
            name = f"<extra_{index}>"
        vocab[name] = index
        special.append(
            {
                "id": index,
                "content": name,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
    level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False}
    document = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": special,
        "normalizer": None,
        "pre_tokenizer": dict(level, use_regex=False),
        "post_processor": None,
        "decoder": dict(level, use_regex=False),
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "vocab": vocab,
            "merges": [],
        },
    }
    return json.dumps(document, ensure_ascii=False)


def _byte_chars():
    """Byte -> the printable character byte-level BPE writes it as (GPT-2's map)."""
    kept = [*range(33, 127), *range(161, 173), *range(174, 256)]
    chars, shift = {}, 0
    for byte in range(256):
        if byte in kept:
            chars[byte] = chr(byte)
        else:
            chars[byte] = chr(256 + shift)
            shift += 1
    return chars


def tokenizer_text(tokenizer, vocab, tokens):
    """The `tokenizer.json` text of `tokenizer` (`"bytes"` or a path), checked.

    `tokens` is `(start token, stop tokens)`, named in a byte tokenizer.
    """
    if isinstance(tokenizer, str) and tokenizer == "bytes":
        return byte_tokenizer(vocab, *tokens)
    if not isinstance(tokenizer, (str, os.PathLike)) or not str(tokenizer).endswith(
        ".json"
    ):
        _fail("tokenizer", "'bytes' or the path of an HF tokenizer.json", tokenizer)
    source = pathlib.Path(tokenizer)  # never `path` (a .litertlm)
    if not source.is_file():
        _fail("tokenizer", "an existing tokenizer.json file", str(source))
    text = source.read_text(encoding="utf-8")
    try:
        json.loads(text)
    except ValueError as error:
        _fail("tokenizer", f"a JSON file ({error})", str(source))
    _check_tokenizer(text, vocab, str(source))
    return text


def _check_tokenizer(text, vocab, source):
    """Refuses a JSON text that is no tokenizer, or whose ids are not the model's.

    The engine would load the bundle and abort on the first, and read
    embedding rows that do not exist (or print ids it has no text for) on
    the second.
    """
    try:
        from tokenizers import Tokenizer
    except ImportError as error:
        raise ImportError(
            f"Reading a tokenizer.json needs `tokenizers`: {EXTRA}"
        ) from error
    try:
        ids = set(Tokenizer.from_str(text).get_vocab(with_added_tokens=True).values())
    except Exception as error:  # the library's own error types vary
        reason = str(error).splitlines()[0] if str(error) else type(error).__name__
        _fail("tokenizer", f"an HF tokenizer.json ({reason})", source)
    missing = sorted(set(range(vocab)) - ids)
    beyond = sorted(i for i in ids if i >= vocab)
    if missing or beyond:
        _fail(
            "tokenizer",
            f"a tokenizer whose ids are the model's 0 .. {vocab - 1} "
            f"(vocab_size={vocab}); ids without a token: {missing[:5]}"
            f"{'...' if len(missing) > 5 else ''}, ids past the vocabulary: "
            f"{beyond[:5]}{'...' if len(beyond) > 5 else ''}",
            source,
        )
