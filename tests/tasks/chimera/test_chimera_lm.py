"""L_T's masked-LM head (trained once, cached by content) and L_T on fixed masked held-out captions,
on a tiny BERT saved as a MiniLM folder (nothing downloads)."""

import pytest
import torch

WORDS = ["dog", "cat", "car", "man", "runs", "sits", "a"]


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory):
    from transformers import BertConfig, BertModel, BertTokenizerFast

    from polyfuse.nn.sentence_encoder import MiniLMEncoder

    folder = tmp_path_factory.mktemp("tiny_bert")
    vocabulary = {word: i for i, word in enumerate(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS])}
    BertTokenizerFast(vocab=vocabulary).save_pretrained(folder)
    torch.manual_seed(0)
    config = BertConfig(vocab_size=12, hidden_size=8, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=16, max_position_embeddings=16)
    BertModel(config).save_pretrained(folder)
    return MiniLMEncoder(folder)


def _captions(count, offset=0):
    return [f"a {WORDS[(i + offset) % 4]} {WORDS[4 + i % 2]} {WORDS[(i + 1) % 4]}" for i in range(count)]


def test_lm_head_is_cached_by_content_and_tied(tiny_encoder, tmp_path):
    from polyfuse.tasks.chimera.lm import LMHeadSettings, lm_head_for

    settings = LMHeadSettings(epochs=2, batch_size=8)
    train, held_out = _captions(24), _captions(8, 1)
    head, report = lm_head_for(tiny_encoder, train, held_out, tmp_path, settings)
    files = list(tmp_path.glob("lm_head_*.safetensors"))
    assert report["cached"] is None and len(files) == 1 and len(report["history"]) == 2
    assert report["held_out_nll"] <= report["held_out_nll_initial"]  # the best epoch is kept
    assert head.decoder_weight is tiny_encoder.model.embeddings.word_embeddings.weight
    again, cached = lm_head_for(tiny_encoder, train, held_out, tmp_path, settings)
    assert cached["cached"] == str(files[0]) and cached["held_out_nll"] == report["held_out_nll"]
    for name, tensor in head.own_state().items():
        assert torch.equal(tensor, again.own_state()[name])
    assert again.decoder_weight is tiny_encoder.model.embeddings.word_embeddings.weight
    lm_head_for(tiny_encoder, train[:-1], held_out, tmp_path, settings)  # other captions: another file
    assert len(list(tmp_path.glob("lm_head_*.safetensors"))) == 2
    files[0].write_bytes(files[0].read_bytes()[:40])  # a truncated file is retrained, never trusted
    with pytest.warns(UserWarning, match="broken masked-LM head cache"):
        rebuilt, rebuilt_report = lm_head_for(tiny_encoder, train, held_out, tmp_path, settings)
    assert rebuilt_report["cached"] is None
    for name, tensor in head.own_state().items():
        assert torch.equal(tensor, rebuilt.own_state()[name])  # deterministic: the same head again


def _corpus(tmp_path):
    from polyfuse.data.formats.experts import ExpertFeatures, RetrievalCorpus

    g = torch.Generator().manual_seed(1)
    ids = [f"v{i}" for i in range(8)]
    expert = ExpertFeatures("app", ids, torch.randn(8, 5, 6, generator=g), torch.ones(8, 5, dtype=torch.bool),
                            torch.ones(8, dtype=torch.bool))
    captions = {v: _captions(2, i) for i, v in enumerate(ids)}
    corpus = RetrievalCorpus.build({"app": expert}, captions, ids)
    return corpus.subset(ids[:6]), corpus.subset(ids[6:])


def test_held_out_topic_lm_uses_fixed_masks_and_equals_eq3_by_hand(tiny_encoder, tmp_path):
    from polyfuse.nn.models.chimera import ChimeraRetrievalModel
    from polyfuse.tasks.chimera.lm import LMHeadSettings, lm_head_for
    from polyfuse.tasks.chimera.spec import held_out_masked_captions, held_out_topic_lm

    train, val = _corpus(tmp_path)
    head, _ = lm_head_for(tiny_encoder, train.captions, val.captions, None, LMHeadSettings(epochs=1))
    captions = _captions(7, 2)
    batches = held_out_masked_captions(tiny_encoder, captions, 0.3, count=5, batch_size=2)
    again = held_out_masked_captions(tiny_encoder, captions, 0.3, count=5, batch_size=2)
    assert sum(len(b[0]) for b in batches) == 5  # the first `count` captions
    assert all(torch.equal(a[3], b[3]) for a, b in zip(batches, again, strict=True))  # the same masks
    torch.manual_seed(3)
    model = ChimeraRetrievalModel(8, 6, num_topics=3, hyperbolic_dim=2)
    out = held_out_topic_lm(model, batches, head)
    total, head_total, identity, count = 0.0, 0.0, 0.0, 0  # Eq. 3 position by position, float64
    with torch.no_grad():
        for hidden, _, ids, masked in batches:
            for b, t in masked.nonzero().tolist():
                h = hidden[b, t].double()
                prior = torch.softmax(model.text_topic.topic_prior(model.text_topic.norm(hidden[b, t])).double(), 0)
                states = model.text_topic.topic_states(hidden[b, t].view(1, 1, -1)).view(3, -1)
                words = [torch.softmax(head(states[z]).double(), 0)[ids[b, t]] for z in range(3)]
                total -= float(torch.log(sum(prior[z] * words[z] for z in range(3))))
                head_total -= float(torch.log_softmax(head(h.float()).double(), 0)[ids[b, t]])
                identity += float(prior[0])
                count += 1
    assert out["val_topic_lm"] == pytest.approx(total / count, rel=1e-5)
    assert out["val_head_nll"] == pytest.approx(head_total / count, rel=1e-5)
    assert out["val_identity_topic"] == pytest.approx(identity / count, rel=1e-5)
    with pytest.raises(ValueError, match="at least one caption"):
        held_out_masked_captions(tiny_encoder, captions, 0.3, count=0)
