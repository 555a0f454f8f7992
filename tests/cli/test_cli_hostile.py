"""Hostile and broken files given to the command line (issue 29): each is refused in one
line naming the file with exit 2 (bad input) or 3 (the machine refused), nothing is run
from a file, and nothing half-written is trusted by a rerun."""

import pathlib
import pickle

from tests.cli.test_retrieval_cli import _files

from polyfuse.cli.main import EXIT_INPUT, main


def _error_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "Traceback" not in err and len(err.splitlines()) == 1, err
    return err


class _Touch:
    """Unpickling this object creates ``marker``: the proof that a pickle ran code."""

    def __init__(self, marker):
        self.marker = pathlib.Path(marker)

    def __reduce__(self):
        return (pathlib.Path.touch, (self.marker,))


def _pickle_payload(path, marker):
    path.write_bytes(pickle.dumps({"state": _Touch(marker), "settings": {}, "text_dim": 4, "expert_dims": [5, 3]}))


def test_a_pickled_retrieval_checkpoint_is_never_unpickled(tmp_path, capsys):
    _, common = _files(tmp_path)
    marker = tmp_path / "ran"
    _pickle_payload(tmp_path / "seed0.pt", marker)
    pickle.loads((tmp_path / "seed0.pt").read_bytes())  # the payload works: unpickled, it creates the marker
    assert marker.exists()
    marker.unlink()
    (tmp_path / "seed0.safetensors").write_bytes((tmp_path / "seed0.pt").read_bytes())
    for name in ("seed0.pt", "seed0.safetensors"):  # a pickle under either name
        assert main(["retrieval", "evaluate", *common, "--checkpoint", str(tmp_path / name)]) == EXIT_INPUT
        line = _error_line(capsys)
        assert str(tmp_path / name) in line and not marker.exists()
        if name.endswith(".pt"):
            assert "re-train, or convert" in line and "weights_only=True" in line
        else:
            assert "corrupt or truncated" in line


def _word_vectors(path, seed):
    import numpy as np

    rng = np.random.default_rng(seed)
    words = ["dog", "cat", "car", "man", "runs", "sits", "a"]
    path.write_text("\n".join(f"{w} " + " ".join(str(x) for x in rng.normal(size=4)) for w in words))
    return path


def test_the_caption_cache_is_keyed_by_the_encoder_and_never_trusts_a_broken_file(tmp_path):
    import pytest
    import torch

    from polyfuse.engine.retrieval import encode_captions
    from polyfuse.nn.sentence_encoder import StaticWordEncoder

    captions = ["dog runs", "a cat sits", "man"]
    first = StaticWordEncoder(_word_vectors(tmp_path / "a.txt", 0))
    second = StaticWordEncoder(_word_vectors(tmp_path / "b.txt", 1))
    cache = tmp_path / ".cache"
    expected = {name: encoder(captions).sentence for name, encoder in (("a", first), ("b", second))}
    assert not torch.allclose(expected["a"], expected["b"])
    torch.testing.assert_close(encode_captions(first, captions, cache_dir=cache), expected["a"])
    # another word-vector file under the same cache folder: its own vectors, not the first file's
    torch.testing.assert_close(encode_captions(second, captions, cache_dir=cache), expected["b"])
    files = sorted(cache.iterdir())
    assert len(files) == 2 and all(f.suffix == ".safetensors" for f in files)
    # a cache read back gives the same vectors (it is used)
    torch.testing.assert_close(encode_captions(first, captions, cache_dir=cache), expected["a"])
    for broken in (b"", files[0].read_bytes()[:40], b"\x00" * 100):  # empty, truncated, garbage
        for f in files:
            f.write_bytes(broken)
        for name, encoder in (("a", first), ("b", second)):
            with pytest.warns(UserWarning, match="rebuilding it"):
                torch.testing.assert_close(encode_captions(encoder, captions, cache_dir=cache), expected[name])
        torch.testing.assert_close(encode_captions(first, captions, cache_dir=cache), expected["a"])  # rebuilt
    assert not list(cache.glob("*.partial"))
