import numpy as np
import pytest

from keras_posenc.data import datasets, synthetic


def test_relative_offset_labels_copy_the_token_three_places_left():
    tokens, labels = synthetic.make_task("relative_offset", 4, 12)
    np.testing.assert_array_equal(labels[:, 3:], tokens[:, :-3])
    assert not labels[:, :3].any()


def test_absolute_and_combined_labels():
    tokens, absolute = synthetic.make_task("absolute_position", 2, 6)
    np.testing.assert_array_equal(absolute, np.repeat(tokens[:, 1:2], 6, axis=1))
    _, both = synthetic.make_task("relative_and_absolute", 2, 6)
    np.testing.assert_array_equal(both[:, 1::2], absolute[:, 1::2])
    np.testing.assert_array_equal(both[:, 4], tokens[:, 1])


def test_rejects_unknown_tasks_and_short_lengths():
    with pytest.raises(ValueError, match="`name` must be one of"):
        synthetic.make_task("sorting", 2, 8)
    with pytest.raises(ValueError, match="`length` must exceed offset=3"):
        synthetic.make_task("relative_offset", 2, 3)


def test_digits_patches_rebuild_the_images():
    from sklearn.datasets import load_digits

    x, y = datasets.digits_patches(seed=0)
    assert x.shape == (1797, 16, 4) and 0.0 <= x.min() and x.max() <= 1.0
    order = np.random.default_rng(0).permutation(1797)
    image = load_digits().images[order[0]] / 16.0
    np.testing.assert_allclose(x[0, 0], image[:2, :2].ravel())  # top-left patch
    np.testing.assert_allclose(x[0, 1], image[:2, 2:4].ravel())  # its right neighbour


def test_sentence_task_labels_the_first_word_of_the_previous_sentence():
    tokens, labels = synthetic.sentence_task(20, 30, min_words=2, max_words=5, seed=3)
    marker = synthetic.MARKER
    for row_tokens, row_labels in zip(tokens, labels):
        starts = [0] + [t + 1 for t in range(29) if row_tokens[t] == marker]
        for t in range(30):
            sentence = sum(start <= t for start in starts) - 1  # its own sentence
            want = row_tokens[starts[sentence - 1]] if sentence > 0 else 0
            assert row_labels[t] == want, (t, row_tokens, row_labels)
        lengths = np.diff(starts) - 1  # words per complete sentence
        assert np.all((lengths >= 2) & (lengths <= 5))


def test_sentence_task_refuses_bad_sentence_lengths():
    with pytest.raises(ValueError, match="`min_words` must be >= 1 and <= max_words"):
        synthetic.sentence_task(2, 8, min_words=3, max_words=2)
    with pytest.raises(ValueError, match="`vocab_size` must be >= 3"):
        synthetic.sentence_task(2, 8, vocab_size=2)


def test_retrieval_task_asks_for_one_early_key_and_answers_its_value():
    tokens, answers = synthetic.retrieval_task(30, 64, num_pairs=3, seed=4)
    filler, keys, values = 16, 8, 8
    assert tokens.max() < synthetic.retrieval_vocab_size() and tokens.min() >= 1
    for row, answer in zip(tokens, answers):
        pairs = [(t, int(row[t]) - filler - 1) for t in range(63) if row[t] > filler]
        assert len(pairs) == 3 and all(t < 8 for t, _ in pairs)  # first eighth
        asked = int(row[-1]) - filler - 1 - keys * values
        found = [pair % values for _, pair in pairs if pair // values == asked]
        assert found == [answer]  # the asked key stands once, with this value
        assert len({pair // values for _, pair in pairs}) == 3  # distinct keys


def test_retrieval_task_refuses_pairs_that_do_not_fit():
    with pytest.raises(ValueError, match="`num_pairs` must be >= 1 and <= num_keys"):
        synthetic.retrieval_task(2, 64, num_pairs=9)
    with pytest.raises(ValueError, match="`length` must hold num_pairs=4"):
        synthetic.retrieval_task(2, 24)
