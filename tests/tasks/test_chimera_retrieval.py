"""Chimera retrieval: pair scores agree with the Chimera module's own H_M; ablations by hand."""

import torch

from polyfuse.functional.pooling import masked_mean
from polyfuse.nn.chimera import Chimera
from polyfuse.tasks.chimera_retrieval import ChimeraRetrievalModel


def _inputs():
    g = torch.Generator().manual_seed(0)
    tokens = torch.randn(3, 4, 8, generator=g)
    tmask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 1]]).bool()
    steps = torch.randn(2, 5, 6, generator=g)
    vmask = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]).bool()
    return tokens, tmask, steps, vmask


def test_pair_scores_equal_chimera_forward():
    torch.manual_seed(0)
    model = ChimeraRetrievalModel(8, 6, num_topics=3, hyperbolic_dim=4).eval()
    reference = Chimera(8, num_topics=3, hyperbolic_dim=4).eval()
    reference.text_topic.load_state_dict(model.text_topic.state_dict())
    reference.image_topic.load_state_dict(model.image_topic.state_dict())
    reference.hyperbolic.load_state_dict(model.hyperbolic.state_dict())
    reference.matching.load_state_dict(model.matching.state_dict())
    tokens, tmask, steps, vmask = _inputs()
    with torch.no_grad():
        scores = model.score_matrix(model.texts(tokens, tmask), model.videos(steps, vmask))
        for t in range(3):
            for v in range(2):
                image = model.video_projection(steps[v : v + 1])
                out = reference(tokens[t : t + 1], image, tmask[t : t + 1], vmask[v : v + 1])
                expected = model.score_head(masked_mean(out.hidden, out.mask)).squeeze()
                assert torch.allclose(scores[t, v], expected, atol=1e-5)


def test_without_topic_and_hyperbolic_layers_by_hand():
    torch.manual_seed(0)
    model = ChimeraRetrievalModel(8, 6, num_topics=0, hyperbolic_dim=0).eval()
    tokens, tmask, steps, vmask = _inputs()
    with torch.no_grad():
        scores = model.score_matrix(model.texts(tokens, tmask), model.videos(steps, vmask))
        wt, wv = model.matching.topic_weight, model.matching.visual_weight
        text = tokens[1, :2]
        image = model.video_projection(steps[0])
        # Eq. 9 with H_h = H_T = H_L: text rows (1 - wt) h + wt (1 - wv) h, image rows (1 - wt) h + wt wv h
        fused = torch.cat(((1 - wt) * text + wt * (1 - wv) * text, (1 - wt) * image + wt * wv * image))
        expected = model.score_head(fused.mean(0)).squeeze()
    assert torch.allclose(scores[1, 0], expected, atol=1e-5)
