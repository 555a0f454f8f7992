"""BAN's VQA forward with the counter at the reference configuration, polyfuse against
the reference code (github.com/jnhwkim/ban-vqa) in one run.

36 objects of 2,048-d, 14 words, hidden 1,024, 8 glimpses, counter of 10 objects,
3,129 answers, batch 32, eval mode, float32 on CPU; the reference modules are read
unchanged from a git mirror (``--git``, as in tests/nn/test_ban_vqa_reference.py).
Prints the median of ``--repeats`` timed forwards of each and their largest
difference in logits.

    python scripts/bench_ban_vqa.py --threads 2
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
import types
import warnings
from pathlib import Path

import torch

FILES = ["base_model.py", "attention.py", "bc.py", "fc.py", "counting.py", "language_model.py", "classifier.py"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--git", default=os.environ.get("POLYFUSE_BAN_VQA_GIT"), required="POLYFUSE_BAN_VQA_GIT" not in os.environ,
                        help="git dir of a ban-vqa mirror (default: $POLYFUSE_BAN_VQA_GIT; docs/TESTING.md)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    folder = Path(tempfile.mkdtemp())
    for name in FILES:
        text = subprocess.run(["git", f"--git-dir={args.git}", "show", f"HEAD:{name}"], capture_output=True, check=True, text=True).stdout
        (folder / name).write_text(text)
    sys.path.insert(0, str(folder))
    sys.modules["utils"] = types.ModuleType("utils")  # only the Flickr model needs it
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import base_model

        from polyfuse.interop import load_ban_vqa

        torch.manual_seed(0)
        dataset = types.SimpleNamespace(dictionary=types.SimpleNamespace(ntoken=20000), v_dim=2048, num_ans_candidates=3129)
        reference = base_model.build_ban(dataset, 1024, op="", gamma=8).eval()
    ours = load_ban_vqa(reference.state_dict()).eval()
    v = torch.randn(args.batch, 36, 2048).relu()
    corners = torch.rand(args.batch, 36, 2)
    b = torch.cat([corners, corners + 0.3 * torch.rand(args.batch, 36, 2)], dim=-1)
    q = torch.randint(0, 20001, (args.batch, 14))

    def timed(function) -> tuple[float, torch.Tensor]:
        seconds = []
        with torch.no_grad():
            for _ in range(args.repeats):
                start = time.perf_counter()
                result = function()
                seconds.append(time.perf_counter() - start)
        return statistics.median(seconds), result

    reference_seconds, (reference_logits, _) = timed(lambda: reference(v, b, q, None))
    ours_seconds, (our_logits, _) = timed(lambda: ours(q, v, b))
    print(f"batch {args.batch}, 36 objects, 14 words, hidden 1024, 8 glimpses, counter; threads {torch.get_num_threads()}")
    print(f"reference ban-vqa forward: {1000 * reference_seconds:.0f} ms (median of {args.repeats})")
    print(f"polyfuse BanVQA forward:   {1000 * ours_seconds:.0f} ms (median of {args.repeats})")
    print(f"largest logit difference: {(our_logits - reference_logits).abs().max().item():.2e}")


if __name__ == "__main__":
    main()
